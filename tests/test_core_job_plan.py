"""core.planning.job_plan.plan_job, the one place a job is planned (the job manager's attempts and placement, the form, the REST
estimate and the command line): driven with a linear footprint and plain values. The attempt loop itself runs real
jobs in test_jobs_manager.py; test_plan_agreement.py drives one request through every path."""

from __future__ import annotations

from typing import Any

from digits_memplugin.core.layers.base import ENGINE_CPU, ENGINE_CUDNN
from digits_memplugin.core.planning.fit import Decision
from digits_memplugin.core.planning.job_plan import JobAsk, PlanningPolicy, plan_job
from digits_memplugin.core.sizes import GIB, MIB


def footprint(batch: int, test_batch: int | None) -> int:
    return 100 * MIB + batch * MIB


def plan(
    *, engine: str = ENGINE_CPU, limit_bytes: int = GIB, requested_batch: int | str | None = "auto",
    fallback: dict[str, Any] | None = None, attempts_made: int = 0, placing: bool = False, **ask: Any,
) -> Decision:
    fallback = fallback or {}
    policy = PlanningPolicy(cpu_safety_margin=0.5, gpu_safety_margin=0.25, max_attempts=3)
    values: dict[str, Any] = {"net_batch": 64, "test_batch": None, "test_iter": 1, **ask}
    return plan_job(
        footprint,
        JobAsk(batch=requested_batch, safety_margin=fallback.get("safety_margin"), start=fallback.get("start", "plan"),
               **values),
        engine=engine, limit_bytes=limit_bytes, policy=policy, attempts_made=attempts_made, placing=placing,
    )


def batch(decision: Decision) -> tuple[int, int]:
    assert decision.plan is not None, decision.message
    return decision.plan.batch_size, decision.plan.iter_size


def test_auto_takes_the_largest_batch_under_the_margin_of_the_engines_kind() -> None:
    small = 350 * MIB  # the cap of "auto" (256) is not reached
    assert batch(plan(limit_bytes=small)) == (75, 1)  # 175 MiB usable, 100 MiB fixed
    assert batch(plan(limit_bytes=small, engine=ENGINE_CUDNN)) == (162, 1)  # 262.5 MiB usable
    assert batch(plan(limit_bytes=small, fallback={"safety_margin": 0.0})) == (250, 1)


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
    assert batch(plan(requested_batch="auto", fallback={"start": "wanted"}, limit_bytes=350 * MIB)) == (75, 1)


def test_no_plan_is_left_alone_by_the_wanted_start() -> None:
    decision = plan(limit_bytes=100 * MIB, requested_batch=8, fallback={"start": "wanted"})
    assert decision.plan is None and "does not fit even at batch 1" in decision.message
    assert plan(attempts_made=3).plan is None  # the retry budget


def test_auto_is_capped_at_a_twentieth_of_the_training_set_and_says_so() -> None:
    """Issue 26, 2: Auto filled batch 1438, the whole sample training set (one update an epoch)."""
    decision = plan(train_items=1438)  # memory for 412
    assert batch(decision) == (71, 1) and decision.limited_by == "max_batch"
    assert decision.auto_cap == (
        "capped at 71 so that an epoch of the 1438 training items has 21 iterations (at most 1/20 of the training set)"
    )
    assert decision.message.endswith(f"; auto {decision.auto_cap}")
    assert batch(plan(train_items=15)) == (1, 1)  # fewer items than iterations an epoch keeps: batch 1
    tight = plan(limit_bytes=300 * MIB, train_items=1438)  # memory for 50 only: memory chose it, not the cap
    assert batch(tight) == (50, 1) and tight.limited_by == "memory" and tight.auto_cap is None
    assert batch(plan(requested_batch=1000, train_items=300)) == (334, 3)  # a number asked for is not capped
    assert plan(requested_batch=1000, train_items=300).auto_cap is None


def test_auto_never_goes_past_the_batch_of_caffes_reference_models() -> None:
    decision = plan(train_items=60000)  # MNIST: a twentieth is 3000, memory has room for 412
    assert batch(decision) == (256, 1) and decision.limited_by == "max_batch"
    assert decision.auto_cap is not None and decision.auto_cap.startswith("capped at 256, the largest batch of Caffe")
    assert "an epoch of the 60000 training items has 235 iterations" in decision.auto_cap
    assert batch(plan()) == (256, 1)  # the training set's size unknown: the ceiling alone
    small = plan(limit_bytes=350 * MIB, train_items=60000)
    assert batch(small) == (75, 1) and small.limited_by == "memory" and small.auto_cap is None


def test_the_policy_gives_each_kind_of_device_its_engine_and_margin() -> None:
    policy = PlanningPolicy(gpu_engine="gpu", cpu_safety_margin=0.02, gpu_safety_margin=0.07)
    assert (policy.engine("cpu"), policy.engine("gpu")) == ("cpu", "gpu")
    assert (policy.safety_margin("cpu"), policy.safety_margin("gpu"), policy.safety_margin("gpu-cudnn")) == (
        0.02, 0.07, 0.07
    )
    assert plan(engine=ENGINE_CUDNN).safety_margin == 0.25
