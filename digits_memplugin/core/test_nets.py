"""Where a job's test nets live, and what each device then holds (docs/memory-model.md, "The test nets apart").

`shared` is Caffe's own way: one process holds the train net, every test net (sharing the train net's weights,
Net::ShareTrainedLayersWith) and the solver's state; core.memory.job_memory counts it. `apart`: the trainer builds
its solver without test nets, so its device holds the train net and the solver's state alone
(`apart_trainer_memory`), and a tester process builds only the test nets from a snapshot's weights
(`apart_tester_memory`): forward only, with their own copy of the weights, no gradients, no solver state. `auto`
leaves the choice to the planner (core.planning.apart.choose_test_net). The words themselves are
core.test_net_modes's, handed on here.
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
from .test_net_modes import (  # noqa: F401 - the words, handed on with the memory they count
    TEST_NET_APART,
    TEST_NET_AUTO,
    TEST_NET_MODES,
    TEST_NET_SHARED,
    TESTER,
    TRAINER,
)

TRAINER_NOTE = "test nets apart: the trainer's process holds the train net and the solver's state only"
TESTER_NOTE = (
    "test nets apart: a tester process holds the test nets alone at their own test batch, one at a time, forward "
    "only, with their own copy of the weights loaded from the snapshot (no gradients, no solver state)"
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
    """The tester's footprint under `apart`: its largest test net's (`tester_net_memory`). The tester builds,
    tests and frees its test nets one at a time: two nets reading one LMDB cannot be open in one process (LMDB
    refuses a second environment on one database in a process), and one at a time the peak is the largest net's."""
    reports = [tester_net_memory(train, test, index, options, binary_snapshot=binary_snapshot)
               for index, test in enumerate(tests, start=1)]
    if not reports:
        raise ValueError("a tester needs at least one test net")
    return max(reports, key=lambda report: report.total_bytes)


def tester_net_memory(
    train: Net, test: Net, index: int, options: MemoryOptions, *, binary_snapshot: bool = True
) -> MemoryReport:
    """One test net in the tester's process (`index`: its place among the solver's nets, 1 for the first test
    net), built in TEST phase (`caffe.Net(proto, TEST, weights=...)`) and run forward.

    What differs from the same nets under `shared`, from Caffe's source: each test net owns its params' data
    (Net::CopyTrainedLayersFrom writes the snapshot into the blobs the fillers allocated at set-up, where `shared`
    makes them point at the train net's with ShareTrainedLayersWith); nothing touches a param's diff (only the
    solver calls Net::ClearParamDiffs, and Backward never runs) and there is no solver history. Every other buffer
    is the one `shared` counts for the same net: SyncedMemory allocates on first touch, and a TEST net's forward
    touches what it touches in the trainer's process (its activations, a loss top's diff from SetLossWeights, the
    GPU forwards' scratch diffs). On the CPU engine, loading a `.caffemodel` (`binary_snapshot`) parses the whole
    NetParameter first (CopyTrainedLayersFromBinaryProto): the train net's weights once more, for a moment, beside
    the test nets' own, before any activation exists; an HDF5 snapshot is read blob by blob into place."""
    share_trained_layers(train, test)  # CopyTrainedLayersFrom CHECKs the same shapes, layer by layer
    per_net = [net_memory(test, options, index)]
    layers = per_net[0]
    assumptions = list(dict.fromkeys(note for layer in test.layers for note in layer.ctx.assumed))
    context, notes = process_context([test], per_net, options, None, "the tester process")
    assumptions.extend(notes)
    if options.flavour == NVCAFFE or (test.param is not None and flavour_of(test.param) == NVCAFFE):
        assumptions.extend(nvcaffe_semantics(layers, options))
    assumptions.append(TESTER_NOTE)
    construction = 0
    if options.engine == ENGINE_CPU:
        construction = context + sum(
            layer.categories.get(DATA_PREFETCH, 0) + layer.categories.get(PARAMS, 0) for layer in layers
        )
        if binary_snapshot:
            construction += snapshot_bytes(train, options)
    data = [test.memory_required_for_data]
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

