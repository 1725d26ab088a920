"""Each layer rule against pycaffe on small hand-written nets: every configuration the zoo leaves out, every
CHECK Caffe aborts on (a ShapeError here, naming the layer and the field), and the recurrent and SPP layers'
internal buffers against bytes measured in a real training step."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from digits_memplugin.core.errors import NetError, ShapeError, UnrollLimitError
from digits_memplugin.core.estimate import EstimateRequest, estimate
from digits_memplugin.core.layers.base import (
    ACTIVATION_DIFFS,
    ACTIVATIONS,
    CONTEXT,
    ENGINE_CPU,
    ENGINE_CUDNN,
    ENGINE_GPU,
    LAYER_BUFFERS,
    PARAM_DIFFS,
    PARAMS,
    SOLVER_HISTORY,
)
from digits_memplugin.core.layers.recurrent import MAX_UNROLLED_STEPS
from digits_memplugin.core.memory import SUBNET_OWN_ELSEWHERE, MemoryOptions, net_memory
from digits_memplugin.core.net import Net, build_net, input_net
from digits_memplugin.core.prototxt import parse_net
from digits_memplugin.core.training import training_definition
from digits_memplugin.estimate.pycaffe_shapes import caffe_net, differences
from digits_memplugin.measure.runner import measure

CONV_NET = """
name: "conv"
layer { name: "x" type: "Input" top: "x" top: "x3d" input_param { shape { dim: 2 dim: 4 dim: 11 dim: 9 } shape { dim: 2 dim: 3 dim: 5 dim: 6 dim: 7 } } }
layer { name: "plain" type: "Convolution" bottom: "x" top: "plain" convolution_param { num_output: 6 kernel_size: 3 } }
layer { name: "rect" type: "Convolution" bottom: "x" top: "rect" convolution_param { num_output: 6 kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 } }
layer { name: "dilated" type: "Convolution" bottom: "x" top: "dilated" convolution_param { num_output: 4 kernel_size: 3 dilation: 2 pad: 1 bias_term: false } }
layer { name: "dil2" type: "Convolution" bottom: "x" top: "dil2" convolution_param { num_output: 4 kernel_size: 3 kernel_size: 2 dilation: 3 dilation: 1 stride: 2 stride: 3 } }
layer { name: "group" type: "Convolution" bottom: "x" top: "group" convolution_param { num_output: 8 kernel_size: 3 group: 2 pad: 1 } }
layer { name: "depthwise" type: "Convolution" bottom: "x" top: "depthwise" convolution_param { num_output: 4 kernel_size: 3 group: 4 stride: 2 } }
layer { name: "one" type: "Convolution" bottom: "x" top: "one" convolution_param { num_output: 5 kernel_size: 1 } }
layer { name: "nd" type: "Convolution" bottom: "x3d" top: "nd" convolution_param { num_output: 2 kernel_size: 3 kernel_size: 2 kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "two" type: "Convolution" bottom: "x" bottom: "x" top: "two_a" top: "two_b" convolution_param { num_output: 3 kernel_size: 5 stride: 3 } }
layer { name: "deconv" type: "Deconvolution" bottom: "x" top: "deconv" convolution_param { num_output: 3 kernel_size: 4 stride: 2 pad: 1 } }
layer { name: "deconv_g" type: "Deconvolution" bottom: "x" top: "deconv_g" convolution_param { num_output: 8 kernel_size: 3 stride: 3 group: 4 dilation: 2 bias_term: false } }
layer { name: "deconv1" type: "Deconvolution" bottom: "x" top: "deconv1" convolution_param { num_output: 2 kernel_size: 1 } }
layer { name: "deconv_nd" type: "Deconvolution" bottom: "x3d" top: "deconv_nd" convolution_param { num_output: 2 kernel_size: 2 stride: 2 } }
layer { name: "im2col" type: "Im2col" bottom: "x" top: "im2col" convolution_param { kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "loss" type: "EuclideanLoss" bottom: "plain" bottom: "plain" top: "loss" }
"""

POOLING_NET = """
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 dim: 13 dim: 11 } } }
layer { name: "max_pad" type: "Pooling" bottom: "x" top: "max_pad" pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 } }
layer { name: "ave_floor" type: "Pooling" bottom: "x" top: "ave_floor" pooling_param { pool: AVE kernel_size: 3 stride: 2 ceil_mode: false } }
layer { name: "global" type: "Pooling" bottom: "x" top: "global" pooling_param { pool: AVE global_pooling: true } }
layer { name: "rect" type: "Pooling" bottom: "x" top: "rect" pooling_param { pool: MAX kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 3 pad_h: 1 pad_w: 0 } }
layer { name: "clipw" type: "Pooling" bottom: "x" top: "clipw" pooling_param { pool: MAX kernel_h: 2 kernel_w: 1 stride_h: 1 stride_w: 3 pad_h: 1 pad_w: 0 } }
layer { name: "mask" type: "Pooling" bottom: "x" top: "mask" top: "mask_idx" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "big" type: "Pooling" bottom: "x" top: "big" pooling_param { pool: MAX kernel_size: 12 stride: 4 } }
layer { name: "spp1" type: "SPP" bottom: "x" top: "spp1" spp_param { pyramid_height: 1 } }
layer { name: "spp3" type: "SPP" bottom: "x" top: "spp3" spp_param { pyramid_height: 3 pool: AVE } }
layer { name: "spp4" type: "SPP" bottom: "x" top: "spp4" spp_param { pyramid_height: 3 } }
layer { name: "pool4" type: "Pooling" bottom: "x" top: "pool4" pooling_param { pool: STOCHASTIC kernel_size: 3 stride: 3 } }
layer { name: "ip" type: "InnerProduct" bottom: "spp4" top: "ip" inner_product_param { num_output: 2 } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "ip" }
"""

SHAPE_NET = """
name: "shape"
layer { name: "x" type: "Input" top: "x" top: "y" top: "ref" input_param { shape { dim: 2 dim: 6 dim: 8 dim: 10 } shape { dim: 2 dim: 3 dim: 8 dim: 10 } shape { dim: 2 dim: 6 dim: 5 dim: 7 } } }
layer { name: "crop" type: "Crop" bottom: "x" bottom: "ref" top: "crop" crop_param { axis: 2 offset: 1 offset: 2 } }
layer { name: "crop1" type: "Crop" bottom: "x" bottom: "ref" top: "crop1" crop_param { axis: -2 offset: 3 } }
layer { name: "crop0" type: "Crop" bottom: "x" bottom: "ref" top: "crop0" crop_param { axis: 1 } }
layer { name: "slice" type: "Slice" bottom: "x" top: "s1" top: "s2" top: "s3" slice_param { axis: 1 slice_point: 1 slice_point: 4 } }
layer { name: "slice_eq" type: "Slice" bottom: "x" top: "e1" top: "e2" slice_param { slice_dim: 3 } }
layer { name: "slice_one" type: "Slice" bottom: "x" top: "o1" }
layer { name: "concat" type: "Concat" bottom: "x" bottom: "y" top: "concat" }
layer { name: "concat3" type: "Concat" bottom: "e1" bottom: "e2" bottom: "e1" top: "concat3" concat_param { axis: -1 } }
layer { name: "concat1" type: "Concat" bottom: "s2" top: "concat1" concat_param { concat_dim: 0 } }
layer { name: "reshape" type: "Reshape" bottom: "x" top: "reshape" reshape_param { shape { dim: 0 dim: -1 dim: 5 } } }
layer { name: "reshape_ax" type: "Reshape" bottom: "x" top: "reshape_ax" reshape_param { shape { dim: 3 dim: 0 dim: -1 } axis: 1 num_axes: 2 } }
layer { name: "reshape_end" type: "Reshape" bottom: "x" top: "reshape_end" reshape_param { shape { dim: -1 } axis: -2 } }
layer { name: "reshape_ins" type: "Reshape" bottom: "x" top: "reshape_ins" reshape_param { shape { dim: 1 } axis: 0 num_axes: 0 } }
layer { name: "flatten" type: "Flatten" bottom: "x" top: "flatten" }
layer { name: "flatten_ax" type: "Flatten" bottom: "x" top: "flatten_ax" flatten_param { axis: 2 end_axis: -1 } }
layer { name: "flatten_mid" type: "Flatten" bottom: "x" top: "flatten_mid" flatten_param { axis: 0 end_axis: 1 } }
layer { name: "flatten_ins" type: "Flatten" bottom: "x" top: "flatten_ins" flatten_param { axis: 2 end_axis: 1 } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip" inner_product_param { num_output: 7 } }
layer { name: "ip_ax" type: "InnerProduct" bottom: "x" top: "ip_ax" inner_product_param { num_output: 3 axis: 2 bias_term: false } }
layer { name: "ip_t" type: "InnerProduct" bottom: "x" top: "ip_t" inner_product_param { num_output: 4 transpose: true axis: -1 } }
layer { name: "argmax" type: "ArgMax" bottom: "x" top: "argmax" argmax_param { top_k: 3 out_max_val: true } }
layer { name: "argmax1" type: "ArgMax" bottom: "ip" top: "argmax1" }
layer { name: "argmax_ax" type: "ArgMax" bottom: "x" top: "argmax_ax" argmax_param { axis: 1 top_k: 2 } }
layer { name: "tile" type: "Tile" bottom: "x" top: "tile" tile_param { axis: 2 tiles: 3 } }
layer { name: "tile0" type: "Tile" bottom: "ip" top: "tile0" tile_param { tiles: 2 } }
layer { name: "red" type: "Reduction" bottom: "x" top: "red" reduction_param { axis: 2 operation: ASUM } }
layer { name: "red0" type: "Reduction" bottom: "x" top: "red0" }
layer { name: "red_m" type: "Reduction" bottom: "x" top: "red_m" reduction_param { axis: -1 operation: MEAN } }
layer { name: "max" type: "Eltwise" bottom: "x" bottom: "x" top: "max" eltwise_param { operation: MAX } }
layer { name: "sum" type: "Eltwise" bottom: "x" bottom: "x" bottom: "x" top: "sum" eltwise_param { coeff: 1 coeff: -1 coeff: 2 } }
layer { name: "prod" type: "Eltwise" bottom: "x" bottom: "x" top: "prod" eltwise_param { operation: PROD } }
layer { name: "softmax" type: "Softmax" bottom: "x" top: "softmax" softmax_param { axis: 2 } }
layer { name: "silence" type: "Silence" bottom: "softmax" bottom: "tile0" }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "ip" top: "loss" }
"""

MISC_NET = """
name: "misc"
layer { name: "x" type: "Input" top: "x" top: "idx" top: "sel" top: "words" top: "sc" input_param { shape { dim: 4 dim: 3 dim: 5 dim: 6 } shape { dim: 7 } shape { dim: 4 dim: 1 } shape { dim: 4 dim: 9 } shape { dim: 4 dim: 3 } } }
layer { name: "dummy" type: "DummyData" top: "d1" top: "d2" dummy_data_param { shape { dim: 4 dim: 3 dim: 5 dim: 6 } shape { dim: 4 } } }
layer { name: "dummy_legacy" type: "DummyData" top: "d3" dummy_data_param { num: 4 channels: 2 height: 3 width: 1 } }
layer { name: "mem" type: "MemoryData" top: "m" top: "ml" memory_data_param { batch_size: 4 channels: 2 height: 3 width: 3 } }
layer { name: "param" type: "Parameter" top: "p" parameter_param { shape { dim: 3 dim: 5 } } }
layer { name: "embed" type: "Embed" bottom: "words" top: "embed" embed_param { num_output: 8 input_dim: 100 } }
layer { name: "embed_nb" type: "Embed" bottom: "words" top: "embed_nb" embed_param { num_output: 2 input_dim: 10 bias_term: false } }
layer { name: "prelu" type: "PReLU" bottom: "x" top: "prelu" }
layer { name: "prelu_in" type: "PReLU" bottom: "prelu" top: "prelu" prelu_param { channel_shared: true } }
layer { name: "scale" type: "Scale" bottom: "x" top: "scale" scale_param { bias_term: true } }
layer { name: "scale2" type: "Scale" bottom: "x" bottom: "sc" top: "scale2" scale_param { axis: 0 bias_term: true } }
layer { name: "scale_ax" type: "Scale" bottom: "x" top: "scale_ax" scale_param { axis: 2 num_axes: 2 } }
layer { name: "scale_sc" type: "Scale" bottom: "x" top: "scale_sc" scale_param { num_axes: 0 } }
layer { name: "bias" type: "Bias" bottom: "x" top: "bias" }
layer { name: "bias2" type: "Bias" bottom: "x" bottom: "sc" top: "bias2" bias_param { axis: 0 } }
layer { name: "bias_all" type: "Bias" bottom: "x" top: "bias_all" bias_param { axis: 1 num_axes: -1 } }
layer { name: "reindex" type: "BatchReindex" bottom: "x" bottom: "idx" top: "reindex" }
layer { name: "filter" type: "Filter" bottom: "x" bottom: "words" bottom: "sel" top: "fx" top: "fw" }
layer { name: "bn" type: "BatchNorm" bottom: "x" top: "bn" }
layer { name: "bn_in" type: "BatchNorm" bottom: "bn" top: "bn" }
layer { name: "lrn" type: "LRN" bottom: "x" top: "lrn" lrn_param { local_size: 3 } }
layer { name: "lrn_w" type: "LRN" bottom: "x" top: "lrn_w" lrn_param { local_size: 5 norm_region: WITHIN_CHANNEL } }
layer { name: "mvn" type: "MVN" bottom: "x" top: "mvn" }
layer { name: "mvn2" type: "MVN" bottom: "words" top: "mvn2" mvn_param { across_channels: true normalize_variance: false } }
layer { name: "drop" type: "Dropout" bottom: "x" top: "drop" dropout_param { dropout_ratio: 0.3 } }
layer { name: "relu" type: "ReLU" bottom: "drop" top: "drop" }
layer { name: "sig" type: "Sigmoid" bottom: "x" top: "sig" }
layer { name: "tanh" type: "TanH" bottom: "x" top: "tanh" }
layer { name: "abs" type: "AbsVal" bottom: "x" top: "abs" }
layer { name: "bnll" type: "BNLL" bottom: "x" top: "bnll" }
layer { name: "elu" type: "ELU" bottom: "x" top: "elu" }
layer { name: "power" type: "Power" bottom: "x" top: "power" power_param { power: 2 } }
layer { name: "exp" type: "Exp" bottom: "x" top: "exp" exp_param { base: 2 } }
layer { name: "log" type: "Log" bottom: "sig" top: "log" }
layer { name: "thr" type: "Threshold" bottom: "x" top: "thr" }
layer { name: "relu6" type: "ReLU6" bottom: "x" top: "relu6" }
layer { name: "hsig" type: "HardSigmoid" bottom: "x" top: "hsig" }
layer { name: "hswish" type: "HardSwish" bottom: "x" top: "hswish" }
layer { name: "ip" type: "InnerProduct" bottom: "bn" top: "ip" inner_product_param { num_output: 5 } }
layer { name: "label" type: "DummyData" top: "label" dummy_data_param { shape { dim: 4 } } }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" top: "per_class" accuracy_param { top_k: 2 } }
layer { name: "softmax_loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "sl" }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
layer { name: "hinge" type: "HingeLoss" bottom: "ip" bottom: "label" }
layer { name: "mlr" type: "MultinomialLogisticLoss" bottom: "ip" bottom: "label" top: "mlr" loss_weight: 0.5 }
layer { name: "sce" type: "SigmoidCrossEntropyLoss" bottom: "ip" bottom: "ip" top: "sce" }
layer { name: "ig_m" type: "DummyData" top: "ig_m" dummy_data_param { shape { dim: 1 dim: 1 dim: 5 dim: 5 } } }
layer { name: "infogain" type: "InfogainLoss" bottom: "ip" bottom: "label" bottom: "ig_m" top: "ig" }
layer { name: "ip2" type: "InnerProduct" bottom: "x" top: "ip2" inner_product_param { num_output: 5 } }
layer { name: "sim" type: "DummyData" top: "sim" dummy_data_param { shape { dim: 4 } } }
layer { name: "contrastive" type: "ContrastiveLoss" bottom: "ip" bottom: "ip2" bottom: "sim" top: "cl" }
layer { name: "euclid" type: "EuclideanLoss" bottom: "mvn" bottom: "lrn" top: "eu" loss_weight: 2 }
layer { name: "silence" type: "Silence" bottom: "d1" bottom: "d2" bottom: "d3" bottom: "m" bottom: "ml" bottom: "p" bottom: "embed" bottom: "embed_nb" bottom: "prelu" bottom: "scale" bottom: "scale2" bottom: "scale_ax" bottom: "scale_sc" bottom: "bias" bottom: "bias2" bottom: "bias_all" bottom: "reindex" bottom: "fx" bottom: "fw" bottom: "lrn_w" bottom: "mvn2" bottom: "relu6" bottom: "hsig" bottom: "hswish" bottom: "tanh" bottom: "abs" bottom: "bnll" bottom: "elu" bottom: "power" bottom: "exp" bottom: "log" bottom: "thr" bottom: "drop" bottom: "acc" bottom: "per_class" bottom: "prob" }
"""

RECURRENT_NET = """
layer { name: "x" type: "Input" top: "x" top: "cont" top: "xs" top: "h0" top: "c0"
  input_param { shape { dim: 5 dim: 3 dim: 4 dim: 2 } shape { dim: 5 dim: 3 } shape { dim: 3 dim: 6 }
                shape { dim: 1 dim: 3 dim: 7 } shape { dim: 1 dim: 3 dim: 7 } } }
layer { name: "x1" type: "Input" top: "x1" top: "cont1"
  input_param { shape { dim: 1 dim: 2 dim: 3 } shape { dim: 1 dim: 2 } } }
layer { name: "lstm" type: "LSTM" bottom: "x" bottom: "cont" top: "lstm" recurrent_param { num_output: 7 } }
layer { name: "lstm_s" type: "LSTM" bottom: "x" bottom: "cont" bottom: "xs" top: "lstm_s"
        recurrent_param { num_output: 7 } }
layer { name: "lstm_e" type: "LSTM" bottom: "x" bottom: "cont" bottom: "xs" bottom: "h0" bottom: "c0"
        top: "lstm_e" top: "hT" top: "cT" recurrent_param { num_output: 7 expose_hidden: true } }
layer { name: "rnn" type: "RNN" bottom: "x" bottom: "cont" top: "rnn" recurrent_param { num_output: 7 } }
layer { name: "rnn_s" type: "RNN" bottom: "x" bottom: "cont" bottom: "xs" top: "rnn_s"
        recurrent_param { num_output: 7 } }
layer { name: "rnn_e" type: "RNN" bottom: "x" bottom: "cont" bottom: "h0" top: "rnn_e" top: "rhT"
        recurrent_param { num_output: 7 expose_hidden: true } }
layer { name: "one_step" type: "LSTM" bottom: "x1" bottom: "cont1" top: "one_step" param { lr_mult: 0 }
        recurrent_param { num_output: 2 } }
layer { name: "gate_ip" type: "InnerProduct" bottom: "h0" top: "gates" inner_product_param { num_output: 28 axis: 2 } }
layer { name: "u" type: "Input" top: "ucont" input_param { shape { dim: 1 dim: 3 } } }
layer { name: "unit" type: "LSTMUnit" bottom: "c0" bottom: "gates" bottom: "ucont" top: "c1" top: "h1" }
layer { name: "loss" type: "EuclideanLoss" bottom: "lstm" bottom: "rnn" }
"""

FORCE_BACKWARD_NET = """
force_backward: true
layer { name: "x" type: "Input" top: "x" top: "idx" top: "sel" top: "label"
  input_param { shape { dim: 4 dim: 3 } shape { dim: 2 } shape { dim: 4 } shape { dim: 4 } } }
layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip" param { lr_mult: 0 } param { lr_mult: 0 }
        inner_product_param { num_output: 3 } }
