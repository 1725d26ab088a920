"""The SSD layers NVcaffe 0.17 carries (from Wei Liu's SSD fork): AnnotatedData, Normalize, Permute, PriorBox,
MultiBoxLoss, DetectionOutput, DetectionEvaluate.

Each rule follows the layer's LayerSetUp and Reshape in NVcaffe 0.17.3 (read from the mirror NEWPLAN/nvcaffe-0.17.3,
commit 12cba10, src/caffe/layers/<name>_layer.cpp), its CHECKs turned into ShapeErrors. Their parameter messages
have the same fields in both schemas pycaffe's caffe.proto and NVcaffe's, so these rules serve either flavour.
"""

from __future__ import annotations

import struct

from .base import (
    DATA_PREFETCH,
    INT_BYTES,
    Buffer,
    Count,
    LayerContext,
    LayerRule,
    LayerSetup,
    Shape,
    count_of,
    layer_rule,
    legacy_dim,
)
from .data import PREFETCH_COUNT, DataSpec, _batch, _mean_buffer, _spec
from .loss import LossRule

DEFAULT_BOXES_PER_IMAGE = 8
"""Ground-truth boxes per image assumed for AnnotatedData's label top when the caller gives none: its shape (1, 1,
boxes in the batch, 8) depends on the images read (COCO averages 7.3 objects per image, VOC 2.4)."""
DEFAULT_IMAGE_CHANNELS = 3
"""Channels of an AnnotatedData image whose size comes from resize_param: SSD's datasets are colour JPEGs."""


def _float32(value: float) -> float:
    """A double rounded to float, as the C++ stores it in a vector<float>."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


# ---------------------------------------------------------------------------------------------- AnnotatedData


@layer_rule("AnnotatedData")
class AnnotatedDataRule(LayerRule):
    """AnnotatedDataLayer::DataLayerSetUp: top[0] is (batch, C, H, W) of the transformed image, top[1] the boxes
    of the whole batch as (1, 1, boxes, 8), at least one row. The image is the dataset's item (given by the caller)
    resized by transform_param.resize_param (WARP to height x width) and cropped by crop_size / crop_h x crop_w
    (DataTransformer::InferBlobShape); with a resize_param of both sides and no item given, 3 channels are assumed.
    The label's box count is the caller's (``layer/label``: the shape, or (boxes,)), else DEFAULT_BOXES_PER_IMAGE
    per image. Prefetch: PREFETCH_COUNT batches of each top, as for Data."""

    is_data = True
    bottoms = Count(exact=0)
    tops = Count(minimum=1, maximum=2)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.data_param
        batch = _batch(ctx, p.batch_size, "data_param.batch_size")
        transform = ctx.param.transform_param
        top = ctx.param.top[0]
        # NVcaffe's resize_param; BVLC's schema (pycaffe's) has none.
        has_resize = "resize_param" in transform.DESCRIPTOR.fields_by_name and transform.HasField("resize_param")
        resize = transform.resize_param if has_resize else None
        if resize is not None and resize.resize_mode == resize.FIT_SMALL_SIZE and batch != 1:
            raise ctx.error("resize_mode FIT_SMALL_SIZE only supports a batch size of 1",
                            field="transform_param.resize_param.resize_mode")
        given = ctx.data_shape(top)
        if given is None and resize is not None and resize.height and resize.width:
            item: Shape = (DEFAULT_IMAGE_CHANNELS, resize.height, resize.width)
            spec = DataSpec(item)
        else:
            spec = _spec(ctx, top, "dataset (data_param.source)")
            item = spec.shape
            if resize is not None and resize.height and resize.width and len(item) >= 2:
                item = (*item[:-2], resize.height, resize.width)
        item = _crop(ctx, item)
        tops: list[Shape] = [(batch, *item)]
        if len(ctx.param.top) > 1:
            tops.append(self._label_shape(ctx, batch))
        return LayerSetup(tops=tops, details={"spec": spec, "batch": batch})

    def _label_shape(self, ctx: LayerContext, batch: int) -> Shape:
        given = ctx.data_shape(ctx.param.top[1], wildcard=False)
        if given is None:
            return (1, 1, max(batch * DEFAULT_BOXES_PER_IMAGE, 1), 8)
        shape = tuple(given.shape if isinstance(given, DataSpec) else given)
        if len(shape) == 1:
            return (1, 1, max(int(shape[0]), 1), 8)
        if len(shape) != 4 or shape[:2] != (1, 1) or shape[3] != 8:
            raise ctx.error(f"the label of an AnnotatedData layer is (1, 1, boxes, 8); {list(shape)} was given",
                            field="top")
        return shape

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        buffers = [Buffer("prefetch.data", PREFETCH_COUNT * count_of(setup.tops[0]), category=DATA_PREFETCH)]
        if len(setup.tops) > 1:
            buffers.append(Buffer("prefetch.label", PREFETCH_COUNT * count_of(setup.tops[1]), category=DATA_PREFETCH))
        return [*buffers, *_mean_buffer(ctx, setup.details["spec"].shape)]


def _crop(ctx: LayerContext, item: Shape) -> Shape:
    """InferBlobShape's crop: crop_h x crop_w when set (NVcaffe), else a square crop_size."""
    t = ctx.param.transform_param
    crop_h = getattr(t, "crop_h", 0) or t.crop_size
    crop_w = getattr(t, "crop_w", 0) or t.crop_size
    if not crop_h and not crop_w:
        return item
    if len(item) < 2:
        raise ctx.error(f"cropping needs an item with height and width, got {list(item)}", field="transform_param")
    height, width = crop_h or item[-2], crop_w or item[-1]
    if height > item[-2] or width > item[-1]:
        raise ctx.error(f"the crop {height} x {width} exceeds the item's {item[-2]} x {item[-1]}",
                        field="transform_param.crop_size")
    return (*item[:-2], height, width)


