"""core.planning.fallback: the first plan, recalibration from failures, the kept effective batch, the retry budget.

Pure tests on affine footprints (Caffe's memory is affine in the batch) plus one on the real estimator; the real
out-of-memory path (capped child processes) is tested in test_jobs_manager.py and measured in bench/fallback.py.
"""

from __future__ import annotations

import itertools
import math

import pytest
from conftest import ZOO
from hypothesis import given, settings
from hypothesis import strategies as st

from digits_memplugin.core.estimator import Estimator
from digits_memplugin.core.memory import MemoryOptions
from digits_memplugin.core.planning.fallback import Failure, Policy, correction, decide
from digits_memplugin.core.training import training_definition

MIB = 1 << 20


def affine(fixed: int, per_item: int, per_test_item: int = 0, test_batch: int = 0) -> object:
    def footprint(batch: int, tb: int | None) -> int:
        return fixed + per_item * batch + per_test_item * (test_batch if tb is None else tb)

    return footprint


def test_the_first_plan_is_the_planners_batch_within_the_margin() -> None:
    footprint = affine(10 * MIB, MIB)
    decision = decide(Policy(safety_margin=0.05), footprint, 64, 100 * MIB)  # type: ignore[arg-type]
    assert decision.plan is not None and decision.correction == 1.0
    assert decision.budget == int(100 * MIB * 0.95)
    assert decision.plan.batch_size == 64 and decision.plan.iter_size == 1  # 74 MiB fits in 95


def test_a_batch_that_does_not_fit_keeps_the_effective_batch_through_iter_size() -> None:
    decision = decide(Policy(), affine(10 * MIB, MIB), 256, 100 * MIB)  # type: ignore[arg-type]
    plan = decision.plan
    assert plan is not None
    assert plan.batch_size < 256 and plan.iter_size > 1
    assert plan.batch_size * plan.iter_size >= 256
    assert decision.estimated_bytes is not None and decision.estimated_bytes <= decision.budget


def test_auto_takes_the_largest_batch_that_fits() -> None:
    decision = decide(Policy(safety_margin=0.0), affine(10 * MIB, MIB), None, 100 * MIB)  # type: ignore[arg-type]
    assert decision.plan is not None
    assert (decision.plan.batch_size, decision.plan.iter_size) == (90, 1)


@pytest.mark.parametrize(("max_batch", "expected"), [(None, 85), (60, 60), (85, 85), (500, 85)])
def test_auto_is_capped_at_the_training_sets_size(max_batch: int | None, expected: int) -> None:
    """Issue 14, 6: auto never plans a pass larger than the dataset (planner.auto_batch_limit gives the cap)."""
    decision = decide(Policy(safety_margin=0.05), affine(10 * MIB, MIB), None, 100 * MIB,  # type: ignore[arg-type]
                      max_batch=max_batch)
    assert decision.plan is not None and (decision.plan.batch_size, decision.plan.iter_size) == (expected, 1)


def test_a_failure_raises_the_estimate_to_what_it_proves_plus_growth() -> None:
    footprint = affine(10 * MIB, MIB)
    failure = Failure(batch_size=85, test_batch_size=None, limit_bytes=100 * MIB)  # estimated 95 MiB, failed at 100
    factor = correction(footprint, [failure], growth=0.1)  # type: ignore[arg-type]
    assert factor == pytest.approx(100 / 95 * 1.1)
    decision = decide(Policy(), footprint, 128, 100 * MIB, [failure], attempts_made=1)  # type: ignore[arg-type]
    plan = decision.plan
    assert plan is not None and plan.batch_size < 85
    assert math.ceil(factor * footprint(plan.batch_size, None)) <= decision.budget  # type: ignore[operator]
    assert plan.batch_size * plan.iter_size >= 128
    assert decision.message.endswith(" (batch 85 ran out of memory: the estimate is raised by 16% to what it used)")


def test_the_numbers_in_the_message_raise_the_floor() -> None:
    footprint = affine(10 * MIB, MIB)
    plain = Failure(85, None, 100 * MIB)
    # NVcaffe said: 10 MiB free when 40 MiB more were asked, so the job needed at least 130 MiB.
    told = Failure(85, None, 100 * MIB, requested_bytes=40 * MIB, free_bytes=10 * MIB)
    assert told.floor() == 130 * MIB
    assert correction(footprint, [told], 0.1) > correction(footprint, [plain], 0.1)  # type: ignore[arg-type]
    seen = Failure(85, None, 100 * MIB, requested_bytes=30 * MIB, used_bytes=90 * MIB)
    assert seen.floor() == 120 * MIB