layer { name: "reindex" type: "BatchReindex" bottom: "ip" bottom: "idx" top: "reindex" }
layer { name: "filter" type: "Filter" bottom: "ip" bottom: "sel" top: "filter" }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "filter" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "filter" bottom: "label" top: "acc" }
layer { name: "silence" type: "Silence" bottom: "reindex" }
"""

NETS = {
    "convolution": CONV_NET,
    "pooling": POOLING_NET,
    "shape": SHAPE_NET,
    "misc": MISC_NET,
    "recurrent": RECURRENT_NET,
    "force_backward": FORCE_BACKWARD_NET,
}


def build(text: str, phase: str = "TRAIN") -> Net:
    return build_net(parse_net(text), phase)


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
@pytest.mark.parametrize("name", list(NETS))
def test_rules_match_pycaffe(name: str, phase: str) -> None:
    net = build(NETS[name], phase)
    assert not any(layer.from_oracle for layer in net.layers)
    assert differences(net, caffe_net(input_net(net), phase)) == []


# Every CHECK Caffe aborts on is a ShapeError naming the layer and the field; pycaffe aborts on the same net.

INPUT = 'layer { name: "x" type: "Input" top: "x" top: "y" top: "v" input_param { shape { dim: 2 dim: 3 dim: 5 dim: 5 } shape { dim: 2 dim: 4 dim: 6 dim: 5 } shape { dim: 2 dim: 3 } } }\n'
ERRORS = [
    pytest.param('layer { name: "c" type: "Convolution" bottom: "x" top: "c" convolution_param { num_output: 2 kernel_size: 7 } }',
                 'c', 'kernel_size', id='conv_kernel_larger'),
    pytest.param('layer { name: "c" type: "Convolution" bottom: "x" top: "c" convolution_param { num_output: 4 kernel_size: 1 group: 2 } }',
                 'c', 'group', id='conv_group'),
    pytest.param('layer { name: "c" type: "Convolution" bottom: "x" top: "c" convolution_param { num_output: 4 kernel_size: 1 group: 3 } }',
                 'c', 'num_output', id='conv_num_output_group'),
    pytest.param('layer { name: "c" type: "Convolution" bottom: "x" top: "c" convolution_param { num_output: 2 kernel_size: 3 kernel_h: 2 kernel_w: 2 } }',
                 'c', 'kernel_size', id='conv_kernel_h_and_size'),
    pytest.param('layer { name: "c" type: "Convolution" bottom: "x" bottom: "y" top: "c" top: "c2" convolution_param { num_output: 2 kernel_size: 3 } }',
                 'c', 'bottom', id='conv_bottoms_differ'),
    pytest.param('layer { name: "c" type: "Convolution" bottom: "x" top: "c" convolution_param { num_output: 2 } }',
                 'c', 'kernel_size', id='conv_no_kernel'),
    pytest.param('layer { name: "c" type: "Deconvolution" bottom: "x" top: "c" convolution_param { num_output: 2 kernel_size: 1 pad: 3 } }',
                 'c', 'convolution_param', id='deconv_negative'),
    pytest.param('layer { name: "p" type: "Pooling" bottom: "x" top: "p" pooling_param { kernel_size: 2 pad: 2 } }',
                 'p', 'pad', id='pool_pad'),
    pytest.param('layer { name: "p" type: "Pooling" bottom: "x" top: "p" pooling_param { kernel_size: 3 pad_h: 1 } }',
                 'p', 'pad', id='pool_pad_h_alone'),
    pytest.param('layer { name: "p" type: "Pooling" bottom: "x" top: "p" pooling_param { stride: 2 } }',
                 'p', 'kernel_size', id='pool_no_kernel'),
    pytest.param('layer { name: "p" type: "Pooling" bottom: "x" top: "p" pooling_param { global_pooling: true kernel_size: 2 } }',
                 'p', 'pooling_param', id='pool_global_kernel'),
    pytest.param('layer { name: "p" type: "Pooling" bottom: "x" top: "p" pooling_param { kernel_size: 8 } }',
                 'p', 'kernel_size', id='pool_kernel_larger'),
    pytest.param('layer { name: "p" type: "Pooling" bottom: "v" top: "p" pooling_param { kernel_size: 2 } }',
                 'p', 'bottom', id='pool_2d'),
    pytest.param('layer { name: "s" type: "SPP" bottom: "x" top: "s" spp_param { pyramid_height: 4 } }',
                 's', 'pyramid_height', id='spp_levels'),
    pytest.param('layer { name: "c" type: "Concat" bottom: "x" bottom: "y" top: "c" }',
                 'c', 'bottom', id='concat_mismatch'),
    pytest.param('layer { name: "c" type: "Concat" bottom: "x" bottom: "v" top: "c" }',
                 'c', 'bottom', id='concat_axes'),
    pytest.param('layer { name: "s" type: "Slice" bottom: "x" top: "a" top: "b" top: "c" slice_param { slice_point: 2 slice_point: 2 } }',
                 's', 'slice_point', id='slice_points'),
    pytest.param('layer { name: "s" type: "Slice" bottom: "x" top: "a" top: "b" slice_param { slice_point: 1 slice_point: 2 } }',
                 's', 'slice_point', id='slice_point_count'),
    pytest.param('layer { name: "s" type: "Slice" bottom: "x" top: "a" top: "b" }',
                 's', 'slice_param', id='slice_uneven'),
    pytest.param('layer { name: "e" type: "Eltwise" bottom: "x" bottom: "x" top: "e" eltwise_param { coeff: 1 } }',
                 'e', 'coeff', id='eltwise_coeff'),
    pytest.param('layer { name: "e" type: "Eltwise" bottom: "x" bottom: "x" top: "e" eltwise_param { operation: PROD coeff: 1 coeff: 1 } }',
                 'e', 'coeff', id='eltwise_prod_coeff'),
    pytest.param('layer { name: "r" type: "Reshape" bottom: "x" top: "r" reshape_param { shape { dim: 4 dim: -1 } } }',
                 'r', 'shape', id='reshape_infer'),
    pytest.param('layer { name: "r" type: "Reshape" bottom: "x" top: "r" reshape_param { shape { dim: -1 dim: -1 } } }',
                 'r', 'shape', id='reshape_two_infer'),
    pytest.param('layer { name: "r" type: "Reshape" bottom: "x" top: "r" reshape_param { shape { dim: 7 } } }',
                 'r', 'reshape_param.shape', id='reshape_count'),
    pytest.param('layer { name: "r" type: "Reshape" bottom: "x" top: "x" reshape_param { shape { dim: 0 dim: -1 } } }',
                 'r', 'top', id='reshape_in_place'),
    pytest.param('layer { name: "f" type: "Flatten" bottom: "v" top: "v" }',
                 'f', 'top', id='flatten_in_place'),
    pytest.param('layer { name: "i" type: "InnerProduct" bottom: "x" top: "i" inner_product_param { num_output: 2 axis: 4 } }',
                 'i', 'axis', id='ip_axis'),
    pytest.param('layer { name: "c" type: "Crop" bottom: "y" bottom: "x" top: "c" crop_param { axis: 2 offset: 2 } }',
                 'c', 'offset', id='crop_offset'),
    pytest.param('layer { name: "c" type: "Crop" bottom: "y" bottom: "x" top: "c" crop_param { axis: 1 offset: 0 offset: 0 } }',
                 'c', 'offset', id='crop_offsets_count'),
    pytest.param('layer { name: "t" type: "Tile" bottom: "x" top: "t" }',
                 't', 'tiles', id='tile_no_tiles'),
    pytest.param('layer { name: "a" type: "ArgMax" bottom: "x" top: "a" argmax_param { top_k: 4 axis: 1 } }',
                 'a', 'top_k', id='argmax_top_k'),
    pytest.param('layer { name: "e" type: "Embed" bottom: "v" top: "e" embed_param { num_output: 2 } }',
                 'e', 'input_dim', id='embed_input_dim'),
    pytest.param('layer { name: "lab" type: "Input" top: "lab" input_param { shape { dim: 2 } } }\n'
                 'layer { name: "l" type: "SoftmaxWithLoss" bottom: "v" bottom: "lab" top: "l" top: "p" }',
                 'l', 'loss_weight', id='softmax_loss_two_tops'),
    pytest.param('layer { name: "lab" type: "Input" top: "lab" input_param { shape { dim: 2 } } }\n'
                 'layer { name: "l" type: "SoftmaxWithLoss" bottom: "v" bottom: "lab" top: "l" top: "p" '
                 'loss_weight: 1 loss_weight: 0 }',
                 'l', 'loss_weight', id='softmax_loss_two_weights'),
    pytest.param('layer { name: "l" type: "SoftmaxWithLoss" bottom: "x" bottom: "v" top: "l" }',
                 'l', 'bottom', id='softmax_loss_labels'),
    pytest.param('layer { name: "a" type: "Accuracy" bottom: "x" bottom: "v" top: "a" accuracy_param { top_k: 30 axis: 3 } }',
                 'a', 'top_k', id='accuracy_top_k'),
    pytest.param('layer { name: "l" type: "EuclideanLoss" bottom: "x" bottom: "v" top: "l" }',
                 'l', 'bottom', id='euclidean_dims'),
    pytest.param('layer { name: "l" type: "EuclideanLoss" bottom: "x" bottom: "x" top: "l" loss_weight: 1 loss_weight: 2 }',
                 'l', 'loss_weight', id='loss_num'),
    pytest.param('layer { name: "l" type: "ContrastiveLoss" bottom: "v" bottom: "x" bottom: "v" top: "l" }',
                 'l', 'bottom', id='contrastive'),
    pytest.param('layer { name: "l" type: "MultinomialLogisticLoss" bottom: "v" bottom: "v" top: "l" }',
                 'l', 'bottom', id='multinomial_label'),
    pytest.param('layer { name: "d" type: "DummyData" top: "d1" top: "d2" top: "d3" dummy_data_param { shape { dim: 1 } shape { dim: 2 } } }',
                 'd', 'shape', id='dummy_shapes'),
    pytest.param('layer { name: "i" type: "Input" top: "i1" top: "i2" top: "i3" input_param { shape { dim: 1 } shape { dim: 2 } } }',
                 'i', 'shape', id='input_shapes'),
    pytest.param('layer { name: "m" type: "MemoryData" top: "m" top: "ml" memory_data_param { batch_size: 2 channels: 0 height: 2 width: 2 } }',
                 'm', 'memory_data_param', id='memory_data'),
    pytest.param('layer { name: "i" type: "Input" top: "one" input_param { shape { dim: 5 } } }\nlayer { name: "b" type: "BatchNorm" bottom: "one" top: "b" }',
                 'b', 'bottom', id='batchnorm_1d'),
    pytest.param('layer { name: "l" type: "LRN" bottom: "x" top: "l" lrn_param { local_size: 4 } }',
                 'l', 'local_size', id='lrn_even'),
    pytest.param('layer { name: "f" type: "Filter" bottom: "x" bottom: "v" top: "f" }',
                 'f', 'bottom', id='filter_selector'),
    pytest.param('layer { name: "e" type: "Exp" bottom: "x" top: "e" exp_param { base: -2 } }',
                 'e', 'base', id='exp_base'),
    pytest.param('layer { name: "a" type: "AbsVal" bottom: "x" top: "x" }',
                 'a', 'top', id='absval_in_place'),
    pytest.param('layer { name: "i" type: "Input" top: "one" input_param { shape { dim: 5 } } }\nlayer { name: "p" type: "PReLU" bottom: "one" top: "p" }',
                 'p', 'bottom', id='prelu_1d'),
    pytest.param('layer { name: "i" type: "Input" top: "five" input_param { shape { dim: 1 dim: 2 dim: 3 dim: 4 dim: 5 } } }\nlayer { name: "m" type: "MVN" bottom: "five" top: "m" }',
                 'm', 'bottom', id='mvn_5d'),
    pytest.param('layer { name: "b" type: "Bias" bottom: "x" bottom: "v" top: "b" bias_param { axis: 1 } }',
                 'b', 'bias_param', id='bias_dims'),
    pytest.param('layer { name: "s" type: "Scale" bottom: "x" top: "s" scale_param { axis: 2 num_axes: 3 } }',
                 's', 'num_axes', id='scale_axes'),
    pytest.param('layer { name: "l" type: "LSTM" bottom: "x" bottom: "x" top: "l" recurrent_param { num_output: 3 } }',
                 'l', 'bottom', id='lstm_cont'),
    pytest.param('layer { name: "l" type: "LSTM" bottom: "x" bottom: "v" top: "l" }',
                 'l', 'num_output', id='lstm_num_output'),
    pytest.param('layer { name: "r" type: "RNN" bottom: "x" bottom: "v" bottom: "v" top: "r" top: "h" recurrent_param { num_output: 3 expose_hidden: true } }',
                 'r', 'bottom', id='rnn_hidden'),
    pytest.param('layer { name: "r" type: "BatchReindex" bottom: "x" bottom: "v" top: "r" }',
                 'r', 'bottom', id='reindex_index'),
    pytest.param('layer { name: "c" type: "ReLU" bottom: "nope" top: "c" }',
                 'c', 'bottom', id='unknown_bottom'),
    pytest.param('layer { name: "i" type: "Im2col" bottom: "v" top: "i" convolution_param { kernel_size: 1 } }',
                 'i', 'axis', id='im2col_no_spatial_axis'),
]


@pytest.mark.slow
@pytest.mark.parametrize(("text", "layer", "field"), ERRORS)
def test_what_caffe_aborts_on_is_a_shape_error(text: str, layer: str, field: str) -> None:
    param = parse_net(INPUT + text)
    with pytest.raises(NetError) as ours:
        build_net(param, "TRAIN")
    assert ours.value.layer == layer
    assert ours.value.field is not None and field in ours.value.field
    if "unknown bottom" not in ours.value.message:
        assert isinstance(ours.value, ShapeError)
    with pytest.raises(NetError) as caffe:
        caffe_net(param, "TRAIN")
    assert caffe.value.layer == layer


def test_force_backward_gives_every_bottom_a_gradient_the_layer_allows() -> None:
    net = build(FORCE_BACKWARD_NET)
    assert all(layer.need_backward for layer in net.layers)
    flags = {layer.name: layer.bottom_need_backward for layer in net.layers}
    # Filter and BatchReindex do not override AllowForceBackward in this Caffe; loss layers refuse their labels.
    assert flags["reindex"] == [True, True]
    assert flags["filter"] == [True, True]
    assert flags["loss"] == [True, False]


# The recurrent layers: Caffe's unrolled net, built by the same net builder.

LSTM_NET = """
layer { name: "x" type: "Input" top: "x" top: "cont" top: "target"
        input_param { shape { dim: 6 dim: 2 dim: 5 } shape { dim: 6 dim: 2 } shape { dim: 6 dim: 2 dim: 4 } } }