# ---------------------------------------------------------------------------------------------- Normalize


@layer_rule("Normalize")
class NormalizeRule(LayerRule):
    """NormalizeLayer (normalize_layer.cpp): top like the bottom (at least 2 axes); one learnable scale, a scalar
    (shape ()) when channel_shared, else one per channel; buffer_ (1, C, H, W), norm_ (N) across_spatial or
    (N, H, W), and per-channel and per-pixel helper vectors."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        bottom = ctx.bottoms[0]
        if len(bottom) < 2:
            raise ctx.error(f"the bottom must have at least 2 axes, got {list(bottom)}", field="bottom")
        channels = legacy_dim(ctx, bottom, 1)
        param: Shape = () if ctx.param.norm_param.channel_shared else (channels,)
        return LayerSetup(tops=[bottom], params=[param])

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        bottom = ctx.bottoms[0]
        num, channels = legacy_dim(ctx, bottom, 0), legacy_dim(ctx, bottom, 1)
        spatial = legacy_dim(ctx, bottom, 2) * legacy_dim(ctx, bottom, 3)
        norm = num if ctx.param.norm_param.across_spatial else num * spatial
        return [
            Buffer("buffer", channels * spatial),
            Buffer("buffer_channel", channels),
            Buffer("buffer_spatial", spatial),
            Buffer("norm", norm),
            Buffer("sum_channel_multiplier", channels),
            Buffer("sum_spatial_multiplier", spatial),
        ]


# ---------------------------------------------------------------------------------------------- Permute


@layer_rule("Permute")
class PermuteRule(LayerRule):
    """PermuteLayer (permute_layer.cpp): `order` names the first axes of the top (each below the bottom's axis
    count, no repeats); the remaining axes follow in their order. When that is the identity, Forward shares the
    bottom's data and Backward its diff, so the top owns no memory. Three int blobs of one entry per axis."""

    bottoms = Count(exact=1)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        bottom = ctx.bottoms[0]
        num_axes = len(bottom)
        orders: list[int] = []
        for index, order in enumerate(ctx.param.permute_param.order):
            if order >= num_axes:
                raise ctx.error(f"order {order} must be less than the input's {num_axes} axes",
                                field=f"permute_param.order[{index}]")
            if order in orders:
                raise ctx.error(f"order {order} is given twice", field=f"permute_param.order[{index}]")
            orders.append(order)
        orders += [axis for axis in range(num_axes) if axis not in orders]
        top = tuple(bottom[axis] for axis in orders)
        identity = orders == list(range(num_axes))
        views = {0: 0} if identity else {}
        return LayerSetup(tops=[top], data_views=views, diff_views=dict(views), details={"axes": num_axes})

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        axes = setup.details["axes"]
        return [Buffer(name, axes, INT_BYTES) for name in ("permute_order", "old_steps", "new_steps")]


