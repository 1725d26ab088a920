"""Data layers: where a batch comes from, how big it is, and what is held in memory to feed it.

Caffe reads the shape of a Data, ImageData or HDF5Data top from the dataset itself; the caller gives it as a
`DataSpec` (the dataset's stored item shape), keyed by top name or ``layer/top``.
"""

from __future__ import annotations

import dataclasses

from ..fields import is_whole
from .base import (
    DATA_PREFETCH,
    Buffer,
    Count,
    LayerContext,
    LayerRule,
    LayerSetup,
    Shape,
    count_of,
    layer_rule,
    python_rule_for,
)

PREFETCH_COUNT = 3
"""BasePrefetchingDataLayer::PREFETCH_COUNT in this Caffe tree: batches loaded ahead by the prefetch thread."""
DATUM_OVERHEAD_BYTES = 112
"""Per queued Datum beside its pixels: the message object, its string's malloc chunk rounding and header, the
queue's pointer (measured with valgrind's massif on LeNet's reader queue: 902 bytes for 784 pixels, of which the
generic per-buffer overhead of 16 is counted elsewhere)."""


@dataclasses.dataclass(frozen=True)
class DataSpec:
    """What the dataset behind a data top holds.

    `shape` is one item's stored shape (C, H, W for images, before cropping); `rows` the number of records in the
    largest file where the layer loads whole files (HDF5Data); `stored_itemsize` the bytes per stored value (1 for
    uint8 pixels in a Datum, 4 for float_data or HDF5 float32).
    """

    shape: Shape
    rows: int | None = None
    stored_itemsize: int = 1


def _spec(
    ctx: LayerContext,
    top: str,
    what: str,
    *,
    wildcard: bool = True,
    missing: str | None = None,
    key: str | None = None,
    example: str = "3,256,256",
) -> DataSpec:
    """The caller's DataSpec for `top`; `missing` replaces the message saying that none was given, `key` and
    `example` are the data_shapes key and shape a front end suggests (the message names neither a flag nor a field:
    the CLI, the API and the form each say how to give a shape)."""
    value = ctx.data_shape(top, wildcard=wildcard)
    if value is None:
        raise ctx.error(
            missing
            or f"the shape of top {top!r} comes from the {what}, which is not available here; give the dataset's "
            f"item shape for {top!r} (for example {example})",
            field="top",
            missing_shape=(key or top, example),
        )
    spec = value if isinstance(value, DataSpec) else DataSpec(_as_shape(ctx, value, top))
    shape = _as_shape(ctx, spec.shape, top)
    if any(d <= 0 for d in shape):
        raise ctx.error(f"the item shape {list(shape)} given for {top!r} must be positive", field="top")
    if spec.rows is not None and (not is_whole(spec.rows) or spec.rows <= 0):
        raise ctx.error(f"the number of rows given for {top!r} must be a positive integer, got {spec.rows!r}",
                        field="top")
    if not is_whole(spec.stored_itemsize) or spec.stored_itemsize not in (1, 2, 4, 8):
        raise ctx.error(f"the stored item size given for {top!r} must be 1, 2, 4 or 8 bytes, got "
                        f"{spec.stored_itemsize!r}", field="top")
    return dataclasses.replace(spec, shape=shape)


def _as_shape(ctx: LayerContext, value: object, top: str) -> Shape:
    """A caller's shape as a tuple of ints; anything else (a string, a float, True) is refused, not guessed."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)) or not all(is_whole(d) for d in value):
        raise ctx.error(f"the item shape given for {top!r} must be a list of integers, got {value!r}", field="top")
    return tuple(value)


def _batch(ctx: LayerContext, batch_size: int, field: str) -> int:
    batch = ctx.batch_override if ctx.batch_override is not None else batch_size
    if batch <= 0:
        raise ctx.error(f"batch_size must be positive, got {batch}", field=field)
    return batch


def _cropped(ctx: LayerContext, item: Shape) -> Shape:
    """DataTransformer::InferBlobShape: a square crop of the last two axes when crop_size is set."""
    crop = ctx.param.transform_param.crop_size
    if not crop:
        return item
    if len(item) < 2:
        raise ctx.error(f"crop_size needs an item with height and width, got {list(item)}", field="transform_param")
    if crop > item[-2] or crop > item[-1]:
        raise ctx.error(
            f"crop_size {crop} exceeds the item's height x width {item[-2]} x {item[-1]}",
            field="transform_param.crop_size",
        )
    return (*item[:-2], crop, crop)


def _mean_buffer(ctx: LayerContext, item: Shape) -> list[Buffer]:
    """DataTransformer loads mean_file into a blob of the stored item's shape (host memory)."""
    if ctx.param.transform_param.mean_file:
        return [Buffer("transformer.mean", count_of(item), category=DATA_PREFETCH, host_only=True)]
    return []