layer { name: "lstm" type: "LSTM" bottom: "x" bottom: "cont" top: "lstm" recurrent_param { num_output: 4 } }
layer { name: "loss" type: "EuclideanLoss" bottom: "lstm" bottom: "target" }
"""


def test_lstm_params_and_top_are_caffes() -> None:
    net = build(LSTM_NET)
    lstm = net.layers[1]
    # W_xc (4 x num_output, input size), b_c, W_hc (4 x num_output, num_output): the unrolled net's own params.
    assert [net.params[i].shape for i in lstm.params] == [(16, 5), (16,), (16, 4)]
    assert net.blob("lstm").shape == (6, 2, 4)
    assert lstm.setup.subnet is not None
    unrolled: Net = lstm.setup.subnet.net
    assert unrolled.layers[2].name == "lstm_cont_slice"
    assert sum(1 for layer in unrolled.layers if layer.type == "LSTMUnit") == 6
    assert unrolled.blob("h").shape == (6, 2, 4)
    # W_hc is shared by every timestep's transform: one owner, five sharers.
    assert sum(1 for param in unrolled.params if param.name == "W_hc" and param.owner is not None) == 5


def test_rnn_with_a_static_input_has_its_extra_weight() -> None:
    text = RECURRENT_NET
    net = build(text)
    rnn = next(layer for layer in net.layers if layer.name == "rnn_s")
    # W_xh, b_h, W_xh_static, W_hh, W_ho, b_o
    assert [net.params[i].shape for i in rnn.params] == [(7, 8), (7,), (7, 6), (7, 7), (7, 7), (7,)]
    lstm = next(layer for layer in net.layers if layer.name == "lstm_e")
    assert [net.blobs[i].shape for i in lstm.tops] == [(5, 3, 7), (1, 3, 7), (1, 3, 7)]


@pytest.mark.parametrize("engine", [ENGINE_CPU, ENGINE_GPU])
def test_lstm_buffers_leave_out_what_the_outer_net_counts(engine: str) -> None:
    net = build(LSTM_NET)
    memory = net_memory(net, MemoryOptions(engine=engine))[1]
    names = [buffer.name for buffer in memory.buffers]
    inner = {layer.name: layer for layer in memory.inner}
    # Params are the layer's own (counted once, as the outer net's); x, cont and the output h share the bottoms'
    # and the top's memory, so the unrolled net's first Input layer and h_concat bring nothing of their own.
    first_input = memory.inner[0]
    assert first_input.categories[ACTIVATIONS] == 0 and first_input.categories[ACTIVATION_DIFFS] == 0
    assert inner["lstm_h_concat"].categories[ACTIVATIONS] == 0
    assert inner["lstm_h_concat"].categories[ACTIVATION_DIFFS] == 0
    assert memory.inner[1].categories[ACTIVATIONS] > 0  # c_0 and h_0 are the unrolled net's own
    assert memory.categories[PARAMS] == sum(
        net.params[i].count * 4 + (16 if engine == ENGINE_CPU else 0) for i in net.layers[1].params
    )
    units = [layer for layer in memory.inner if layer.type == "LSTMUnit" and layer.categories[ACTIVATIONS]]
    assert len(units) == 6
    assert "unrolled.c_T.diff" in names  # LayerSetUp zeroes the last cell state's diff
    assert any(layer.categories[ACTIVATION_DIFFS] for layer in memory.inner)
    # The layer counts its top, its own buffers and params, and the inner net's blobs and buffers (its params and
    # their state aside: they are the layer's), plus on the CPU the inner net's bookkeeping.
    overhead = 16 if engine == ENGINE_CPU else 0
    top = net.blob("lstm").count * 4 + overhead

    def inner(category: str) -> int:
        return sum(layer.categories[category] for layer in memory.inner)

    assert memory.categories[ACTIVATIONS] == inner(ACTIVATIONS) + top
    assert memory.categories[ACTIVATION_DIFFS] == inner(ACTIVATION_DIFFS) + top + sum(
        b.bytes + overhead for b in memory.buffers if b.category == ACTIVATION_DIFFS
    )
    assert memory.categories[LAYER_BUFFERS] == inner(LAYER_BUFFERS) > 0
    assert memory.categories[PARAM_DIFFS] == memory.categories[PARAMS]  # the layer's own, not the inner net's too
    assert (memory.categories[CONTEXT] > 0) == (engine == ENGINE_CPU)
    assert {PARAMS, PARAM_DIFFS, SOLVER_HISTORY} == SUBNET_OWN_ELSEWHERE


def test_lstm_in_a_test_net_keeps_no_diffs_but_the_zeroed_ones() -> None:
    net = build(LSTM_NET, "TEST")
    memory = net_memory(net, MemoryOptions())[1]
    diffs = [buffer.name for buffer in memory.buffers if buffer.category == ACTIVATION_DIFFS]
    assert sorted(diffs) == ["unrolled.c_T.diff", "unrolled.h_6.diff"]
    inner_diffs = [layer.name for layer in memory.inner if layer.categories[ACTIVATION_DIFFS]]
    assert inner_diffs == ["h_pseudoloss"]  # its loss weight is written into its diff at set-up


def test_lstm_unit_keeps_gate_activations_on_the_gpu_only() -> None:
    net = build(RECURRENT_NET)
    unit = next(layer for layer in net.layers if layer.name == "unit")
    assert unit.rule is not None
    assert unit.rule.buffers(unit.ctx, unit.setup, ENGINE_CPU) == []
    assert [b.count for b in unit.rule.buffers(unit.ctx, unit.setup, ENGINE_GPU)] == [3 * 28]


# Layer buffers that depend on the engine and the configuration.


def buffers(text: str, layer: str, engine: str = ENGINE_CPU, phase: str = "TRAIN") -> dict[str, int]:
    net = build(text, phase)
    memory = next(m for m in net_memory(net, MemoryOptions(engine=engine)) if m.name == layer)
    return {buffer.name: buffer.count for buffer in memory.buffers}


def test_max_pooling_keeps_its_index_under_cudnn_too() -> None:
    """BVLC's layer factory gives MAX pooling Caffe's own PoolingLayer even on a cuDNN build."""
    assert buffers(POOLING_NET, "max_pad", ENGINE_CUDNN) == {"max_idx": 2 * 3 * 7 * 6}
    assert buffers(POOLING_NET, "ave_floor", ENGINE_CUDNN) == {}
    assert buffers(POOLING_NET, "mask", ENGINE_CUDNN) == {}  # the mask top holds the index


def test_deconvolution_is_never_cudnn() -> None:
    assert set(buffers(CONV_NET, "deconv", ENGINE_CUDNN)) == {"col_buffer", "bias_multiplier"}
    assert set(buffers(CONV_NET, "plain", ENGINE_CUDNN)) == {"cudnn_workspace"}
    assert set(buffers(CONV_NET, "dilated", ENGINE_CUDNN)) == {"col_buffer"}  # dilation: Caffe's own


def test_wide_lrn_falls_back_to_caffes_own_under_cudnn() -> None:
    wide = MISC_NET.replace("lrn_param { local_size: 3 }", "lrn_param { local_size: 17 }")
    assert buffers(wide, "lrn", ENGINE_CUDNN) == {"scale": 4 * 3 * 5 * 6}
    assert buffers(MISC_NET, "lrn", ENGINE_CUDNN) == {}


def test_reduction_keeps_a_multiplier_for_sum_and_mean_only() -> None:
    assert buffers(SHAPE_NET, "red") == {}
    assert buffers(SHAPE_NET, "red0") == {"sum_multiplier": 2 * 6 * 8 * 10}
    assert buffers(SHAPE_NET, "red_m") == {"sum_multiplier": 10}


def test_mvn_reads_its_bottom_as_four_axes() -> None:
    assert build(MISC_NET).blob("mvn2").shape == (4, 9, 1, 1)
    assert buffers(MISC_NET, "mvn2") == {"mean": 36, "temp": 36, "sum_multiplier": 9}


def test_spp_levels_and_buffers() -> None:
    net = build(POOLING_NET)
    assert net.blob("spp3").shape == (2, 3 * (1 + 4 + 16))
    assert net.blob("spp1").shape == (2, 3, 1, 1)
    assert buffers(POOLING_NET, "spp1") == {"max_idx": 6}
    # Not under a loss: no backward, so no diffs.
    assert buffers(POOLING_NET, "spp3") == {"level0.pooled": 6, "level1.pooled": 24, "level2.pooled": 96}
    # Under a loss, after a layer that needs backward: each level gets its diffs.
    text = POOLING_NET.replace('bottom: "x" top: "spp4"', 'bottom: "conv" top: "spp4"').replace(
        'layer { name: "spp4"',
        'layer { name: "conv" type: "Convolution" bottom: "x" top: "conv" convolution_param { num_output: 3 '
        'kernel_size: 1 } }\nlayer { name: "spp4"',
    )
    spp4 = buffers(text, "spp4")
    assert spp4["level2.split.diff"] == 2 * 3 * 13 * 11
    assert spp4["level2.pooled.diff"] == spp4["level2.max_idx"] == 96
    assert "level2.split.diff" not in buffers(text, "spp4", phase="TEST")


def test_scale_sums_its_gradient_through_sum_result_only_when_it_must() -> None:
    text = """