def test_a_failure_the_estimate_already_predicted_tells_nothing() -> None:
    footprint = affine(10 * MIB, MIB)
    assert correction(footprint, [Failure(500, None, 100 * MIB)], 0.1) == 1.0  # type: ignore[arg-type]


def test_a_retry_says_what_the_failures_changed_in_words() -> None:
    """Issue 26 point 6: while attempt 2 ran, the page said "estimate raised x1.00 after 1 out-of-memory
    failure(s)". A failure the estimate already explained is said so; the batches that failed are named."""
    footprint = affine(10 * MIB, MIB)
    failures = [Failure(500, None, 100 * MIB), Failure(300, None, 100 * MIB)]
    decision = decide(Policy(), footprint, 512, 100 * MIB, failures, attempts_made=2)  # type: ignore[arg-type]
    assert decision.correction == 1.0
    assert decision.message.endswith(
        " (batches 500 and 300 ran out of memory; the estimate stands: it was not below what those attempts used)"
    )
    assert "x1.00" not in decision.message and "(s)" not in decision.message
    nothing = decide(Policy(), affine(200 * MIB, MIB), 8, 100 * MIB, failures[:1], attempts_made=1)  # type: ignore[arg-type]
    assert nothing.message.endswith("(batch 500 ran out of memory; the estimate stands: it was not below what that "
                                    "attempt used)")


def test_the_next_batch_is_always_below_every_failed_one() -> None:
    """Even when the estimate says a failed batch fits (the limit grew meanwhile), it is not tried again."""
    footprint = affine(10 * MIB, MIB)
    failure = Failure(40, None, 60 * MIB)
    decision = decide(Policy(), footprint, 40, 10_000 * MIB, [failure], attempts_made=1)  # type: ignore[arg-type]
    assert decision.plan is not None and decision.plan.batch_size <= 39
    assert decision.plan.batch_size * decision.plan.iter_size >= 40


def test_the_retry_budget_stops_the_job_with_what_was_tried() -> None:
    failures = [Failure(64, None, 100 * MIB), Failure(50, None, 100 * MIB)]
    decision = decide(Policy(max_attempts=2), affine(MIB, MIB), 64, 100 * MIB, failures, attempts_made=2)  # type: ignore[arg-type]
    assert decision.stop
    assert decision.message == (
        "gave up after 2 attempts (the retry budget); batches that ran out of memory: 64, 50"
    )


def test_nothing_fits_is_said_with_numbers() -> None:
    decision = decide(Policy(), affine(200 * MIB, MIB), 8, 100 * MIB)  # type: ignore[arg-type]
    assert decision.stop
    assert decision.message.startswith("does not fit even at batch 1: estimated 201.0 MiB against 95.0 MiB usable")


def test_messages_write_sizes_with_the_size_formatter() -> None:
    """Issue 14, 8: job messages said "22480.7 MiB"; they write sizes as every page does (sizes.format_size)."""
    gib = 1 << 30
    fits = decide(Policy(safety_margin=0.0), affine(20 * gib, 10 * MIB), 64, 24 * gib)  # type: ignore[arg-type]
    assert fits.message == "batch 64 x iter_size 1: estimated 20.6 GiB of 24.0 GiB usable"
    nothing = decide(Policy(safety_margin=0.0), affine(30 * gib, MIB), 8, 24 * gib)  # type: ignore[arg-type]
    assert nothing.message.startswith("does not fit even at batch 1: estimated 30.0 GiB against 24.0 GiB usable")
    assert "MiB" not in fits.message + nothing.message


def test_the_test_batch_shrinks_when_not_even_batch_one_fits_beside_it() -> None:
    footprint = affine(10 * MIB, MIB, per_test_item=MIB, test_batch=100)  # 111 MiB at batch 1
    decision = decide(Policy(safety_margin=0.0), footprint, 8, 100 * MIB, test_batch=100, test_iter=10)  # type: ignore[arg-type]
    assert decision.plan is not None
    assert decision.test_plan is not None
    shrunk = decision.test_plan["batch_size"]
    assert shrunk < 100
    assert decision.test_plan["test_iter"] == math.ceil(10 * 100 / shrunk)  # a test pass covers as many items


