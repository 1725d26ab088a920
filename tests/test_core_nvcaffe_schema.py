"""NVcaffe's schema, as core/nvcaffe_pb2.py builds it, against NVcaffe 0.17.3's own caffe.proto: every message,
field (number, type, label, default) and enum value, both ways.

The reference is data derived from NVcaffe's file (tests/data/nvcaffe_0.17.3_schema.tsv, whose header says where it
was read), not a copy of it: a field the declaration lacks fails `test_every_nvcaffe_entry_is_in_the_schema`, one
NVcaffe has not (a BVLC field left in, a renumbered one) fails `test_the_schema_has_nothing_nvcaffe_lacks`.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2

from digits_memplugin.core import nvcaffe_pb2
from digits_memplugin.core.estimate import EstimateRequest, estimate
from digits_memplugin.core.flavour import NVCAFFE, flavour_of
from digits_memplugin.core.prototxt import parse_net

REFERENCE = Path(__file__).parent / "data" / "nvcaffe_0.17.3_schema.tsv"
F = descriptor_pb2.FieldDescriptorProto
TYPES = {number: name[len("TYPE_"):].lower() for name, number in F.Type.items()}
LABELS = {number: name[len("LABEL_"):].lower() for name, number in F.Label.items()}

Key = tuple[str, str, str]
"""(kind, scope, name): a message, a field of a message, a value of an enum."""
Entry = tuple[str, str, str, str]
"""(number, type, label, default), "-" where the kind has none."""


def reference() -> dict[Key, Entry]:
    rows: dict[Key, Entry] = {}
    lines = [line for line in REFERENCE.read_text().splitlines() if line and not line.startswith("#")]
    assert lines[0].split("\t") == ["kind", "scope", "name", "number", "type", "label", "default"]
    for line in lines[1:]:
        kind, scope, name, number, type_, label, default = line.split("\t")
        key = (kind, scope, name)
        assert key not in rows, f"{key} is in the reference twice"
        rows[key] = (number, type_, label, "" if default == '""' else default)
    # A guard against a reference that cannot fail: it holds NVcaffe's messages and the fields the finding names.
    assert sum(kind == "message" for kind, _, _ in rows) >= 90 and len(rows) > 950
    assert rows[("field", "NetParameter", "eltwise_mem_sharing")] == ("20", "bool", "optional", "true")
    assert rows[("field", "LayerParameter", "forward_type")] == ("145", "Type", "optional", "FLOAT")
    assert rows[("value", "Packing", "NHWC")] == ("1", "-", "-", "-")
    return rows


def schema() -> dict[Key, Entry]:
    """The same rows from nvcaffe_pb2's file descriptor (type names without the `.nvcaffe.` package)."""
    proto = descriptor_pb2.FileDescriptorProto.FromString(nvcaffe_pb2.DESCRIPTOR.serialized_pb)
    package = f".{proto.package}."
    rows: dict[Key, Entry] = {}

    def enum(scope: str, values: descriptor_pb2.EnumDescriptorProto) -> None:
        for value in values.value:
            rows[("value", scope, value.name)] = (str(value.number), "-", "-", "-")

    def message(prefix: str, described: descriptor_pb2.DescriptorProto) -> None:
        scope = prefix + described.name
        rows[("message", scope, "-")] = ("-", "-", "-", "-")
        for field in described.field:
            type_ = field.type_name.removeprefix(package) if field.type_name else TYPES[field.type]
            label = LABELS[field.label] + (" packed" if field.options.packed else "")
            default = field.default_value if field.HasField("default_value") else "-"
            rows[("field", scope, field.name)] = (str(field.number), type_, label, default)
        for nested_enum in described.enum_type:
            enum(f"{scope}.{nested_enum.name}", nested_enum)
        for nested in described.nested_type:
            message(f"{scope}.", nested)

    for top in proto.message_type:
        message("", top)
    for top_enum in proto.enum_type:
        enum(top_enum.name, top_enum)
    return rows


def test_every_nvcaffe_entry_is_in_the_schema() -> None:
    ours = schema()
    missing = {key: entry for key, entry in reference().items() if key not in ours}
    assert not missing, f"NVcaffe 0.17.3 has, nvcaffe_pb2 lacks: {sorted(missing.items())}"


def test_the_schema_has_nothing_nvcaffe_lacks() -> None:
    theirs = reference()
    extra = {key: entry for key, entry in schema().items() if key not in theirs}
    assert not extra, f"nvcaffe_pb2 has, NVcaffe 0.17.3 lacks: {sorted(extra.items())}"


def test_every_shared_entry_has_nvcaffe_s_number_type_label_and_default() -> None:
    ours, theirs = schema(), reference()
    differing = {key: (ours[key], theirs[key]) for key in ours.keys() & theirs.keys() if ours[key] != theirs[key]}
    assert not differing, f"(ours, NVcaffe 0.17.3's) differ: {sorted(differing.items())}"


RESNET_HEAD = """name: "ResNet-50"
default_forward_type: FLOAT16
default_backward_type: FLOAT16
default_forward_math: FLOAT
default_backward_math: FLOAT
global_grad_scale: 1024
global_grad_scale_adaptive: true
eltwise_mem_sharing: true
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 32 dim: 32 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 8 kernel_size: 3 pad: 1 } }
layer { name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
  convolution_param { num_output: 8 kernel_size: 3 pad: 1 } }
layer { name: "sum" type: "Eltwise" bottom: "conv1" bottom: "conv2" top: "sum" }
layer { name: "loss" type: "EuclideanLoss" bottom: "sum" bottom: "conv1" top: "loss" }
"""
"""The net-level fields NVIDIA's own ResNet-50 examples for NVcaffe 0.17 set (models/resnet50), on a small net."""


def test_a_net_with_eltwise_mem_sharing_reads_as_nvcaffe_and_estimates() -> None:
    net = parse_net(RESNET_HEAD, "train_val.prototxt")
    assert flavour_of(net) == NVCAFFE and net.eltwise_mem_sharing and net.global_grad_scale_adaptive
    document = estimate(EstimateRequest(net=RESNET_HEAD, net_source="train_val.prototxt"))
    assert document["flavour"] == NVCAFFE and document["total_bytes"] > 0
