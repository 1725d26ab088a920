"""Where each layer block of a prototxt starts, for messages, and how many there are, for limits.

protobuf's text parser does not report positions of what it parsed, so this scanner walks the text once, skipping
comments and quoted strings and counting braces, and notes the line of every `layer { ... }` (or V1 `layers`)
block. It knows the forms text format allows: `layer {`, `layer: {`, `layer <...>`, and the list form
`layer [ {...}, {...} ]`. It reads positions only; the parsing itself is text_format's.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

_OPEN = "{<"
_CLOSE = "}>"
INPUT_SHAPE_FIELDS = ("input_shape", "input_dim")

_STRING_OR_COMMENT = re.compile(r'#[^\n]*|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'')
"""A comment, or a quoted string on one line (text format's strings cannot span lines). Scanned from the left,
a `#` inside a string is part of the string and a quote inside a comment part of the comment."""
_BLOCK_TOKEN = re.compile(r"[{}<>\[\]]|(?<![A-Za-z0-9_])layers?(?![A-Za-z0-9_])")
"""What the block scanner needs once strings and comments are blanked out: brackets and the `layer`/`layers`
names. Other names and newlines are left to the regular expression engine, so the loop runs over a fraction of
the text; lines are counted only where a block is reported."""


def _without_strings(text: str) -> str:
    """The text with every quoted string and comment replaced by `""`: neither holds a newline, so lines stay
    where they were, and the brackets or names inside them are gone."""
    return _STRING_OR_COMMENT.sub('""', text)


def _layer_blocks(text: str) -> Iterator[tuple[int, int, int]]:
    """(depth, block index at depth 0 around it, line) of every layer block, in text order; `text` as
    `_without_strings` returns it."""
    depth = 0
    line, counted_to = 1, 0  # `line` is the line of offset `counted_to`
    outer = -1  # index of the current depth-0 block, so nested layers can be grouped by the net they belong to
    pending: int | None = None  # offset of a `layer` field name waiting for its `{`
    in_list = False  # inside `layer [ ... ]` at the current depth
    list_depth = -1
    for match in _BLOCK_TOKEN.finditer(text):
        token = match.group()
        first = token[0]
        if first in _OPEN:
            at = pending if pending is not None else match.start() if in_list and depth == list_depth else None
            if at is not None:
                line += text.count("\n", counted_to, at)
                counted_to = at
                yield depth, outer, line
            if depth == 0:
                outer += 1
            pending = None
            depth += 1
        elif first in _CLOSE:
            depth = max(depth - 1, 0)
            pending = None
        elif first == "[":
            if pending is not None:
                in_list, list_depth = True, depth
            pending = None
        elif first == "]":
            if in_list and depth == list_depth:
                in_list = False
            pending = None
        else:
            pending = match.start()


def code_spans_outside_strings(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of every stretch of text that is neither a quoted string nor a comment."""
    position = 0
    for match in _STRING_OR_COMMENT.finditer(text):
        yield position, match.start()
        position = match.end()
    yield position, len(text)


def string_spans(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of every quoted string, quotes included."""
    for match in _STRING_OR_COMMENT.finditer(text):
        if match.group()[0] != "#":
            yield match.start(), match.end()


def layer_lines(text: str | bytes) -> list[int | None]:
    """1-based line of each top-level layer block, in the order of NetParameter.layer after parsing and upgrading.

    Caffe's UpgradeNetInput turns net-level `input` + `input_shape`/`input_dim` fields into an Input layer placed
    first; its line is that of the first `input` field, so the lines stay aligned with the upgraded net's layers.
    """
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", errors="replace")
    text = _without_strings(text)
    lines: list[int | None] = [line for depth, _, line in _layer_blocks(text) if depth == 0]
    input_line = _top_level_input_line(text)
    if input_line is not None:
        lines.insert(0, input_line)
    return lines


_INPUT_TOKEN = re.compile(r"[{}<>]|(?<![A-Za-z0-9_])input(?:_shape|_dim)?(?![A-Za-z0-9_])")


def _top_level_input_line(text: str) -> int | None:
    """Line of the first top-level `input` field when the net also has input_shape or input_dim, else None;
    `text` as `_without_strings` returns it."""
    if "input_shape" not in text and "input_dim" not in text:
        return None
    depth = 0
    first_input: int | None = None
    has_shape = False
    for match in _INPUT_TOKEN.finditer(text):
        token = match.group()
        if token in _OPEN:
            depth += 1
        elif token in _CLOSE:
            depth = max(depth - 1, 0)
        elif depth == 0 and token == "input" and first_input is None:
            first_input = match.start()
        elif depth == 0 and token in INPUT_SHAPE_FIELDS:
            has_shape = True
    return text.count("\n", 0, first_input) + 1 if first_input is not None and has_shape else None


def count_layer_blocks(text: str, stop_after: int, *, nested: bool = False) -> tuple[int, int | None]:
    """The largest number of layer blocks in one net, counting no further than `stop_after`, and the line of the
    block where counting stopped (None when it did not stop).

    A net text's layers are its top-level blocks; with `nested`, the text is a solver's and each top-level block
    (net_param, train_net_param, test_net_param) is a net of its own whose layers are counted apart.
    """
    wanted_depth = 1 if nested else 0
    counts: dict[int, int] = {}
    for depth, outer, line in _layer_blocks(_without_strings(text)):
        if depth != wanted_depth:
            continue
        net = outer if nested else 0
        counts[net] = counts.get(net, 0) + 1
        if counts[net] >= stop_after:
            return counts[net], line
    return max(counts.values(), default=0), None