@settings(max_examples=300, deadline=None)
@given(
    fixed=st.integers(1, 500),
    per_item=st.integers(1, 50),
    wanted=st.integers(1, 2000),
    limit=st.integers(50, 20_000),
    true_factor=st.floats(1.0, 2.5),
    true_extra=st.integers(0, 200),
    margin=st.floats(0.0, 0.2),
    requested=st.one_of(st.none(), st.integers(1, 500)),
)
def test_the_loop_converges_below_the_true_limit_and_keeps_the_effective_batch(
    fixed: int, per_item: int, wanted: int, limit: int, true_factor: float, true_extra: int, margin: float,
    requested: int | None,
) -> None:
    """An estimate that is low by any factor up to 2.5 plus a constant: every attempt is smaller than the last
    failed one, the job ends in success whenever batch 1 truly fits (within the retry budget), never above the
    true limit, always with batch x iter_size >= wanted."""
    policy = Policy(safety_margin=margin, max_attempts=50)

    def estimated(batch: int, tb: int | None) -> int:
        return fixed + per_item * batch

    def real(batch: int) -> float:
        return true_factor * estimated(batch, None) + true_extra

    failures: list[Failure] = []
    for attempt in range(policy.max_attempts):
        decision = decide(policy, estimated, wanted, limit, failures, attempts_made=attempt)
        if decision.stop:
            if attempt == 0:  # the first plan refuses only what the estimate says cannot fit
                assert estimated(1, None) > limit * (1 - margin) - 1
            else:  # later, only what the failures prove
                assert real(1) > limit
            return
        plan = decision.plan
        assert plan is not None
        assert plan.batch_size * plan.iter_size >= wanted
        assert all(plan.batch_size < failure.batch_size for failure in failures)
        if real(plan.batch_size) <= limit:
            return  # trains
        failures.append(Failure(plan.batch_size, None, limit, requested_bytes=requested))
    pytest.fail("no decision within the retry budget")


@settings(max_examples=200, deadline=None)
@given(fixed=st.integers(1, 500), per_item=st.integers(1, 50), limit=st.integers(1, 20_000), batches=st.lists(
    st.integers(1, 3000), min_size=1, max_size=4))
def test_more_failures_never_lower_the_correction(fixed: int, per_item: int, limit: int, batches: list[int]) -> None:
    def footprint(batch: int, tb: int | None) -> int:
        return fixed + per_item * batch

    failures = [Failure(batch, None, limit) for batch in batches]
    factors = [correction(footprint, failures[:n], 0.1) for n in range(len(failures) + 1)]
    assert factors[0] == 1.0
    assert all(a <= b for a, b in itertools.pairwise(factors))


def test_with_the_real_estimator_one_failure_is_enough_when_the_estimate_is_10_percent_low() -> None:
    text = (ZOO / "caffe_lenet" / "lenet_train_test.prototxt").read_text()
    solver = (ZOO / "caffe_lenet" / "lenet_solver.prototxt").read_text()
    definition = training_definition(text, solver)
    estimator = Estimator(definition, MemoryOptions(), {"data": (1, 28, 28)})

    def footprint(batch: int, tb: int | None) -> int:
        return estimator.report(batch, tb)[0].total_bytes

    def real(batch: int) -> float:
        return 1.10 * footprint(batch, None)

    policy, limit = Policy(safety_margin=0.0), 100 * MIB
    first = decide(policy, footprint, None, limit, test_batch=100, test_iter=100)  # the largest batch that fits
    assert first.plan is not None and real(first.plan.batch_size) > limit  # the estimate was too low: it fails
    failure = Failure(first.plan.batch_size, 100, limit)
    second = decide(policy, footprint, None, limit, [failure], attempts_made=1, test_batch=100, test_iter=100)
    assert second.plan is not None and real(second.plan.batch_size) <= limit
    assert second.plan.batch_size >= 0.8 * first.plan.batch_size  # not halved: most of the batch is kept


def test_policy_values_are_checked() -> None:
    for bad in ({"safety_margin": 1.0}, {"growth": -0.1}, {"max_attempts": 0}, {"max_attempts": True}):
        with pytest.raises(ValueError):
            Policy(**bad)  # type: ignore[arg-type]
