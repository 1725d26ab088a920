"""Memory sizes as people write them ("24GiB", "1.5 GB") and as the UI shows them, plus the `--simulate-gpus` spec.

Standard library only: settings validation, the command line and the fake NVML library all use it.
"""

from __future__ import annotations

import re

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4

# Binary units are what GPU memory is sold and reported in; decimal ones are accepted because people type them.
_UNITS = {
    "b": 1,
    "kib": KIB,
    "mib": MIB,
    "gib": GIB,
    "tib": TIB,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*$", re.ASCII)  # 0-9 only: not "١٢"
_ITEM = re.compile(r"^\s*(?:(\d+)\s*[xX]\s*)?(.+?)\s*$")

MAX_SIZE_TEXT = 40
"""Characters a size may have: no size needs more, and float() reads 400 digits as infinity, which int() refuses."""
MAX_SIMULATED_GPUS = 64
MIN_SIMULATED_GPU_MEMORY = 256 * MIB
MAX_SIMULATED_GPU_MEMORY = 16 * TIB


def parse_size(text: str) -> int:
    """Bytes in `text`, which must name its unit ("24GiB", "512 MiB", "1.5GB"): a bare number is too easy to misread."""
    match = _SIZE.match(text) if len(text) <= MAX_SIZE_TEXT else None
    if not match or match.group(2).lower() not in _UNITS:
        units = "B, KiB, MiB, GiB, TiB, KB, MB, GB, TB"
        shown = text.strip() if len(text) <= MAX_SIZE_TEXT else f"{text.strip()[:MAX_SIZE_TEXT]}..."
        raise ValueError(f"{shown!r} is not a memory size: write a number and a unit ({units}), e.g. '24GiB'")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def byte_count(value: object) -> int:
    """A byte count as the REST API takes it: a whole number of bytes, or a size with its unit ("8GiB"), as the
    command line and the settings take it. Raises ValueError saying why; the range is the caller's to check."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        return parse_size(value)
    raise ValueError('must be a whole number of bytes or a size such as "8GiB"')


def format_size(size: int | None) -> str:
    """A byte count for people, in binary units with one decimal ("23.6 GiB"); None (unknown) is "n/a"."""
    if size is None:
        return "n/a"
    if size < KIB:
        return f"{size} B"
    for unit, factor in (("TiB", TIB), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover


def parse_gpu_spec(spec: str) -> tuple[int, ...]:
    """The memory of each simulated GPU in a spec like "2x24GiB" or "24GiB,16GiB" (items may repeat: "2x24GiB,80GiB")."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("the GPU spec is empty: write e.g. '2x24GiB' or '24GiB,16GiB'")
    sizes: list[int] = []
    for item in spec.split(","):
        match = _ITEM.match(item)
        if not match or not match.group(2):
            raise ValueError(f"{item.strip()!r} in {spec!r} is not '<count>x<size>' or '<size>'")
        count = int(match.group(1)) if match.group(1) else 1
        if count < 1:
            raise ValueError(f"{item.strip()!r} in {spec!r} asks for no GPU: the count must be at least 1")
        try:
            size = parse_size(match.group(2))
        except ValueError as error:
            raise ValueError(f"in GPU spec {spec!r}: {error}") from None
        if not MIN_SIMULATED_GPU_MEMORY <= size <= MAX_SIMULATED_GPU_MEMORY:
            raise ValueError(
                f"{item.strip()!r} in {spec!r}: a simulated GPU has between "
                f"{format_size(MIN_SIMULATED_GPU_MEMORY)} and {format_size(MAX_SIMULATED_GPU_MEMORY)}"
            )
        sizes.extend([size] * count)
        if len(sizes) > MAX_SIMULATED_GPUS:
            raise ValueError(f"{spec!r} asks for more than {MAX_SIMULATED_GPUS} simulated GPUs")
    return tuple(sizes)
