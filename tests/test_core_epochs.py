"""core.epochs: a job's length and validation by epochs, as DIGITS writes its solver (digits/model/tasks/
caffe_train.py: max_iter = epochs x ceil(items / (batch x iter_size)), test_iter = ceil(val items / val batch),
intervals in epochs rounded to at least 1 and at most max_iter)."""

from __future__ import annotations

import pytest

from digits_memplugin.core.epochs import DEFAULT_EPOCHS, EpochLength, iterations_per_epoch, validation_iterations


def test_the_sample_set_at_autos_batch_trains_630_iterations_in_30_epochs() -> None:
    """Issue 26, 2: 10,000 iterations at batch 1438 read the 1438-image sample set 10,000 times (~100 minutes)."""
    length = EpochLength(DEFAULT_EPOCHS, 1438, 71)
    assert (length.per_epoch, length.max_iter, length.interval()) == (21, 630, 21)
    assert length.to_dict() == {"epochs": 30, "train_items": 1438, "effective_batch": 71,
                                "iterations_per_epoch": 21, "max_iter": 630}


def test_an_update_reads_batch_size_times_iter_size_items() -> None:
    assert iterations_per_epoch(60000, 64) == 938  # MNIST at LeNet's 64: 937.5, a last short update
    assert iterations_per_epoch(60000, 86 * 3) == 233
    assert iterations_per_epoch(10, 64) == 1  # a batch larger than the set: one update an epoch


def test_one_validation_pass_reads_each_validation_item_once() -> None:
    """32 x 100 read the 359-image sample validation set nine times per test."""
    assert validation_iterations(359, 32) == 12
    assert validation_iterations(64, 32) == 2 and validation_iterations(1, 32) == 1


def test_intervals_are_rounded_as_digits_rounds_them() -> None:
    length = EpochLength(2, 1000, 10)  # 100 iterations an epoch, 200 in all
    assert length.interval(1) == 100 and length.interval(0.5) == 50
    assert length.interval(0.001) == 1  # never below one iteration
    assert length.interval(5) == 200  # past the end: once, at the end


@pytest.mark.parametrize(("epochs", "items", "batch"), [(0, 10, 1), (1, 0, 1), (1, 10, 0)])
def test_nothing_is_made_of_empty_figures(epochs: int, items: int, batch: int) -> None:
    with pytest.raises(ValueError):
        EpochLength(epochs, items, batch)
