"""The batch planner: exact largest batch on affine and non-affine curves, iter_size plans, and the estimate's plan."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from conftest import ZOO
from hypothesis import given, settings
from hypothesis import strategies as st

from digits_memplugin.core.errors import BlobLimitError, NetError, ShapeError
from digits_memplugin.core.estimate import EstimateRequest, estimate
from digits_memplugin.core.planning.planner import (
    MAX_BATCH,
    MemoryCurve,
    auto_batch_limit,
    auto_cap,
    max_batch,
    max_buildable,
    plan_batch,
    usable_bytes,
)


def brute_force_max(f, budget: int, limit: int) -> int:  # type: ignore[no-untyped-def]
    best = 0
    for b in range(1, limit + 1):
        if f(b) <= budget:
            best = b
    return best


def stepped(base: int, slope: int, step_at: int, step: int) -> Callable[[int], int]:
    """A monotone curve with a jump the affine model cannot see (a buffer that appears past some batch)."""
    return lambda b: base + slope * b + (step if b >= step_at else 0)


@given(
    base=st.integers(0, 10**9),
    slope=st.integers(1, 10**7),
    budget=st.integers(0, 2 * 10**9),
)
@settings(max_examples=300, deadline=None)
def test_affine_curve_gives_the_exact_largest_batch(base: int, slope: int, budget: int) -> None:
    curve = MemoryCurve(lambda b: base + slope * b)
    expected = 0 if base + slope > budget else min(MAX_BATCH, (budget - base) // slope)
    assert max_batch(curve, budget) == expected
    assert curve.evaluations <= 4  # two to fit the line, two to check it


STEPPED_CURVES = {
    "base": st.integers(0, 10**6),
    "slope": st.integers(1, 10**4),
    "step_at": st.integers(1, 300),
    "step": st.integers(0, 10**6),
    "budget": st.integers(0, 5 * 10**6),
}


@given(**STEPPED_CURVES)
@settings(max_examples=200, deadline=None)
def test_non_affine_curve_falls_back_to_an_exact_search(
    base: int, slope: int, step_at: int, step: int, budget: int
) -> None:
    f = stepped(base, slope, step_at, step)
    curve = MemoryCurve(f)
    assert max_batch(curve, budget, limit=400) == brute_force_max(f, budget, 400)


@given(**STEPPED_CURVES, seeded=st.integers(1, 500))
@settings(max_examples=300, deadline=None)
def test_a_known_point_replaces_one_evaluation_and_the_answer_stays_exact(
    base: int, slope: int, step_at: int, step: int, budget: int, seeded: int
) -> None:
    # The estimate seeds the curve with the report's batch: the search fits its line through it instead of
    # building batch 2, affine or not, within the limit or beyond it.
    f = stepped(base, slope, step_at, step)
    curve = MemoryCurve(f, known={seeded: f(seeded)})
    assert max_batch(curve, budget, limit=400) == brute_force_max(f, budget, 400)
    if step == 0 and 1 < seeded <= 400:
        assert curve.evaluations <= 3  # batch 1, then the guess and the batch above it


def test_batches_caffe_cannot_build_count_as_not_fitting() -> None:
    def f(b: int) -> int:
        if b > 1000:
            raise BlobLimitError("would create a blob of 3000000000 elements; Caffe's limit is 2147483647 (INT_MAX)")
        return 100 * b

    assert max_batch(MemoryCurve(f), budget=10**12) == 1000


def test_other_shape_errors_are_not_swallowed() -> None:
    def f(b: int) -> int:
        raise ShapeError("kernel extent 7 exceeds the padded input 5")

    with pytest.raises(ShapeError, match="kernel extent"):
        max_batch(MemoryCurve(f), budget=10)


@pytest.mark.parametrize(
    ("wanted", "largest", "expected"),
    [
        (256, 256, (256, 1)),  # fits as is
        (256, 100, (86, 3)),  # three passes of 86 cover 256 (258)
        (256, 128, (128, 2)),
        (100, 33, (25, 4)),
        (7, 1, (1, 7)),
    ],
)
def test_plan_keeps_the_effective_batch_with_the_fewest_passes(
    wanted: int, largest: int, expected: tuple[int, int]
) -> None:
    curve = MemoryCurve(lambda b: 1000 + 10 * b)
    budget = 1000 + 10 * largest
    plan = plan_batch(curve, wanted, budget)
    assert (plan.batch_size, plan.iter_size) == expected
    assert plan.fits
    assert plan.batch_size <= largest
    assert plan.batch_size * plan.iter_size >= wanted
    # no fewer passes would do, and no smaller batch with these passes covers `wanted`
    assert math.ceil(wanted / largest) == plan.iter_size
    assert (plan.batch_size - 1) * plan.iter_size < wanted


def test_plan_when_nothing_fits_says_so() -> None:
    plan = plan_batch(MemoryCurve(lambda b: 1000 + b), wanted=64, budget=500)
    assert not plan.fits
    assert (plan.batch_size, plan.iter_size) == (1, 64)


@pytest.mark.parametrize("margin", [-0.1, 1.0, 2.0])
def test_safety_margin_out_of_range(margin: float) -> None:
    with pytest.raises(ValueError, match="safety margin"):
        usable_bytes(10**9, margin)


def test_estimate_plan_fits_and_the_next_batch_does_not() -> None:
    net = (ZOO / "caffe_lenet" / "lenet_train_test.prototxt").read_text()
    solver = (ZOO / "caffe_lenet" / "lenet_solver.prototxt").read_text()
    # The test nets beside the train net: the figures at each batch (total_bytes) are theirs. (With them apart the
    # plan is the trainer's alone: tests/test_core_test_net.py.)
    request = {"net": net, "solver": solver, "data_shapes": {"data": (1, 28, 28)}, "safety_margin": 0.0,
               "test_net": "shared"}
    free = 40 * 1024 * 1024
    document = estimate(EstimateRequest(**request, batch=512, free_bytes=free))
    largest = document["max_batch_size"]
    assert largest > 0
    at_largest = estimate(EstimateRequest(**request, batch=largest))["total_bytes"]
    above = estimate(EstimateRequest(**request, batch=largest + 1))["total_bytes"]
    assert at_largest <= free < above
    plan = document["plan"]
    assert plan["fits"] and plan["batch_size"] <= largest
    assert plan["batch_size"] * plan["iter_size"] >= 512
    assert estimate(EstimateRequest(**request, batch=plan["batch_size"]))["total_bytes"] <= free


def test_estimate_shrinks_the_test_batch_when_even_batch_1_does_not_fit_beside_it() -> None:
    net = (ZOO / "caffe_lenet" / "lenet_train_test.prototxt").read_text()
    solver = (ZOO / "caffe_lenet" / "lenet_solver.prototxt").read_text()
    base = {"net": net, "solver": solver, "data_shapes": {"data": (1, 28, 28)}, "safety_margin": 0.0}
    # LeNet's test net runs 100 images at a time; give room for training at batch 1 with a 10-image test batch only.
    budget = estimate(EstimateRequest(**base, batch=1, test_batch=10))["total_bytes"]
    document = estimate(EstimateRequest(**base, batch=64, free_bytes=budget))
    assert document["test_plan"] is not None
    assert 10 <= document["test_plan"]["batch_size"] < 100
    assert document["test_plan"]["test_iter"] * document["test_plan"]["batch_size"] >= 100 * 100  # test_iter 100
    assert document["plan"]["fits"]




# --- Caffe's blob limit: the wanted batch is reached through iter_size (issue 14, point 3) ------------------------


def test_max_buildable_finds_the_last_batch_caffe_can_build_with_or_without_a_good_hint() -> None:
    def f(b: int) -> int:
        if b > 2674:
            raise BlobLimitError("over INT_MAX")
        return b

    for hint in (None, 2674, 14266, 1, 10**9):
        assert max_buildable(MemoryCurve(f), limit=4095, hint=hint) == 2674
    assert max_buildable(MemoryCurve(f), limit=1000) == 1000  # the limit itself is buildable


def test_a_wanted_batch_past_the_blob_limit_is_planned_with_iter_size() -> None:
    # GoogLeNet at batch 4096 on 3x256x256 items: conv1's top would hold 3,288,334,336 elements, past INT_MAX.
    net = (ZOO / "caffe_googlenet" / "train_val.prototxt").read_text()
    document = estimate(EstimateRequest(net=net, batch=4096, engine="gpu-cudnn", free_bytes=24 << 30,
                                        data_shapes={"data": (3, 256, 256)}))
    limit = document["blob_limit"]
    assert limit["wanted_batch_size"] == 4096 and limit["layer"] == "conv1/7x7_s2"
    assert limit["elements"] == 3288334336 and limit["max_batch_size"] == 2674
    assert (limit["batch_size"], limit["iter_size"]) == (2048, 2)
    assert "INT_MAX" in limit["message"] and "2048 x iter_size 2" in limit["message"]
    assert document["batch_size"] == 2048  # the footprint shown is one pass's
    plan = document["plan"]
    assert plan["fits"] and plan["effective_batch"] >= 4096 and document["safety_margin"] == 0.05  # jobs' GPU margin
    assert plan["batch_size"] <= 2674 and plan["iter_size"] > 1
    assert document["max_batch_limited_by"] == "memory"
    # The same net on a device with memory for more than Caffe can build: the plan is capped by the blob limit.
    roomy = estimate(EstimateRequest(net=net, batch=4096, engine="cpu", free_bytes=1 << 50,
                                     data_shapes={"data": (3, 256, 256)}))
    assert (roomy["plan"]["batch_size"], roomy["plan"]["iter_size"]) == (2048, 2)
    assert roomy["max_batch_size"] == 2674 and roomy["max_batch_limited_by"] == "blob_limit"


def test_a_batch_caffe_cannot_take_at_all_is_refused_at_the_batch_field() -> None:
    net = (ZOO / "caffe_lenet" / "lenet_train_test.prototxt").read_text()
    with pytest.raises(NetError) as raised:
        estimate(EstimateRequest(net=net, batch=2**31, data_shapes={"data": (1, 28, 28)}))
    assert raised.value.field == "batch" and "at most 2147483647" in str(raised.value)


def test_a_net_whose_own_batch_or_batch_one_is_past_the_limit_stays_an_error() -> None:
    net = (ZOO / "caffe_lenet" / "lenet_train_test.prototxt").read_text()
    with pytest.raises(BlobLimitError):  # no batch asked for: the net as written cannot be built
        estimate(EstimateRequest(net=net, data_shapes={"data": (1, 100000, 100000)}))
    with pytest.raises(BlobLimitError):  # not even batch 1 can be built: iter_size cannot help
        estimate(EstimateRequest(net=net, batch=64, data_shapes={"data": (1, 100000, 100000)}))


@pytest.mark.parametrize(("items", "limit", "reason", "per_epoch"), [
    (None, 256, "ceiling", None), (0, 256, "ceiling", None), (10, 1, "epoch", 10), (1438, 71, "epoch", 21),
    (1797, 89, "epoch", 21), (5119, 255, "epoch", 21), (5120, 256, "ceiling", 20), (60000, 256, "ceiling", 235),
    (MAX_BATCH + 5, 256, "ceiling", 4097),
])
def test_auto_is_a_twentieth_of_the_training_set_at_most_256(
    items: int | None, limit: int, reason: str, per_epoch: int | None,
) -> None:
    """Issue 26, 2: "the largest that fits" gave batch 1438 for the 1438-image sample set, one update an epoch."""
    cap = auto_cap(items)
    assert (cap.batch, cap.reason, cap.epoch_iterations) == (limit, reason, per_epoch)
    assert auto_batch_limit(items) == limit and auto_batch_limit(items, limit=7) == min(7, limit)
    if items and reason == "epoch":
        assert per_epoch is not None and per_epoch >= min(20, items)  # an epoch keeps its 20 iterations
