"""jobs.attempts.plan_attempt, the one place a job's attempt is planned (the scheduler's plan included): driven with
a linear footprint and plain values. The attempt loop itself runs real jobs in test_jobs_manager.py."""

from __future__ import annotations

from typing import Any

from digits_memplugin.core.fallback import Decision
from digits_memplugin.core.layers.base import ENGINE_CPU, ENGINE_CUDNN
from digits_memplugin.jobs.attempts import plan_attempt
from digits_memplugin.sizes import GIB, MIB


def footprint(batch: int, test_batch: int | None) -> int:
    return 100 * MIB + batch * MIB


def plan(**given: Any) -> Decision:
    values: dict[str, Any] = {
        "engine": ENGINE_CPU, "limit_bytes": GIB, "requested_batch": "auto", "fallback": {}, "effective_batch": None,
        "iteration": 0, "net_batch": 64, "test_batch": None, "test_iter": 1, "cpu_safety_margin": 0.5,
        "gpu_safety_margin": 0.25, "max_attempts": 3,
    }
    return plan_attempt(footprint, **{**values, **given})


def batch(decision: Decision) -> tuple[int, int]:
    assert decision.plan is not None, decision.message
    return decision.plan.batch_size, decision.plan.iter_size


def test_auto_takes_the_largest_batch_under_the_margin_of_the_engines_kind() -> None:
    assert batch(plan()) == (412, 1)  # 512 MiB usable, 100 MiB fixed
    assert batch(plan(engine=ENGINE_CUDNN)) == (668, 1)  # 768 MiB usable
    assert batch(plan(fallback={"safety_margin": 0.0})) == (924, 1)


def test_the_wanted_batch_is_the_requests_the_nets_or_the_one_training_started_with() -> None:
    assert batch(plan(requested_batch=256)) == (256, 1)
    assert batch(plan(requested_batch=None)) == (64, 1)
    assert batch(plan(requested_batch=1000)) == (334, 3)
    assert batch(plan(requested_batch=256, effective_batch=128, iteration=10)) == (128, 1)
    assert batch(plan(requested_batch=256, effective_batch=128, iteration=0)) == (256, 1)


def test_the_wanted_start_tries_the_batch_as_given_first() -> None:
    decision = plan(requested_batch=1000, fallback={"start": "wanted"})
    assert decision.plan is not None
    assert (decision.plan.batch_size, decision.plan.iter_size, decision.plan.fits) == (1000, 1, False)
    assert decision.plan.bytes == 1100 * MIB
    assert decision.message == 'the wanted batch 1000 as given first (fallback start "wanted")'
    assert batch(plan(requested_batch=1000, fallback={"start": "wanted"}, placing=True)) == (334, 3)
    assert batch(plan(requested_batch=1000, fallback={"start": "wanted"}, attempts_made=1)) == (334, 3)
    assert batch(plan(requested_batch="auto", fallback={"start": "wanted"})) == (412, 1)


def test_no_plan_is_left_alone_by_the_wanted_start() -> None:
    decision = plan(limit_bytes=100 * MIB, requested_batch=8, fallback={"start": "wanted"})
    assert decision.plan is None and "does not fit even at batch 1" in decision.message
    assert plan(attempts_made=3).plan is None  # the retry budget
