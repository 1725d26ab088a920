"""A net as Caffe builds it for one phase: filtered layers, split layers, blobs, shapes, params, backward flags.

This is Net::Init (src/caffe/net.cpp) in Python: FilterNet's NetStateRule semantics, InsertSplits, in-place
tops, automatic loss tops, shared params, and the need-backward analysis, with shapes from the layer rules
instead of real blobs. Blob and layer names match pycaffe's, split blobs included, so results compare one to one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .cost import Meter
from .errors import BlobLimitError, BuildLimitError, NetError, ShapeError, UnsupportedLayerError
from .flavour import NVCAFFE, flavour_of, schema
from .layers import DeferToPycaffe, LayerContext, LayerRule, LayerSetup, Shape, count_of, rule_for
from .layers.base import FLOAT_BYTES, INT_MAX, PHASE_TEST, PHASE_TRAIN, InputDefault, check_layer_fillers
from .proto import caffe_pb2
from .sanitize import opened_field, refusal, sanitized

PHASES = {PHASE_TRAIN: caffe_pb2.TRAIN, PHASE_TEST: caffe_pb2.TEST}

ShapeOracle = Callable[[Any, str], Mapping[str, tuple[list[Shape], list[Shape]]]]
"""Asks real Caffe for shapes: (NetParameter, phase) -> layer name -> (tops, params). The net it is given holds
Input layers for what the rules shaped, then the layers it must shape, with no layer that opens a file or imports
code and no path-bearing field (`core.sanitize`)."""


@dataclasses.dataclass
class Blob:
    id: int
    name: str
    shape: Shape
    producer: int
    loss_weight: float = 0.0
    data_of: int | None = None
    """Id of the blob whose data this one shares (Flatten, Reshape, Split tops); None when it owns its data."""
    diff_of: int | None = None
    """Id of the blob whose diff this one shares (Flatten, Reshape tops); None when it owns its diff."""
    need_backward: bool = False
    capacity: int = 0
    """Elements of its buffers: the largest count it had (an in-place layer may reshape it larger)."""

    @property
    def count(self) -> int:
        return count_of(self.shape)


@dataclasses.dataclass
class Param:
    id: int
    layer: int
    index: int
    shape: Shape
    name: str
    lr_mult: float
    owner: int | None = None
    """Id of the param this one shares storage with (same ParamSpec name earlier in the net), None when owned."""

    @property
    def count(self) -> int:
        return count_of(self.shape)


@dataclasses.dataclass
class Layer:
    index: int
    name: str
    type: str
    param: Any
    rule: LayerRule | None
    ctx: LayerContext
    setup: LayerSetup
    bottoms: list[int]
    tops: list[int]
    params: list[int] = dataclasses.field(default_factory=list)
    need_backward: bool = False
    bottom_need_backward: list[bool] = dataclasses.field(default_factory=list)
    param_need_backward: list[bool] = dataclasses.field(default_factory=list)
    source_index: int | None = None
    line: int | None = None
    from_oracle: bool = False
    top_counts: list[int] = dataclasses.field(default_factory=list)
    """Each top's count right after this layer's set-up (what Caffe's "Memory required for data" adds up)."""


@dataclasses.dataclass
class Net:
    name: str
    phase: str
    layers: list[Layer]
    blobs: list[Blob]
    params: list[Param]
    force_backward: bool
    param: Any = None
    """The NetParameter the net was built from (before filtering), for `input_net`."""

    @property
    def memory_required_for_data(self) -> int:
        """Caffe's "Memory required for data" log line: every top's count, in-place tops counted again."""
        return sum(count for layer in self.layers for count in layer.top_counts) * FLOAT_BYTES

    def blob(self, name: str) -> Blob:
        for blob in reversed(self.blobs):
            if blob.name == name:
                return blob
        raise KeyError(name)


# ---------------------------------------------------------------------------------------------- filtering


def net_state(net_param: Any, phase: str, extra_state: Any | None = None) -> Any:
    """The NetState Caffe uses: the phase, merged with the net's own state and the solver's train/test state."""
    state = schema(flavour_of(net_param)).NetState()
    state.phase = PHASES[phase]
    state.MergeFrom(net_param.state)
    if extra_state is not None:
        # By value: an NVcaffe solver's state may meet a BVLC net (NetState is the same message in both schemas).
        state.MergeFromString(extra_state.SerializeToString())
    return state


def state_meets_rule(state: Any, rule: Any) -> bool:
    """Net::StateMeetsRule."""
    if rule.HasField("phase") and rule.phase != state.phase:
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        return False
    stages = set(state.stage)
    if any(stage not in stages for stage in rule.stage):
        return False
    return not any(stage in stages for stage in rule.not_stage)


def filter_layers(net_param: Any, state: Any, source: str, lines: Sequence[int | None]) -> list[tuple[int, Any]]:
    """Net::FilterNet: the (index, layer) pairs the state includes, in order."""
    kept = []
    for index, layer in enumerate(net_param.layer[:]):
        include, exclude = layer.include[:], layer.exclude[:]
        if include and exclude:
            raise NetError(
                "specify either include rules or exclude rules, not both",
                source=source,
                line=_line(lines, index),
                layer=layer.name,
                layer_type=layer.type,
                field="include",
            )
        included = not include
        if any(state_meets_rule(state, rule) for rule in exclude):
            included = False
        if any(state_meets_rule(state, rule) for rule in include):
            included = True
        if included:
            kept.append((index, layer))
    return kept


def _line(lines: Sequence[int | None], index: int | None) -> int | None:
    if index is None or index >= len(lines):
        return None
    return lines[index]


# ---------------------------------------------------------------------------------------------- splits


def insert_splits(
    layers: list[tuple[int | None, Any]], source: str, lines: Sequence[int | None]
) -> list[tuple[int | None, Any]]:
    """InsertSplits (src/caffe/util/insert_splits.cpp): a Split layer wherever a top feeds several consumers."""
    last_top: dict[str, tuple[int, int]] = {}
    bottom_source: dict[tuple[int, int], tuple[int, int]] = {}
    consumers: dict[tuple[int, int], int] = {}
    loss_weights: dict[tuple[int, int], float] = {}
    names = [layer.name for _, layer in layers]
    # Repeated fields are read by slicing: a list in one call, where iterating the pure-Python container costs a
    # call per element (most of preparing a ResNet-152).
    for i, (orig, layer) in enumerate(layers):
        tops = layer.top[:]
        for j, blob in enumerate(layer.bottom[:]):
            if blob not in last_top:
                raise NetError(
                    f"unknown bottom blob {blob!r} (bottom index {j}): no earlier layer in this phase produces it",
                    source=source,
                    line=_line(lines, orig),
                    layer=layer.name,
                    layer_type=layer.type,
                    field="bottom",
                )
            top_idx = last_top[blob]
            bottom_source[(i, j)] = top_idx
            consumers[top_idx] = consumers.get(top_idx, 0) + 1
        for j, blob in enumerate(tops):
            last_top[blob] = (i, j)
        for j, weight in enumerate(layer.loss_weight[: len(tops)]):
            top_idx = last_top[tops[j]]
            loss_weights[top_idx] = weight
            if weight:
                consumers[top_idx] = consumers.get(top_idx, 0) + 1

    split_index: dict[tuple[int, int], int] = {}
    result: list[tuple[int | None, Any]] = []
    for i, (orig, original) in enumerate(layers):
        # Copied only when renamed below: the parsed net is shared by every phase and build, and most layers of
        # a net keep their bottoms (copying them all was a third of preparing a ResNet).
        layer = original
        for j in range(len(original.bottom)):
            top_idx = bottom_source[(i, j)]
            if consumers.get(top_idx, 0) > 1:
                if layer is original:
                    layer = _copy(original)
                k = split_index.get(top_idx, 0)
                split_index[top_idx] = k + 1
                layer.bottom[j] = _split_blob_name(names[top_idx[0]], layer.bottom[j], top_idx[1], k)
        position = len(result)
        result.append((orig, layer))
        for j, top in enumerate(original.top[:]):
            top_idx = (i, j)
            count = consumers.get(top_idx, 0)
            if count > 1:
                loss_weight = loss_weights.get(top_idx, 0.0)
                split = type(original)()  # the net's own schema (BVLC or NVcaffe)
                split.bottom.append(top)
                split.name = f"{top}_{names[i]}_{j}_split"
                split.type = "Split"
                for k in range(count):
                    split.top.append(_split_blob_name(names[i], top, j, k))
                    if loss_weight:
                        split.loss_weight.append(loss_weight if k == 0 else 0.0)
                if loss_weight:
                    if layer is original:
                        layer = _copy(original)
                        result[position] = (orig, layer)
                    layer.ClearField("loss_weight")
                    split_index[top_idx] = split_index.get(top_idx, 0) + 1
                result.append((None, split))
    return result


def _copy(layer: Any) -> Any:
    copy = type(layer)()
    copy.CopyFrom(layer)
    return copy


def _split_blob_name(layer_name: str, blob_name: str, blob_idx: int, split_idx: int) -> str:
    return f"{blob_name}_{layer_name}_{blob_idx}_split_{split_idx}"


# ---------------------------------------------------------------------------------------------- building


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """One layer as Net::Init sees it, read out of its LayerParameter once: everything that does not depend on the
    batch size, so that estimating at many batch sizes does not walk the protobuf messages again."""

    orig: int | None
    """Index in the NetParameter the layer came from; None for an inserted Split layer."""
    param: Any
    line: int | None
    name: str
    type: str
    bottoms: tuple[str, ...]
    tops: tuple[str, ...]
    propagate_down: tuple[bool, ...]
    loss_weight: tuple[float, ...]
    param_specs: tuple[tuple[str, float, int], ...]
    """(name, lr_mult, share_mode) of each ParamSpec given."""
    rule: LayerRule | None


@dataclasses.dataclass(frozen=True)
class PreparedNet:
    """A net filtered for a phase and state, with Caffe's Split layers inserted: the batch-independent half of
    Net::Init. `build_net` shapes it for a batch."""

    net_param: Any
    phase: str
    source: str
    lines: tuple[int | None, ...]
    filtered: list[tuple[int, Any]]
    layers: tuple[LayerSpec, ...]
    memos: tuple[dict[Any, Any], ...]
    """One `LayerContext.memo` per layer, shared by every build of this prepared net."""
    input_defaults: Mapping[str, InputDefault] = dataclasses.field(default_factory=dict)
    """Blob name -> what the data top of that name holds when no shape is given for it, declared by the rule of a
    layer that reads it (`LayerRule.input_defaults`)."""


def prepare_net(
    net_param: Any,
    phase: str,
    *,
    source: str = "net.prototxt",
    lines: Sequence[int | None] = (),
    state: Any | None = None,
) -> PreparedNet:
    """Filter `net_param` for `phase` (merged with the solver's `state`) and insert the Split layers."""
    net_state_ = net_state(net_param, phase, state)
    filtered = filter_layers(net_param, net_state_, source, lines)
    layers_in = insert_splits([(index, layer) for index, layer in filtered], source, lines)
    specs = []
    flavour = flavour_of(net_param)
    for orig, param in layers_in:
        specs.append(
            LayerSpec(
                orig=orig,
                param=param,
                line=_line(lines, orig),
                name=param.name,
                type=param.type,
                bottoms=tuple(param.bottom[:]),
                tops=tuple(param.top[:]),
                propagate_down=tuple(bool(flag) for flag in param.propagate_down[:]),
                loss_weight=tuple(param.loss_weight[:]),
                param_specs=tuple((spec.name, spec.lr_mult, spec.share_mode) for spec in param.param[:]),
                rule=rule_for(param.type, flavour),
            )
        )
    defaults: dict[str, InputDefault] = {}
    for spec in specs:
        if spec.rule is None or spec.orig is None:
            continue
        written = net_param.layer[spec.orig].bottom  # as written: a Split layer may feed the bottom by now
        for index, default in spec.rule.input_defaults(spec.param).items():
            if index < len(written):
                defaults.setdefault(written[index], default)
    return PreparedNet(
        net_param, phase, source, tuple(lines), filtered, tuple(specs), tuple({} for _ in specs), defaults
    )


_DEFAULT_PARAM_SPEC = ("", 1.0, caffe_pb2.ParamSpec.STRICT)  # ParamSpec's proto defaults


def build_net(
    net_param: Any,
    phase: str,
    *,
    source: str = "net.prototxt",
    lines: Sequence[int | None] = (),
    state: Any | None = None,
    data_shapes: Mapping[str, Shape] | None = None,
    batch_override: int | None = None,
    oracle: ShapeOracle | None = None,
    prepared: PreparedNet | None = None,
    meter: Meter | None = None,
) -> Net:
    """Build the net Caffe would build for `phase`, with every blob's shape.

    `state` is the solver's train_state/test_state for this net; `data_shapes` gives the per-item shape of data
    tops whose shape Caffe reads from the dataset (by top name or ``layer/top``); `batch_override` replaces the
    batch size of every data layer. `prepared` (from `prepare_net` with the same arguments) skips the filtering.
    `meter` counts the layers set up (and stops the build past its deadline: `cost.TimeUp`); whatever it is, a
    build that would set up more than `cost.MAX_BUILD_LAYERS` layers, those of the nets its layers hold included,
    is a `cost.BuildLimitError`.
    """
    if prepared is None:
        prepared = prepare_net(net_param, phase, source=source, lines=lines, state=state)
    if meter is None:
        meter = Meter()
    meter.start_build()
    return _build_prepared(prepared, data_shapes, batch_override, oracle, meter)


def _build_prepared(
    prepared: PreparedNet,
    data_shapes: Mapping[str, Shape] | None,
    batch_override: int | None,
    oracle: ShapeOracle | None,
    meter: Meter,
) -> Net:
    """`build_net`'s work, counted in the current build of `meter`."""
    net_param, source = prepared.net_param, prepared.source
    shapes = dict(data_shapes or {})
    phase_built = prepared.phase
    reached = meter.add(len(prepared.layers))
    if reached is not None:
        raise BuildLimitError(
            f"building the net at this batch would set up {reached} layers or more, the nets its recurrent layers "
            f"unroll included; the estimator builds at most {meter.build_limit}",
            source=source,
        )

    def build_subnet(subnet_param: Any) -> Net:
        """A net a layer holds inside (RecurrentLayer's unrolled net): built like this one, in its phase, as part
        of this build."""
        subnet = prepare_net(subnet_param, phase_built, source=source or "net.prototxt")
        return _build_prepared(subnet, None, None, None, meter)
    pycaffe_note = ""
    if oracle is not None and flavour_of(net_param) == NVCAFFE:
        # pycaffe here is BVLC's: it can neither read an NVcaffe net nor build its layers the way NVcaffe does.
        oracle, pycaffe_note = None, "; this is an NVcaffe net, which BVLC's pycaffe cannot shape"

    blobs: list[Blob] = []
    params: list[Param] = []
    layers: list[Layer] = []
    blob_by_name: dict[str, int] = {}
    available: set[str] = set()
    param_owner_by_name: dict[str, int] = {}
    oracle_shapes: Mapping[str, tuple[list[Shape], list[Shape]]] | None = None
    PERMISSIVE = caffe_pb2.ParamSpec.PERMISSIVE

    for layer_index, spec in enumerate(prepared.layers):
        meter.tick()
        param, line, name_, type_ = spec.param, spec.line, spec.name, spec.type
        if spec.propagate_down and len(spec.propagate_down) != len(spec.bottoms):
            raise ShapeError(
                f"propagate_down must be given 0 or {len(spec.bottoms)} times (once per bottom), "
                f"got {len(spec.propagate_down)}",
                source=source, line=line, layer=name_, layer_type=type_, field="propagate_down",
            )
        bottom_ids = []
        for bottom_index, name in enumerate(spec.bottoms):
            if name not in available:
                raise NetError(
                    f"unknown bottom blob {name!r} (bottom index {bottom_index})",
                    source=source, line=line, layer=name_, layer_type=type_, field="bottom",
                )
            bottom_ids.append(blob_by_name[name])
            available.discard(name)

        rule = spec.rule
        ctx = LayerContext(
            param,
            [blobs[i].shape for i in bottom_ids],
            prepared.phase,
            source=source,
            line=line,
            data_shapes=shapes,
            batch_override=batch_override,
            memo=prepared.memos[layer_index],
            name=name_,
            layer_type=type_,
            build_subnet=build_subnet,
            input_defaults=prepared.input_defaults,
        )
        from_oracle = False
        setup = None
        unsupported: str | None = None
        if rule is not None:
            # The blob counts and the fillers depend on the definition only: checked at the first build of a
            # prepared net, remembered in its memo once they pass.
            structure_checked = ctx.memo.get("structure checked", False)
            if not structure_checked:
                rule.bottoms.check(len(bottom_ids), "bottom", ctx)
                num_tops = len(spec.tops)
                if rule.auto_top_blobs:
                    num_tops = max(num_tops, rule.needed_tops())
                rule.tops.check(num_tops, "top", ctx)
            try:
                setup = rule.setup(ctx)
            except DeferToPycaffe as deferred:
                rule = None
                unsupported = f"{deferred}; only pycaffe can shape it" if str(deferred) else None
            else:
                if not structure_checked:
                    check_layer_fillers(ctx)
                    ctx.memo["structure checked"] = True
        if setup is None:
            if oracle is None:
                raise UnsupportedLayerError(
                    (unsupported or "layer type is not known to the estimator")
                    + (pycaffe_note or " (and no pycaffe fallback was given)"),
                    source=source, line=line, layer=name_, layer_type=type_, field="type",
                )
            if oracle_shapes is None or name_ not in oracle_shapes:
                # One question covers this layer and the rule-less ones after it, as far as the net can be sent
                # without a layer that opens a file; a layer past that asks again, with more already shaped.
                oracle_shapes = _ask_oracle(oracle, prepared, layers, blobs)
            if name_ not in oracle_shapes:
                raise UnsupportedLayerError(
                    "layer type is not known to the estimator, and pycaffe did not report its shapes",
                    source=source, line=line, layer=name_, layer_type=type_, field="type",
                )
            top_shapes, param_shapes = oracle_shapes[name_]
            setup = LayerSetup(tops=list(top_shapes), params=list(param_shapes))
            from_oracle = True
        if len(setup.tops) < len(spec.tops):
            raise ctx.error(f"produces {len(setup.tops)} top(s) but {len(spec.tops)} are named", field="top")
        for shape in setup.tops:
            _check_blob_size(shape, ctx)

        # Tops: in place when a top repeats the bottom at the same index, else a new blob.
        top_ids = []
        named_tops = len(spec.tops)
        for top_index, shape in enumerate(setup.tops):
            name = spec.tops[top_index] if top_index < named_tops else "(automatic)"
            in_place = (
                top_index < named_tops
                and top_index < len(spec.bottoms)
                and name == spec.bottoms[top_index]
                and name in blob_by_name
            )
            if in_place:
                blob_id = blob_by_name[name]
                if blobs[blob_id].shape != shape:
                    # The layer's Reshape reshapes the shared blob; its buffer grows when the count does.
                    blobs[blob_id].capacity = max(blobs[blob_id].capacity, count_of(shape))
                    blobs[blob_id].shape = shape
            else:
                if top_index < named_tops and name in blob_by_name:
                    raise ctx.error(f"top blob {name!r} is produced by more than one layer", field="top")
                blob_id = len(blobs)
                blobs.append(Blob(id=blob_id, name=name, shape=shape, producer=layer_index, capacity=count_of(shape)))
                if top_index < named_tops:
                    blob_by_name[name] = blob_id
            if top_index < named_tops:
                available.add(name)
            if not in_place:
                if top_index in setup.data_views:
                    source_blob = blobs[bottom_ids[setup.data_views[top_index]]]
                    blobs[blob_id].data_of = source_blob.data_of if source_blob.data_of is not None else source_blob.id
                if top_index in setup.diff_views:
                    source_blob = blobs[bottom_ids[setup.diff_views[top_index]]]
                    blobs[blob_id].diff_of = source_blob.diff_of if source_blob.diff_of is not None else source_blob.id
            top_ids.append(blob_id)

        # Loss weights (Layer::SetLossWeights): explicit, else 1 on a loss layer's first top. LossLayer::LayerSetUp
        # adds that 1 as the layer's only loss_weight, so a loss layer with more tops must give one per top.
        loss_weight = spec.loss_weight
        if not loss_weight and rule is not None and rule.is_loss and len(top_ids) != 1:
            raise ctx.error(
                f"a loss layer with {len(top_ids)} tops must give loss_weight once per top (Caffe adds a single "
                "default weight of 1 and then finds it does not match the tops)",
                field="loss_weight",
            )
        if loss_weight and len(loss_weight) != len(top_ids):
            raise ctx.error(
                f"loss_weight must be given once per top ({len(top_ids)}), got {len(loss_weight)}",
                field="loss_weight",
            )
        for top_index, blob_id in enumerate(top_ids):
            weight = 0.0
            if loss_weight:
                weight = loss_weight[top_index]
            elif rule is not None and rule.is_loss and top_index == 0:
                weight = 1.0
            blobs[blob_id].loss_weight = weight

        layer = Layer(
            index=layer_index, name=name_, type=type_, param=param, rule=rule, ctx=ctx, setup=setup,
            bottoms=bottom_ids, tops=top_ids, source_index=spec.orig, line=line, from_oracle=from_oracle,
            top_counts=[count_of(shape) for shape in setup.tops],
        )
        need_backward = any(blobs[i].need_backward for i in bottom_ids)
        # Net::AppendBottom: propagate_down, when given, replaces the blob's own need for backward.
        if spec.propagate_down:
            layer.bottom_need_backward = list(spec.propagate_down)
        else:
            layer.bottom_need_backward = [blobs[i].need_backward for i in bottom_ids]

        # Params (Net::AppendParam): a named param shared with an earlier one keeps one storage.
        if len(spec.param_specs) > len(setup.params):
            raise ctx.error(
                f"has {len(spec.param_specs)} param specs but the layer has {len(setup.params)} param blob(s)",
                field="param",
            )
        for param_index, shape in enumerate(setup.params):
            _check_blob_size(shape, ctx)
            spec_name, lr_mult, share_mode = (
                spec.param_specs[param_index] if param_index < len(spec.param_specs) else _DEFAULT_PARAM_SPEC
            )
            need_backward = need_backward or lr_mult != 0
            layer.param_need_backward.append(lr_mult != 0)
            owner = None
            if spec_name:
                if spec_name in param_owner_by_name:
                    owner = param_owner_by_name[spec_name]
                    owner_shape = params[owner].shape
                    strict = share_mode != PERMISSIVE
                    if (strict and owner_shape != shape) or count_of(owner_shape) != count_of(shape):
                        raise ctx.error(
                            f"shared param {spec_name!r} has shape {list(shape)} here but {list(owner_shape)} "
                            "where it is first defined",
                            field="param",
                        )
                else:
                    param_owner_by_name[spec_name] = len(params)
            params.append(
                Param(id=len(params), layer=layer_index, index=param_index, shape=shape, name=spec_name,
                      lr_mult=lr_mult, owner=owner)
            )
            layer.params.append(len(params) - 1)
        layer.need_backward = need_backward
        if need_backward:
            for blob_id in top_ids:
                blobs[blob_id].need_backward = True
        layers.append(layer)

    _prune_backward(layers, blobs)
    net = Net(
        name=net_param.name, phase=prepared.phase, layers=layers, blobs=blobs, params=params,
        force_backward=net_param.force_backward, param=net_param,
    )
    if net_param.force_backward:
        _force_backward(net)
    # What the rules' `buffers` read: whether backward runs through each layer (in TRAIN), and for which bottoms.
    training = prepared.phase == PHASE_TRAIN
    for layer in net.layers:
        layer.ctx.need_backward = training and layer.need_backward
        layer.ctx.bottom_need_backward = list(layer.bottom_need_backward) if training else []
    return net


MAX_BLOB_AXES = 32
"""Caffe's kMaxBlobAxes."""


def _check_blob_size(shape: Shape, ctx: LayerContext) -> None:
    """Blob::Reshape's CHECKs, in its order: at most 32 axes, each dimension a non-negative int, and the count
    checked against INT_MAX dimension by dimension (a later 0 does not excuse an earlier overflow). A blob of 0
    elements has no memory, and Caffe aborts (CHECK data_) the first time a layer touches it."""
    if len(shape) > MAX_BLOB_AXES:
        raise ctx.error(f"would create a blob of {len(shape)} axes; Caffe's limit is {MAX_BLOB_AXES}")
    count = 1
    for dim in shape:
        if dim < 0:
            raise ctx.error(f"would create a blob with a negative dimension {list(shape)}")
        if dim > INT_MAX or (count != 0 and dim > INT_MAX // count):
            error = BlobLimitError(
                f"would create a blob of {count_of(shape)} elements {list(shape)}; Caffe's limit is {INT_MAX} (INT_MAX)",
                source=ctx.source, line=ctx.line, layer=ctx.name, layer_type=ctx.type,
            )
            error.elements = count_of(shape)
            raise error
        count *= dim
    if count == 0:
        raise ctx.error(
            f"would create an empty blob {list(shape)}; Caffe aborts the first time a layer touches it (CHECK data_)"
        )


def _prune_backward(layers: list[Layer], blobs: list[Blob]) -> None:
    """The second half of Net::Init: skip backward for layers that do not contribute to any loss."""
    under_loss: set[str] = set()
    skip_backprop: set[str] = set()
    for layer in reversed(layers):
        contributes = False
        skip_propagate_down = True
        for blob_id in layer.tops:
            name = blobs[blob_id].name
            if blobs[blob_id].loss_weight or name in under_loss:
                contributes = True
            if name not in skip_backprop:
                skip_propagate_down = False
            if contributes and not skip_propagate_down:
                break
        if layer.need_backward and skip_propagate_down:
            layer.need_backward = False
            layer.bottom_need_backward = [False] * len(layer.bottoms)
        if not contributes:
            layer.need_backward = False
        for bottom_index, blob_id in enumerate(layer.bottoms):
            name = blobs[blob_id].name
            if contributes:
                under_loss.add(name)
            else:
                layer.bottom_need_backward[bottom_index] = False
            if not layer.bottom_need_backward[bottom_index]:
                skip_backprop.add(name)


def _force_backward(net: Net) -> None:
    for layer in net.layers:
        layer.need_backward = True
        for bottom_index, blob_id in enumerate(layer.bottoms):
            allowed = layer.rule.allow_force_backward(bottom_index) if layer.rule else True
            layer.bottom_need_backward[bottom_index] = layer.bottom_need_backward[bottom_index] or allowed
            net.blobs[blob_id].need_backward = net.blobs[blob_id].need_backward or layer.bottom_need_backward[
                bottom_index
            ]
        layer.param_need_backward = [True] * len(layer.params)


def _ask_oracle(
    oracle: ShapeOracle, prepared: PreparedNet, built: list[Layer], blobs: list[Blob]
) -> Mapping[str, tuple[list[Shape], list[Shape]]]:
    """The oracle's shapes for the rule-less layers from the next one to build (`len(built)`) on, keyed by name; its
    errors name a layer but not where it is written, so that is added."""
    try:
        oracle_param, asked = _oracle_net(prepared, built, blobs)
        answer = oracle(oracle_param, prepared.phase)
    except NetError as error:
        if error.source is None:
            error.source = prepared.source
            orig = next((index for index, layer in prepared.filtered if layer.name == error.layer), None)
            error.line = _line(prepared.lines, orig)
        raise
    return {name: shapes for name, shapes in answer.items() if name in asked}


def _oracle_net(prepared: PreparedNet, built: list[Layer], blobs: list[Blob]) -> tuple[Any, set[str]]:
    """The net pycaffe is asked to build, and the names of the rule-less layers it shapes.

    Every layer shaped so far becomes an Input layer of the blobs it created, at their shapes now (an in-place
    layer may have reshaped them since): pycaffe never sees a data layer, a Python layer or a layer that writes, and
    fills no weights it is not asked about. Then come the layers from the next one to build, sanitized (no
    include/exclude rules, no path-bearing field), up to the last rule-less one before the first layer that would
    open a file to be set up or is a data layer (a later question covers what lies past it). The first of them has
    no rule (or its rule deferred to pycaffe): if it opens a file to be set up (a data layer without a rule, such as
    AnnotatedData), it is refused here."""
    net_param = prepared.net_param
    oracle_param = caffe_pb2.NetParameter()
    oracle_param.name = net_param.name
    if net_param.force_backward:
        oracle_param.force_backward = True
    for layer in built:
        if layer.source_index is None:
            continue  # a split layer: Caffe inserts it again
        named = len(prepared.layers[layer.index].tops)
        created = [blobs[i] for i in layer.tops[:named] if blobs[i].producer == layer.index]
        if created:
            replacement = oracle_param.layer.add()
            replacement.name = layer.name
            replacement.type = "Input"
            for blob in created:
                replacement.top.append(blob.name)
                replacement.input_param.shape.add().dim.extend(blob.shape)
    pending: list[Any] = []
    asked: set[str] = set()
    sent = 0
    for position, spec in enumerate(prepared.layers[len(built) :]):
        if spec.orig is None:
            continue
        original = net_param.layer[spec.orig]  # its bottoms as written: Caffe inserts the splits again
        opened = opened_field(original)
        current = position == 0  # the layer being built: no rule, or its rule deferred to pycaffe
        if opened is not None:
            if current:
                raise refusal(original, opened)
            break
        if spec.rule is not None and spec.rule.is_data and not current:
            break
        pending.append(sanitized(original))
        if spec.rule is None or current:
            asked.add(spec.name)
            sent = len(pending)
    oracle_param.layer.extend(pending[:sent])
    return oracle_param, asked


def input_net(net: Net) -> Any:
    """The net Caffe would build for `net`'s phase, as a NetParameter pycaffe can build without any dataset: the
    layers the phase keeps (no include/exclude rules left, splits left for Caffe to insert again), each data
    layer replaced by an Input layer of the shapes computed for its tops, each path-bearing field cleared (a layer
    that opens a file to be set up, such as HDF5Output, stays: pycaffe_shapes refuses such a net)."""
    if net.param is None:
        raise ValueError("the net does not know the NetParameter it was built from")
    filtered = [(layer.source_index, net.param.layer[layer.source_index]) for layer in net.layers
                if layer.source_index is not None]
    return _input_net(net.param, filtered, net.layers, net.blobs)


def _input_net(net_param: Any, filtered: list[tuple[int, Any]], built: list[Layer], blobs: list[Blob]) -> Any:
    """The filtered net (before splits: Caffe inserts them again) with its data layers replaced by Input layers of
    the shapes computed for them, every layer sanitized."""
    oracle_param = caffe_pb2.NetParameter()
    oracle_param.name = net_param.name
    if net_param.force_backward:
        oracle_param.force_backward = True
    by_source = {layer.source_index: layer for layer in built if layer.source_index is not None}
    for orig, layer in filtered:
        built_layer = by_source.get(orig)
        if built_layer is not None and built_layer.rule is not None and built_layer.rule.is_data:
            replacement = oracle_param.layer.add()
            replacement.name = layer.name
            replacement.type = "Input"
            replacement.top.extend(layer.top)
            for blob_id in built_layer.tops[: len(layer.top)]:
                replacement.input_param.shape.add().dim.extend(blobs[blob_id].shape)
            continue
        oracle_param.layer.append(sanitized(layer))
    return oracle_param
