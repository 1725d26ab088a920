"""Loss layers (a scalar top with loss weight 1, created when not named) and Accuracy."""

from __future__ import annotations

from .base import (
    ENGINE_CPU,
    ENGINE_CUDNN,
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
from .normalization import softmax_buffers


class LossRule(LayerRule):
    """LossLayer: two bottoms with the same first dimension, one scalar top, no backward into the label."""

    bottoms = Count(exact=2)
    tops = Count(exact=1)
    auto_top_blobs = True
    is_loss = True

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1

    def host_tops(self, ctx: LayerContext, engine: str) -> tuple[int, ...]:
        # Every loss's Forward_gpu (or its Forward_cpu) writes the loss with top[0]->mutable_cpu_data().
        return (0,)

    def check_same_num(self, ctx: LayerContext) -> None:
        a, b = ctx.bottoms[0], ctx.bottoms[1]
        if not a or not b or a[0] != b[0]:
            raise ctx.error(
                f"the data and label should have the same first dimension ({list(a)} vs {list(b)})", field="bottom"
            )

    def setup(self, ctx: LayerContext) -> LayerSetup:
        self.check_same_num(ctx)
        return LayerSetup(tops=[()])


def _outer_inner(ctx: LayerContext, axis_value: int, field: str) -> tuple[int, int, int]:
    scores, labels = ctx.bottoms[0], ctx.bottoms[1]
    axis = ctx.canonical_axis(axis_value, len(scores), field)
    outer, inner = count_of(scores[:axis]), count_of(scores[axis + 1 :])
    if outer * inner != count_of(labels):
        raise ctx.error(
            f"number of labels ({count_of(labels)}, {list(labels)}) must match the number of predictions "
            f"({outer * inner}: {list(scores)} with the class axis {axis})",
            field="bottom",
        )
    return axis, outer, inner


def _inner_loss_weight(ctx: LayerContext) -> float:
    """The first loss_weight the inner layer of a loss layer sees when it gets a copy of the outer layer's
    LayerParameter after LossLayer::LayerSetUp: the given weight, else the 1 that LossLayer::LayerSetUp adds."""
    weights = ctx.param.loss_weight
    return weights[0] if len(weights) else 1.0


@layer_rule("SoftmaxWithLoss")
class SoftmaxWithLossRule(LossRule):
    """SoftmaxWithLossLayer: an inner Softmax into prob_ (the input's size); optional second top is prob."""

    bottoms = Count(exact=2)
    tops = Count(minimum=1, maximum=2)

    def needed_tops(self) -> int:
        return 1

    def forward_bottom_diffs(self, ctx: LayerContext, engine: str) -> tuple[int, ...]:
        # Forward_gpu: "loss_data = bottom[0]->mutable_gpu_diff()", the per-item losses, in every net.
        return () if engine == ENGINE_CPU else (0,)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        self.check_same_num(ctx)
        if len(ctx.param.loss_weight) > 1:
            # LayerSetUp copies its LayerParameter, loss_weight included, into the inner Softmax, whose one top
            # then rejects the list; without a list the outer layer's two tops reject the single default weight.
            # So this Caffe cannot give the second (probabilities) top.
            raise ctx.error(
                f"{len(ctx.param.loss_weight)} loss weights reach the inner Softmax layer, which has one top: this "
                "Caffe cannot give SoftmaxWithLoss a second (probabilities) top; use a separate Softmax layer",
                field="loss_weight",
            )
        axis, _, _ = _outer_inner(ctx, ctx.param.softmax_param.axis, "softmax_param.axis")
        tops = [()] + ([ctx.bottoms[0]] if len(ctx.param.top) > 1 else [])
        return LayerSetup(tops=tops, details={"axis": axis})

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        scores = ctx.bottoms[0]
        buffers = [Buffer("prob", count_of(scores))]
        if engine != ENGINE_CPU:
            # Forward_gpu counts the valid labels in prob_'s diff on the device (`counts`), in every net.
            buffers.append(Buffer("prob.diff", count_of(scores)))
        elif _inner_loss_weight(ctx) != 0:
            # LayerSetUp copies this layer's LayerParameter into the inner Softmax after LossLayer::LayerSetUp
            # added the default loss_weight 1 (when none is given, or when InsertSplits moved it to a Split layer).
            # The inner layer's SetUp (Layer::SetLossWeights) then writes a non-zero weight into prob_'s diff:
            # allocated at set-up in every net, TRAIN and TEST, and never read (on a GPU: pinned host memory,
            # before Forward_gpu takes the same diff on the device).
            buffers.append(Buffer("prob.diff", count_of(scores)))
        p = ctx.param.softmax_param
        if not (engine == ENGINE_CUDNN and p.engine in (p.DEFAULT, p.CUDNN)):
            buffers += [Buffer(f"softmax.{b.name}", b.count, host_only=b.host_only)
                        for b in softmax_buffers(scores, setup.details["axis"])]
        return buffers


@layer_rule("EuclideanLoss")
class EuclideanLossRule(LossRule):
    """EuclideanLossLayer: keeps the difference of its inputs."""

    def allow_force_backward(self, bottom_index: int) -> bool:
        return True

    def setup(self, ctx: LayerContext) -> LayerSetup:
        self.check_same_num(ctx)
        if count_of(ctx.bottoms[0][1:]) != count_of(ctx.bottoms[1][1:]):
            raise ctx.error(
                f"inputs must have the same dimension ({list(ctx.bottoms[0])} vs {list(ctx.bottoms[1])})", field="bottom"
            )
        return LayerSetup(tops=[()])

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        return [Buffer("diff", count_of(ctx.bottoms[0]))]


@layer_rule("SigmoidCrossEntropyLoss")
class SigmoidCrossEntropyLossRule(LossRule):
    """SigmoidCrossEntropyLossLayer: an inner Sigmoid into sigmoid_output_ (the input's size)."""

    def setup(self, ctx: LayerContext) -> LayerSetup:
        self.check_same_num(ctx)
        if count_of(ctx.bottoms[0]) != count_of(ctx.bottoms[1]):
            raise ctx.error("inputs must have the same count", field="bottom")
        return LayerSetup(tops=[()])

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        count = count_of(ctx.bottoms[0])
        buffers = [Buffer("sigmoid_output", count)]
        # The inner Sigmoid is built in the constructor from the LayerParameter the net gives (after InsertSplits,
        # before LossLayer::LayerSetUp adds its default): only a loss_weight written in the prototxt (and left on
        # this layer by InsertSplits) reaches it, and SetLossWeights then writes it into sigmoid_output_'s diff. On
        # a GPU the inner layer's Layer::Forward then reads that weight with gpu_diff(): on the device too.
        weights = ctx.param.loss_weight
        if len(weights) and weights[0] != 0:
            buffers.append(Buffer("sigmoid_output.diff", count))
        return buffers


@layer_rule("ContrastiveLoss")
class ContrastiveLossRule(LossRule):
    """ContrastiveLossLayer: two feature blobs and a similarity label; keeps a_i - b_i and distances."""

    bottoms = Count(exact=3)

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 2

    def setup(self, ctx: LayerContext) -> LayerSetup:
        self.check_same_num(ctx)
        a, b, sim = ctx.bottoms
        # LayerSetUp reads the bottoms as (num, channels, height, width).
        dims = [[legacy_dim(ctx, shape, i) for i in range(4)] for shape in (a, b, sim)]
        if dims[0][1] != dims[1][1] or any(d[2:] != [1, 1] for d in dims) or dims[2][1] != 1:
            raise ctx.error(
                f"expects two (N, C, 1, 1) features and an (N, 1, 1, 1) similarity, got {list(a)}, {list(b)}, "
                f"{list(sim)}",
                field="bottom",
            )
        if dims[2][0] != dims[0][0]:
            raise ctx.error(f"the similarity {list(sim)} must have one value per pair ({dims[0][0]})", field="bottom")
        return LayerSetup(tops=[()])

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        n, c = legacy_dim(ctx, ctx.bottoms[0], 0), legacy_dim(ctx, ctx.bottoms[0], 1)
        buffers = [Buffer("diff", n * c), Buffer("dist_sq", n), Buffer("summer_vec", c)]
        if engine != ENGINE_CPU:
            buffers.append(Buffer("diff_sq", n * c))
        return buffers


@layer_rule("HingeLoss")
class PlainLossRule(LossRule):
    """Losses that keep nothing of their own."""


def _check_label(ctx: LayerContext) -> None:
    """The (N, 1, 1, 1) label these losses read as (num, channels, height, width)."""
    label = ctx.bottoms[1]
    if any(legacy_dim(ctx, label, i) != 1 for i in (1, 2, 3)):
        raise ctx.error(f"the label {list(label)} must hold one value per item: (N), (N, 1) ... (N, 1, 1, 1)",
                        field="bottom")


@layer_rule("MultinomialLogisticLoss")
class MultinomialLogisticLossRule(LossRule):
    """MultinomialLogisticLossLayer: probabilities and one label per item."""

    def setup(self, ctx: LayerContext) -> LayerSetup:
        self.check_same_num(ctx)
        _check_label(ctx)
        return LayerSetup(tops=[()])


@layer_rule("InfogainLoss")
class InfogainLossRule(LossRule):
    """InfogainLossLayer: the infogain matrix as a third bottom or loaded from a file (a K x K blob)."""

    bottoms = Count(minimum=2, maximum=3)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        self.check_same_num(ctx)
        _check_label(ctx)
        scores = ctx.bottoms[0]
        classes = count_of(scores) // legacy_dim(ctx, scores, 0) if legacy_dim(ctx, scores, 0) else 0
        if len(ctx.bottoms) == 3:
            matrix = ctx.bottoms[2]
            if [legacy_dim(ctx, matrix, i) for i in range(4)] != [1, 1, classes, classes]:
                raise ctx.error(
                    f"the infogain matrix {list(matrix)} must be {classes} x {classes} (1, 1, {classes}, {classes})",
                    field="bottom",
                )
        elif not ctx.param.infogain_loss_param.source:
            raise ctx.error("without a third bottom the infogain matrix must come from a file",
                            field="infogain_loss_param.source")
        return LayerSetup(tops=[()], details={"classes": classes})

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        if len(ctx.bottoms) == 3:
            return []
        k = setup.details["classes"]
        return [Buffer("infogain", k * k)]


@layer_rule("Accuracy")
class AccuracyRule(LayerRule):
    """AccuracyLayer: a scalar (and per-class accuracies); never part of backward."""

    def host_tops(self, ctx: LayerContext, engine: str) -> tuple[int, ...]:
        return tuple(range(len(ctx.param.top)))  # no GPU code: Forward_cpu writes them on the host

    bottoms = Count(exact=2)
    tops = Count(minimum=1, maximum=2)

    def setup(self, ctx: LayerContext) -> LayerSetup:
        p = ctx.param.accuracy_param
        scores = ctx.bottoms[0]
        if p.top_k > count_of(scores) // max(count_of(ctx.bottoms[1]), 1):
            raise ctx.error("top_k must be less than or equal to the number of classes", field="accuracy_param.top_k")
        axis, _, _ = _outer_inner(ctx, p.axis, "accuracy_param.axis")
        tops: list[Shape] = [()] + ([(scores[axis],)] if len(ctx.param.top) > 1 else [])
        return LayerSetup(tops=tops, details={"classes": scores[axis]})

    def buffers(self, ctx: LayerContext, setup: LayerSetup, engine: str) -> list[Buffer]:
        if len(ctx.param.top) > 1:
            return [Buffer("nums_buffer", setup.details["classes"])]
        return []
