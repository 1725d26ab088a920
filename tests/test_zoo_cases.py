"""Where the tests find the shared zoo: $DIGITS_MEMPLUGIN_ZOO, else ../shared/zoo beside the checkout, nowhere else."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO
from zoo_cases import BESIDE_THE_CHECKOUT, ZOO, ZOO_VARIABLE, find_zoo


def a_zoo(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "SOURCES.tsv").write_text("net\tsource\tlicense\n")
    return folder


def test_the_zoo_beside_the_checkout_is_relative_to_the_repository() -> None:
    assert REPO.parent / "shared" / "zoo" == BESIDE_THE_CHECKOUT
    assert (ZOO / "SOURCES.tsv").is_file()


def test_the_variable_names_the_zoo(tmp_path: Path) -> None:
    named = a_zoo(tmp_path / "elsewhere")
    assert find_zoo({ZOO_VARIABLE: str(named)}, beside=a_zoo(tmp_path / "beside")) == named


def test_without_the_variable_the_zoo_beside_the_checkout_is_used(tmp_path: Path) -> None:
    beside = a_zoo(tmp_path / "shared" / "zoo")
    assert find_zoo({}, beside=beside) == beside
    assert find_zoo({ZOO_VARIABLE: ""}, beside=beside) == beside  # set but empty: as if unset


def test_a_variable_naming_no_zoo_is_an_error_not_a_fallback(tmp_path: Path) -> None:
    missing = tmp_path / "no-zoo"
    with pytest.raises(FileNotFoundError) as caught:
        find_zoo({ZOO_VARIABLE: str(missing)}, beside=a_zoo(tmp_path / "beside"))
    assert f"${ZOO_VARIABLE} names {missing}, which holds no SOURCES.tsv" in str(caught.value)


def test_no_zoo_anywhere_says_where_it_looked_and_how_to_fix_it(tmp_path: Path) -> None:
    beside = tmp_path / "shared" / "zoo"
    beside.mkdir(parents=True)  # a folder without the zoo's SOURCES.tsv is not the zoo
    with pytest.raises(FileNotFoundError) as caught:
        find_zoo({}, beside=beside)
    message = str(caught.value)
    assert f"{beside} (../shared/zoo beside the checkout) holds no SOURCES.tsv" in message
    assert f"${ZOO_VARIABLE} is not set" in message and f"set ${ZOO_VARIABLE} to its folder" in message