# ---------------------------------------------------------------------------------------------- PriorBox


def prior_count(ctx: LayerContext) -> int:
    """PriorBoxLayer::LayerSetUp's num_priors_: the aspect ratios (1 first; each new ratio, and its inverse when
    flip, duplicates within 1e-6 dropped) times the min sizes, plus one per max size; with its CHECKs."""
    p = ctx.param.prior_box_param
    if len(p.min_size) == 0:
        raise ctx.error("must provide min_size", field="prior_box_param.min_size")
    for index, size in enumerate(p.min_size):
        if size <= 0:
            raise ctx.error(f"min_size must be positive, got {size}", field=f"prior_box_param.min_size[{index}]")
    ratios = [1.0]
    for ratio in p.aspect_ratio:
        if any(abs(ratio - known) < 1e-6 for known in ratios):
            continue
        ratios.append(ratio)
        if p.flip:
            ratios.append(_float32(1.0 / ratio) if ratio else float("inf"))
    count = len(ratios) * len(p.min_size)
    if len(p.max_size):
        if len(p.max_size) != len(p.min_size):
            raise ctx.error(f"give max_size once per min_size ({len(p.min_size)}), got {len(p.max_size)}",
                            field="prior_box_param.max_size")
        for index, (low, high) in enumerate(zip(p.min_size, p.max_size)):
            if high <= low:
                raise ctx.error(f"max_size must be greater than min_size ({high} <= {low})",
                                field=f"prior_box_param.max_size[{index}]")
        count += len(p.max_size)
    if len(p.variance) > 1 and len(p.variance) != 4:
        raise ctx.error(f"give one variance or four, got {len(p.variance)}", field="prior_box_param.variance")
    for index, variance in enumerate(p.variance):
        if variance <= 0:
            raise ctx.error(f"variance must be positive, got {variance}", field=f"prior_box_param.variance[{index}]")
    if p.HasField("img_h") or p.HasField("img_w"):
        if p.HasField("img_size"):
            raise ctx.error("give either img_size or img_h/img_w, not both", field="prior_box_param.img_size")
        if p.img_h <= 0 or p.img_w <= 0:
            raise ctx.error("img_h and img_w must both be larger than 0", field="prior_box_param.img_h")
    elif p.HasField("img_size") and p.img_size <= 0:
        raise ctx.error("img_size must be larger than 0", field="prior_box_param.img_size")
    if p.HasField("step_h") or p.HasField("step_w"):
        if p.HasField("step"):
            raise ctx.error("give either step or step_h/step_w, not both", field="prior_box_param.step")
        if p.step_h <= 0 or p.step_w <= 0:
            raise ctx.error("step_h and step_w must both be larger than 0", field="prior_box_param.step_h")
    elif p.HasField("step") and p.step <= 0:
        raise ctx.error("step must be larger than 0", field="prior_box_param.step")
    return count


