"""Non-finite numbers (NaN, infinity) in the JSON documents this package writes: the runner's records, the jobs
database, the REST API and the socketio events.

JSON has no NaN and no infinity. Python's json writes the bare tokens `NaN` and `Infinity`, which browsers'
`JSON.parse`, jq and every strict client refuse; with `allow_nan=False` it raises instead, and a diverging loss
then ended the training child with a traceback. Here a non-finite number is written as one of three strings,
"NaN", "Infinity" and "-Infinity", as the Protocol Buffers JSON mapping writes float fields, and as JavaScript's
`Number()` reads them back. A field that holds a number may hold one of these strings instead (the OpenAPI
document says which: `ReportedNumber`).

`dumps` writes a document, `loads` reads one (the bare tokens another writer may have left are read as the
strings, so a document read here holds only JSON values), and `number` reads a number out of one. Standard
library only: the training child, the core and the web layer all use it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

NAN: Final = "NaN"
INFINITY: Final = "Infinity"
NEGATIVE_INFINITY: Final = "-Infinity"
NON_FINITE: Final = frozenset({NAN, INFINITY, NEGATIVE_INFINITY})
"""The strings a document holds in place of a number that is not finite."""


def name(value: float) -> str:
    """The string a non-finite float is written as; ValueError for a finite one."""
    if math.isnan(value):
        return NAN
    if math.isinf(value):
        return INFINITY if value > 0 else NEGATIVE_INFINITY
    raise ValueError(f"{value!r} is finite")


def encode(value: Any) -> Any:
    """`value` with every non-finite float (in dicts, lists and tuples, at any depth) replaced by its string; the
    rest as it is. Values that hold no such float are returned unchanged, not copied."""
    if isinstance(value, float):
        return value if math.isfinite(value) else name(value)
    if isinstance(value, Mapping):
        items = {key: encode(item) for key, item in value.items()}
        return value if all(items[key] is value[key] for key in items) else items
    if isinstance(value, (list, tuple)):
        encoded = [encode(item) for item in value]
        return value if all(new is old for new, old in zip(encoded, value)) else encoded
    return value


def dumps(value: Any, *, default: Callable[[Any], Any] | None = None, **options: Any) -> str:
    """Strict JSON of `value`, non-finite numbers written as their strings. `default` converts what json cannot
    (numpy scalars); what it returns is encoded too."""
    convert = None if default is None else (lambda item: encode(default(item)))
    return json.dumps(encode(value), allow_nan=False, default=convert, **options)


def loads(text: str | bytes) -> Any:
    """A JSON document, with the bare `NaN`, `Infinity` and `-Infinity` tokens (Python's json writes them) read
    as the strings this module writes: what is read can be written again as strict JSON."""
    return json.loads(text, parse_constant=str)


def number(value: Any) -> float | None:
    """A number read from a document: an int or float as a float, one of the three strings as NaN or an
    infinity; None for anything else (null, text, a bool)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value in NON_FINITE:
        return float(value)
    return None


def is_non_finite(value: Any) -> bool:
    """Whether a document's value is a number that is not finite (a float, or one of the three strings)."""
    read = number(value)
    return read is not None and not math.isfinite(read)


def text(value: Any, spec: str = ".6g", missing: str = "n/a") -> str:
    """A document's number for people: formatted with `spec`, "NaN" / "Infinity" / "-Infinity" as written,
    `missing` for anything that is not a number."""
    read = number(value)
    if read is None:
        return missing
    return format(read, spec) if math.isfinite(read) else name(read)


__all__ = [
    "INFINITY", "NAN", "NEGATIVE_INFINITY", "NON_FINITE", "dumps", "encode", "is_non_finite", "loads", "name",
    "number", "text",
]
