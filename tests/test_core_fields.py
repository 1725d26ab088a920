"""core/fields.py: each check of untrusted values accepts what it should, refuses the rest with the field named,
and never takes a bool for a number; FieldErrors is the one field-errors exception."""

from __future__ import annotations

import math
from typing import Any

import pytest

from digits_memplugin.core import fields
from digits_memplugin.core.errors import FieldErrors, MemPluginError
from digits_memplugin.core.inputs import MAX_LISTED, MORE
from digits_memplugin.jobs.errors import InvalidDefinition, JobError, JobValidationError

INT32_MAX = 2**31 - 1


def refused(check: Any, value: Any, **options: Any) -> FieldErrors:
    with pytest.raises(FieldErrors) as raised:
        check("the_field", value, **options)
    return raised.value


def test_field_errors_carry_fields_and_messages() -> None:
    error = FieldErrors({"batch": "must be a positive integer", "classes": "too many"})
    assert error.errors == {"batch": "must be a positive integer", "classes": "too many"}
    assert str(error) == "batch: must be a positive integer; classes: too many"
    assert isinstance(error, ValueError) and isinstance(error, MemPluginError)
    one = FieldErrors.one("device", "no such device")
    assert (one.field, one.message, one.errors) == ("device", "no such device", {"device": "no such device"})


def test_job_validation_errors_are_field_errors_and_job_errors() -> None:
    error = JobValidationError({"queue": "full"})
    assert isinstance(error, FieldErrors) and isinstance(error, JobError)
    assert str(error) == "queue: full" and error.field == "queue"
    from digits_memplugin.core.errors import NetError

    definition = InvalidDefinition("net", NetError("bad", field="top"))
    assert definition.field == "net" and definition.errors["net"]["detail"] == "bad"


@pytest.mark.parametrize(
    ("value", "options", "expected"),
    [(1, {}, 1), (0, {"low": 0}, 0), (19, {"low": 0, "high": 19}, 19), (INT32_MAX, {"high": INT32_MAX}, INT32_MAX),
     (-5, {}, -5)],
)
def test_integer_accepts_whole_numbers_in_bounds(value: int, options: dict[str, Any], expected: int) -> None:
    assert fields.integer("n", value, **options) == expected


@pytest.mark.parametrize(
    ("value", "options"),
    [(True, {}), (False, {"low": 0}), (1.0, {}), ("1", {}), (None, {}), (0, {"low": 1}), (20, {"high": 19}),
     (INT32_MAX + 1, {"high": INT32_MAX}), ([1], {})],
)
def test_integer_refuses_bools_other_types_and_values_out_of_bounds(value: Any, options: dict[str, Any]) -> None:
    error = refused(fields.integer, value, **options)
    assert error.field == "the_field" and "whole number" in error.message


def test_integer_says_its_bounds_or_the_callers_words() -> None:
    assert refused(fields.integer, 0, low=1, high=9).message == "must be a whole number from 1 to 9"
    assert refused(fields.integer, 0, low=1).message == "must be a whole number of at least 1"
    assert refused(fields.integer, 0, low=1, must="give a count").message == "give a count"


@pytest.mark.parametrize(
    ("value", "options", "expected"),
    [(1, {}, 1.0), (0.5, {"low": 0, "below": 1}, 0.5), (0, {"low": 0}, 0.0), (3600, {"low": 1, "high": 3600}, 3600.0),
     (1e-9, {"above": 0}, 1e-9)],
)
def test_number_accepts_finite_numbers_in_bounds(value: Any, options: dict[str, Any], expected: float) -> None:
    result = fields.number("x", value, **options)
    assert result == expected and isinstance(result, float)


@pytest.mark.parametrize(
    ("value", "options"),
    [(True, {}), ("1", {}), (None, {}), (math.nan, {}), (math.inf, {}), (-math.inf, {"high": 0}), (10**400, {}),
     (1, {"low": 0, "below": 1}), (0, {"above": 0}), (0.5, {"low": 1}), (3601, {"high": 3600})],
)
def test_number_refuses_bools_non_finite_values_and_values_out_of_bounds(value: Any, options: dict[str, Any]) -> None:
    assert refused(fields.number, value, **options).field == "the_field"


def test_boolean() -> None:
    assert fields.boolean("b", True) is True and fields.boolean("b", False) is False
    for value in (1, 0, "true", None):
        assert refused(fields.boolean, value).errors == {"the_field": "must be true or false"}


def test_choice() -> None:
    assert fields.choice("c", "gpu", ("gpu", "gpu-cudnn")) == "gpu"
    assert fields.choice("c", None, (None, "gpu")) is None
    for value in ("cpu", None, ["gpu"], {"gpu": 1}):
        assert refused(fields.choice, value, options=("gpu", "gpu-cudnn")).message == "must be one of 'gpu', 'gpu-cudnn'"


def test_string() -> None:
    assert fields.string("s", " x ") == " x " and fields.string("s", "") == ""
    assert fields.string("s", "ab", max_length=2, nonblank=True) == "ab"
    for value, options in ((1, {}), (None, {}), ("  ", {"nonblank": True}), ("abc", {"max_length": 2})):
        assert refused(fields.string, value, **options).field == "the_field"


def test_of_type_never_takes_a_bool_for_a_number() -> None:
    assert fields.of_type("t", 3, int) == 3 and fields.of_type("t", True, bool) is True
    assert fields.of_type("t", "8GiB", (int, str)) == "8GiB"
    assert refused(fields.of_type, True, kind=int).message == "must be int, got bool"
    assert refused(fields.of_type, 1.5, kind=(list, str)).message == "must be list or str, got float"


def test_shape_takes_1_to_8_dimensions_each_from_1_to_int32_max() -> None:
    assert fields.shape("s", [3, 224, 224]) == (3, 224, 224)
    assert fields.shape("s", [INT32_MAX] * 8) == (INT32_MAX,) * 8
    for value in ([], [1] * 9, [0], [-1], [INT32_MAX + 1], [True], [1.0], "1,28,28", (1, 28, 28), None):
        assert refused(fields.shape, value).errors == {"the_field": fields.SHAPE}


def test_shapes_names_each_entry_that_is_not_a_shape() -> None:
    assert fields.shapes("data_shapes", {"data": [1, 28, 28], "*": [3]}) == {"data": (1, 28, 28), "*": (3,)}
    assert refused(fields.shapes, [1, 2]).errors == {"the_field": "must map data tops to item shapes"}
    error = refused(fields.shapes, {"data": [1, 28, 28], "a": [0], "b": [INT32_MAX + 1]})
    assert error.errors == {"the_field.a": fields.SHAPE, "the_field.b": fields.SHAPE}


def test_refusals_keep_every_refusal_and_cap_a_long_list_of_entries() -> None:
    refusals = fields.Refusals()
    values: dict[str, Any] = {}
    refusals.take(values, "batch", fields.integer, 4, low=1)
    refusals.take(values, "classes", fields.integer, 0, low=1)
    assert values == {"batch": 4} and set(refusals.errors) == {"classes"}
    many = {f"top{index}": [0] for index in range(100)}
    refusals.take(values, "data_shapes", fields.shapes, many, many="data_shapes entries that are not shapes")
    assert len(refusals.errors) == MAX_LISTED + 1 and "data_shapes" not in values
    assert refusals.errors[MORE] == f"and {100 - MAX_LISTED + 1} more data_shapes entries that are not shapes, not listed"
    refusals.take(values, "device", fields.integer, -1, low=0)  # a field's own refusal is never left out
    assert "device" in refusals.errors
