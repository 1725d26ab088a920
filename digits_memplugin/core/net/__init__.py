"""A net as Caffe builds it for one phase: filtered layers, split layers, blobs, shapes, params, backward flags.

This is Net::Init (src/caffe/net.cpp) in Python, one module per step: `filtering` (FilterNet's NetStateRule
semantics), `splits` (InsertSplits), `prepare` (both, once per phase: the batch-independent half), `build` (each
layer set up for a batch: in-place tops, automatic loss tops, shared params, the need-backward analysis) with
shapes from the layer rules instead of real blobs, and `pycaffe_net` (the nets pycaffe is given where no rule
shapes a layer). Blob and layer names match pycaffe's, split blobs included, so results compare one to one.
"""

from .build import MAX_BLOB_AXES, build_net
from .filtering import PHASES, filter_layers, net_state, state_meets_rule
from .model import Blob, Layer, Net, Param
from .prepare import LayerSpec, PreparedNet, prepare_net
from .pycaffe_net import ShapeOracle, input_net
from .splits import insert_splits

__all__ = [
    "MAX_BLOB_AXES", "PHASES", "Blob", "Layer", "LayerSpec", "Net", "Param", "PreparedNet", "ShapeOracle",
    "build_net", "filter_layers", "input_net", "insert_splits", "net_state", "prepare_net", "state_meets_rule",
]
