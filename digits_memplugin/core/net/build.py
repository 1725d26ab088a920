"""Net::Init's second half in Python: a prepared net set up layer by layer for a batch, each layer's shapes from
its rule (or pycaffe, for a layer no rule shapes), with Caffe's in-place tops, loss weights, shared params and
need-backward analysis."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..cost import Meter
from ..errors import BlobLimitError, BuildLimitError, NetError, ShapeError, UnsupportedLayerError
from ..flavour import NVCAFFE, flavour_of
from ..layers import DeferToPycaffe, LayerContext, LayerRule, LayerSetup, Shape, count_of
from ..layers.base import INT_MAX, PHASE_TRAIN, check_layer_fillers
from ..proto import caffe_pb2
from .model import Blob, Layer, Net, Param
from .prepare import LayerSpec, PreparedNet, prepare_net
from .pycaffe_net import ShapeOracle, ask_oracle

_DEFAULT_PARAM_SPEC = ("", 1.0, caffe_pb2.ParamSpec.STRICT)  # ParamSpec's proto defaults
_PERMISSIVE = caffe_pb2.ParamSpec.PERMISSIVE


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
    reached = meter.add(len(prepared.layers))
    if reached is not None:
        raise BuildLimitError(
            f"building the net at this batch would set up {reached} layers or more, the nets its recurrent layers "
            f"unroll included; the estimator builds at most {meter.build_limit}",
            source=prepared.source,
        )
    builder = _NetBuilder(prepared, dict(data_shapes or {}), batch_override, oracle, meter)
    for layer_index, spec in enumerate(prepared.layers):
        meter.tick()
        builder.append_layer(layer_index, spec)
    return builder.finish()


class _NetBuilder:
    """The state Net::Init keeps while it appends layers: the blobs and params so far, which blob each top name
    holds now, which names a later bottom may still take, and who first owns each named param."""

    def __init__(self, prepared: PreparedNet, shapes: dict[str, Shape], batch_override: int | None,
                 oracle: ShapeOracle | None, meter: Meter) -> None:
        self.prepared = prepared
        self.source = prepared.source
        self.shapes = shapes
        self.batch_override = batch_override
        self.meter = meter
        self.pycaffe_note = ""
        if oracle is not None and flavour_of(prepared.net_param) == NVCAFFE:
            # pycaffe here is BVLC's: it can neither read an NVcaffe net nor build its layers the way NVcaffe does.
            oracle, self.pycaffe_note = None, "; this is an NVcaffe net, which BVLC's pycaffe cannot shape"
        self.oracle = oracle
        self.blobs: list[Blob] = []
        self.params: list[Param] = []
        self.layers: list[Layer] = []
        self.blob_by_name: dict[str, int] = {}
        self.available: set[str] = set()
        self.param_owner_by_name: dict[str, int] = {}
        self.oracle_shapes: Mapping[str, tuple[list[Shape], list[Shape]]] | None = None

    def build_subnet(self, subnet_param: Any) -> Net:
        """A net a layer holds inside (RecurrentLayer's unrolled net): built like this one, in its phase, as part
        of this build."""
        subnet = prepare_net(subnet_param, self.prepared.phase, source=self.source or "net.prototxt")
        return _build_prepared(subnet, None, None, None, self.meter)

    def append_layer(self, layer_index: int, spec: LayerSpec) -> None:
        """One layer of Net::Init: its bottoms, its setup, its tops, their loss weights, its params."""
        bottom_ids = self._append_bottoms(spec)
        ctx = LayerContext(
            spec.param,
            [self.blobs[i].shape for i in bottom_ids],
            self.prepared.phase,
            source=self.source,
            line=spec.line,
            data_shapes=self.shapes,
            batch_override=self.batch_override,
            memo=self.prepared.memos[layer_index],
            name=spec.name,
            layer_type=spec.type,
            build_subnet=self.build_subnet,
            input_defaults=self.prepared.input_defaults,
        )
        rule, setup, from_oracle = self._set_up(spec, ctx, len(bottom_ids))
        if len(setup.tops) < len(spec.tops):
            raise ctx.error(f"produces {len(setup.tops)} top(s) but {len(spec.tops)} are named", field="top")
        for shape in setup.tops:
            _check_blob_size(shape, ctx)
        top_ids = self._append_tops(layer_index, spec, setup, bottom_ids, ctx)
        self._set_loss_weights(spec, rule, top_ids, ctx)
        layer = Layer(
            index=layer_index, name=spec.name, type=spec.type, param=spec.param, rule=rule, ctx=ctx, setup=setup,
            bottoms=bottom_ids, tops=top_ids, source_index=spec.orig, line=spec.line, from_oracle=from_oracle,
            top_counts=[count_of(shape) for shape in setup.tops],
        )
        need_backward = any(self.blobs[i].need_backward for i in bottom_ids)
        # Net::AppendBottom: propagate_down, when given, replaces the blob's own need for backward.
        if spec.propagate_down:
            layer.bottom_need_backward = list(spec.propagate_down)
        else:
            layer.bottom_need_backward = [self.blobs[i].need_backward for i in bottom_ids]
        need_backward = self._append_params(layer, spec, setup, ctx) or need_backward
        layer.need_backward = need_backward
        if need_backward:
            for blob_id in top_ids:
                self.blobs[blob_id].need_backward = True
        self.layers.append(layer)

    def _append_bottoms(self, spec: LayerSpec) -> list[int]:
        """Net::AppendBottom: each bottom names a top no later layer has taken yet (a bottom consumes it)."""
        if spec.propagate_down and len(spec.propagate_down) != len(spec.bottoms):
            raise ShapeError(
                f"propagate_down must be given 0 or {len(spec.bottoms)} times (once per bottom), "
                f"got {len(spec.propagate_down)}",
                source=self.source, line=spec.line, layer=spec.name, layer_type=spec.type, field="propagate_down",
            )
        bottom_ids = []
        for bottom_index, name in enumerate(spec.bottoms):
            if name not in self.available:
                raise NetError(
                    f"unknown bottom blob {name!r} (bottom index {bottom_index})",
                    source=self.source, line=spec.line, layer=spec.name, layer_type=spec.type, field="bottom",
                )
            bottom_ids.append(self.blob_by_name[name])
            self.available.discard(name)
        return bottom_ids

    def _set_up(self, spec: LayerSpec, ctx: LayerContext, bottoms: int) -> tuple[LayerRule | None, LayerSetup, bool]:
        """Layer::SetUp's shapes: from the layer's rule, else from pycaffe (the oracle); the rule in force (None
        when pycaffe shaped the layer), the setup, and whether pycaffe gave it."""
        rule = spec.rule
        unsupported: str | None = None
        if rule is not None:
            # The blob counts and the fillers depend on the definition only: checked at the first build of a
            # prepared net, remembered in its memo once they pass.
            structure_checked = ctx.memo.get("structure checked", False)
            if not structure_checked:
                rule.bottoms.check(bottoms, "bottom", ctx)
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
                return rule, setup, False
        return None, self._set_up_by_pycaffe(spec, unsupported), True

    def _set_up_by_pycaffe(self, spec: LayerSpec, unsupported: str | None) -> LayerSetup:
        if self.oracle is None:
            raise self._unsupported(
                spec, (unsupported or "layer type is not known to the estimator")
                + (self.pycaffe_note or " (and no pycaffe fallback was given)"),
            )
        if self.oracle_shapes is None or spec.name not in self.oracle_shapes:
            # One question covers this layer and the rule-less ones after it, as far as the net can be sent
            # without a layer that opens a file; a layer past that asks again, with more already shaped.
            self.oracle_shapes = ask_oracle(self.oracle, self.prepared, self.layers, self.blobs)
        if spec.name not in self.oracle_shapes:
            raise self._unsupported(
                spec, "layer type is not known to the estimator, and pycaffe did not report its shapes"
            )
        top_shapes, param_shapes = self.oracle_shapes[spec.name]
        return LayerSetup(tops=list(top_shapes), params=list(param_shapes))

    def _unsupported(self, spec: LayerSpec, message: str) -> UnsupportedLayerError:
        return UnsupportedLayerError(
            message, source=self.source, line=spec.line, layer=spec.name, layer_type=spec.type, field="type"
        )

    def _append_tops(self, layer_index: int, spec: LayerSpec, setup: LayerSetup, bottom_ids: list[int],
                     ctx: LayerContext) -> list[int]:
        """Net::AppendTop: in place when a top repeats the bottom at the same index, else a new blob (a view of a
        bottom's data or diff where the layer shares them)."""
        blobs, blob_by_name = self.blobs, self.blob_by_name
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
                self.available.add(name)
            if not in_place:
                if top_index in setup.data_views:
                    source_blob = blobs[bottom_ids[setup.data_views[top_index]]]
                    blobs[blob_id].data_of = source_blob.data_of if source_blob.data_of is not None else source_blob.id
                if top_index in setup.diff_views:
                    source_blob = blobs[bottom_ids[setup.diff_views[top_index]]]
                    blobs[blob_id].diff_of = source_blob.diff_of if source_blob.diff_of is not None else source_blob.id
            top_ids.append(blob_id)
        return top_ids

    def _set_loss_weights(self, spec: LayerSpec, rule: LayerRule | None, top_ids: list[int],
                          ctx: LayerContext) -> None:
        """Layer::SetLossWeights: explicit, else 1 on a loss layer's first top. LossLayer::LayerSetUp adds that 1 as
        the layer's only loss_weight, so a loss layer with more tops must give one per top."""
        loss_weight = spec.loss_weight
        is_loss = rule is not None and rule.is_loss
        if not loss_weight and is_loss and len(top_ids) != 1:
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
            elif is_loss and top_index == 0:
                weight = 1.0
            self.blobs[blob_id].loss_weight = weight

    def _append_params(self, layer: Layer, spec: LayerSpec, setup: LayerSetup, ctx: LayerContext) -> bool:
        """Net::AppendParam: a named param shared with an earlier one keeps one storage. Whether a param learns
        (lr_mult != 0), which makes the layer need backward."""
        if len(spec.param_specs) > len(setup.params):
            raise ctx.error(
                f"has {len(spec.param_specs)} param specs but the layer has {len(setup.params)} param blob(s)",
                field="param",
            )
        params, owners = self.params, self.param_owner_by_name
        learns = False
        for param_index, shape in enumerate(setup.params):
            _check_blob_size(shape, ctx)
            spec_name, lr_mult, share_mode = (
                spec.param_specs[param_index] if param_index < len(spec.param_specs) else _DEFAULT_PARAM_SPEC
            )
            learns = learns or lr_mult != 0
            layer.param_need_backward.append(lr_mult != 0)
            owner = None
            if spec_name:
                if spec_name in owners:
                    owner = owners[spec_name]
                    owner_shape = params[owner].shape
                    strict = share_mode != _PERMISSIVE
                    if (strict and owner_shape != shape) or count_of(owner_shape) != count_of(shape):
                        raise ctx.error(
                            f"shared param {spec_name!r} has shape {list(shape)} here but {list(owner_shape)} "
                            "where it is first defined",
                            field="param",
                        )
                else:
                    owners[spec_name] = len(params)
            params.append(
                Param(id=len(params), layer=layer.index, index=param_index, shape=shape, name=spec_name,
                      lr_mult=lr_mult, owner=owner)
            )
            layer.params.append(len(params) - 1)
        return learns

    def finish(self) -> Net:
        """The net, with backward pruned to what reaches a loss (or forced) and each rule told what runs backward."""
        _prune_backward(self.layers, self.blobs)
        net_param = self.prepared.net_param
        net = Net(
            name=net_param.name, phase=self.prepared.phase, layers=self.layers, blobs=self.blobs,
            params=self.params, force_backward=net_param.force_backward, param=net_param,
        )
        if net_param.force_backward:
            _force_backward(net)
        # What the rules' `buffers` read: whether backward runs through each layer (in TRAIN), and for which bottoms.
        training = self.prepared.phase == PHASE_TRAIN
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
