"""The memory model: what Caffe allocates to train a net, buffer by buffer (docs/memory-model.md explains it).

It follows SyncedMemory's lazy allocation: a blob's data or diff costs memory only once something touches it, and
nothing is freed during training, so the state after construction + one training iteration + one test pass is
the peak. For each net of a training job it counts activations (top data), activation diffs (where backward or
a loss weight touches them), params and their diffs, the solver's history, every layer-internal buffer, the data
layers' prefetch, and on GPU engines the cuDNN workspace and the CUDA context.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Sequence

from .cpu_bookkeeping import (
    CPU_ALIGNMENT,
    CPU_ALLOCATION_OVERHEAD,
    CPU_BLOB_BYTES,
    CPU_LAYER_BUFFER_BYTES,
    CPU_LAYER_BYTES,
    CPU_LAYER_TYPE_BYTES,
    CPU_LEARNABLE_PARAM_BYTES,
    CPU_LRN_WITHIN_CHANNEL_BYTES,
    CPU_MMAP_THRESHOLD,
    CPU_PAGE_BYTES,
    CPU_PARAM_BYTES,
    CPU_RUNTIME_BYTES,
    CPU_SCALE_BIAS_BYTES,
    CPU_SIZE_BYTES,
    CPU_THREAD_BYTES,
)
from .errors import ShapeError
from .flavour import BVLC, NVCAFFE, NVCAFFE_UNVERIFIED, flavour_of, layer_storage, pool_allocation
from .layers.base import (
    ACTIVATION_DIFFS,
    ACTIVATIONS,
    CATEGORIES,
    CONTEXT,
    DATA_PREFETCH,
    ENGINE_CPU,
    ENGINE_CUDNN,
    ENGINE_GPU,
    ENGINES,
    FLOAT_BYTES,
    LAYER_BUFFERS,
    PARAM_DIFFS,
    PARAMS,
    PHASE_TEST,
    PHASE_TRAIN,
    SOLVER_HISTORY,
    WORKSPACE,
    Buffer,
    SubNet,
)
from .net import Net
from .sizes import format_size

MiB = 1024 * 1024

# Per learnable param, how many param-sized blobs of solver state each solver touches (solvers/*.cpp). The CPU
# paths go through update_ (and temp_) step by step; the GPU paths run one fused kernel on the history only.
SOLVER_STATE_BLOBS: dict[str, dict[str, int]] = {
    "SGD": {ENGINE_CPU: 1, ENGINE_GPU: 1},
    "Nesterov": {ENGINE_CPU: 2, ENGINE_GPU: 1},
    "AdaGrad": {ENGINE_CPU: 2, ENGINE_GPU: 1},
    "RMSProp": {ENGINE_CPU: 2, ENGINE_GPU: 1},
    "AdaDelta": {ENGINE_CPU: 4, ENGINE_GPU: 2},
    "Adam": {ENGINE_CPU: 3, ENGINE_GPU: 2},
}
# Solvers whose CPU path already touches temp_, which L1 regularization needs too.
CPU_SOLVERS_USING_TEMP = {"AdaDelta", "Adam"}

DEFAULT_CUDA_CONTEXT_BYTES = 300 * MiB
"""CUDA context, cuBLAS and cuRAND handles of one Caffe process: a per-machine constant, best calibrated once."""
DEFAULT_CUDNN_HANDLE_BYTES = 0
"""Device memory per cuDNN handle. BVLC creates group x 3 handles per cuDNN convolution layer."""


@dataclasses.dataclass(frozen=True)
class MemoryOptions:
    """How to count: the engine, the solver, and the GPU constants."""

    engine: str = ENGINE_CPU
    solver_type: str = "SGD"
    l1_regularization: bool = False
    cuda_context_bytes: int = DEFAULT_CUDA_CONTEXT_BYTES
    cudnn_handle_bytes: int = DEFAULT_CUDNN_HANDLE_BYTES
    flavour: str = BVLC
    """NVcaffe: allocations through its GPU pool, storage types per layer, one shared cuDNN workspace."""
    history_itemsize: int = FLOAT_BYTES
    """Bytes per element of the solver's history (NVcaffe's solver_data_type)."""

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.solver_type not in SOLVER_STATE_BLOBS:
            raise ValueError(f"unknown solver type {self.solver_type!r} (known: {', '.join(SOLVER_STATE_BLOBS)})")

    @property
    def on_gpu(self) -> bool:
        return self.engine != ENGINE_CPU


@dataclasses.dataclass
class LayerMemory:
    """Bytes one layer of one net accounts for, by category."""

    name: str
    type: str
    phase: str
    net_index: int
    categories: dict[str, int] = dataclasses.field(default_factory=lambda: defaultdict(int))
    buffers: list[Buffer] = dataclasses.field(default_factory=list)
    inner: list[LayerMemory] = dataclasses.field(default_factory=list)
    """The layers of the net inside this one (RecurrentLayer's unrolled net), already in `categories`."""

    @property
    def bytes(self) -> int:
        return sum(self.categories.values())


@dataclasses.dataclass
class MemoryReport:
    """The footprint of one training job (train net, test nets, solver) on one engine."""

    engine: str
    layers: list[LayerMemory]
    context_bytes: int
    assumptions: list[str]
    memory_required_for_data: list[int]
    """Caffe's "Memory required for data" line of each net, train first."""
    construction_bytes: int = 0
    """Host memory right after the solver is built, before the first test pass (CPU engine only): each test net
    still holds its own filled copy of the weights until Solver::Test shares the train net's."""

    @property
    def categories(self) -> dict[str, int]:
        totals = dict.fromkeys(CATEGORIES, 0)
        for layer in self.layers:
            for category, value in layer.categories.items():
                totals[category] += value
        totals[CONTEXT] += self.context_bytes
        return totals

    @property
    def steady_bytes(self) -> int:
        """After one training iteration and one test pass: what the job then holds until it ends."""
        return sum(self.categories.values())

    @property
    def total_bytes(self) -> int:
        """The peak: the steady state, or the state after construction when that is larger."""
        return max(self.steady_bytes, self.construction_bytes)


def _allocation(nbytes: int, options: MemoryOptions, single: bool = True) -> int:
    """What one malloc of `nbytes` costs on the CPU engine (glibc's chunk header and rounding; a chunk served by
    mmap is whole pages), or on a GPU engine the bytes themselves. `single` False: the bytes of several
    allocations a rule added up, charged the header once."""
    if nbytes <= 0:
        return 0
    if options.engine != ENGINE_CPU:
        return pool_allocation(nbytes) if options.flavour == NVCAFFE else nbytes
    if single and nbytes >= CPU_MMAP_THRESHOLD:
        chunk = ((nbytes + CPU_SIZE_BYTES + CPU_ALIGNMENT - 1) & ~(CPU_ALIGNMENT - 1)) + CPU_SIZE_BYTES
        return -(-chunk // CPU_PAGE_BYTES) * CPU_PAGE_BYTES
    return nbytes + CPU_ALLOCATION_OVERHEAD


def cpu_bookkeeping_bytes(net: Net, layers: Sequence[LayerMemory], learnable: bool) -> int:
    """Caffe's own objects for one net on the CPU engine, beyond the bytes of its blobs: per layer, per blob, per
    param blob (`learnable`: the train net, whose owned params have solver state) and per internal blob."""
    total = CPU_BLOB_BYTES * len(net.blobs) + CPU_PARAM_BYTES * len(net.params)
    if learnable:
        total += CPU_LEARNABLE_PARAM_BYTES * sum(1 for param in net.params if param.owner is None)
    for layer, memory in zip(net.layers, layers):
        extra = CPU_LAYER_TYPE_BYTES.get(layer.type)
        if extra is None:
            # A layer with a net inside (LSTM, RNN) holds one more set of objects per inner layer with internal
            # blobs, beyond the inner net's own bookkeeping: the LSTM and RNN measurements of test_core_layers
            # (mallinfo2, 40 timesteps) come to -0.32% and -0.43% with it, -0.37% and -0.62% without.
            extra = CPU_LAYER_BUFFER_BYTES * (
                sum(
                    1 for buffer in memory.buffers
                    if buffer.category == LAYER_BUFFERS and not buffer.name.endswith(".diff")
                )
                + sum(1 for inner in memory.inner if inner.categories.get(LAYER_BUFFERS, 0) > 0)
            )
        elif layer.type == "LRN" and layer.param.lrn_param.norm_region == layer.param.lrn_param.WITHIN_CHANNEL:
            extra += CPU_LRN_WITHIN_CHANNEL_BYTES
        elif layer.type == "Scale" and layer.param.scale_param.bias_term:
            extra += CPU_SCALE_BIAS_BYTES
        elif layer.type == "InnerProduct" and not layer.param.inner_product_param.bias_term:
            extra = 0  # its only own blob is bias_multiplier_
        total += CPU_LAYER_BYTES + extra
    return total


SUBNET_OWN_ELSEWHERE = frozenset({PARAMS, PARAM_DIFFS, SOLVER_HISTORY})
"""What a layer's inner net has that the outer net counts: its params are the layer's own (counted with the outer
net's params, their gradients and solver state)."""


def net_memory(
    net: Net,
    options: MemoryOptions,
    net_index: int = 0,
    shared_param_layers: Iterable[str] = (),
    external_blobs: frozenset[str] = frozenset(),
) -> list[LayerMemory]:
    """Per-layer memory of one net. `shared_param_layers` names the layers whose params are the train net's
    (Net::ShareTrainedLayersWith for test nets), so their data is not counted again. `external_blobs` names blobs
    whose data and diff belong to an enclosing net (an unrolled net's inputs and output)."""
    # Bytes per element of each layer's data and diff (NVcaffe's forward/backward types; float in BVLC).
    storage = [layer_storage(net.param, layer.param) for layer in net.layers]
    result = [LayerMemory(layer.name, layer.type, net.phase, net_index) for layer in net.layers]
    external: set[int] = {blob.id for blob in net.blobs if blob.name in external_blobs} if external_blobs else set()
    for layer in net.layers:
        if layer.setup.details.get("external_tops"):
            external.update(layer.tops)
    # Which blob buffers are touched, each charged to the layer that produces the blob.
    for blob_id, producer in _data_owners(net, options, external).items():
        result[producer].categories[ACTIVATIONS] += _allocation(
            net.blobs[blob_id].capacity * storage[producer][0], options
        )
    for blob_id in _touched_diffs(net, options, external):
        producer = net.blobs[blob_id].producer
        result[producer].categories[ACTIVATION_DIFFS] += _allocation(
            net.blobs[blob_id].capacity * storage[producer][1], options
        )
    _count_params(net, options, storage, result, set(shared_param_layers))
    _count_buffers(net, options, storage, result)
    return result


def _data_owners(net: Net, options: MemoryOptions, external: set[int]) -> dict[int, int]:
    """The blobs whose data this net allocates, by id, with the layer that produces each: not a top that shares
    another blob's data, nor an enclosing net's, nor (on a GPU) a top written on the host that never reaches it."""
    owners = {
        blob.id: blob.producer for blob in net.blobs if blob.data_of is None and blob.id not in external
    }
    if options.on_gpu:
        # A top written on the host (an Accuracy, a loss of weight 0) that no layer reads never reaches the device.
        consumed = {blob_id for layer in net.layers for blob_id in layer.bottoms}
        for layer in net.layers:
            if layer.rule is None:
                continue
            for index in layer.rule.host_tops(layer.ctx, options.engine):
                if index >= len(layer.tops):
                    continue
                host = net.blobs[layer.tops[index]]
                if host.id not in consumed and not host.loss_weight and host.data_of is None:
                    owners.pop(host.id, None)
    return owners


def _touched_diffs(net: Net, options: MemoryOptions, external: set[int]) -> set[int]:
    """The blobs whose diff something touches (the blob that owns a shared diff): a loss weight at set-up, a GPU
    forward that clears a bottom's diff, and in a TRAIN net the backward of every layer that needs it."""
    touched: set[int] = set()

    def touch_diff(blob_id: int) -> None:
        blob = net.blobs[blob_id]
        root = blob.diff_of if blob.diff_of is not None else blob_id
        if root not in external:
            touched.add(root)

    for blob in net.blobs:
        if blob.loss_weight:
            touch_diff(blob.id)  # Layer::SetLossWeights writes the weight into the diff at set-up
    if options.on_gpu:
        for layer in net.layers:
            if layer.rule is not None:
                for index in layer.rule.forward_bottom_diffs(layer.ctx, options.engine):
                    touch_diff(layer.bottoms[index])
    if net.phase == PHASE_TRAIN:
        for layer in net.layers:
            if not layer.need_backward:
                continue
            for blob_id in layer.tops:
                touch_diff(blob_id)
            rule = layer.rule
            for index, (blob_id, needed) in enumerate(zip(layer.bottoms, layer.bottom_need_backward)):
                if needed or (rule is not None and rule.writes_bottom_diff_always(layer.ctx, options.engine, index)):
                    touch_diff(blob_id)
    return touched


def _count_params(
    net: Net, options: MemoryOptions, storage: Sequence[tuple[int, int]], result: list[LayerMemory], shared: set[str]
) -> None:
    """Each learnable param once (a shared one by its owner): its data unless it is the train net's, and in a TRAIN
    net its diff and the solver's history of it."""
    training = net.phase == PHASE_TRAIN
    state_blobs = SOLVER_STATE_BLOBS[options.solver_type][ENGINE_GPU if options.on_gpu else ENGINE_CPU]
    if options.l1_regularization and (options.on_gpu or options.solver_type not in CPU_SOLVERS_USING_TEMP):
        state_blobs += 1
    for param in net.params:
        if param.owner is not None:
            continue
        layer = net.layers[param.layer]
        data_size, diff_size = storage[param.layer]
        nbytes = _allocation(param.count * data_size, options)
        if layer.name not in shared:
            result[param.layer].categories[PARAMS] += nbytes
        if training:
            result[param.layer].categories[PARAM_DIFFS] += _allocation(param.count * diff_size, options)
            result[param.layer].categories[SOLVER_HISTORY] += state_blobs * _allocation(
                param.count * options.history_itemsize, options
            )


def _count_buffers(
    net: Net, options: MemoryOptions, storage: Sequence[tuple[int, int]], result: list[LayerMemory]
) -> None:
    """Every layer's internal buffers, as its rule gives them for the engine, and the nets inside layers."""
    training = net.phase == PHASE_TRAIN
    for layer, memory in zip(net.layers, result):
        if layer.rule is None:
            continue
        # The rule sees whether backward runs in this count: as the net was built (net.py sets it), or for a net
        # counted as TEST (an inner net whose layer runs no backward) on a copy: a built net is never changed.
        ctx = layer.ctx
        if ctx.need_backward != (training and layer.need_backward) or (not training and ctx.bottom_need_backward):
            ctx = ctx.counted(training and layer.need_backward,
                              list(layer.bottom_need_backward) if training else [])
        for buffer in layer.rule.buffers(ctx, layer.setup, options.engine):
            if options.on_gpu and buffer.host_only:
                continue
            # A rule gives bytes (itemsize 1) for what it added up over many allocations (a reader's queued
            # records): no page rounding for the sum.
            size = buffer.bytes
            if buffer.itemsize == FLOAT_BYTES and buffer.category != DATA_PREFETCH and storage[layer.index][0] != 4:
                size = buffer.count * storage[layer.index][0]  # an NVcaffe layer's Ftype blobs
            nbytes = _allocation(size, options, single=buffer.itemsize != 1)
            if nbytes:
                memory.categories[buffer.category] += nbytes
                memory.buffers.append(buffer)
        if layer.setup.subnet is not None:
            _count_subnet(layer.setup.subnet, ctx.need_backward, memory, options)


def _count_subnet(subnet: SubNet, runs_backward: bool, memory: LayerMemory, options: MemoryOptions) -> None:
    """A net inside a layer (RecurrentLayer's unrolled net), counted with the layer, recursively: its blobs and
    layer buffers less the blobs it shares with the outer net and its params (the layer's own, counted as the outer
    net's); on the CPU, its own bookkeeping too. It runs backward when the layer does."""
    net = subnet.net
    counted = net if runs_backward or net.phase != PHASE_TRAIN else dataclasses.replace(net, phase=PHASE_TEST)
    inner = net_memory(counted, options, external_blobs=subnet.shared_blobs)
    for layer in inner:
        for category, nbytes in layer.categories.items():
            if category not in SUBNET_OWN_ELSEWHERE and nbytes:
                memory.categories[category] += nbytes
    if options.engine == ENGINE_CPU:
        owned = sum(1 for param in net.params if param.owner is None)
        memory.categories[CONTEXT] += cpu_bookkeeping_bytes(net, inner, learnable=False) - owned * CPU_PARAM_BYTES
    memory.inner = inner


def share_trained_layers(train: Net, test: Net) -> list[str]:
    """Net::ShareTrainedLayersWith: test layers named like a train layer use its params (same shapes required)."""
    train_layers = {layer.name: layer for layer in train.layers}
    shared = []
    for layer in test.layers:
        source = train_layers.get(layer.name)
        if source is None or not source.params:
            continue
        source_shapes = [train.params[i].shape for i in source.params]
        target_shapes = [test.params[i].shape for i in layer.params]
        if len(source_shapes) != len(target_shapes):
            raise ShapeError(
                f"has {len(target_shapes)} param blobs in the TEST net but {len(source_shapes)} in the TRAIN net",
                source=layer.ctx.source, line=layer.line, layer=layer.name, layer_type=layer.type, field="param",
            )
        for index, (a, b) in enumerate(zip(source_shapes, target_shapes)):
            if a != b:
                raise ShapeError(
                    f"param {index} has shape {list(b)} in the TEST net but {list(a)} in the TRAIN net; the test net "
                    "shares the train net's weights, so they must match",
                    source=layer.ctx.source, line=layer.line, layer=layer.name, layer_type=layer.type, field="param",
                )
        shared.append(layer.name)
    return shared


def job_memory(train: Net, tests: Sequence[Net], options: MemoryOptions) -> MemoryReport:
    """The footprint of a training job: the train net, each test net (sharing the train net's params), solver."""
    per_net = [net_memory(train, options, 0)]
    for index, test in enumerate(tests, start=1):
        per_net.append(net_memory(test, options, index, share_trained_layers(train, test)))
    layers = [layer for net_layers in per_net for layer in net_layers]
    # What the rules took as given for want of a shape (a DetectNet label LMDB's layout...), once each.
    assumed = (note for net in (train, *tests) for layer in net.layers for note in layer.ctx.assumed)
    assumptions = list(dict.fromkeys(assumed))
    context, notes = process_context((train, *tests), per_net, options, train)
    assumptions.extend(notes)
    nvcaffe_nets = any(flavour_of(net.param) == NVCAFFE for net in (train, *tests) if net.param is not None)
    if options.flavour == NVCAFFE or nvcaffe_nets:  # an NVcaffe solver trains BVLC-schema nets with NVcaffe too
        assumptions.extend(nvcaffe_semantics(layers, options))
    if any(layer.from_oracle for net in (train, *tests) for layer in net.layers):
        names = sorted({layer.name for net in (train, *tests) for layer in net.layers if layer.from_oracle})
        assumptions.append(f"shapes of {', '.join(names)} came from pycaffe; their internal buffers are not counted")
    construction = 0
    if options.engine == ENGINE_CPU:
        # Before the first test pass every test net holds its own filled weights; the data layers' prefetch
        # batches and reader queues already exist. Activations, gradients and solver state come later.
        construction = context + sum(
            layer.categories.get(DATA_PREFETCH, 0) + (layer.categories.get(PARAMS, 0) if layer.phase == PHASE_TRAIN else 0)
            for layer in layers
        )
        construction += sum(
            _allocation(param.count * FLOAT_BYTES, options) for test in tests for param in test.params if param.owner is None
        )
    return MemoryReport(
        construction_bytes=construction,
        engine=options.engine,
        layers=layers,
        context_bytes=context,
        assumptions=assumptions,
        memory_required_for_data=[net.memory_required_for_data for net in (train, *tests)],
    )


def process_context(
    nets: Sequence[Net], per_net: Sequence[Sequence[LayerMemory]], options: MemoryOptions, learnable: Net | None,
    process: str = "the training process",
) -> tuple[int, list[str]]:
    """What one Caffe process holding `nets` costs beyond their blobs, and the notes that say so: on the CPU its
    runtime, data threads and bookkeeping (`learnable`: the net whose params have solver state, None in a process
    without a solver), on GPU engines the CUDA context and the cuDNN handles."""
    context, notes = 0, []
    if options.engine == ENGINE_CPU:
        threads = sum(
            2 if layer.type == "Data" else 1
            for net in nets
            for layer in net.layers
            if layer.type in ("Data", "ImageData", "WindowData")
        )
        layer_count = sum(len(net.layers) for net in nets)
        context = CPU_RUNTIME_BYTES + threads * CPU_THREAD_BYTES + sum(
            cpu_bookkeeping_bytes(net, net_layers, net is learnable) for net, net_layers in zip(nets, per_net)
        )
        notes.append(
            f"Caffe's own bookkeeping in {process}: {format_size(context)} "
            f"(protobuf descriptors, {threads} data threads, {layer_count} layers)"
        )
    if options.on_gpu:
        context = options.cuda_context_bytes
        notes.append(
            f"CUDA context and library handles: {format_size(options.cuda_context_bytes)} (a per-machine constant)"
        )
    if options.engine == ENGINE_CUDNN:
        handles = sum(
            layer.setup.details.get("group", 1) * 3
            for net in nets
            for layer in net.layers
            if layer.type in ("Convolution", "Deconvolution") and layer.setup.details.get("cudnn")
        )
        context += handles * options.cudnn_handle_bytes
        notes.append(
            "cuDNN workspace: per convolution, one group's im2col matrix capped at BVLC's 8 MiB limit, "
            "x group x 3 streams (the algorithm cuDNN picks is only known on the GPU)"
        )
    return context, notes


def nvcaffe_semantics(layers: Sequence[LayerMemory], options: MemoryOptions) -> list[str]:
    """NVcaffe's one cuDNN workspace per device (GPUMemory::workspace_, shared by every convolution of every net of
    the solver, cudnn_conv_layer.cpp) instead of BVLC's per layer: only the largest layer's figure stays. Says what
    the NVcaffe model assumes."""
    notes = [NVCAFFE_UNVERIFIED]
    if options.on_gpu:
        notes.append("NVcaffe's GPU pool (cub::CachingDeviceAllocator, bins 2^6..2^22) rounds each allocation up to "
                     "a power of two up to 4 MiB")
    workspaces = [layer for layer in layers if layer.categories.get(WORKSPACE)]
    if workspaces:
        largest = max(workspaces, key=lambda layer: layer.categories[WORKSPACE])
        for layer in workspaces:
            if layer is not largest:
                layer.categories[WORKSPACE] = 0
        notes.append(f"NVcaffe shares one cuDNN workspace between all convolutions: the largest, "
                     f"{largest.categories[WORKSPACE] / MiB:.1f} MiB for {largest.name}")
    if options.history_itemsize != FLOAT_BYTES:
        notes.append(f"solver history stored in {options.history_itemsize} bytes per value (solver_data_type)")
    return notes
