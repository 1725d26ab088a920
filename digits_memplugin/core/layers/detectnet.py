"""NVcaffe's own layers that DIGITS' DetectNet uses (DetectNetTransformation, L1Loss, the Python layers of
caffe.layers.detectnet), and NVcaffe's BatchNorm.

Each C++ layer follows NVcaffe 0.17.3's LayerSetUp / Reshape (mirror NEWPLAN/nvcaffe-0.17.3, commit 12cba10,
src/caffe/layers/<name>_layer.cpp and src/caffe/util/detectnet_coverage_rectangular.cpp). DetectNet's Python layers
(NVcaffe's python/caffe/layers/detectnet/clustering.py and mean_ap.py, which DIGITS' DetectNet names) are never
imported: their `reshape` fixes their tops from their bottoms and param_str, and the rules here say so
(`python_layer_rule`), so DetectNet estimates from its image shape alone. DIGITS' label LMDB has one layout, which
the transformation layer declares for its label input when none is given (`DetectNetTransformationRule.input_defaults`).
"""

from __future__ import annotations

from typing import Any

from .base import (
    Buffer,
    Count,
    InputDefault,
    LayerContext,
    LayerRule,
    LayerSetup,
    Shape,
    count_of,
    layer_rule,
    legacy_dim,
    python_layer_rule,
)
from .data import DataSpec
from .loss import LossRule

TRANSFORMED_LABEL_SIZE = 8
"""CoverageGenerator::TRANSFORMED_LABEL_SIZE: foreground, 4 box corners, 2 inverse sizes, obj_norm per grid cell;
then one coverage channel per class."""
AUGMENT_SELECTION_BYTES = 32
"""sizeof(AugmentSelection) (detectnet_transform_layer.hpp: flip, rotation, scale, crop offset, hue, saturation),
the per-image record the GPU path reserves."""

BOX_VALUES = 16
"""Values per box in DIGITS' label LMDB (GroundTruthObj.lmdb_format_length: box, alpha, class, 0, rotation,
truncation, occlusion, dimensions, location), which DetectNetTransformationLayer::blobToLabels checks (sizeof
BboxLabel / sizeof(Dtype)); the first row is a header (box count, 16)."""
DIGITS_LABEL_BOXES = 64
"""Boxes a DIGITS label is padded to by default (digits/extensions/data/objectDetection/utils.py, pad_bbox's
max_bboxes; DIGITS passes the dataset's most boxes per image)."""
DIGITS_LABEL_ITEM: Shape = (1, DIGITS_LABEL_BOXES + 1, BOX_VALUES)
"""One label item as DIGITS stores it (bbox_to_array: 1 x (boxes + header) x 16 floats)."""


