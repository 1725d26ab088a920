"""Reading net and solver definitions: protobuf text format through caffe_pb2 (NVcaffe's schema when the text needs
it), upgraded the way Caffe upgrades.

No hand-written parser: `google.protobuf.text_format` does the parsing, so anything Caffe's own text parser
accepts is accepted here, and errors carry the parser's line and column (1-based, counted in characters).
Before parsing, the text is checked against `ParseLimits` (size, number of layers) so that hostile input costs
bounded time and memory.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from typing import Any

from google.protobuf import text_format
from google.protobuf.message import Message

from .errors import NetError, PrototxtSyntaxError
from .flavour import parse_either
from .sourcemap import code_spans_outside_strings, count_layer_blocks, string_spans
from .upgrade import check_inline_net, upgrade_net, upgrade_solver


@dataclasses.dataclass(frozen=True)
class ParseLimits:
    """Bounds on what a definition may hold, so that hostile input costs bounded time and memory."""

    max_bytes: int = 4 * 1024 * 1024
    """Largest prototxt text accepted (GoogLeNet's train_val is 40 KB; 4 MiB parses in about two seconds)."""
    max_layers: int = 5000
    """Most layers in one net (ResNet-1001 has about 3000)."""


DEFAULT_LIMITS = ParseLimits()

MAX_DETAIL = 240
"""Longest parser message kept: a 100 000-digit number must not come back in the error."""

BOM = "\ufeff"
_UNICODE_SPACE = re.compile(r"[^\S \t\n\r\f\v]")
"""Whitespace beyond ASCII's (a no-break space pasted from a web page): Python's parser skips it, Caffe's refuses."""
_ESCAPE = re.compile(r"\\(.)")
_VALID_ESCAPES = set("abfnrtv\\'\"01234567xuU")
"""Escapes both parsers read alike. Caffe refuses others (\\q); Python's warns, or raises under -W error."""


def _check_text(text: str | bytes, source: str, limits: ParseLimits) -> str:
    """The text as str, or a NetError: wrong type, too big, not UTF-8, a byte-order mark, a NUL character."""
    if isinstance(text, (bytes, bytearray)):
        data = bytes(text)
        if len(data) > limits.max_bytes:
            raise NetError(f"is {len(data)} bytes; the limit is {limits.max_bytes}", source=source)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            line, column = _position_of_byte(data, error.start)
            raise PrototxtSyntaxError(
                f"is not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start})",
                source=source,
                line=line,
                column=column,
            ) from None
    elif not isinstance(text, str):
        raise NetError(f"must be text, not {type(text).__name__}", source=source)
    if len(text) > limits.max_bytes:
        raise NetError(f"is {len(text)} characters; the limit is {limits.max_bytes}", source=source)
    if text.startswith(BOM):
        # Caffe's parser refuses it too; editors on Windows add it silently, so say what it is.
        raise PrototxtSyntaxError(
            "starts with a byte-order mark (BOM), which Caffe cannot parse; save the file as UTF-8 without BOM",
            source=source,
            line=1,
            column=1,
        )
    nul = text.find("\x00")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        column = nul - (text.rfind("\n", 0, nul) + 1) + 1
        raise PrototxtSyntaxError("contains a NUL character", source=source, line=line, column=column)
    _check_unicode_space(text, source)
    _check_escapes(text, source)
    return text


def _check_escapes(text: str, source: str) -> None:
    if "\\" not in text:
        return
    for start, end in string_spans(text):
        for match in _ESCAPE.finditer(text, start + 1, end - 1):
            if match.group(1) not in _VALID_ESCAPES:
                at = match.start()
                what = (
                    "escape sequence '\\?' is not supported here (Caffe reads it as ?); write ? instead"
                    if match.group(1) == "?"
                    else f"invalid escape sequence {match.group()!r} in a string"
                )
                raise PrototxtSyntaxError(
                    what,
                    source=source,
                    line=text.count("\n", 0, at) + 1,
                    column=at - (text.rfind("\n", 0, at) + 1) + 1,
                )


def _check_unicode_space(text: str, source: str) -> None:
    if _UNICODE_SPACE.search(text) is None:
        return
    for start, end in code_spans_outside_strings(text):
        match = _UNICODE_SPACE.search(text, start, end)
        if match is not None:
            at = match.start()
            char = text[at]
            name = unicodedata.name(char, "unnamed whitespace").lower()
            raise PrototxtSyntaxError(
                f"contains the character U+{ord(char):04X} ({name}) outside a string; Caffe's parser does not accept "
                "it (replace it with an ordinary space)",
                source=source,
                line=text.count("\n", 0, at) + 1,
                column=at - (text.rfind("\n", 0, at) + 1) + 1,
            )


def _position_of_byte(data: bytes, offset: int) -> tuple[int, int]:
    """1-based line and character column of a byte offset (the column counts the decodable characters before it)."""
    line_start = data.rfind(b"\n", 0, offset) + 1
    column = len(data[line_start:offset].decode("utf-8", errors="replace")) + 1
    return data.count(b"\n", 0, offset) + 1, column


def _parse(text: str, message: Message, source: str) -> None:
    try:
        text_format.Parse(text, message, allow_unknown_extension=False)
    except text_format.ParseError as error:
        line, column = error.GetLine(), error.GetColumn()
        raise PrototxtSyntaxError(_detail(error, text), source=source, line=line, column=column) from None
    except (RecursionError, OverflowError, ValueError, TypeError, Warning) as error:
        # ValueError: a number longer than Python's int-conversion limit; Warning: a codec warning (an escape
        # sequence) when warnings are errors.
        raise PrototxtSyntaxError(f"cannot be parsed: {_shorten(str(error))}", source=source) from None


def _detail(error: text_format.ParseError, text: str) -> str:
    """The parser's message without its "line:column : " prefix and without the quoted source line it may start
    with (the location is carried separately, and a long line would swamp the message)."""
    detail = str(error)
    line, column = error.GetLine(), error.GetColumn()
    detail = detail.removeprefix(f"{line}:{column} : ")
    if detail.startswith("'"):
        lines = text.split("\n")
        candidates = [lines[line - 1]] if line is not None and 0 < line <= len(lines) else []
        for candidate in [*candidates, ""]:
            prefix = f"'{candidate}': "
            if detail.startswith(prefix):
                detail = detail[len(prefix) :]
                break
    return _shorten(detail)


def _shorten(detail: str) -> str:
    return detail if len(detail) <= MAX_DETAIL else detail[: MAX_DETAIL - 1] + "…"


def _check_layer_count(text: str, source: str, limits: ParseLimits, nested: bool) -> None:
    """Refuse a text with too many layer blocks before parsing it: 600 000 empty layers fit in 4 MiB and take
    the parser several seconds, the scan a fraction of that."""
    count, line = count_layer_blocks(text, limits.max_layers + 1, nested=nested)
    if count > limits.max_layers:
        raise NetError(
            f"has more than {limits.max_layers} layers (the limit); layer {limits.max_layers + 1} starts here",
            source=source,
            line=line,
        )


def parse_net(
    text: str | bytes, source: str = "net.prototxt", limits: ParseLimits = DEFAULT_LIMITS
) -> Any:  # caffe_pb2.NetParameter
    """Parse a NetParameter and upgrade it as Caffe's UpgradeNetAsNeeded does (V1 layers, input fields...)."""
    checked = _check_text(text, source, limits)
    _check_layer_count(checked, source, limits, nested=False)
    # BVLC's schema first, NVcaffe's when the text uses its fields (`flavour.flavour_of` tells which it took).
    net = parse_either(lambda message: _parse(checked, message, source), "NetParameter")
    upgrade_net(net, source)
    check_net_size(net, source, limits)
    return net


def check_net_size(net: Any, source: str, limits: ParseLimits = DEFAULT_LIMITS) -> None:
    """A parsed net within `limits.max_layers` (an upgrade adds an Input layer; inline nets are counted here)."""
    if len(net.layer) + len(net.layers) > limits.max_layers:
        raise NetError(
            f"has {len(net.layer) + len(net.layers)} layers; the limit is {limits.max_layers}", source=source
        )


def parse_solver(
    text: str | bytes, source: str = "solver.prototxt", limits: ParseLimits = DEFAULT_LIMITS
) -> Any:  # caffe_pb2.SolverParameter
    """Parse a SolverParameter and upgrade its legacy `solver_type` enum, as UpgradeSolverAsNeeded does.

    Nets given inside the solver (net_param, train_net_param, test_net_param) are not upgraded: Caffe's Solver
    copies them as they are, so a legacy one is refused with an explanation (see `upgrade.check_inline_net`).
    """
    checked = _check_text(text, source, limits)
    _check_layer_count(checked, source, limits, nested=True)
    solver = parse_either(lambda message: _parse(checked, message, source), "SolverParameter")
    upgrade_solver(solver, source)
    for field in ("net_param", "train_net_param"):
        if solver.HasField(field):
            check_inline_net(getattr(solver, field), source, field)
            check_net_size(getattr(solver, field), source, limits)
    for index, net in enumerate(solver.test_net_param):
        check_inline_net(net, source, "test_net_param", index)
        check_net_size(net, source, limits)
    return solver
