"""The per-layer-type rules: what a layer's tops and params look like, and what it allocates inside.

One `LayerRule` subclass per layer kind, registered with `@layer_rule("Type", ...)`. A rule mirrors the layer's
C++ source in BVLC Caffe (src/caffe/layers/*.cpp): `setup` is LayerSetUp + Reshape (top and param shapes, with
Caffe's CHECKs turned into `ShapeError`s), `buffers` lists the blobs the layer allocates for itself during one
training iteration and one test pass.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from ..errors import BuildLimitError, NetError, ShapeError, UnsupportedLayerError

Shape = tuple[int, ...]
FLOAT_BYTES = 4  # Caffe's Dtype is float for training
INT_BYTES = 4
INT_MAX = 2**31 - 1

PHASE_TRAIN = "TRAIN"
PHASE_TEST = "TEST"

ENGINE_CPU = "cpu"
ENGINE_GPU = "gpu"
ENGINE_CUDNN = "gpu-cudnn"
ENGINES = (ENGINE_CPU, ENGINE_GPU, ENGINE_CUDNN)

# Memory categories of the report, in display order.
ACTIVATIONS = "activations"
ACTIVATION_DIFFS = "activation_diffs"
PARAMS = "params"
PARAM_DIFFS = "param_diffs"
SOLVER_HISTORY = "solver_history"
LAYER_BUFFERS = "layer_buffers"
DATA_PREFETCH = "data_prefetch"
WORKSPACE = "workspace"
CONTEXT = "context"
CATEGORIES = (
    ACTIVATIONS, ACTIVATION_DIFFS, PARAMS, PARAM_DIFFS, SOLVER_HISTORY, LAYER_BUFFERS, DATA_PREFETCH, WORKSPACE,
    CONTEXT,
)


def count_of(shape: Sequence[int]) -> int:
    return math.prod(shape)


@dataclasses.dataclass(frozen=True)
class Buffer:
    """Memory a layer allocates for itself (not a top blob, not a param)."""

    name: str
    count: int
    itemsize: int = FLOAT_BYTES
    category: str = LAYER_BUFFERS
    host_only: bool = False
    """Host memory even when training on a GPU (the data reader's queue, for instance)."""

    @property
    def bytes(self) -> int:
        return self.count * self.itemsize


@dataclasses.dataclass
class LayerSetup:
    """What `setup` computes: top shapes (one per top, automatic tops included) and param blob shapes."""

    tops: list[Shape]
    params: list[Shape] = dataclasses.field(default_factory=list)
    data_views: dict[int, int] = dataclasses.field(default_factory=dict)
    """Top index -> bottom index whose data the top shares (Blob::ShareData), so it allocates none of its own."""
    diff_views: dict[int, int] = dataclasses.field(default_factory=dict)
    """Top index -> bottom index whose diff the top shares (Blob::ShareDiff)."""
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Rule-specific facts `buffers` needs (convolution geometry, the data layer's batch...)."""
    subnet: SubNet | None = None
    """A net the layer builds and runs inside itself (RecurrentLayer's unrolled net), counted with the layer."""


@dataclasses.dataclass(frozen=True)
class SubNet:
    """A net inside a layer, as Caffe's RecurrentLayer holds its unrolled net: the rule describes it (a
    NetParameter), the net builder builds it (`LayerContext.build_subnet`) and the memory model counts it with the
    layer, recursively, less what it shares with the outer net. Nothing changes it once built."""

    net: Any
    """The built core.net.Net (typed loosely: the rules do not import the net builder, which imports them)."""
    shared_blobs: frozenset[str]
    """Its blobs whose data and diff are the outer net's (the layer's bottoms and tops): counted there."""


@dataclasses.dataclass(frozen=True)
class InputDefault:
    """What a data layer's top is taken to hold when the caller gives no shape for it, declared by the rule of the
    layer that reads it (`LayerRule.input_defaults`): the label LMDB DIGITS writes for DetectNet has one layout, so
    its shape need not be asked for. The estimate says so (`assumption`)."""

    spec: Any
    """A layers.data.DataSpec (typed loosely: base does not import the data layers)."""
    assumption: str


@dataclasses.dataclass(frozen=True)
class Count:
    """Caffe's ExactNum/MinNum/MaxNum Bottom/Top Blobs: None means unconstrained."""

    exact: int | None = None
    minimum: int | None = None
    maximum: int | None = None

    def check(self, actual: int, what: str, ctx: LayerContext) -> None:
        if self.exact is not None and actual != self.exact:
            raise ctx.error(f"takes exactly {self.exact} {what} blob(s), got {actual}", field=what)
        if self.minimum is not None and actual < self.minimum:
            raise ctx.error(f"takes at least {self.minimum} {what} blob(s), got {actual}", field=what)
        if self.maximum is not None and actual > self.maximum:
            raise ctx.error(f"takes at most {self.maximum} {what} blob(s), got {actual}", field=what)


class LayerContext:
    """One layer as a rule sees it: its parameters, its bottom shapes, the phase, where it is defined."""

    def __init__(
        self,
        param: Any,
        bottoms: list[Shape],
        phase: str,
        source: str | None = None,
        line: int | None = None,
        data_shapes: dict[str, Shape] | None = None,
        batch_override: int | None = None,
        memo: dict[Any, Any] | None = None,
        name: str | None = None,
        layer_type: str | None = None,
        build_subnet: Callable[[Any], Any] | None = None,
        input_defaults: Mapping[str, InputDefault] | None = None,
    ) -> None:
        self.param = param
        self._build_subnet = build_subnet
        self.name: str = param.name if name is None else name
        self.type: str = param.type if layer_type is None else layer_type
        self.memo: dict[Any, Any] = {} if memo is None else memo
        """What a rule read out of `param` that does not depend on the bottoms, kept across the builds of one
        prepared net (a planner's search builds it at many batches); never holds a result that depends on them."""
        self.bottoms = bottoms
        self.phase = phase
        self.source = source
        self.line = line
        self.data_shapes = data_shapes or {}
        self.input_defaults = input_defaults or {}
        """Top name -> what it holds when no shape is given for it (see InputDefault)."""
        self.assumed: list[str] = []
        """The assumptions `data_shape` took from `input_defaults` for this layer, for the estimate to list."""
        self.batch_override = batch_override
        # Set once the whole net is known (Net::Init's backward analysis), for `buffers`: some buffers exist only
        # when backward runs, or only when a bottom's gradient is computed.
        self.need_backward = False
        self.bottom_need_backward: list[bool] = []

    def counted(self, need_backward: bool, bottom_need_backward: list[bool]) -> LayerContext:
        """This context as a count that runs backward differently sees it (a net inside a layer that runs none): a
        copy, since a built net is never changed once built."""
        view = object.__new__(LayerContext)
        view.__dict__.update(self.__dict__)
        view.need_backward = need_backward
        view.bottom_need_backward = bottom_need_backward
        return view

    def build_subnet(self, net_param: Any) -> Any:
        """Build a net this layer holds inside (in this layer's phase, by the builder that builds this net); its
        errors are this layer's."""
        if self._build_subnet is None:
            raise self.error("cannot build a net inside this layer here (no net builder given)")
        try:
            return self._build_subnet(net_param)
        except BuildLimitError as error:
            # Too large at this batch, not wrong: this layer's, and still a batch the planner may step over.
            raise BuildLimitError(
                error.message, source=self.source, line=self.line, layer=self.name, layer_type=self.type,
                field="bottom",
            ) from None
        except NetError as error:
            raise self.error(f"its unrolled net: {error}", field="recurrent_param") from None

    def error(self, message: str, field: str | None = None, missing_shape: tuple[str, str] | None = None) -> ShapeError:
        return ShapeError(
            message, source=self.source, line=self.line, layer=self.name, layer_type=self.type, field=field,
            missing_shape=missing_shape,
        )

    def data_shape(self, top: str, *, wildcard: bool = True, default: bool = True) -> Shape | None:
        """A shape given by the caller for this layer's top: by ``PHASE:layer/top`` (TRAIN and TEST data layers
        often share a name but read different datasets), ``layer/top``, the top's name; else, unless `default` is
        False, the input default its reader declares (noted in `assumed`); else ``*`` for the first top of every data
        layer (the image, whatever the net calls it) unless `wildcard` is False."""
        keys = [f"{self.phase}:{self.name}/{top}", f"{self.name}/{top}", top]
        for key in keys:
            if key in self.data_shapes:
                return self.data_shapes[key]
        if default and top in self.input_defaults:
            declared = self.input_defaults[top]
            if declared.assumption not in self.assumed:
                self.assumed.append(declared.assumption)
            return declared.spec  # type: ignore[no-any-return]
        if wildcard and len(self.param.top) and top == self.param.top[0] and "*" in self.data_shapes:
            return self.data_shapes["*"]
        return None

    def canonical_axis(self, axis: int, num_axes: int, field: str) -> int:
        """Blob::CanonicalAxisIndex: negative axes count from the end."""
        if not -num_axes <= axis < num_axes:
            raise self.error(f"axis {axis} is out of range for a {num_axes}-axis blob", field=field)
        return axis + num_axes if axis < 0 else axis

    def positive(self, value: int, field: str) -> int:
        if value <= 0:
            raise self.error(f"must be positive, got {value}", field=field)
        return value


class LayerRule:
    """Base rule: subclasses set the class attributes and override `setup` (and `buffers` when they allocate)."""

    types: ClassVar[tuple[str, ...]] = ()
    bottoms: ClassVar[Count] = Count()
    tops: ClassVar[Count] = Count()
    auto_top_blobs: ClassVar[bool] = False
    """LossLayer: missing tops are created anonymously up to the required number."""
    is_loss: ClassVar[bool] = False
    """LossLayer: top 0 has loss weight 1 unless `loss_weight` says otherwise."""
    is_data: ClassVar[bool] = False
    """Produces data without bottoms; its tops never need backward."""

    def allow_force_backward(self, bottom_index: int) -> bool:
        return True

    def host_tops(self, ctx: LayerContext, engine: str) -> tuple[int, ...]:
        """The tops this layer's Forward writes in host memory on a GPU engine (mutable_cpu_data): a layer without
        GPU code (Layer::Forward falls back to Forward_cpu), a loss writing its scalar. Such a top reaches the
        device only when a layer reads it there, or when Layer::Forward weighs it as a loss (gpu_data, gpu_diff)."""
        return ()

    def forward_bottom_diffs(self, ctx: LayerContext, engine: str) -> tuple[int, ...]:
        """The bottoms whose diff this layer's Forward touches on `engine`, in every net, TRAIN and TEST:
        SoftmaxWithLossLayer::Forward_gpu keeps its per-item losses in bottom 0's gradient."""
        return ()

    def writes_bottom_diff_always(self, ctx: LayerContext, engine: str, index: int) -> bool:
        """True when Backward fetches bottom `index`'s diff whatever propagate_down says (ConvolutionLayer's
        Backward_cpu takes `bottom[i]->mutable_cpu_diff()` before testing propagate_down[i])."""
        return False

    def setup(self, ctx: LayerContext) -> LayerSetup:  # pragma: no cover - every rule overrides it
        raise NotImplementedError

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        """Internal allocations of one training iteration (TRAIN) or one test pass (TEST) on `engine`."""
        return []

    def needed_tops(self) -> int:
        return max(self.tops.minimum or 0, self.tops.exact or 0)

    def input_defaults(self, param: Any) -> dict[int, InputDefault]:
        """Bottom index -> what a data layer's top feeding that bottom holds when the caller gives no shape for it
        (a fixed dataset layout this layer reads). None by default: the shape must be given."""
        return {}

    def layers_held(self, param: Any) -> int:
        """The most layers of the nets this layer holds (a recurrent layer's unrolled net) that one build sets up:
        what the estimate's cost counts beside the layer itself (core/cost.py). 0 for a layer holding none."""
        return 0


_REGISTRY: dict[str, LayerRule] = {}
_FLAVOUR_REGISTRY: dict[tuple[str, str], LayerRule] = {}
"""(flavour, type) -> the rule for a layer type a Caffe fork implements differently (NVcaffe's BatchNorm)."""
R = TypeVar("R", bound=type[LayerRule])


def layer_rule(*types: str, flavour: str | None = None) -> Callable[[R], R]:
    """Register a rule class for the given layer types (for one schema flavour only, when given: see
    core/flavour.py); a type registered twice is a programming error."""

    def register(cls: R) -> R:
        instance = cls()
        cls.types = types
        for layer_type in types:
            registry: dict[Any, LayerRule] = _REGISTRY if flavour is None else _FLAVOUR_REGISTRY
            key: Any = layer_type if flavour is None else (flavour, layer_type)
            if key in registry:
                raise RuntimeError(f"layer type {layer_type!r} has two rules")
            registry[key] = instance
        return cls

    return register


def rule_for(layer_type: str, flavour: str | None = None) -> LayerRule | None:
    if flavour is not None and (flavour, layer_type) in _FLAVOUR_REGISTRY:
        return _FLAVOUR_REGISTRY[(flavour, layer_type)]
    return _REGISTRY.get(layer_type)


def known_types() -> list[str]:
    return sorted(_REGISTRY)


_PYTHON_REGISTRY: dict[tuple[str, str], LayerRule] = {}
"""(python_param.module, python_param.layer) -> the rule of a Python layer whose shapes are fixed by its source."""


def python_layer_rule(module: str, layer: str) -> Callable[[R], R]:
    """Register the rule of a Python layer (`type: "Python"`, python_param module and layer) whose top shapes its
    source fixes, so that the caller need not give them; the module is never imported (layers.data.PythonRule)."""

    def register(cls: R) -> R:
        if (module, layer) in _PYTHON_REGISTRY:
            raise RuntimeError(f"Python layer {module}.{layer} has two rules")
        _PYTHON_REGISTRY[(module, layer)] = cls()
        cls.types = ("Python",)
        return cls

    return register


def python_rule_for(module: str, layer: str) -> LayerRule | None:
    return _PYTHON_REGISTRY.get((module, layer))


def known_python_layers() -> list[tuple[str, str]]:
    return sorted(_PYTHON_REGISTRY)


class DeferToPycaffe(Exception):
    """Raised by a rule for a configuration it does not model; the net builder then asks pycaffe for the shapes."""


def unsupported(ctx: LayerContext, why: str) -> UnsupportedLayerError:
    return UnsupportedLayerError(why, source=ctx.source, line=ctx.line, layer=ctx.name, layer_type=ctx.type)


def spatial_param(
    ctx: LayerContext,
    values: Sequence[int],
    h: int | None,
    w: int | None,
    num_spatial: int,
    default: int,
    field: str,
) -> list[int]:
    """BaseConvolutionLayer::LayerSetUp's reading of kernel/stride/pad: `x_h`/`x_w` when either is set (2-D only,
    not with the repeated field; an unset one reads as the proto's 0), else the repeated field given once or once
    per spatial axis (nothing: `default`, which for the kernel is no valid size)."""
    if h is not None or w is not None:
        name = field.rsplit(".", 1)[-1]
        base = name.removesuffix("_size")
        if num_spatial != 2:
            raise ctx.error(f"{base}_h and {base}_w can only be used for 2-D spatial blobs", field=field)
        if len(values):
            raise ctx.error(f"give either {name} or {base}_h/{base}_w, not both", field=field)
        return [h or 0, w or 0]
    if len(values) == 0:
        return [default] * num_spatial
    if len(values) == 1:
        return [values[0]] * num_spatial
    if len(values) != num_spatial:
        raise ctx.error(
            f"must be given once or once per spatial axis ({num_spatial}), got {len(values)} values", field=field
        )
    return list(values)


def legacy_dim(ctx: LayerContext, shape: Shape, index: int, what: str = "bottom") -> int:
    """Blob::LegacyShape (num, channels, height, width): blobs of at most 4 axes, missing axes read as 1."""
    if len(shape) > 4:
        raise ctx.error(f"this layer reads {what} shapes as (num, channels, height, width); {list(shape)} has more "
                        "than 4 axes", field="bottom")
    return shape[index] if index < len(shape) else 1


FILLER_TYPES = ("constant", "gaussian", "positive_unitball", "uniform", "xavier", "msra", "bilinear")
"""GetFiller's names (include/caffe/filler.hpp); any other aborts at set-up."""


def check_filler(ctx: LayerContext, filler: Any, field: str) -> None:
    """What GetFiller and the fillers CHECK when a layer fills a blob: a known type, and `sparse` only for the
    gaussian filler."""
    if filler.type not in FILLER_TYPES:
        raise ctx.error(f"unknown filler type {filler.type!r} (Caffe knows {', '.join(FILLER_TYPES)})", field=field)
    if filler.sparse != -1 and filler.type != "gaussian":
        raise ctx.error(f"only the gaussian filler takes sparse; {filler.type!r} needs it unset (-1)", field=field)
    if filler.sparse < -1:
        raise ctx.error(f"sparse must be -1 or more, got {filler.sparse}", field=field)


# The fillers each layer type runs at set-up: (its parameter message, the filler fields it reads). A bias filler
# is read only when the layer has a bias; an unset filler is Caffe's default and always valid.
LAYER_FILLERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "Convolution": ("convolution_param", ("weight_filler", "bias_filler")),
    "Deconvolution": ("convolution_param", ("weight_filler", "bias_filler")),
    "InnerProduct": ("inner_product_param", ("weight_filler", "bias_filler")),
    "Embed": ("embed_param", ("weight_filler", "bias_filler")),
    "LSTM": ("recurrent_param", ("weight_filler", "bias_filler")),
    "RNN": ("recurrent_param", ("weight_filler", "bias_filler")),
    "PReLU": ("prelu_param", ("filler",)),
    "Scale": ("scale_param", ("filler", "bias_filler")),
    "Bias": ("bias_param", ("filler",)),
}


def check_layer_fillers(ctx: LayerContext) -> None:
    """check_filler for every filler the layer really runs."""
    if ctx.type == "DummyData":
        for index, filler in enumerate(ctx.param.dummy_data_param.data_filler):
            check_filler(ctx, filler, f"dummy_data_param.data_filler[{index}]")
        return
    if ctx.type not in LAYER_FILLERS:
        return
    message_name, fields = LAYER_FILLERS[ctx.type]
    message = getattr(ctx.param, message_name)
    for field in fields:
        if not message.HasField(field):
            continue
        if field == "bias_filler" and hasattr(message, "bias_term") and not message.bias_term:
            continue
        if ctx.type in ("Scale", "Bias") and field == "filler" and len(ctx.bottoms) > 1:
            continue  # the scale (or bias) is the second bottom: nothing is filled
        check_filler(ctx, getattr(message, field), f"{message_name}.{field}")


def optional(message: Any, field: str) -> Any:
    return getattr(message, field) if message.HasField(field) else None