layer { name: "x" type: "Input" top: "x" top: "s" input_param { shape { dim: 2 dim: 3 dim: 4 } shape { dim: 2 } } }
layer { name: "learned" type: "Scale" bottom: "x" top: "learned" scale_param { axis: 1 } }
layer { name: "frozen" type: "Scale" bottom: "x" top: "frozen" param { lr_mult: 0 } scale_param { axis: 1 } }
layer { name: "one" type: "Scale" bottom: "x" top: "one" scale_param { axis: 0 num_axes: 1 } }
layer { name: "sum" type: "Eltwise" bottom: "learned" bottom: "frozen" bottom: "one" top: "sum" }
layer { name: "loss" type: "EuclideanLoss" bottom: "sum" bottom: "sum" }
"""
    assert buffers(text, "learned")["sum_result"] == 2 * 3
    assert "sum_result" not in buffers(text, "frozen")
    assert "sum_result" not in buffers(text, "one")  # outer dimension 1: summed into the scale's diff directly
    assert "sum_result" not in buffers(text, "learned", phase="TEST")


def test_slice_points_start_above_zero() -> None:
    text = INPUT + 'layer { name: "s" type: "Slice" bottom: "x" top: "a" top: "b" slice_param { slice_point: 0 } }'
    with pytest.raises(ShapeError, match="positive and increasing"):
        build(text)


# Internal buffers against real bytes: one training step of pycaffe, measured with mallinfo2.


def measured_and_estimated(text: str) -> tuple[int, int, int]:
    """(bytes pycaffe allocated, the estimate, the estimate with the layer's own buffers left out)."""
    definition = training_definition(text)
    report, _, _ = definition.memory(MemoryOptions())
    with tempfile.TemporaryDirectory() as folder:
        measurement = measure(definition, Path(folder), {})
    own = sum(  # the layer's buffers, and its inner net's blobs, buffers and bookkeeping (its params aside)
        sum(b.bytes for b in layer.buffers) + layer.categories.get(CONTEXT, 0)
        + sum(n for inner in layer.inner for c, n in inner.categories.items() if c not in SUBNET_OWN_ELSEWHERE)
        for layer in report.layers if layer.type in ("LSTM", "RNN", "SPP")
    )
    return measurement.allocated, report.total_bytes, report.total_bytes - own


def recurrent_net(kind: str) -> str:
    return f"""
layer {{ name: "x" type: "Input" top: "x" top: "cont" top: "target"
        input_param {{ shape {{ dim: 40 dim: 32 dim: 64 }} shape {{ dim: 40 dim: 32 }}
                      shape {{ dim: 40 dim: 32 dim: 128 }} }} }}
layer {{ name: "rec" type: "{kind}" bottom: "x" bottom: "cont" top: "rec"
        recurrent_param {{ num_output: 128 weight_filler {{ type: "uniform" }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "rec" bottom: "target" }}
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_recurrent_buffers_are_what_caffe_allocates(kind: str) -> None:
    """40 timesteps of 32 streams: the unrolled net is nearly all of the memory, its bookkeeping (hundreds of small
    layers and blobs) included."""
    allocated, estimated, without_buffers = measured_and_estimated(recurrent_net(kind))
    assert without_buffers < allocated / 4
    assert abs(estimated - allocated) < 0.01 * allocated


@pytest.mark.slow
@pytest.mark.parametrize("levels", [1, 4])
def test_spp_buffers_are_what_caffe_allocates(levels: int) -> None:
    text = f"""
layer {{ name: "x" type: "Input" top: "x" top: "t" input_param {{ shape {{ dim: 8 dim: 32 dim: 96 dim: 80 }}
                                                             shape {{ dim: 8 dim: 4 }} }} }}
layer {{ name: "conv" type: "Convolution" bottom: "x" top: "conv"
        convolution_param {{ num_output: 32 kernel_size: 1 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "spp" type: "SPP" bottom: "conv" top: "spp" spp_param {{ pyramid_height: {levels} }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "spp" top: "ip"
        inner_product_param {{ num_output: 4 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "t" }}
"""
    allocated, estimated, _ = measured_and_estimated(text)
    assert abs(estimated - allocated) < 0.01 * allocated


def test_planning_a_recurrent_net_is_bounded_by_the_unroll_limit() -> None:
    """Recurrent nets put time on the first axis, which the planner varies like a batch: its search once built
    unrolled nets of up to a million timesteps (it never ended). Past MAX_UNROLLED_STEPS a batch cannot be built:
    the plan stops there, and a net written with more timesteps is a clear error."""
    document = estimate(EstimateRequest(net=LSTM_NET, free_bytes=8 << 30, engine=ENGINE_GPU))
    assert document["max_batch_size"] == MAX_UNROLLED_STEPS
    assert document["max_batch_limited_by"] == "unroll_limit"
    with pytest.raises(UnrollLimitError, match="would unroll 501 timesteps; the estimator builds at most 500"):
        estimate(EstimateRequest(net=LSTM_NET.replace("dim: 6", "dim: 501"), engine=ENGINE_GPU))
