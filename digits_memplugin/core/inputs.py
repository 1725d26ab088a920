"""What a client sends, made safe to look at before any field is checked: JSON whose integers Python cannot read,
text that UTF-8 cannot carry, numbers written with other digits than 0-9, and error lists as long as the request.

Python refuses to turn more than 4300 digits into an int (a guard against quadratic conversion), so `json.loads`
fails on the whole document: the field it was in could not be named. Here such a number reads as a `LongNumber`,
which no field takes, so the field's own check names it. A lone surrogate ("\\ud800", which JSON may escape) is a
str that cannot be written to a file, SQLite or a socket: `surrogate_in` finds one and says where. `int()` reads
"١٢٣" and " 12 " and "1_000"; `ascii_int` reads only 0-9, at most `max_digits` of them. And a request of 300 000
unknown keys must not be answered with 300 000 messages: `capped` lists at most MAX_LISTED and says how many more.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

MAX_DIGITS = 100
"""Integers in JSON with more digits than this read as a LongNumber (2**63 has 19; no field takes more than 20)."""
MAX_LISTED = 20
"""Field errors listed at most in one answer; the rest are counted."""
MAX_NAME = 80
"""Characters of a field's name shown in an error; a longer name is cut, saying so."""
MORE = "..."
"""The key under which a capped error list says how many were left out."""
_ASCII_INT = re.compile(r"[+-]?[0-9]+")


class LongNumber:
    """An integer of more than MAX_DIGITS digits in a JSON document: kept as its digit count, never converted."""

    __slots__ = ("digits",)

    def __init__(self, text: str) -> None:
        self.digits = len(text.lstrip("+-"))

    def __repr__(self) -> str:
        return f"<a number of {self.digits} digits>"

    __str__ = __repr__


def _parse_int(text: str) -> int | LongNumber:
    return LongNumber(text) if len(text.lstrip("-")) > MAX_DIGITS else int(text)


def loads(data: str | bytes) -> Any:
    """`json.loads`, with integers of more than MAX_DIGITS digits read as LongNumber instead of failing the whole
    document. Raises ValueError (json.JSONDecodeError) for what is not JSON, RecursionError for deep nesting."""
    return json.loads(data, parse_int=_parse_int)


def type_name(value: Any) -> str:
    """What a value is, in an error message ("int", "str"; "a number of 5000 digits")."""
    return repr(value) if isinstance(value, LongNumber) else type(value).__name__


def surrogate_in(value: Any, depth: int = 0) -> str | None:
    """Where in `value` (text, or lists and objects of it, keys included) a lone surrogate is, said for an error
    message; None when there is none. Such a character is in no UTF-8 text, so nothing can store or send it."""
    if isinstance(value, str):
        try:  # at C speed: a 2.7 MiB text checked character by character held the server's thread 0.2-0.6 s
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            return f"a lone surrogate (\\u{ord(value[error.start]):04x}) at character {error.start}"
        return None
    if depth > 200:  # JSON is at most about 1000 deep; below this the strings are what matters
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = surrogate_in(key, depth + 1)
            if found is not None:
                return f"{found} of the key {shown(key)}"
            found = surrogate_in(item, depth + 1)
            if found is not None:
                return f"{found} under {shown(key)}"
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = surrogate_in(item, depth + 1)
            if found is not None:
                return f"{found} in item {index}"
    return None


def not_text(where: str) -> str:
    """The message for a field holding a lone surrogate."""
    return f"holds {where}, which is not text (no UTF-8 can carry it): send valid Unicode"


def shown(name: Any) -> str:
    """A field's name as an error shows it: at most MAX_NAME characters, a lone surrogate written as \\udXXX."""
    text = str(name)
    if len(text) > MAX_NAME:
        text = f"{text[:MAX_NAME]}... ({len(text)} characters)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def ascii_int(text: str, max_digits: int = 18) -> int | None:
    """`text` as an int when it is written with the digits 0-9 only (a sign and surrounding spaces allowed), with at
    most `max_digits` of them; None otherwise ("²", "١٢٣", "1_000", 5000 digits)."""
    text = text.strip()
    if not _ASCII_INT.fullmatch(text) or len(text.lstrip("+-")) > max_digits:
        return None
    return int(text)


def capped(errors: dict[str, Any], names: Iterable[Any], message: str, what: str = "unknown fields") -> None:
    """Add `message` to `errors` for each of `names`, at most MAX_LISTED in all (counting what `errors` has), each
    name cut to MAX_NAME characters; the rest are counted under the key MORE."""
    listed(errors, ((name, message) for name in names), what)


def listed(errors: dict[str, Any], entries: Iterable[tuple[Any, Any]], what: str) -> None:
    """`capped` for (name, message) entries, each with its own message."""
    left_out = 0
    for name, message in entries:
        if len(errors) >= MAX_LISTED:
            left_out += 1
        else:
            errors[shown(name)] = message
    if left_out:
        errors[MORE] = f"and {left_out} more {what}, not listed"
