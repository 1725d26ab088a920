"""Which Caffe can build a definition: BVLC's, BVLC's with Wei Liu's SSD layers, or NVIDIA's fork, NVcaffe 0.17.

DIGITS ships NVcaffe, and its users' prototxts use fields only NVcaffe has (`scale_bias` in BatchNorm, SSD's
`resize_param`, `solver_data_type`). A text is read with the BVLC schema first; only when that fails is it read
with NVcaffe's (`nvcaffe_pb2`), so a net both can read keeps BVLC's. The schema rides on the parsed message itself
(its descriptor's package): `flavour_of(message)` says which ("bvlc" or "nvcaffe").

A definition's flavour (`definition_flavour`, the estimate's `"flavour"`) names the Caffe that builds it, in the
words a DIGITS user meets: "nvcaffe" when a net or the solver needs NVcaffe's schema; "ssd" when its nets read with
BVLC's schema but use the layers of Wei Liu's SSD Caffe (AnnotatedData, PriorBox, MultiBoxLoss...), which BVLC Caffe
has not and both SSD Caffe and NVcaffe 0.17 have; "bvlc" otherwise. The Caffes that may train it are
`builders(flavour)`, or exactly for given messages `caffes_that_build` (a BVLC net NVcaffe's schema cannot read, such
as one with a Parameter layer, is not NVcaffe's). This server's pycaffe (brocolli-caffe: BVLC Caffe plus SSD's
layers) is `BUNDLED_CAFFE`, an SSD Caffe.

NVcaffe's memory semantics that differ from BVLC are modelled here, each with the NVcaffe source it follows:
storage types per layer, its GPU memory pool, its shared cuDNN workspace. None of it is measured (NVcaffe needs
CUDA to build), hence the wider planning margin.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from google.protobuf import text_format

from . import nvcaffe_pb2
from .errors import PrototxtSyntaxError
from .proto import caffe_pb2

BVLC = "bvlc"
SSD = "ssd"
NVCAFFE = "nvcaffe"
FLAVOURS = (BVLC, SSD, NVCAFFE)
"""A definition's flavours, from the most widely built to the least; also the names of the Caffes that build them."""
FLAVOUR_TITLES = {
    BVLC: "BVLC Caffe",
    SSD: "SSD Caffe (BVLC Caffe with Wei Liu's SSD layers)",
    NVCAFFE: "NVcaffe 0.17 (NVIDIA's Caffe, which DIGITS ships)",
}
SSD_LAYER_TYPES = frozenset(
    {"AnnotatedData", "DetectionEvaluate", "DetectionOutput", "MultiBoxLoss", "Normalize", "Permute", "PriorBox"}
)
"""The layers Wei Liu's SSD Caffe adds to BVLC's (each has its parameter message in both pycaffe's and NVcaffe
0.17's caffe.proto): a net with one reads with BVLC's schema, yet BVLC Caffe cannot build it."""
_BUILDERS = {BVLC: frozenset(FLAVOURS), SSD: frozenset({SSD, NVCAFFE}), NVCAFFE: frozenset({NVCAFFE})}
BUNDLED_CAFFE = SSD
"""This server's pycaffe (brocolli-caffe: BVLC Caffe at 9b89154 plus SSD's layers), the Caffe jobs train with."""

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
    """The schema a parsed message (any caffe.proto message) belongs to: BVLC or NVCAFFE."""
    return NVCAFFE if message.DESCRIPTOR.file.package == nvcaffe_pb2.PACKAGE else BVLC


def schema(flavour: str) -> Any:
    """The protobuf module of a schema flavour (caffe_pb2 or nvcaffe_pb2)."""
    return _MODULES[flavour]


def definition_flavour(messages: Iterable[Any]) -> str:
    """The flavour of a training definition, given its messages (solver and NetParameters; None is skipped):
    NVCAFFE when one needs NVcaffe's schema, SSD when a net uses SSD's layers, else BVLC."""
    present = [message for message in messages if message is not None]
    if any(flavour_of(message) == NVCAFFE for message in present):
        return NVCAFFE
    if any(_layer_types(message) & SSD_LAYER_TYPES for message in present):
        return SSD
    return BVLC


def builders(flavour: str) -> frozenset[str]:
    """The Caffes (named as FLAVOURS) that build a definition of `flavour`: a BVLC one builds in any of them, an
    SSD one in SSD Caffe and NVcaffe 0.17, an NVcaffe one in NVcaffe only."""
    return _BUILDERS[flavour]


def can_train(caffe: str, flavour: str) -> bool:
    """Whether the Caffe `caffe` (one of FLAVOURS, e.g. BUNDLED_CAFFE) can build a definition of `flavour`."""
    return caffe in builders(flavour)


def caffes_that_build(messages: Iterable[Any]) -> frozenset[str]:
    """`builders` of the messages' flavour, less NVcaffe when its schema cannot read one of them (a BVLC field or
    layer parameter NVcaffe 0.17.3 dropped: the Parameter layer, BVLC's Swish or Clip...). Layer types NVcaffe
    lacks are not known here."""
    present = [message for message in messages if message is not None]
    found = builders(definition_flavour(present))
    if NVCAFFE in found and not all(nvcaffe_reads(message) for message in present):
        found = found - {NVCAFFE}
    return found


def nvcaffe_reads(message: Any) -> bool:
    """Whether NVcaffe 0.17.3's schema reads a parsed message (its text, field names and enum values)."""
    if flavour_of(message) == NVCAFFE:
        return True
    counterpart = getattr(nvcaffe_pb2, message.DESCRIPTOR.name)()
    try:
        text_format.Parse(text_format.MessageToString(message), counterpart)
    except text_format.ParseError:
        return False
    return True


def _layer_types(message: Any) -> set[str]:
    """The layer types of a NetParameter (V1 layers come upgraded by then); none for a solver."""
    if message.DESCRIPTOR.name != "NetParameter":
        return set()
    return {layer.type for layer in message.layer}


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