@layer_rule("DetectNetTransformation")
class DetectNetTransformationRule(LayerRule):
    """DetectNetTransformationLayer::Reshape: 3-channel images and their labels in (same num); out the image at
    detectnet_groundtruth_param's image_size_y x image_size_x, and the label tensor (N, 8 + classes, grid rows,
    grid columns), the grid being the image divided by `stride` (CoverageGenerator's gridROI_); classes are the
    largest object_class dst + 1 (class 1 -> 0 when none is given). On the GPU it reserves a scratch copy of the
    input images and one AugmentSelection per image."""

    bottoms = Count(exact=2)
    tops = Count(exact=2)

    def input_defaults(self, param: Any) -> dict[int, InputDefault]:
        """Its label input, when no shape is given for it: DIGITS' object-detection label LMDB (float data, a header
        row and 16 values per box) at DIGITS' default padding. Only its prefetch and reader queue depend on it (64
        bytes per box and image); the label tensor this layer makes does not."""
        if len(param.bottom) < 2:
            return {}
        label = param.bottom[1]
        return {1: InputDefault(
            DataSpec(DIGITS_LABEL_ITEM, stored_itemsize=4),
            f"no shape given for {label!r} (DetectNet's label LMDB, not read here): each label item taken as DIGITS "
            f"writes it at its default padding, {' x '.join(map(str, DIGITS_LABEL_ITEM))} floats (a header row, then "
            f"{BOX_VALUES} values for each of {DIGITS_LABEL_BOXES} boxes); DIGITS pads to the dataset's most boxes per "
            f"image, 64 bytes per box and image: give the shape of {label!r}, (1, boxes + 1, {BOX_VALUES}), to count "
            "the dataset's own",
        )}

    def setup(self, ctx: LayerContext) -> LayerSetup:
        images, labels = ctx.bottoms
        if legacy_dim(ctx, images, 1) != 3:
            raise ctx.error(f"accepts only three-channel images, got {list(images)}", field="bottom")
        if legacy_dim(ctx, images, 0) != legacy_dim(ctx, labels, 0):
            raise ctx.error(f"images and labels must have the same num ({list(images)} vs {list(labels)})",
                            field="bottom")
        g = ctx.param.detectnet_groundtruth_param
        if g.stride == 0:
            raise ctx.error("stride must be positive", field="detectnet_groundtruth_param.stride")
        classes = max((mapping.dst for mapping in g.object_class), default=0) + 1
        grid_y = int(g.image_size_y * (1.0 / g.stride))
        grid_x = int(g.image_size_x * (1.0 / g.stride))
        image: Shape = (legacy_dim(ctx, images, 0), 3, g.image_size_y, g.image_size_x)
        label: Shape = (legacy_dim(ctx, labels, 0), TRANSFORMED_LABEL_SIZE + classes, grid_y, grid_x)
        return LayerSetup(tops=[image, label])

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        images = ctx.bottoms[0]
        buffers = []
        if engine != "cpu":
            buffers += [
                # The layer's own GPUMemory::Workspace objects, not the shared cuDNN workspace.
                Buffer("gpu_workspace_tmpdata", count_of(images)),
                Buffer("gpu_workspace_augmentations", legacy_dim(ctx, images, 0) * AUGMENT_SELECTION_BYTES, 1),
            ]
            if ctx.param.transform_param.mean_file:
                buffers.append(Buffer("mean_blob", count_of(images[1:])))
        return buffers


@layer_rule("L1Loss")
class L1LossRule(LossRule):
    """L1LossLayer::Reshape: LossLayer's checks (same num), both bottoms the same count past the first axis; a
    scalar loss; diff_ and sign_ shaped like bottom[0]."""

    def setup(self, ctx: LayerContext) -> LayerSetup:
        self.check_same_num(ctx)
        a, b = ctx.bottoms
        if count_of(a[1:]) != count_of(b[1:]):
            raise ctx.error(f"inputs must have the same dimension ({list(a)} vs {list(b)})", field="bottom")
        return LayerSetup(tops=[()])

    def allow_force_backward(self, bottom_index: int) -> bool:
        return True  # Backward_cpu writes either bottom's gradient

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        count = count_of(ctx.bottoms[0])
        return [Buffer("diff", count), Buffer("sign", count)]


