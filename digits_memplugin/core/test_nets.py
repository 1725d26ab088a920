"""Where a job's test nets live, and what each device then holds (docs/memory-model.md, "The test nets apart").

`shared` is Caffe's own way: one process holds the train net, every test net (sharing the train net's weights,
Net::ShareTrainedLayersWith) and the solver's state; core.memory.job_memory counts it. `apart`: the trainer builds
its solver without test nets, so its device holds the train net and the solver's state alone
(`apart_trainer_memory`), and a tester process builds only the test nets from a snapshot's weights
(`apart_tester_memory`): forward only, with their own copy of the weights, no gradients, no solver state. `auto` leaves the choice to the planner
(core.planning.apart.choose_test_net).
"""

from __future__ import annotations

from collections.abc import Sequence

from .flavour import NVCAFFE, flavour_of
from .layers.base import DATA_PREFETCH, ENGINE_CPU, FLOAT_BYTES, PARAMS, PHASE_TEST
from .memory import (
    MemoryOptions,
    MemoryReport,
    _allocation,
    job_memory,
    net_memory,
    nvcaffe_semantics,
    process_context,
    share_trained_layers,
)
from .net import Net

TEST_NET_SHARED = "shared"
"""The test nets beside the train net in the trainer's process, sharing its weights (Caffe's own way)."""
TEST_NET_APART = "apart"
"""The test nets in a tester process of their own, on a snapshot's weights: the trainer's device holds no test net."""
TEST_NET_AUTO = "auto"
"""`apart` only where it pays (core.planning.apart.choose_test_net), else `shared`."""
TEST_NET_MODES = (TEST_NET_SHARED, TEST_NET_APART, TEST_NET_AUTO)

TRAINER_NOTE = "test nets apart: the trainer's process holds the train net and the solver's state only"
TESTER_NOTE = (
    "test nets apart: a tester process holds the test nets alone at their own test batch, forward only, with their "
    "own copy of the weights loaded from the snapshot (no gradients, no solver state)"
)


def apart_trainer_memory(train: Net, options: MemoryOptions) -> MemoryReport:
    """The trainer's footprint under `apart`: the job's without a test net (Solver::InitTestNets builds none), the
    same buffers as `shared` less the test nets' layers and, in the process, their bookkeeping, data threads and
    cuDNN handles."""
    report = job_memory(train, [], options)
    report.assumptions.append(TRAINER_NOTE)
    return report


def apart_tester_memory(
    train: Net, tests: Sequence[Net], options: MemoryOptions, *, binary_snapshot: bool = True
) -> MemoryReport:
    """The tester's footprint under `apart`: the test nets alone, each built in TEST phase (`caffe.Net(proto,
    weights, TEST)`) and run forward.

    What differs from the same nets under `shared`, from Caffe's source: each test net owns its params' data
    (Net::CopyTrainedLayersFrom writes the snapshot into the blobs the fillers allocated at set-up, where `shared`
    makes them point at the train net's with ShareTrainedLayersWith); nothing touches a param's diff (only the
    solver calls Net::ClearParamDiffs, and Backward never runs) and there is no solver history. Every other buffer
    is the one `shared` counts for the same net: SyncedMemory allocates on first touch, and a TEST net's forward
    touches what it touches in the trainer's process (its activations, a loss top's diff from SetLossWeights, the
    GPU forwards' scratch diffs). On the CPU engine, loading a `.caffemodel` (`binary_snapshot`) parses the whole
    NetParameter first (CopyTrainedLayersFromBinaryProto): the train net's weights once more, for a moment, beside
    the test nets' own, before any activation exists; an HDF5 snapshot is read blob by blob into place."""
    for test in tests:
        share_trained_layers(train, test)  # CopyTrainedLayersFrom CHECKs the same shapes, layer by layer
    per_net = [net_memory(test, options, index) for index, test in enumerate(tests, start=1)]
    layers = [layer for net_layers in per_net for layer in net_layers]
    assumptions = list(dict.fromkeys(note for net in tests for layer in net.layers for note in layer.ctx.assumed))
    context, notes = process_context(tests, per_net, options, None, "the tester process")
    assumptions.extend(notes)
    if options.flavour == NVCAFFE or any(flavour_of(net.param) == NVCAFFE for net in tests if net.param is not None):
        assumptions.extend(nvcaffe_semantics(layers, options))
    assumptions.append(TESTER_NOTE)
    construction = 0
    if options.engine == ENGINE_CPU:
        construction = context + sum(
            layer.categories.get(DATA_PREFETCH, 0) + layer.categories.get(PARAMS, 0) for layer in layers
        )
        if binary_snapshot:
            construction += snapshot_bytes(train, options)
    data = [net.memory_required_for_data for net in tests]
    return MemoryReport(options.engine, layers, context, assumptions, data, construction)


def snapshot_bytes(train: Net, options: MemoryOptions) -> int:
    """Host bytes of a parsed `.caffemodel` of `train`: Net::ToProto writes every layer's param blobs as floats (a
    blob shared by name is written again by each layer that holds it)."""
    return sum(_allocation(param.count * FLOAT_BYTES, options) for param in train.params)


def share_of_test_nets(shared: MemoryReport) -> dict[str, int]:
    """The bytes of the test nets' layers in a `shared` report, by category (what `apart` takes off the trainer's
    device besides the process's bookkeeping of those nets)."""
    totals: dict[str, int] = {}
    for layer in shared.layers:
        if layer.phase == PHASE_TEST and layer.net_index > 0:
            for category, nbytes in layer.categories.items():
                totals[category] = totals.get(category, 0) + nbytes
    return totals

