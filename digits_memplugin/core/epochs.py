"""A training's length and validation by epochs, as DIGITS writes its solver (digits/model/tasks/caffe_train.py,
save_prototxt_files): its form asks for training epochs (30 by default) and a validation interval in epochs (1),
and computes

    iterations per epoch = ceil(training items / (batch_size x iter_size))
    max_iter             = epochs x iterations per epoch
    test_interval        = one epoch's iterations (at least 1, at most max_iter)
    test_iter            = ceil(validation items / the validation batch): one pass over the validation set

so that a job's length follows its dataset and its batch rather than a fixed 10,000 iterations (which at a batch
of the whole 1438-image sample set read it 10,000 times), and a validation pass reads each validation item once
(32 x 100 read the 359-image sample validation set nine times). Pure arithmetic: the job manager resolves a job's
length with it once its batch is planned, the New model page shows it.
"""

from __future__ import annotations

import dataclasses
import math

DEFAULT_EPOCHS = 30
"""DIGITS' default number of training epochs (digits/model/forms.py: train_epochs)."""
EVERY_EPOCH = "epoch"
"""A validation interval of one epoch, DIGITS' default (val_interval = 1 epoch)."""
ONE_PASS = "pass"
"""Validation iterations that read the validation set once (DIGITS' test_iter)."""
MAX_ITER = 2**31 - 1
"""Caffe counts iterations in int32 fields of caffe.proto (SolverParameter.max_iter)."""


def iterations_per_epoch(train_items: int, effective_batch: int) -> int:
    """Weight updates that read the training set once: each update reads batch_size x iter_size items."""
    if train_items <= 0 or effective_batch <= 0:
        raise ValueError(f"training items and batch must be positive, got {train_items} and {effective_batch}")
    return math.ceil(train_items / effective_batch)


def validation_iterations(validation_items: int, test_batch: int) -> int:
    """Forward passes of the validation net that read its set once: ceil(items / batch)."""
    if validation_items <= 0 or test_batch <= 0:
        raise ValueError(f"validation items and batch must be positive, got {validation_items} and {test_batch}")
    return math.ceil(validation_items / test_batch)


@dataclasses.dataclass(frozen=True)
class EpochLength:
    """A training of `epochs` passes over `train_items` items, `effective_batch` items per update."""

    epochs: int
    train_items: int
    effective_batch: int

    def __post_init__(self) -> None:
        if self.epochs <= 0:
            raise ValueError(f"epochs must be positive, got {self.epochs}")
        iterations_per_epoch(self.train_items, self.effective_batch)  # checks them

    @property
    def per_epoch(self) -> int:
        return iterations_per_epoch(self.train_items, self.effective_batch)

    @property
    def max_iter(self) -> int:
        return self.epochs * self.per_epoch

    def check_countable(self) -> None:
        """ValueError when these epochs take more iterations than Caffe can count (`MAX_ITER`): a length a solver
        cannot hold must be refused when it is asked, not found out when the solver is written."""
        if self.max_iter > MAX_ITER:
            raise ValueError(
                f"{self.epochs} epochs of {self.per_epoch} iterations (train_items {self.train_items} at "
                f"{self.effective_batch} items per update) are {self.max_iter} iterations, more than the {MAX_ITER} "
                "Caffe can count; ask fewer epochs or a larger batch"
            )

    def interval(self, epochs: float = 1.0) -> int:
        """Iterations between two events every `epochs` epochs, rounded as DIGITS rounds its validation and
        snapshot intervals: at least 1, and max_iter when that is past the end (once, at the end)."""
        value = epochs * self.per_epoch
        if 0 < value <= 1:
            return 1
        if 1 < value < self.max_iter:
            return int(value)
        return self.max_iter

    def to_dict(self) -> dict[str, int]:
        return {
            "epochs": self.epochs, "train_items": self.train_items, "effective_batch": self.effective_batch,
            "iterations_per_epoch": self.per_epoch, "max_iter": self.max_iter,
        }