class PrefetchingDataRule(LayerRule):
    """BasePrefetchingDataLayer: PREFETCH_COUNT batches of data (and label), copied into the tops each step."""

    is_data = True
    bottoms = Count(exact=0)
    tops = Count(minimum=1, maximum=2)

    def prefetch(self, setup: LayerSetup) -> list[Buffer]:
        buffers = [Buffer("prefetch.data", PREFETCH_COUNT * count_of(setup.tops[0]), category=DATA_PREFETCH)]
        if len(setup.tops) > 1:
            buffers.append(Buffer("prefetch.label", PREFETCH_COUNT * count_of(setup.tops[1]), category=DATA_PREFETCH))
        return buffers


@layer_rule("Data")
class DataRule(PrefetchingDataRule):
    """DataLayer (LMDB/LevelDB): a DataReader queue of `prefetch` x batch raw Datums, then the prefetch batches."""

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.data_param
        batch = _batch(ctx, p.batch_size, "data_param.batch_size")
        spec = _spec(ctx, ctx.param.top[0], "dataset (data_param.source)")
        tops: list[Shape] = [(batch, *_cropped(ctx, spec.shape))]
        if len(ctx.param.top) > 1:
            tops.append((batch,))
        return LayerSetup(tops=tops, details={"spec": spec, "batch": batch})

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        spec: DataSpec = setup.details["spec"]
        queued = ctx.param.data_param.prefetch * setup.details["batch"]
        reader = Buffer(
            "reader.datums",
            queued * (count_of(spec.shape) * spec.stored_itemsize + DATUM_OVERHEAD_BYTES),
            itemsize=1,
            category=DATA_PREFETCH,
            host_only=True,
        )
        return [*self.prefetch(setup), reader, *_mean_buffer(ctx, spec.shape)]


@layer_rule("ImageData")
class ImageDataRule(PrefetchingDataRule):
    """ImageDataLayer: images from a list file, resized to new_height x new_width when given."""

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.image_data_param
        batch = _batch(ctx, p.batch_size, "image_data_param.batch_size")
        channels = 3 if p.is_color else 1
        if p.new_height and p.new_width:
            item: Shape = (channels, p.new_height, p.new_width)
        elif p.new_height or p.new_width:
            raise ctx.error("new_height and new_width must be given together", field="image_data_param")
        else:
            spec = _spec(ctx, ctx.param.top[0], "first image of the list (image_data_param.source)")
            item = (channels, *spec.shape[-2:])
        tops: list[Shape] = [(batch, *_cropped(ctx, item))]
        if len(ctx.param.top) > 1:
            tops.append((batch,))
        return LayerSetup(tops=tops, details={"item": item})

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        return self.prefetch(setup) + _mean_buffer(ctx, setup.details["item"])


@layer_rule("WindowData")
class WindowDataRule(PrefetchingDataRule):
    """WindowDataLayer: crops of crop_size from the windows listed in a file."""

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.window_data_param
        batch = _batch(ctx, p.batch_size, "window_data_param.batch_size")
        crop = ctx.param.transform_param.crop_size or p.crop_size
        if not crop:
            raise ctx.error("crop_size must be positive", field="transform_param.crop_size")
        tops: list[Shape] = [(batch, 3, crop, crop)]
        if len(ctx.param.top) > 1:
            tops.append((batch,))
        return LayerSetup(tops=tops)

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        return self.prefetch(setup)


