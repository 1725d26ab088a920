"""NVcaffe's own layers that DIGITS' DetectNet uses (DetectNetTransformation, L1Loss), and NVcaffe's BatchNorm.

Each follows NVcaffe 0.17.3's LayerSetUp / Reshape (mirror NEWPLAN/nvcaffe-0.17.3, commit 12cba10,
src/caffe/layers/<name>_layer.cpp and src/caffe/util/detectnet_coverage_rectangular.cpp). DetectNet's Python
clustering layer (caffe.layers.detectnet.clustering) is a Python layer like any other: the estimator never imports
it, so its top shapes come from the caller (`layers.data.PythonRule`).
"""

from __future__ import annotations

from .base import (
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
from .loss import LossRule

TRANSFORMED_LABEL_SIZE = 8
"""CoverageGenerator::TRANSFORMED_LABEL_SIZE: foreground, 4 box corners, 2 inverse sizes, obj_norm per grid cell;
then one coverage channel per class."""
AUGMENT_SELECTION_BYTES = 32
"""sizeof(AugmentSelection) (detectnet_transform_layer.hpp: flip, rotation, scale, crop offset, hue, saturation),
the per-image record the GPU path reserves."""


@layer_rule("DetectNetTransformation")
class DetectNetTransformationRule(LayerRule):
    """DetectNetTransformationLayer::Reshape: 3-channel images and their labels in (same num); out the image at
    detectnet_groundtruth_param's image_size_y x image_size_x, and the label tensor (N, 8 + classes, grid rows,
    grid columns), the grid being the image divided by `stride` (CoverageGenerator's gridROI_); classes are the
    largest object_class dst + 1 (class 1 -> 0 when none is given). On the GPU it reserves a scratch copy of the
    input images and one AugmentSelection per image."""

    bottoms = Count(exact=2)
    tops = Count(exact=2)

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
