"""Caffe's learning-rate policies (SGDSolver::GetLearningRate), so the runner can report the rate of each iteration.

pycaffe does not expose the rate, and the job runner drives the solver one step at a time, so it computes the rate
itself from the solver's fields. The formulas are Caffe's, in the same order of operations; the tests hold them to
the "Iteration N, lr = X" lines Caffe logs.

Changing batch_size and iter_size between attempts leaves the schedule valid: it depends on the iteration (the
number of weight updates) only, and a fallback keeps the effective batch per update.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from .errors import NetError

POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")


@dataclasses.dataclass(frozen=True)
class LearningRate:
    """The fields of a SolverParameter the rate depends on."""

    policy: str = "fixed"
    base_lr: float = 0.0
    gamma: float = 0.0
    power: float = 0.0
    stepsize: int = 0
    stepvalues: tuple[int, ...] = ()
    max_iter: int = 0

    @classmethod
    def from_solver(cls, solver: Any, source: str = "solver.prototxt") -> LearningRate:
        """Read a caffe_pb2.SolverParameter; a policy Caffe would abort on (or divide by zero in) is a NetError."""
        schedule = cls(
            policy=solver.lr_policy,
            base_lr=float(solver.base_lr),
            gamma=float(solver.gamma),
            power=float(solver.power),
            stepsize=int(solver.stepsize),
            stepvalues=tuple(int(value) for value in solver.stepvalue),
            max_iter=int(solver.max_iter),
        )
        schedule.check(source)
        return schedule

    def check(self, source: str = "solver.prototxt") -> None:
        if self.policy not in POLICIES:
            raise NetError(
                f"unknown learning rate policy {self.policy!r} (Caffe knows {', '.join(POLICIES)})",
                source=source,
                field="lr_policy",
            )
        if self.policy == "step" and self.stepsize <= 0:
            raise NetError("the step policy needs a positive stepsize", source=source, field="stepsize")
        if self.policy == "poly" and self.max_iter <= 0:
            raise NetError("the poly policy needs a positive max_iter", source=source, field="max_iter")

    def current_step(self, iteration: int) -> int:
        """Solver::current_step_ when `iteration` is being run (step and multistep policies; 0 otherwise).

        Multistep advances at most one step per iteration (it checks one stepvalue per call), so repeated or
        unsorted stepvalues are passed one iteration at a time, as Caffe passes them.
        """
        if self.policy == "step":
            return iteration // self.stepsize
        if self.policy != "multistep":
            return 0
        step, reached = 0, -1
        for value in self.stepvalues:
            reached = max(value, reached + 1)
            if reached > iteration:
                break
            step += 1
        return step

    def rate(self, iteration: int) -> float:
        """The learning rate of the update made at `iteration` (Solver::iter_ before it is incremented)."""
        if iteration < 0:
            raise ValueError(f"iteration must be >= 0, got {iteration}")
        if self.policy == "fixed":
            return self.base_lr
        if self.policy in ("step", "multistep"):
            return self.base_lr * math.pow(self.gamma, self.current_step(iteration))
        if self.policy == "exp":
            return self.base_lr * math.pow(self.gamma, iteration)
        if self.policy == "inv":
            return self.base_lr * math.pow(1.0 + self.gamma * iteration, -self.power)
        if self.policy == "poly":
            return self.base_lr * math.pow(1.0 - iteration / self.max_iter, self.power)
        if self.policy == "sigmoid":
            return self.base_lr * (1.0 / (1.0 + math.exp(-self.gamma * (iteration - self.stepsize))))
        self.check()
        raise AssertionError("unreachable")  # pragma: no cover - check() raised

    def to_dict(self) -> dict[str, Any]:
        document = dataclasses.asdict(self)
        document["stepvalues"] = list(self.stepvalues)
        return document