@layer_rule("BatchNorm", flavour="nvcaffe")
class NVcaffeBatchNormRule(LayerRule):
    """NVcaffe's BatchNormLayer (batch_norm_layer.cpp): mean, variance and the variance correction as params, plus
    a learned per-channel scale and bias when scale_bias (or a scale_filler / bias_filler) is given, so one layer
    does BVLC's BatchNorm + Scale. Per-element temp_NCHW_ and x_norm_, per-channel and per-image helpers; backward
    adds temp_NCHW_'s diff, temp_C_'s, and x_norm_'s with scale_bias. Modelled on the Caffe engine (NVcaffe picks
    cuDNN's when built with it; its buffers are not modelled separately)."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def writes_bottom_diff_always(self, ctx: LayerContext, engine: str, index: int) -> bool:
        return True  # Backward_cpu has no propagate_down test

    @staticmethod
    def scale_bias(ctx: LayerContext) -> bool:
        p = ctx.param.batch_norm_param
        return p.scale_bias or p.HasField("scale_filler") or p.HasField("bias_filler")

    def setup(self, ctx: LayerContext) -> LayerSetup:
        bottom = ctx.bottoms[0]
        if len(bottom) < 2 or len(bottom) == 3:
            # LayerSetUp reads shape(1) always, and shape(2), shape(3) once there are 3 axes or more.
            raise ctx.error(f"input must have 2 or at least 4 axes (num, channels, height, width), got {list(bottom)}",
                            field="bottom")
        channels = bottom[1]
        params: list[Shape] = [(channels,), (channels,), (1,)]
        if self.scale_bias(ctx):
            params += [(channels,), (channels,)]
        return LayerSetup(tops=[bottom], params=params, details={"channels": channels})

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        bottom = ctx.bottoms[0]
        count, channels, num = count_of(bottom), setup.details["channels"], bottom[0]
        spatial = count_of(bottom[2:4])
        buffers = [
            Buffer("mean", channels), Buffer("var", channels), Buffer("inv_var", channels),
            Buffer("ones_C", channels), Buffer("ones_N", num), Buffer("ones_HW", spatial),
            Buffer("temp_C", channels), Buffer("temp_NC", num * channels),
            Buffer("temp_NCHW", count), Buffer("x_norm", count),
        ]
        if ctx.need_backward:
            buffers += [Buffer("temp_NCHW.diff", count), Buffer("temp_C.diff", channels)]
            if self.scale_bias(ctx):
                buffers.append(Buffer("x_norm.diff", count))
        return buffers


# ---------------------------------------------------------------------------------------------- DetectNet's Python layers

MAX_BOXES = 50
"""mean_ap.MAX_BOXES, and the clustering layers' max_boxes when param_str does not give one: boxes kept per image."""
BOX_LIST_VALUES = 5
"""Values per box in the lists these layers pass on (xl, yt, xr, yb, then confidence, 0 or the match class)."""

ParamField = tuple[str, type, Any]
"""(name, int or float, default or None when the layer's setup reads it unconditionally)."""


def _param_str(ctx: LayerContext, fields: tuple[ParamField, ...]) -> dict[str, Any]:
    """python_param.param_str as the layer's `setup` reads it: split on commas, item i converted with int() or
    float() as the Python 2 these layers run under does (ASCII digits, the spaces DIGITS' DetectNet leaves after
    each comma; no `_` separators or other scripts' digits, which only Python 3 takes); a missing required item or
    one that does not convert stops the layer, as its ValueError or IndexError would stop Caffe."""
    text = ctx.param.python_param.param_str
    items = text.split(",")
    values: dict[str, Any] = {}
    for index, (name, kind, default) in enumerate(fields):
        if index >= len(items):
            if default is None:
                raise ctx.error(
                    f"param_str {text!r} has {len(items)} value(s); the layer reads {name} from value {index + 1} "
                    f"({', '.join(field[0] for field in fields)})",
                    field="python_param.param_str",
                )
            values[name] = default
            continue
        item = items[index]
        try:
            if not item.isascii() or "_" in item:
                raise ValueError(item)
            values[name] = kind(item)
        except ValueError:
            shown = item if len(item) <= 40 else f"{item[:40]}... ({len(item)} characters)"
            raise ctx.error(
                f"param_str value {index + 1} ({name}) must be {'an integer' if kind is int else 'a number'}, got "
                f"{shown!r}",
                field="python_param.param_str",
            ) from None
    return values


