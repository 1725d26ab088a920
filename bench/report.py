"""Writing a benchmark's table into docs/benchmarks.md, between `<!-- NAME:begin -->` and `<!-- NAME:end -->`."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, name: str, body: str) -> None:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{begin}\n{body}\n{end}"
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        text = head + block + tail
    else:
        text = text.rstrip() + f"\n\n## {name}\n\n{block}\n"
    path.write_text(text)