@layer_rule("HDF5Data")
class HDF5DataRule(LayerRule):
    """HDF5DataLayer: loads a whole file's datasets (one per top) into memory, then copies batches out."""

    is_data = True
    bottoms = Count(exact=0)
    tops = Count(minimum=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.hdf5_data_param
        batch = _batch(ctx, p.batch_size, "hdf5_data_param.batch_size")
        specs = [_spec(ctx, top, "HDF5 files (hdf5_data_param.source)") for top in ctx.param.top]
        return LayerSetup(tops=[(batch, *spec.shape) for spec in specs], details={"specs": specs, "batch": batch})

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        buffers = []
        rows = max((spec.rows or setup.details["batch"]) for spec in setup.details["specs"])
        for top, spec in zip(ctx.param.top, setup.details["specs"]):
            buffers.append(
                Buffer(f"file.{top}", (spec.rows or rows) * count_of(spec.shape), category=DATA_PREFETCH, host_only=True)
            )
        buffers.append(Buffer("data_permutation", rows, category=DATA_PREFETCH, host_only=True))
        return buffers


@layer_rule("MemoryData")
class MemoryDataRule(LayerRule):
    """MemoryDataLayer: tops point into arrays the caller hands over; it keeps one batch for AddDatumVector."""

    is_data = True
    bottoms = Count(exact=0)
    tops = Count(exact=2)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.memory_data_param
        batch = _batch(ctx, p.batch_size, "memory_data_param.batch_size")
        if min(p.channels, p.height, p.width) <= 0:
            raise ctx.error("batch_size, channels, height and width must be positive", field="memory_data_param")
        return LayerSetup(
            tops=[(batch, p.channels, p.height, p.width), (batch,)], details={"external_tops": True}
        )

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        return [
            Buffer("added_data", count_of(setup.tops[0]), category=DATA_PREFETCH, host_only=True),
            Buffer("added_label", count_of(setup.tops[1]), category=DATA_PREFETCH, host_only=True),
        ]


@layer_rule("DummyData")
class DummyDataRule(LayerRule):
    """DummyDataLayer: tops of the given shapes, filled at set-up."""

    is_data = True
    bottoms = Count(exact=0)
    tops = Count(minimum=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.dummy_data_param
        n = len(ctx.param.top)
        if len(p.data_filler) not in (0, 1, n):
            raise ctx.error(f"give 0, 1 or {n} (one per top) data fillers, got {len(p.data_filler)}",
                            field="dummy_data_param.data_filler")
        legacy = len(p.num) or len(p.channels) or len(p.height) or len(p.width)
        if legacy and len(p.shape):
            raise ctx.error("give shape or num/channels/height/width, not both", field="dummy_data_param")
        shapes: list[Shape]
        if legacy:
            fields = [list(p.num), list(p.channels), list(p.height), list(p.width)]
            for values in fields:
                if len(values) not in (1, n):
                    raise ctx.error(f"num/channels/height/width must be given once or {n} times", field="dummy_data_param")
            shapes = [tuple(v[i] if len(v) > 1 else v[0] for v in fields) for i in range(n)]
        else:
            if len(p.shape) not in (1, n):
                raise ctx.error(f"shape must be given once or {n} times, got {len(p.shape)}", field="dummy_data_param.shape")
            shapes = [tuple(p.shape[i if len(p.shape) > 1 else 0].dim) for i in range(n)]
        if ctx.batch_override is not None:
            shapes = [(ctx.batch_override, *shape[1:]) if shape else shape for shape in shapes]
        return LayerSetup(tops=shapes)


@layer_rule("Input")
class InputRule(LayerRule):
    """InputLayer: tops of the given shapes (one shape for all tops, or one per top)."""

    is_data = True
    bottoms = Count(exact=0)
    tops = Count(minimum=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.input_param
        n = len(ctx.param.top)
        if len(p.shape) == 0:
            shapes = []
            for top in ctx.param.top:
                spec = _spec(ctx, top, "caller (input_param has no shape)")
                shapes.append(spec.shape)
        elif len(p.shape) in (1, n):
            shapes = [tuple(p.shape[i if len(p.shape) > 1 else 0].dim) for i in range(n)]
        else:
            raise ctx.error(f"shape must be given once or {n} times, got {len(p.shape)}", field="input_param.shape")
        if ctx.batch_override is not None:
            shapes = [(ctx.batch_override, *shape[1:]) if shape else shape for shape in shapes]
        return LayerSetup(tops=shapes)


@layer_rule("Python")
class PythonRule(LayerRule):
    """A Python layer: its module is never imported here (importing runs anyone's code, and pycaffe would call it).
    The Python layers whose shapes their source fixes have rules of their own (`python_layer_rule`: DetectNet's
    clustering and mAP layers, layers/detectnet.py), computed from the bottoms; a shape given for one of their tops
    must agree past the batch axis. Any other needs its top shapes given, batch first, as for a data layer; a
    planner's batch replaces the first dimension. A Python layer with bottoms is no different: what it computes from
    them is unknown, so the given shapes are all there is (the ``*`` shorthand for a data layer's image does not
    reach it). What the layer allocates inside is not counted."""

    is_data = True

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.python_param
        known = python_rule_for(p.module, p.layer)
        if known is not None:
            return _known_python_setup(known, ctx)
        shapes = []
        for top in ctx.param.top:
            missing = (
                f"the shape of top {top!r} comes from Python layer {p.module}.{p.layer}, which the estimator never "
                f"imports (that would run its code); give the shape of {top!r}, batch first (for example "
                "1,3,256,256)"
            )
            spec = _spec(
                ctx, top, "Python layer", wildcard=not ctx.bottoms, missing=missing, key=f"{ctx.name}/{top}",
                example="1,3,256,256",
            )
            shape = spec.shape
            if ctx.batch_override is not None and shape:
                shape = (ctx.batch_override, *shape[1:])
            shapes.append(shape)
        return LayerSetup(tops=shapes)


def _known_python_setup(known: LayerRule, ctx: LayerContext) -> LayerSetup:
    """A Python layer with a rule of its own: its blob counts, its shapes, and the caller's shapes checked against
    them (a given shape is a claim about the layer, and a wrong one is said, not used)."""
    p = ctx.param.python_param
    known.bottoms.check(len(ctx.bottoms), "bottom", ctx)
    known.tops.check(len(ctx.param.top), "top", ctx)
    setup = known.setup(ctx)
    for top, shape in zip(ctx.param.top, setup.tops):
        given = ctx.data_shape(top, wildcard=False, default=False)
        if given is None:
            continue
        claimed = given.shape if isinstance(given, DataSpec) else given
        if not isinstance(claimed, (tuple, list)) or tuple(claimed)[1:] != tuple(shape)[1:] or len(claimed) != len(shape):
            raise ctx.error(
                f"{p.module}.{p.layer} shapes top {top!r} as {list(shape)} (from its bottoms and param_str); the "
                f"shape given for it, {list(claimed) if isinstance(claimed, (tuple, list)) else claimed!r}, differs "
                "past the batch axis: give none, its source fixes it",
                field="top",
            )
    return setup