@layer_rule("PriorBox")
class PriorBoxRule(LayerRule):
    """PriorBoxLayer::Reshape: one set of priors for the whole batch, (1, 2, H x W x num_priors x 4) from the
    feature map's height and width (bottom[0]); the second channel holds the variances. bottom[1] is the image,
    read in Forward only. No params, no buffers."""

    bottoms = Count(exact=2)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        num_priors = ctx.memo.get("num_priors")
        if num_priors is None:
            num_priors = ctx.memo["num_priors"] = prior_count(ctx)
        feature = ctx.bottoms[0]
        height, width = legacy_dim(ctx, feature, 2), legacy_dim(ctx, feature, 3)
        return LayerSetup(tops=[(1, 2, width * height * num_priors * 4)])


# ---------------------------------------------------------------------------------------------- MultiBoxLoss


@layer_rule("MultiBoxLoss")
class MultiBoxLossRule(LossRule):
    """MultiBoxLossLayer: bottoms loc (N, priors x loc_classes x 4), conf (N, priors x classes), priors (1, 2,
    priors x 4), ground truth (1, 1, boxes, 8); a scalar loss. Its matching runs on the host (enforce_cpu on its
    inner SmoothL1Loss / SoftmaxWithLoss layers): the encoded predictions, targets and the softmax's probabilities
    are host blobs, sized by the matches found at run time; counted at their bound, every prior of every image."""

    bottoms = Count(exact=4)

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index < 2  # Backward_cpu aborts on a gradient for the priors or the labels

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.multibox_loss_param
        if not p.HasField("num_classes"):
            raise ctx.error("must provide num_classes", field="multibox_loss_param.num_classes")
        if p.num_classes < 1:
            raise ctx.error("num_classes should not be less than 1", field="multibox_loss_param.num_classes")
        mining = p.mining_type != p.NONE
        if p.HasField("do_neg_mining") and p.do_neg_mining != mining:
            raise ctx.error("do_neg_mining (deprecated) contradicts mining_type", field="multibox_loss_param")
        if mining and not p.share_location:
            raise ctx.error("negative mining needs share_location", field="multibox_loss_param.share_location")
        if p.conf_loss_type == p.SOFTMAX and not 0 <= p.background_label_id < p.num_classes:
            raise ctx.error(f"background_label_id must be within [0, {p.num_classes}) for Softmax",
                            field="multibox_loss_param.background_label_id")
        self.check_same_num(ctx)
        loc, conf, priors = ctx.bottoms[0], ctx.bottoms[1], ctx.bottoms[2]
        num_priors = legacy_dim(ctx, priors, 2) // 4
        loc_classes = 1 if p.share_location else p.num_classes
        if num_priors * loc_classes * 4 != legacy_dim(ctx, loc, 1):
            raise ctx.error(f"number of priors ({num_priors}) must match number of location predictions "
                            f"({legacy_dim(ctx, loc, 1)} = priors x {loc_classes} x 4)", field="bottom")
        if num_priors * p.num_classes != legacy_dim(ctx, conf, 1):
            raise ctx.error(f"number of priors ({num_priors}) must match number of confidence predictions "
                            f"({legacy_dim(ctx, conf, 1)} = priors x {p.num_classes})", field="bottom")
        return LayerSetup(tops=[()], details={"priors": num_priors, "num": loc[0] if loc else 1})

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        p = ctx.param.multibox_loss_param
        rows = setup.details["num"] * setup.details["priors"]
        classes = p.num_classes
        return [
            Buffer("loc_pred", 2 * rows * 4, host_only=True),  # data and diff
            Buffer("loc_gt", rows * 4, host_only=True),
            Buffer("conf_pred", 2 * rows * classes, host_only=True),
            Buffer("conf_gt", rows * (classes if p.conf_loss_type == p.LOGISTIC else 1), host_only=True),
            Buffer("conf_loss.prob", rows * classes, host_only=True),
        ]


# ---------------------------------------------------------------------------------------------- detection output


