"""A diverging training: a net output that is NaN or infinite in a runner's record, and what a job does about it.

With too high a learning rate (LeNet at base_lr 50) the loss overflows within a few iterations and stays NaN:
Caffe itself trains on, printing `loss = nan`; DIGITS stopped the job with "Network outputted NaN for "loss"
(Train phase). Try decreasing your learning rate." (digits/model/tasks/caffe_train.py). A job here does the
same by default (`STOP`), or trains to the end if its submission asked for `CONTINUE`.

The records are the runner's (jobs.child.runner, or any runner that writes the same records): `iteration` records are
the Train phase, `test` records the Test phase; an output is a number, a short list, or {"mean", "count"}, and a
non-finite number is a float or one of core.nonfinite's strings. `find` says whether a record shows divergence;
`DivergenceWatch` follows an attempt's records and says when to stop it; core.oom.classify turns it into the
attempt's outcome. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Final, Literal

from .nonfinite import name, number

STOP: Final = "stop"
"""End the attempt at the first non-finite output, with DIGITS' advice (the default)."""
CONTINUE: Final = "continue"
"""Train on to max_iter, as Caffe itself does; the job's message says when the outputs stopped being finite."""
POLICIES: Final = (STOP, CONTINUE)
DEFAULT_POLICY: Final = STOP
ADVICE: Final = "Try decreasing your learning rate."
"""DIGITS' words."""

Phase = Literal["Train", "Test"]
PHASES: Final[Mapping[str, Phase]] = {"iteration": "Train", "test": "Test"}
"""Record events that carry net outputs, and the phase Caffe's log names them by ("Train net output #0")."""


@dataclasses.dataclass(frozen=True)
class Divergence:
    """The first non-finite output of an attempt."""

    phase: Phase
    output: str
    """The output's name ("loss", "accuracy"), or "loss" for the weighted loss when no single output says it."""
    value: str
    """"NaN", "Infinity" or "-Infinity" (core.nonfinite's strings)."""
    iteration: int | None
    """The record's iteration: updates done when the output was computed."""
    net: int | None = None
    """The test net (Test phase)."""

    @property
    def digits_message(self) -> str:
        """DIGITS' sentence: 'Network outputted NaN for "loss" (Train phase). Try decreasing your learning rate.'"""
        where = f"{self.phase} phase" + (f", test net {self.net}" if self.phase == "Test" and self.net else "")
        return f'Network outputted {self.value} for "{self.output}" ({where}). {ADVICE}'

    @property
    def stopped_message(self) -> str:
        """Why an attempt stopped for it (the attempt's and the job's message)."""
        at = f" at iteration {self.iteration}" if self.iteration is not None else ""
        return f"{self.digits_message} Training stopped{at}, where it first did."

    @property
    def trained_on_note(self) -> str:
        """What a job that trained on regardless adds to its message."""
        since = f" from iteration {self.iteration} on" if self.iteration is not None else ""
        return f'the network outputted {self.value} for "{self.output}" ({self.phase} phase){since}'

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Divergence:
        """The divergence `to_dict` wrote (a node's result); KeyError/ValueError when it is not one."""
        phase = data["phase"]
        if phase not in PHASES.values():
            raise ValueError(f"phase must be Train or Test, not {phase!r}")
        return cls(phase, str(data["output"]), str(data["value"]), data.get("iteration"), data.get("net"))


def _non_finite_in(value: Any) -> str | None:
    """The string of the first non-finite number in an output's value (a number, a list, {"mean", "count"})."""
    if isinstance(value, Mapping):
        return _non_finite_in(value.get("mean"))
    if isinstance(value, (list, tuple)):
        return next((found for item in value if (found := _non_finite_in(item)) is not None), None)
    read = number(value)
    return None if read is None or math.isfinite(read) else name(read)


def find(record: Mapping[str, Any]) -> Divergence | None:
    """The first non-finite output of an iteration or test record (outputs in the net's order, then the weighted
    loss); None for other records and for finite ones."""
    phase = PHASES.get(str(record.get("event")))
    if phase is None:
        return None
    iteration = record.get("iteration") if isinstance(record.get("iteration"), int) else None
    net = record.get("net") if phase == "Test" and isinstance(record.get("net"), int) else None
    outputs = record.get("outputs")
    candidates = list(outputs.items()) if isinstance(outputs, Mapping) else []
    candidates.append(("loss", record.get("loss")))
    for output, value in candidates:
        found = _non_finite_in(value)
        if found is not None:
            return Divergence(phase, str(output), found, iteration, net)
    return None


class DivergenceWatch:
    """An attempt's records as they come: `see` each one; it answers True once, for the record at which an attempt
    under STOP must end. `first` is the first divergence seen, whatever the policy."""

    def __init__(self, policy: str = DEFAULT_POLICY) -> None:
        if policy not in POLICIES:
            raise ValueError(f"divergence policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        self.policy = policy
        self.first: Divergence | None = None

    @property
    def trains_on(self) -> bool:
        return self.policy == CONTINUE

    def see(self, record: Mapping[str, Any]) -> bool:
        if self.first is not None:
            return False
        self.first = find(record)
        return self.first is not None and not self.trains_on


__all__ = [
    "ADVICE", "CONTINUE", "DEFAULT_POLICY", "POLICIES", "STOP", "Divergence", "DivergenceWatch", "Phase", "find",
]
