"""Typed checks of untrusted values: a request's fields, a form's, a setting. Each check takes the field's name and
the value, returns the value it accepts (typed), and raises `FieldErrors` naming the field with what it must be, so
that the REST API, the pages and the settings refuse the same things, with one set of bounds.

Python's True is 1 and its False 0: no check here takes a bool for a number. `Refusals` runs several checks and
keeps every refusal (the API answers 400 with all of them at once, at most `inputs.MAX_LISTED`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import Any, NoReturn, TypeGuard

from .errors import FieldErrors
from .inputs import listed, type_name

INT32_MAX = 2**31 - 1
"""Caffe's batch sizes, dimensions, max_iter and class counts are 32-bit; larger values are refused with the field
named, before they reach a prototxt or the database (SQLite's integers are 64-bit)."""
MAX_DIMS = 8
"""Dimensions of an item shape (a blob has at most 32 axes; no data layer's item has more than a few)."""
SHAPE = f"must be a list of 1 to {MAX_DIMS} positive integers up to {INT32_MAX}"


def refuse(field: str, message: Any) -> NoReturn:
    """Raise the one-field refusal."""
    raise FieldErrors.one(field, message)


def is_whole(value: object) -> TypeGuard[int]:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: object) -> TypeGuard[int | float]:
    """An int or a float that is not a bool (finite or not)."""
    return isinstance(value, float) or is_whole(value)


def _within(value: Any, low: Any, high: Any) -> bool:
    return (low is None or value >= low) and (high is None or value <= high)


def _bounds(low: Any, high: Any) -> str:
    if low is not None and high is not None:
        return f" from {low} to {high}"
    return f" of at least {low}" if low is not None else f" up to {high}" if high is not None else ""


def integer(field: str, value: Any, *, low: int | None = None, high: int | None = None, must: str | None = None) -> int:
    """A whole number within [low, high] (either bound left out: none that side)."""
    if not is_whole(value) or not _within(value, low, high):
        refuse(field, must or f"must be a whole number{_bounds(low, high)}")
    return int(value)


def number(
    field: str, value: Any, *, low: float | None = None, high: float | None = None, above: float | None = None,
    below: float | None = None, must: str | None = None,
) -> float:
    """A finite number (an int or a float) within [low, high] and (above, below), as a float."""
    try:
        real = float(value) if is_real(value) else math.nan
    except OverflowError:  # an int past what a float holds
        real = math.inf
    if (
        not math.isfinite(real) or not _within(real, low, high)
        or (above is not None and real <= above) or (below is not None and real >= below)
    ):
        refuse(field, must or f"must be a number{_bounds(low, high)}")
    return real


def boolean(field: str, value: Any, *, must: str = "must be true or false") -> bool:
    """True or False, not a number or a word that reads like one."""
    if not isinstance(value, bool):
        refuse(field, must)
    return value


def choice(field: str, value: Any, options: Collection[Any], *, must: str | None = None) -> Any:
    """One of `options` (compared as equal: the options are words, or None), as given."""
    if value not in tuple(options):
        refuse(field, must or f"must be one of {', '.join(map(repr, options))}")
    return value


def string(
    field: str, value: Any, *, nonblank: bool = False, max_length: int | None = None, must: str | None = None
) -> str:
    """Text, optionally not blank (not only spaces) and of at most `max_length` characters."""
    if (
        not isinstance(value, str) or (nonblank and not value.strip())
        or (max_length is not None and len(value) > max_length)
    ):
        refuse(field, must or ("must be text" + (" that is not blank" if nonblank else "")
                               + (f" of at most {max_length} characters" if max_length is not None else "")))
    return value


def of_type(field: str, value: Any, kind: type | tuple[type, ...]) -> Any:
    """A value of JSON's type `kind` (bool is not int): "must be int, got str"."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        refuse(field, f"must be {' or '.join(k.__name__ for k in kinds)}, got {type_name(value)}")
    return value


def shape(field: str, value: Any, *, must: str = SHAPE) -> tuple[int, ...]:
    """An item shape: a list of 1 to MAX_DIMS dimensions, each from 1 to INT32_MAX."""
    if (
        not isinstance(value, list) or not 0 < len(value) <= MAX_DIMS
        or not all(is_whole(d) and 0 < d <= INT32_MAX for d in value)
    ):
        refuse(field, must)
    return tuple(value)


def shapes(field: str, value: Any, *, must: str = "must map data tops to item shapes") -> dict[str, tuple[int, ...]]:
    """`data_shapes`, the one check of it: a mapping of data tops (or `layer/top`, or `*`) to item shapes; each
    entry that is not a shape is refused as `<field>.<top>`."""
    if not isinstance(value, Mapping):
        refuse(field, must)
    parsed: dict[str, tuple[int, ...]] = {}
    wrong: dict[str, str] = {}
    for top, item in value.items():
        try:
            parsed[str(top)] = shape(f"{field}.{top}", item)
        except FieldErrors as refused:
            wrong.update(refused.errors)
    if wrong:
        raise FieldErrors(wrong)
    return parsed


class Refusals:
    """Fields checked one after the other, every refusal kept in `errors`, the answer's {field: message}. A check
    that refuses entry by entry (`shapes`: `<field>.<top>`) has its entries listed within `inputs.MAX_LISTED`: a
    request of 300 000 bad entries is not answered with 300 000 messages."""

    def __init__(self) -> None:
        self.errors: dict[str, Any] = {}

    def take(
        self, values: dict[str, Any], field: str, check: Callable[..., Any], value: Any, *, many: str | None = None,
        **options: Any,
    ) -> None:
        """`values[field]` is the checked value, or the check's refusal is kept; `many` says what the field's
        entries are, for the count of those left out of a long list."""
        try:
            values[field] = check(field, value, **options)
        except FieldErrors as refused:
            if many is None or field in refused.errors:
                self.errors.update(refused.errors)
            else:
                listed(self.errors, refused.errors.items(), many)