def _check_priors(ctx: LayerContext, num_classes: int, share_location: bool) -> int:
    loc, conf, priors = ctx.bottoms[0], ctx.bottoms[1], ctx.bottoms[2]
    if not loc or not conf or loc[0] != conf[0]:
        raise ctx.error(f"loc and conf must have the same num ({list(loc)} vs {list(conf)})", field="bottom")
    num_priors = legacy_dim(ctx, priors, 2) // 4
    loc_classes = 1 if share_location else num_classes
    if num_priors * loc_classes * 4 != legacy_dim(ctx, loc, 1):
        raise ctx.error(f"number of priors ({num_priors}) must match number of location predictions "
                        f"({legacy_dim(ctx, loc, 1)})", field="bottom")
    if num_priors * num_classes != legacy_dim(ctx, conf, 1):
        raise ctx.error(f"number of priors ({num_priors}) must match number of confidence predictions "
                        f"({legacy_dim(ctx, conf, 1)})", field="bottom")
    return num_priors


@layer_rule("DetectionOutput")
class DetectionOutputRule(LayerRule):
    """DetectionOutputLayer::Reshape: a (fake) (1, 1, 1, 7) top, since the detections kept are only known after
    NMS; Forward then reshapes it to (1, 1, kept, 7), at most keep_top_k per image (every prior of every class
    without keep_top_k): that growth is counted as a buffer. bbox_preds_ and conf_permute_ (and bbox_permute_
    without share_location) are copies of the loc and conf bottoms."""

    bottoms = Count(exact=3)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.detection_output_param
        if not p.HasField("num_classes"):
            raise ctx.error("must provide num_classes", field="detection_output_param.num_classes")
        if p.nms_param.nms_threshold < 0:
            raise ctx.error("nms_threshold must be non negative", field="detection_output_param.nms_param")
        num_priors = _check_priors(ctx, p.num_classes, p.share_location)
        return LayerSetup(tops=[(1, 1, 1, 7)], details={"priors": num_priors})

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        p = ctx.param.detection_output_param
        loc, conf = ctx.bottoms[0], ctx.bottoms[1]
        num = loc[0]
        per_image = p.keep_top_k if p.keep_top_k > -1 else setup.details["priors"] * p.num_classes
        buffers = [
            Buffer("bbox_preds", count_of(loc)),
            Buffer("conf_permute", count_of(conf)),
            Buffer("top.grown", max(num * per_image - 1, 0) * 7),
        ]
        if not p.share_location:
            buffers.append(Buffer("bbox_permute", count_of(loc)))
        return buffers


@layer_rule("DetectionEvaluate")
class DetectionEvaluateRule(LayerRule):
    """DetectionEvaluateLayer::Reshape: detections (1, 1, D, 7) and ground truth (1, 1, G, 8) in; out (1, 1,
    positive classes + valid detections, 5). At set-up the detections blob holds zeros, so all D rows count as
    valid; in Forward it grows with the detections kept (counted with DetectionOutput's growth)."""

    bottoms = Count(exact=2)
    tops = Count(exact=1)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.detection_evaluate_param
        if not p.HasField("num_classes"):
            raise ctx.error("must provide num_classes", field="detection_evaluate_param.num_classes")
        if p.overlap_threshold <= 0:
            raise ctx.error("overlap_threshold must be positive", field="detection_evaluate_param.overlap_threshold")
        detections, truth = ctx.bottoms
        for index, (blob, width) in enumerate(((detections, 7), (truth, 8))):
            dims = [legacy_dim(ctx, blob, axis) for axis in range(4)]
            if dims[0] != 1 or dims[1] != 1 or dims[3] != width:
                raise ctx.error(f"bottom {index} must be (1, 1, rows, {width}), got {list(blob)}", field="bottom")
        positive = p.num_classes if p.background_label_id == -1 else p.num_classes - 1
        return LayerSetup(tops=[(1, 1, positive + legacy_dim(ctx, detections, 2), 5)])

