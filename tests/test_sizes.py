"""Memory sizes: parsing what people write, formatting for people, and the --simulate-gpus spec."""

from __future__ import annotations

import pytest

from digits_memplugin.core.sizes import GIB, MIB, byte_count, format_size, parse_gpu_spec, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("24GiB", 24 * GIB),
        ("24 gib", 24 * GIB),
        ("512MiB", 512 * MIB),
        ("1.5GiB", 3 * GIB // 2),
        ("1TiB", 1024 * GIB),
        ("16GB", 16 * 10**9),
        ("100B", 100),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["24", "24G", "GiB", "-1GiB", "24 GiB of memory", ""])
def test_a_size_without_a_known_unit_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a memory size"):
        parse_size(text)


def test_a_size_of_hundreds_of_digits_is_refused_not_overflowed() -> None:
    """float() reads 400 nines as infinity, which int() cannot convert: an OverflowError no caller expected."""
    with pytest.raises(ValueError, match="not a memory size"):
        parse_size("9" * 400 + "GiB")


@pytest.mark.parametrize(("value", "size"), [(0, 0), (8 * GIB, 8 * GIB), ("8GiB", 8 * GIB), (" 512 MiB ", 512 * MIB)])
def test_byte_count_takes_bytes_or_a_size(value: object, size: int) -> None:
    assert byte_count(value) == size


@pytest.mark.parametrize(("value", "message"), [("8", "not a memory size"), ("lots", "not a memory size"),
                                                (1.5, "whole number of bytes"), (True, "whole number of bytes"),
                                                (None, "whole number of bytes"), ([8], "whole number of bytes")])
def test_byte_count_refuses_what_is_not_a_byte_count(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        byte_count(value)


@pytest.mark.parametrize(
    ("size", "text"),
    [(None, "n/a"), (0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (24 * GIB, "24.0 GiB"), (300 * MIB, "300.0 MiB")],
)
def test_format_size(size: int | None, text: str) -> None:
    assert format_size(size) == text


@pytest.mark.parametrize(
    ("spec", "sizes"),
    [
        ("2x24GiB", (24 * GIB, 24 * GIB)),
        ("24GiB,16GiB", (24 * GIB, 16 * GIB)),
        (" 2 x 24GiB , 80GiB ", (24 * GIB, 24 * GIB, 80 * GIB)),
        ("1X512MiB", (512 * MIB,)),
    ],
)
def test_parse_gpu_spec(spec: str, sizes: tuple[int, ...]) -> None:
    assert parse_gpu_spec(spec) == sizes


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty"),
        ("2x", "not a memory size"),
        ("0x24GiB", "at least 1"),
        ("24GiB,", "not '<count>x<size>'"),
        ("1MiB", "between 256.0 MiB and 16.0 TiB"),
        ("65x1GiB", "more than 64"),
        ("two GPUs", "not a memory size"),
    ],
)
def test_bad_gpu_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_gpu_spec(spec)
