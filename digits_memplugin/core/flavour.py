"""Which Caffe a definition is written for: BVLC's (what pycaffe here is) or NVIDIA's fork, NVcaffe 0.17.

DIGITS ships NVcaffe, and its users' prototxts use fields only NVcaffe has (`scale_bias` in BatchNorm, SSD's
`resize_param`, `solver_data_type`). A text is read with the BVLC schema first; only when that fails is it read
with NVcaffe's (`nvcaffe_pb2`), so a net both can read stays "bvlc". The flavour rides on the parsed message
itself (its descriptor's package), so every later step can ask `flavour_of(message)`.

NVcaffe's memory semantics that differ from BVLC are modelled here, each with the NVcaffe source it follows:
storage types per layer, its GPU memory pool, its shared cuDNN workspace. None of it is measured (NVcaffe needs
CUDA to build), hence the wider planning margin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import nvcaffe_pb2
from .errors import PrototxtSyntaxError
from .proto import caffe_pb2

BVLC = "bvlc"
NVCAFFE = "nvcaffe"
FLAVOURS = (BVLC, NVCAFFE)

NVCAFFE_SAFETY_MARGIN = 0.20
"""Fraction of free memory kept back when planning an NVcaffe net, instead of the policy's 3-5 %: the figures for
NVcaffe (fp16 storage, the pooled allocator's rounding, one shared cuDNN workspace, auto-tuned prefetch) follow its
source but no GPU measurement has checked them yet; widen the margin until one has."""

NVCAFFE_UNVERIFIED = (
    "NVcaffe net: its memory is a model from NVcaffe 0.17's source (storage types, pooled allocator, shared cuDNN "
    "workspace), not yet checked against a GPU measurement; planning keeps a wider margin"
)

_MODULES = {BVLC: caffe_pb2, NVCAFFE: nvcaffe_pb2}


def flavour_of(message: Any) -> str:
    """The schema a parsed message (any caffe.proto message) belongs to."""
    return NVCAFFE if message.DESCRIPTOR.file.package == nvcaffe_pb2.PACKAGE else BVLC


def schema(flavour: str) -> Any:
    """The protobuf module of a flavour (caffe_pb2 or nvcaffe_pb2)."""
    return _MODULES[flavour]


def parse_either(parse: Callable[[Any], None], message_name: str) -> Any:
    """`parse` into a BVLC message; when the text needs NVcaffe's schema, into an NVcaffe one. A text neither
    reads raises BVLC's error: it is the schema this server trains with, and its message names the first field it
    does not know."""
    message = getattr(caffe_pb2, message_name)()
    try:
        parse(message)
    except PrototxtSyntaxError as bvlc_error:
        fallback = getattr(nvcaffe_pb2, message_name)()
        try:
            parse(fallback)
        except PrototxtSyntaxError:
            raise bvlc_error from None
        return fallback
    return message


# ---------------------------------------------------------------------------------------------- storage types

TYPE_BYTES = {nvcaffe_pb2.DOUBLE: 8, nvcaffe_pb2.FLOAT: 4, nvcaffe_pb2.FLOAT16: 2}
"""Bytes per element of NVcaffe's storage types (caffe.proto `enum Type`; INT/UINT/BOOL are never blob types)."""


def layer_storage(net_param: Any, layer_param: Any) -> tuple[int, int]:
    """(data, diff) bytes per element of what a layer stores: its tops' data and its params' data in its forward
    type, their diffs in its backward type (NVcaffe's Layer<Ftype, Btype>; a layer's `forward_type` and
    `backward_type` win over the net's `default_forward_type` / `default_backward_type`, include/caffe/layer.hpp
    and net.cpp's Net::Init). BVLC stores everything as float."""
    if flavour_of(layer_param) != NVCAFFE:
        return 4, 4
    forward = layer_param.forward_type if layer_param.HasField("forward_type") else net_param.default_forward_type
    backward = (
        layer_param.backward_type if layer_param.HasField("backward_type") else net_param.default_backward_type
    )
    return TYPE_BYTES.get(forward, 4), TYPE_BYTES.get(backward, 4)


def solver_storage(solver: Any | None) -> int:
    """Bytes per element of NVcaffe's solver history (SolverParameter.solver_data_type, float by default)."""
    if solver is None or flavour_of(solver) != NVCAFFE:
        return 4
    return TYPE_BYTES.get(solver.solver_data_type, 4)


# ---------------------------------------------------------------------------------------------- GPU memory pool

POOL_MIN_BIN_BYTES = 1 << 6
POOL_MAX_BIN_BYTES = 1 << 22
"""NVcaffe's GPUMemory::Manager hands every device allocation to cub::CachingDeviceAllocator(BIN_GROWTH=2,
MIN_BIN=6, MAX_BIN=22) (src/caffe/util/gpu_memory.cpp): a request up to 4 MiB takes the next power of two (64 B
at least); a larger one is allocated at its own size."""


def pool_allocation(nbytes: int) -> int:
    """Device bytes the NVcaffe pool takes for a request of `nbytes`."""
    if nbytes <= 0:
        return 0
    if nbytes > POOL_MAX_BIN_BYTES:
        return nbytes
    return max(POOL_MIN_BIN_BYTES, 1 << (nbytes - 1).bit_length())
