"""The test nets apart (issue 28), the core's part: what the trainer's and the tester's devices hold
(core.test_nets), the plan of each placement and `auto`'s choice (core.planning.apart). The tester child and the
job manager's wiring are tested where they live."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from zoo_cases import CASES_BY_NAME

from digits_memplugin.core.cpu_bookkeeping import CPU_RUNTIME_BYTES, CPU_THREAD_BYTES
from digits_memplugin.core.estimator import ApartFootprints, Estimator
from digits_memplugin.core.layers.base import (
    ENGINE_CPU,
    ENGINE_CUDNN,
    PARAM_DIFFS,
    PARAMS,
    PHASE_TEST,
    PHASE_TRAIN,
    SOLVER_HISTORY,
)
from digits_memplugin.core.memory import MemoryOptions, MemoryReport, cpu_bookkeeping_bytes, job_memory
from digits_memplugin.core.net import Net
from digits_memplugin.core.planning.apart import (
    STOP_COST_LIMIT,
    ApartTester,
    StopCost,
    choose_test_net,
    fit_apart,
    pays,
    plan_test_net,
)
from digits_memplugin.core.planning.fit import Decision, fit
from digits_memplugin.core.planning.planner import BatchPlan
from digits_memplugin.core.sizes import GIB, MIB
from digits_memplugin.core.test_nets import (
    TEST_NET_APART,
    TEST_NET_AUTO,
    TEST_NET_SHARED,
    apart_tester_memory,
    apart_trainer_memory,
    share_of_test_nets,
    snapshot_bytes,
)
from digits_memplugin.core.training import TrainingDefinition, fill_num_classes, training_definition

ZOO_NETS = ["caffe_lenet", "caffe_cifar10_quick", "caffe_mnist_siamese", "digits_lenet", "caffe_alexnet",
            "caffe_googlenet"]
"""Small nets and two whose test net is large beside the train net (GoogLeNet tests at 50, trains at 32)."""
ENGINES = [ENGINE_CPU, ENGINE_CUDNN]


def definition_of(name: str) -> TrainingDefinition:
    case = CASES_BY_NAME[name]
    net, solver = case.texts()
    definition = training_definition(net, solver, net_source=case.net)
    if case.classes:
        fill_num_classes(definition, case.classes)
    return definition


def built(name: str, engine: str, batch: int | None = None, test_batch: int | None = None
          ) -> tuple[MemoryOptions, Net, list[Net]]:
    definition = definition_of(name)
    train, tests = definition.build(batch, test_batch, CASES_BY_NAME[name].data_shapes)
    return MemoryOptions(engine=engine, solver_type=definition.solver_type), train, tests


def data_threads(nets: list[Net]) -> int:
    return sum(2 if layer.type == "Data" else 1 for net in nets for layer in net.layers
               if layer.type in ("Data", "ImageData", "WindowData"))


def by_layer(report: MemoryReport, phase: str) -> dict[tuple[int, str], dict[str, int]]:
    return {(layer.net_index, layer.name): {k: v for k, v in layer.categories.items() if v}
            for layer in report.layers if layer.phase == phase}


# What each device holds.

@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ZOO_NETS)
def test_the_trainer_holds_the_shared_footprint_less_exactly_the_test_nets_share(name: str, engine: str) -> None:
    options, train, tests = built(name, engine, batch=2)
    shared, trainer = job_memory(train, tests, options), apart_trainer_memory(train, options)
    # The train net's layers are counted as under `shared`, buffer for buffer (its params, gradients and history).
    assert by_layer(trainer, PHASE_TRAIN) == by_layer(shared, PHASE_TRAIN)
    assert not by_layer(trainer, PHASE_TEST)
    # The process: on the CPU the test nets' bookkeeping (no learnable params) and data threads; on a GPU the
    # CUDA context is one per process, and cuDNN handles cost 0 bytes by default.
    shared_tests = [[layer for layer in shared.layers if layer.net_index == index] for index in range(1, len(tests) + 1)]
    process = 0
    if engine == ENGINE_CPU:
        process = CPU_THREAD_BYTES * data_threads(tests) + sum(
            cpu_bookkeeping_bytes(test, layers, learnable=False) for test, layers in zip(tests, shared_tests)
        )
    assert shared.context_bytes - trainer.context_bytes == process
    assert shared.steady_bytes - trainer.steady_bytes == sum(share_of_test_nets(shared).values()) + process
    assert trainer.total_bytes < shared.total_bytes


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name", ZOO_NETS)
def test_the_tester_holds_the_test_nets_alone_with_their_own_weights(name: str, engine: str) -> None:
    options, train, tests = built(name, engine, batch=2)
    shared, tester = job_memory(train, tests, options), apart_tester_memory(train, tests, options)
    shared_layers, tester_layers = by_layer(shared, PHASE_TEST), by_layer(tester, PHASE_TEST)
    assert tester_layers.keys() == shared_layers.keys()
    own_weights = 0
    for key, categories in tester_layers.items():
        # No gradient of a param and no solver history anywhere; a param's data is the test net's own copy.
        assert not categories.keys() & {PARAM_DIFFS, SOLVER_HISTORY}
        beside = {k: v for k, v in categories.items() if k != PARAMS}
        assert beside == {k: v for k, v in shared_layers[key].items() if k != PARAMS}
        own_weights += categories.get(PARAMS, 0) - shared_layers[key].get(PARAMS, 0)
    # The weights `shared` takes from the train net are exactly the ones the tester holds on its own.
    train_params = {layer.name: layer.categories.get(PARAMS, 0) for layer in apart_trainer_memory(train, options).layers}
    expected_params = sum(train_params.get(layer.name, 0) for test in tests for layer in test.layers)
    assert own_weights == expected_params > 0
    if engine == ENGINE_CPU:
        assert tester.context_bytes == CPU_RUNTIME_BYTES + CPU_THREAD_BYTES * data_threads(tests) + sum(
            cpu_bookkeeping_bytes(test, [layer for layer in tester.layers if layer.net_index == index], False)
            for index, test in enumerate(tests, start=1)
        )
        # Loading a .caffemodel parses the train net's weights whole before copying them (the construction peak).
        assert snapshot_bytes(train, options) >= expected_params
        assert tester.construction_bytes == tester.context_bytes + snapshot_bytes(train, options) + sum(
            layer.categories.get(PARAMS, 0) + layer.categories.get("data_prefetch", 0) for layer in tester.layers
        )
        binary = tester.construction_bytes
        assert apart_tester_memory(train, tests, options, binary_snapshot=False).construction_bytes == (
            binary - snapshot_bytes(train, options)
        )
    else:
        assert tester.context_bytes == options.cuda_context_bytes and tester.construction_bytes == 0
    assert tester.memory_required_for_data == shared.memory_required_for_data[1:]


def test_googlenet_s_test_net_is_a_large_share_and_the_tester_needs_it_alone() -> None:
    options, train, tests = built("caffe_googlenet", ENGINE_CUDNN)  # its own batches: train 32, test 50
    shared = job_memory(train, tests, options)
    trainer, tester = apart_trainer_memory(train, options), apart_tester_memory(train, tests, options)
    share = sum(share_of_test_nets(shared).values())
    assert share > 0.2 * shared.steady_bytes  # a fifth of what `shared` holds is the test net's
    # The tester needs far less than the trainer (no gradients, no history) but more than its share of `shared`
    # (its own weights and CUDA context).
    assert share < tester.total_bytes < trainer.total_bytes
    assert trainer.assumptions[-1].startswith("test nets apart") and tester.assumptions[-1].startswith("test nets apart")


# Planning each placement, on real footprints.

def _footprints(name: str, engine: str) -> tuple[Estimator, ApartFootprints]:
    definition = definition_of(name)
    estimator = Estimator(definition, MemoryOptions(engine=engine, solver_type=definition.solver_type),
                          CASES_BY_NAME[name].data_shapes)
    return estimator, ApartFootprints(estimator)


def test_apart_gives_googlenet_a_larger_train_batch_where_its_test_net_holds_shared_back() -> None:
    estimator, apart = _footprints("caffe_googlenet", ENGINE_CUDNN)
    limit, margin = 6 * GIB, 0.05
    shared = fit(estimator.total, None, limit, margin, test_batch=50)
    planned = fit_apart(apart.trainer, ApartTester(apart.tester()), None, limit, margin, test_batch=50)
    assert shared.plan is not None and planned.plan is not None
    assert planned.plan.batch_size > shared.plan.batch_size
    assert (shared.plan.batch_size, planned.plan.batch_size) == (46, 70)
    # The largest exactly: it fits on the trainer's budget alone, the next does not.
    assert apart.trainer(planned.plan.batch_size) <= planned.budget < apart.trainer(planned.plan.batch_size + 1)
    assert planned.test_net == TEST_NET_APART and planned.tester_bytes == apart.tester()
    assert planned.test_plan is None  # the test nets keep their own batch
    assert "the tester needs" in planned.message and "the trainer's device" in planned.message
    # The wanted 256 in fewer passes.
    wanted_shared = fit(estimator.total, 256, limit, margin, test_batch=50)
    wanted_apart = fit_apart(apart.trainer, ApartTester(apart.tester()), 256, limit, margin, test_batch=50)
    assert wanted_shared.plan is not None and wanted_apart.plan is not None
    assert wanted_apart.plan.iter_size < wanted_shared.plan.iter_size
    assert (wanted_shared.plan.batch_size, wanted_shared.plan.iter_size) == (43, 6)
    assert (wanted_apart.plan.batch_size, wanted_apart.plan.iter_size) == (64, 4)
    assert wanted_apart.plan.batch_size * wanted_apart.plan.iter_size >= 256


def test_shared_plans_are_fit_s_unchanged() -> None:
    estimator, _ = _footprints("caffe_googlenet", ENGINE_CUDNN)
    for wanted in (None, 64, 256):
        for limit in (2 * GIB, 6 * GIB, 40 * GIB):
            def shared(wanted: int | None = wanted, limit: int = limit) -> Decision:
                return fit(estimator.total, wanted, limit, 0.05, test_batch=50, test_iter=1000, max_batch=256)

            got = plan_test_net(TEST_NET_SHARED, shared, lambda: pytest.fail("shared plans nothing apart"))
            assert got == shared()
            assert got.test_net == TEST_NET_SHARED and got.test_net_note is None and got.tester_bytes is None
    # Today's figures for GoogLeNet on 6 GiB (its test net at 50 beside the train net): 46 a pass, 256 as 43 x 6.
    assert (shared_plan := fit(estimator.total, None, 6 * GIB, 0.05, test_batch=50).plan) is not None
    assert (shared_plan.batch_size, shared_plan.iter_size) == (46, 1)


def test_the_tester_at_its_own_batch_must_fit_its_device_or_the_plan_says_which_does_not() -> None:
    _, apart = _footprints("caffe_googlenet", ENGINE_CUDNN)
    tester = apart.tester()
    # Another device too small for the test nets at batch 50: refused, never shrunk.
    refused = fit_apart(apart.trainer, ApartTester(tester, limit_bytes=tester), None, 6 * GIB, 0.05, test_batch=50)
    assert refused.stop and refused.test_net == TEST_NET_APART
    assert refused.message.startswith("the test nets apart do not fit: the tester needs")
    assert "at their own test batch 50" in refused.message and "the tester's device" in refused.message
    # Room for the tester but not for even train batch 1.
    trainer_one = apart.trainer(1)
    refused = fit_apart(apart.trainer, ApartTester(tester, limit_bytes=8 * GIB), None, trainer_one, 0.05, test_batch=50)
    assert refused.stop and refused.message.startswith("the train net alone does not fit even at batch 1")
    # The same device: the tester has the trainer's whole budget (they never hold it at once).
    same = fit_apart(apart.trainer, ApartTester(tester), None, int(tester / 0.95) + 1, 0.05, test_batch=50)
    assert "the tester needs" in same.message and not same.message.startswith("the test nets apart")


# `auto`, on plain footprints: 100 MiB fixed, 1 MiB per train item, the test nets 200 MiB beside the train net.

FIXED, TEST_NETS = 100 * MIB, 200 * MIB


def shared_footprint(batch: int, test_batch: int | None) -> int:
    return FIXED + TEST_NETS + batch * MIB


def trainer_footprint(batch: int) -> int:
    return FIXED + batch * MIB


def auto(wanted: int | None, limit: int = GIB, *, tester: ApartTester | None = None,
         cost: StopCost | None = None, max_batch: int | None = 256) -> Decision:
    tester = tester or ApartTester(150 * MIB)
    return plan_test_net(
        TEST_NET_AUTO,
        lambda: fit(shared_footprint, wanted, limit, 0.0, test_batch=50, max_batch=max_batch),
        lambda: fit_apart(trainer_footprint, tester, wanted, limit, 0.0, test_batch=50, max_batch=max_batch),
        cost, same_device=tester.same_device,
    )


def test_auto_picks_apart_where_it_grows_the_batch_and_the_cost_is_not_measured_yet() -> None:
    decision = auto(None, limit=450 * MIB)  # shared: 150 items; apart: 350, capped at 256
    assert decision.test_net == TEST_NET_APART and (decision.plan.batch_size, decision.plan.iter_size) == (256, 1)
    assert "not measured yet: it will be on the first interval" in decision.test_net_note
    assert decision.test_net_note in decision.message


def test_auto_keeps_shared_where_apart_does_not_pay() -> None:
    decision = auto(None)  # 1 GiB: both reach the cap of 256
    assert decision.test_net == TEST_NET_SHARED
    assert decision.test_net_note.startswith("test nets shared: apart does not pay")
    assert "apart trains 256 x iter_size 1, shared 256 x iter_size 1" in decision.test_net_note
    same = fit(shared_footprint, None, GIB, 0.0, test_batch=50, max_batch=256)
    assert dataclasses.replace(decision, test_net_note=None, message=same.message) == same


def test_auto_picks_apart_for_fewer_passes_while_the_stop_costs_under_five_percent() -> None:
    limit = 500 * MIB  # shared: 200 items a pass, 256 in 2 x 128; apart: 400, 256 in one pass
    assert auto(256, limit).test_net == TEST_NET_APART
    under = auto(256, limit, cost=StopCost(setup_seconds=4.9, interval_seconds=100.0))
    assert under.test_net == TEST_NET_APART and (under.plan.batch_size, under.plan.iter_size) == (256, 1)
    assert "4.9 s per test interval, 4.9% of its 100.0 s of training, under 5%" in under.test_net_note
    over = auto(256, limit, cost=StopCost(setup_seconds=5.0, interval_seconds=100.0))
    assert over.test_net == TEST_NET_SHARED and (over.plan.batch_size, over.plan.iter_size) == (128, 2)
    assert over.test_net_note.startswith("test nets shared: stopping and resuming costs 5.0 s per test interval")
    assert STOP_COST_LIMIT == 0.05


def test_auto_on_another_device_has_no_stop_cost() -> None:
    elsewhere = ApartTester(150 * MIB, limit_bytes=GIB)
    decision = auto(256, 500 * MIB, tester=elsewhere, cost=StopCost(setup_seconds=50.0, interval_seconds=100.0))
    assert decision.test_net == TEST_NET_APART and "on another device" in decision.test_net_note
    # ... but the tester must fit there: then apart does not pay at all.
    cramped = auto(256, 500 * MIB, tester=ApartTester(150 * MIB, limit_bytes=100 * MIB))
    assert cramped.test_net == TEST_NET_SHARED and "the test nets apart do not fit" in cramped.test_net_note


def test_auto_picks_apart_where_shared_cannot_train_at_all() -> None:
    limit = FIXED + TEST_NETS  # not even batch 1 beside the test nets, whatever their batch here
    decision = auto(None, limit, cost=StopCost(setup_seconds=90.0, interval_seconds=100.0))
    assert decision.test_net == TEST_NET_APART and "shared does not fit at all" in decision.test_net_note


def test_a_cost_half_measured_is_not_measured_yet() -> None:
    shared = fit(shared_footprint, 256, 500 * MIB, 0.0)
    apart = fit_apart(trainer_footprint, ApartTester(150 * MIB), 256, 500 * MIB, 0.0)
    for cost in (StopCost(setup_seconds=3.0), StopCost(interval_seconds=100.0), StopCost(3.0, 0.0)):
        chosen = choose_test_net(shared, apart, cost, same_device=True)
        assert chosen.test_net == TEST_NET_APART and "not measured yet" in chosen.test_net_note


def test_pays_compares_passes_first_then_the_batch() -> None:
    def plan(batch: int, iter_size: int) -> BatchPlan:
        return BatchPlan(batch, iter_size, True, 0, batch * iter_size)

    assert pays(plan(64, 2), plan(128, 1)) and pays(plan(64, 1), plan(65, 1)) and pays(None, plan(1, 1))
    assert not pays(plan(64, 1), plan(64, 1)) and not pays(plan(64, 1), None) and not pays(None, None)
    assert not pays(plan(128, 1), plan(200, 2))


def test_the_three_modes_are_one_constant_each() -> None:
    assert (TEST_NET_SHARED, TEST_NET_APART, TEST_NET_AUTO) == ("shared", "apart", "auto")
    with pytest.raises(ValueError, match="test_net must be one of shared, apart, auto"):
        plan_test_net("both", lambda: fit(shared_footprint, None, GIB, 0.0), lambda: pytest.fail("not planned"))
    assert fit(shared_footprint, None, GIB, 0.0).test_net == TEST_NET_SHARED  # a plan made as today's says so


# The tester's footprint held to what pycaffe allocates: a TEST-phase net alone, on a snapshot's weights.

SAVE_WEIGHTS = """
import sys, caffe
caffe.set_mode_cpu()
caffe.Net(sys.argv[1], caffe.TEST if sys.argv[3] == "test" else caffe.TRAIN).save(sys.argv[2])
"""
MEASURE_TESTER = """
import json, sys, caffe
from digits_memplugin.measure.child import _in_use, _settled
caffe.set_mode_cpu()
before = _in_use()
net = caffe.Net(sys.argv[1], caffe.TEST, weights=sys.argv[2])
constructed = _settled()  # the data layers' reader threads fill their queues
net.forward()
after = _settled()
print(json.dumps({"allocated": after - before, "constructed": constructed - before}))
"""


def _pycaffe(script: str, *args: str, cwd: Path) -> str:
    env = {**os.environ, "GLOG_minloglevel": "2", "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=600,
                          env=env, cwd=cwd, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("name", ["caffe_lenet", "caffe_cifar10_quick", "caffe_mnist_siamese", "caffe_alexnet"])
def test_the_tester_footprint_matches_a_test_net_built_alone_in_pycaffe(name: str, tmp_path: Path) -> None:
    from google.protobuf import text_format

    from digits_memplugin.measure.runner import prepare_net

    case, definition = CASES_BY_NAME[name], definition_of(name)
    options, train, tests = built(name, ENGINE_CPU)
    train_path, test_path, weights = tmp_path / "train.prototxt", tmp_path / "test.prototxt", tmp_path / "w.caffemodel"
    train_net = prepare_net(definition.train.param, tmp_path / "a", case.data_shapes)
    for layer in train_net.layer:  # the snapshot's weights do not depend on the batch: build it small
        if layer.HasField("data_param"):
            layer.data_param.batch_size = 1
    train_path.write_text(text_format.MessageToString(train_net))
    test_path.write_text(text_format.MessageToString(prepare_net(definition.tests[0].param, tmp_path / "b", case.data_shapes)))
    _pycaffe(SAVE_WEIGHTS, str(train_path), str(weights), "train", cwd=tmp_path)  # the snapshot, in its own process
    measured = json.loads(_pycaffe(MEASURE_TESTER, str(test_path), str(weights), cwd=tmp_path).splitlines()[-1])
    tester = apart_tester_memory(train, tests[:1], options)
    error = tester.steady_bytes - measured["allocated"]
    # The accuracy tests' bound: within 1% (or 1 MiB), never below by more than 0.5% (or 1 MiB).
    assert abs(error) <= max(0.01 * measured["allocated"], MIB), (tester.steady_bytes, measured)
    assert error >= -max(0.005 * measured["allocated"], MIB), (tester.steady_bytes, measured)
    # After construction the parsed snapshot is gone again: the filled weights, prefetch and bookkeeping stay.
    without_snapshot = tester.construction_bytes - snapshot_bytes(train, options)
    assert abs(without_snapshot - measured["constructed"]) <= max(0.01 * measured["constructed"], MIB), measured


def test_past_five_percent_auto_keeps_apart_only_where_an_interval_apart_was_measured_faster() -> None:
    """The stop's cost against an interval decides until the job has trained an interval each way; then what each
    took, the stop included: a larger batch can gain more than the stop costs."""
    limit = 500 * MIB
    unmeasured = StopCost(setup_seconds=5.0, interval_seconds=10.0)  # 50%: shared, not knowing what apart gains
    assert unmeasured.keeps_apart() is False and unmeasured.apart_faster is None
    assert auto(256, limit, cost=unmeasured).test_net == TEST_NET_SHARED
    faster = StopCost(setup_seconds=5.0, interval_seconds=10.0, shared_interval_seconds=16.0)  # 15 s against 16
    chosen = auto(256, limit, cost=faster)
    assert faster.apart_faster and chosen.test_net == TEST_NET_APART and chosen.by_stop_cost
    assert "apart is faster, its stop included" in chosen.test_net_note
    assert "an interval with the test nets shared took 16.0 s" in chosen.test_net_note
    slower = StopCost(setup_seconds=5.0, interval_seconds=10.0, shared_interval_seconds=14.0)
    kept_shared = auto(256, limit, cost=slower)
    assert kept_shared.test_net == TEST_NET_SHARED and "shared is faster" in kept_shared.test_net_note
    # Under the limit apart is kept whatever shared took (the rule), and a plan not decided on the cost says so.
    cheap = StopCost(setup_seconds=1.0, interval_seconds=100.0, shared_interval_seconds=50.0)
    assert cheap.keeps_apart() and auto(256, limit, cost=cheap).test_net == TEST_NET_APART
    assert not auto(256, limit).by_stop_cost
