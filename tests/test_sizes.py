"""Memory sizes: parsing what people write, formatting for people, and the --simulate-gpus spec."""

from __future__ import annotations

import pytest

from digits_memplugin.sizes import GIB, MIB, format_size, parse_gpu_spec, parse_size


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
