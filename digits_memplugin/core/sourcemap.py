"""Where each top-level `layer { ... }` (or V1 `layers { ... }`) block starts in a prototxt, for messages.

protobuf's text parser does not report positions of what it parsed, so this scanner walks the text once, skipping
comments and quoted strings and counting braces, and notes the line of every top-level layer block. It reads
positions only; the parsing itself is text_format's.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r'#[^\n]*|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|[{}]|\n|[A-Za-z_][A-Za-z0-9_]*')


def layer_lines(text: str) -> list[int | None]:
    """1-based line of each top-level layer block, in order (the order of NetParameter.layer after parsing)."""
    lines: list[int | None] = []
    depth = 0
    line = 1
    pending: int | None = None
    for match in _TOKEN.finditer(text):
        token = match.group()
        if token == "\n":
            line += 1
        elif token == "{":
            if depth == 0 and pending is not None:
                lines.append(pending)
            pending = None
            depth += 1
        elif token == "}":
            depth = max(depth - 1, 0)
        elif depth == 0:
            pending = line if token in ("layer", "layers") else None
    return lines