def _box_lists(ctx: LayerContext, values: dict[str, Any]) -> LayerSetup:
    """ClusterGroundtruth / ClusterDetections.reshape: one (images, max_boxes, 5) box list per class, one top per
    class (setup refuses another count), the classes being bottom 0's channels."""
    classes, max_boxes = values["num_classes"], values["max_boxes"]
    if len(ctx.param.top) != classes:
        raise ctx.error(f"has {len(ctx.param.top)} top(s) but param_str names {classes} class(es): one box list per "
                        "class", field="top")
    coverage = ctx.bottoms[0]
    if len(coverage) < 2:
        raise ctx.error(f"bottom 0 (coverage) needs images x classes, got {list(coverage)}", field="bottom")
    if coverage[1] != classes:
        raise ctx.error(f"bottom 0 (coverage) has {coverage[1]} class channel(s), param_str names {classes}",
                        field="bottom")
    if max_boxes < 0:
        raise ctx.error(f"max_boxes must not be negative (Blob::Reshape), got {max_boxes}",
                        field="python_param.param_str")
    return LayerSetup(tops=[(coverage[0], max_boxes, BOX_LIST_VALUES) for _ in range(classes)])


@python_layer_rule("caffe.layers.detectnet.clustering", "ClusterGroundtruth")
class ClusterGroundtruthRule(LayerRule):
    """ClusterGroundtruth: the label's coverage and boxes in, per class a list of up to max_boxes boxes.
    param_str: image_size_x, image_size_y, stride[, num_classes (1)[, max_boxes (50)]]."""

    bottoms = Count(minimum=2)  # reshape reads bottom 0, forward bottom 1
    FIELDS: tuple[ParamField, ...] = (
        ("image_size_x", int, None), ("image_size_y", int, None), ("stride", int, None),
        ("num_classes", int, 1), ("max_boxes", int, MAX_BOXES),
    )

    def setup(self, ctx: LayerContext) -> LayerSetup:
        return _box_lists(ctx, _param_str(ctx, self.FIELDS))


@python_layer_rule("caffe.layers.detectnet.clustering", "ClusterDetections")
class ClusterDetectionsRule(LayerRule):
    """ClusterDetections: the predicted coverage and boxes in, per class a list of up to max_boxes clustered boxes.
    param_str: image_size_x, image_size_y, stride, gridbox_cvg_threshold, gridbox_rect_thresh, gridbox_rect_eps,
    min_height[, num_classes (1)[, max_boxes (50)]]."""

    bottoms = Count(minimum=2)
    FIELDS: tuple[ParamField, ...] = (
        ("image_size_x", int, None), ("image_size_y", int, None), ("stride", int, None),
        ("gridbox_cvg_threshold", float, None), ("gridbox_rect_thresh", int, None),
        ("gridbox_rect_eps", float, None), ("min_height", int, None),
        ("num_classes", int, 1), ("max_boxes", int, MAX_BOXES),
    )

    def setup(self, ctx: LayerContext) -> LayerSetup:
        return _box_lists(ctx, _param_str(ctx, self.FIELDS))


@python_layer_rule("caffe.layers.detectnet.mean_ap", "ScoreDetections")
class ScoreDetectionsRule(LayerRule):
    """ScoreDetections.reshape: the ground-truth and predicted box lists in (the same number of images), the scored
    list out, (images, MAX_BOXES, 5) whatever the inputs hold; param_str (an IoU threshold) changes no shape."""

    bottoms = Count(minimum=2)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        truth, predicted = ctx.bottoms[0], ctx.bottoms[1]
        if not truth or not predicted:
            raise ctx.error("its bottoms need an images axis", field="bottom")
        if truth[0] != predicted[0]:
            raise ctx.error(f"# of images not matching: {truth[0]} ground-truth lists, {predicted[0]} predicted",
                            field="bottom")
        return LayerSetup(tops=[(truth[0], MAX_BOXES, BOX_LIST_VALUES)])


@python_layer_rule("caffe.layers.detectnet.mean_ap", "mAP")
class MeanAPRule(LayerRule):
    """mAP.reshape: three one-value tops (mAP, precision, recall) from the scored box list."""

    bottoms = Count(minimum=1)  # forward reads bottom 0
    tops = Count(exact=3)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        return LayerSetup(tops=[(1,), (1,), (1,)])
