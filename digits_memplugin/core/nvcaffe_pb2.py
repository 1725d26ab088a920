"""NVcaffe's schema (NVIDIA/caffe, branch caffe-0.17, release 0.17.3, src/caffe/proto/caffe.proto) as a second
caffe_pb2.

DIGITS trains with NVIDIA's fork of Caffe, whose caffe.proto renumbers and adds fields (per-layer storage types,
DetectNet's parameters, SSD's resize and distortion policies, `eltwise_mem_sharing`). Its messages are built here,
at import, from the BVLC schema caffe_pb2 already carries plus a declaration of what NVcaffe 0.17.3 changes
(`_PATCH`, `_NEW_MESSAGES`, `_REMOVED_MESSAGES`): no protoc run, no generated file to keep in step, and neither
Caffe imported. The package is renamed `nvcaffe` (file `nvcaffe/caffe.proto`) so that both schemas live in
protobuf's default descriptor pool without clashing. tests/test_core_nvcaffe_schema.py holds the result to
NVcaffe 0.17.3's own messages, field by field (name, number, type, label, default) and value by value.

The module exposes the same names a generated module does (`NetParameter`, `LayerParameter`, `TRAIN`, `FLOAT16`...).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.internal import builder

from .proto import caffe_pb2

PACKAGE = "nvcaffe"
FILE_NAME = "nvcaffe/caffe.proto"

F = descriptor_pb2.FieldDescriptorProto
OPTIONAL, REPEATED, REQUIRED = F.LABEL_OPTIONAL, F.LABEL_REPEATED, F.LABEL_REQUIRED
PACKED = -1
"""A label for `Field`: repeated, [packed = true] (how the binary format stores it; the text format is the same)."""
_SCALARS = {
    "float": F.TYPE_FLOAT, "double": F.TYPE_DOUBLE, "int32": F.TYPE_INT32, "int64": F.TYPE_INT64,
    "uint32": F.TYPE_UINT32, "bool": F.TYPE_BOOL, "string": F.TYPE_STRING, "bytes": F.TYPE_BYTES,
}

Field = tuple[Any, ...]
"""(name, number, type, default or None[, label]): `type` a scalar name, `enum:X` or a message name; `label`
OPTIONAL unless given (REPEATED, PACKED, REQUIRED)."""


def _field(spec: Field) -> descriptor_pb2.FieldDescriptorProto:
    name, number, kind, default, *rest = spec
    label = rest[0] if rest else OPTIONAL
    field = F(name=name, number=number, label=REPEATED if label == PACKED else label)
    if label == PACKED:
        field.options.packed = True
    if kind in _SCALARS:
        field.type = _SCALARS[kind]
    elif kind.startswith("enum:"):
        field.type, field.type_name = F.TYPE_ENUM, f".{PACKAGE}.{kind[5:]}"
    else:
        field.type, field.type_name = F.TYPE_MESSAGE, f".{PACKAGE}.{kind}"
    if default is not None:
        field.default_value = default
    return field


def _enum(name: str, values: Iterable[str]) -> descriptor_pb2.EnumDescriptorProto:
    enum = descriptor_pb2.EnumDescriptorProto(name=name)
    for value in values:
        label, number = value.split("=")
        enum.value.add(name=label, number=int(number))
    return enum


TYPE_ENUM = ("DOUBLE=0", "FLOAT=1", "FLOAT16=2", "INT=3", "UINT=4", "BOOL=5")
"""Math and storage types (caffe.proto `enum Type`): what default_forward_type / forward_type name."""
PACKING_ENUM = ("NCHW=0", "NHWC=1")
"""Tensor layouts (caffe.proto `enum Packing`): TransformationParameter.forward_packing."""

# What NVcaffe 0.17.3 has that BVLC (as pycaffe's caffe.proto carries it) has not, and what it lacks. Per message:
# fields removed by name, fields added (one a BVLC field of the same number is replaced by: a changed default, a
# renumbered field), nested enums added, values added to nested enums BVLC has.
_ENGINE = ("DEFAULT=0", "CAFFE=1", "CUDNN=2")
_PATCH: dict[str, dict[str, Any]] = {
    "BlobProto": {"add": [("raw_data_type", 10, "enum:Type", None), ("raw_diff_type", 11, "enum:Type", None),
                          ("raw_data", 12, "bytes", None), ("raw_diff", 13, "bytes", None)]},
    "Datum": {"add": [("record_id", 8, "uint32", "0")]},
    "AnnotatedDatum": {"add": [("record_id", 4, "uint32", "0")]},
    "NetParameter": {"add": [
        ("default_forward_type", 11, "enum:Type", "FLOAT"), ("default_backward_type", 12, "enum:Type", "FLOAT"),
        ("default_forward_math", 13, "enum:Type", "FLOAT"), ("default_backward_math", 14, "enum:Type", "FLOAT"),
        ("global_grad_scale", 15, "float", "1"), ("global_grad_scale_adaptive", 16, "bool", "false"),
        ("default_conv_algos_override", 17, "string", "-1,-1,-1"), ("reduce_buckets", 18, "int32", "6"),
        ("default_cudnn_math_override", 19, "int32", "-1"), ("eltwise_mem_sharing", 20, "bool", "true"),
    ]},
    "SolverParameter": {
        "remove": ["eval_type", "ap_version"],
        "add": [
            ("eval_type", 241, "string", "classification"), ("ap_version", 242, "string", "Integral"),
            ("show_per_class_result", 244, "bool", "false"), ("test_initialization", 32, "bool", "false"),
            ("rampup_interval", 41, "int32", "0"), ("rampup_lr", 42, "float", "0"), ("min_lr", 43, "float", "0"),
            ("momentum_policy", 46, "string", "fixed"), ("max_momentum", 47, "float", "0.99"),
            ("momentum_power", 48, "float", "1"), ("larc", 49, "bool", "false"),
            ("larc_policy", 50, "string", "scale"), ("larc_eta", 51, "float", "0.001"),
            ("larc_turbo", 55, "bool", "false"), ("weight_decay_policy", 52, "string", "fixed"),
            ("weight_decay_power", 53, "float", "1"), ("max_weight_decay", 56, "float", "0"),
            ("plateau_winsize", 243, "int32", None, REPEATED), ("solver_data_type", 44, "enum:Type", "FLOAT"),
            ("store_blobs_in_old_format", 45, "bool", "false"), ("test_and_snapshot_last_epochs", 54, "int32", "0"),
        ],
        "values": [("SolverType", ("SAG=6",))],
    },
    "SolverState": {"add": [("minimum_loss", 5, "float", "1e+38"), ("iter_last_event", 6, "int32", "0")]},
    "LayerParameter": {
        "remove": ["bn_param", "parameter_param", "resize_param", "inception_param", "upsample_param",
                   "hardsigmoid_param", "unsqueeze_param", "relu6_param", "pad_param", "bilinear_interpolate_param",
                   "max_unpool_param", "pixelshuffle_param", "proposal_param", "psroi_pooling_param"],
        "add": [
            ("forward_type", 145, "enum:Type", "FLOAT"), ("backward_type", 146, "enum:Type", "FLOAT"),
            ("forward_math", 147, "enum:Type", "FLOAT"), ("backward_math", 148, "enum:Type", "FLOAT"),
            ("debug", 149, "bool", "false"), ("cudnn_math_override", 150, "int32", "-1"),
            ("recurrent_param", 151, "RecurrentParameter", None), ("trt_param", 152, "TRTParameter", None),
            ("detectnet_groundtruth_param", 6801, "DetectNetGroundTruthParameter", None),
            ("detectnet_augmentation_param", 6802, "DetectNetAugmentationParameter", None),
        ],
    },
    "TransformationParameter": {
        "remove": ["crop_h", "crop_w", "old_resize_param", "noise_param", "emit_constraint"],
        "add": [
            ("img_rand_resize_lower", 10, "uint32", "0"), ("img_rand_resize_upper", 11, "uint32", "0"),
            ("rand_resize_ratio_lower", 12, "float", "0"), ("rand_resize_ratio_upper", 13, "float", "0"),
            ("vertical_stretch_lower", 14, "float", "1"), ("vertical_stretch_upper", 15, "float", "1"),
            ("horizontal_stretch_lower", 16, "float", "1"), ("horizontal_stretch_upper", 17, "float", "1"),
            ("interpolation_algo_down", 18, "enum:TransformationParameter.InterpolationAlgo", "INTER_NEAREST"),
            ("interpolation_algo_up", 19, "enum:TransformationParameter.InterpolationAlgo", "INTER_CUBIC"),
            ("allow_upscale", 20, "bool", "false"), ("forward_packing", 21, "enum:Packing", "NCHW"),
            ("crop_h", 211, "uint32", "0"), ("crop_w", 212, "uint32", "0"), ("use_gpu_transform", 8, "bool", "false"),
            ("random_seed", 9, "int64", "-1"), ("display", 22, "bool", "false"), ("num_labels", 23, "int32", "0"),
            ("resize_param", 208, "ResizeParameter", None), ("noise_param", 209, "NoiseParameter", None),
            ("distort_param", 213, "DistortionParameter", None), ("expand_param", 214, "ExpansionParameter", None),
            ("emit_constraint", 210, "EmitConstraint", None),
        ],
        "enums": [("InterpolationAlgo", ("INTER_NEAREST=0", "INTER_LINEAR=1", "INTER_CUBIC=2", "INTER_AREA=3"))],
    },
    "LossParameter": {"add": [("label_smoothing", 4, "float", "0")]},
    "AnnotatedDataParameter": {"add": [("anno_type", 3, "enum:AnnotatedDatum.AnnotationType", None)]},
    "BatchNormParameter": {
        "remove": ["weight_filler", "bias_filler", "use_alpha_beta", "do_all_reduce"],
        "add": [("use_global_stats", 1, "bool", "false"), ("scale_filler", 5, "FillerParameter", None),
                ("bias_filler", 6, "FillerParameter", None), ("scale_bias", 7, "bool", "false"),
                ("engine", 15, "enum:BatchNormParameter.Engine", "DEFAULT")],
        "enums": [("Engine", _ENGINE)],
    },
    "ConvolutionParameter": {
        "remove": ["width_group", "height_group"],
        "add": [("stride_h", 13, "uint32", None), ("stride_w", 14, "uint32", None),
                ("cudnn_convolution_algo_seeker", 19,
                 "enum:ConvolutionParameter.CuDNNConvolutionAlgorithmSeeker", "FINDEX"),
                ("conv_algos_override", 20, "string", "-1,-1,-1")],
        "enums": [("CuDNNConvolutionAlgorithmSeeker", ("GET=0", "FINDEX=1"))],
    },
    "DataParameter": {
        "remove": ["prefetch"],
        "add": [("prefetch", 10, "uint32", "0"), ("threads", 11, "uint32", "0"), ("parser_threads", 12, "uint32", "0"),
                ("cache", 13, "bool", "false"), ("shuffle", 14, "bool", "false"), ("precache", 16, "bool", "false")],
    },
    "ImageDataParameter": {"add": [
        ("short_side", 13, "uint32", "0"), ("threads", 14, "uint32", "4"), ("cache", 15, "bool", "false"),
        ("precache", 16, "bool", "false"), ("dataset_share_per_node", 17, "float", "1"),
    ]},
    "DetectionEvaluateParameter": {"add": [("resize_param", 6, "ResizeParameter", None)]},
    "SaveOutputParameter": {"add": [("resize_param", 7, "ResizeParameter", None)]},
    "DetectionOutputParameter": {"remove": ["thresholds", "save_file"], "add": [("save_file", 12, "string", None)]},
    "MultiBoxLossParameter": {"add": [("ignore_difficult_gt", 24, "bool", "false")]},
    "PriorBoxParameter": {"add": [("clip", 5, "bool", "false")]},
    "DropoutParameter": {
        "add": [("engine", 2, "enum:DropoutParameter.Engine", "DEFAULT"), ("random_seed", 3, "int64", "-1")],
        "enums": [("Engine", _ENGINE)],
    },
    "ELUParameter": {"add": [("lambda", 2, "float", "1")]},
    "PoolingParameter": {"remove": ["ceil_mode"], "add": [("torch_pooling", 40, "bool", "false")]},
    "VideoDataParameter": {"add": [("skip_frames", 4, "uint32", "0")]},
    "V1LayerParameter": {"remove": ["bn_param", "batch_norm_param"]},
}

_REMOVED_MESSAGES = {
    "ProposalParameter", "PSROIPoolingParameter", "BNParameter", "ParameterParameter", "InceptionColumnParameter",
    "InceptionParameter", "ResizeParameter", "OldResizeParameter", "UpsampleParameter", "HardSigmoidParameter",
    "UnsqueezeParameter", "ReLU6Parameter", "PadParameter", "BilinearInterpolateParameter", "MaxUnPoolParameter",
    "PixelShuffleParameter",
}
"""Messages of pycaffe's schema that NVcaffe 0.17.3 has not (its ResizeParameter is a different message, below)."""

_AUGMENTATION_POLICIES: list[Field] = [
    ("resize_param", 208, "ResizeParameter", None), ("noise_param", 209, "NoiseParameter", None),
    ("distort_param", 213, "DistortionParameter", None), ("expand_param", 214, "ExpansionParameter", None),
    ("emit_constraint", 210, "EmitConstraint", None),
]

_NEW_MESSAGES: list[tuple[str, list[Field], list[tuple[str, tuple[str, ...]]]]] = [
    ("DetectNetGroundTruthParameter", [
        ("stride", 1, "uint32", "4"), ("scale_cvg", 2, "float", "0.5"),
        ("gridbox_type", 3, "enum:DetectNetGroundTruthParameter.GridboxType", "GRIDBOX_MAX"),
        ("max_cvg_len", 4, "uint32", "50"), ("min_cvg_len", 5, "uint32", "50"),
        ("coverage_type", 7, "enum:DetectNetGroundTruthParameter.CoverageType", "RECTANGULAR"),
        ("image_size_x", 8, "uint32", "1248"), ("image_size_y", 9, "uint32", "384"),
        ("obj_norm", 11, "bool", "false"), ("crop_bboxes", 12, "bool", "true"),
        ("object_class", 13, "DetectNetGroundTruthParameter.ClassMapping", None, REPEATED),
    ], [("GridboxType", ("GRIDBOX_MAX=0", "GRIDBOX_MIN=1")), ("CoverageType", ("RECTANGULAR=0",))]),
    ("DetectNetAugmentationParameter", [
        ("crop_prob", 1, "float", "1"), ("shift_x", 2, "uint32", "0"), ("shift_y", 3, "uint32", "0"),
        ("scale_prob", 4, "float", "0.33"), ("scale_min", 5, "float", "0.7"), ("scale_max", 6, "float", "1"),
        ("flip_prob", 7, "float", "0.33"), ("rotation_prob", 8, "float", "0.33"),
        ("max_rotate_degree", 9, "float", "1"), ("hue_rotation_prob", 10, "float", "0.33"),
        ("hue_rotation", 11, "float", "15"), ("desaturation_prob", 12, "float", "0.33"),
        ("desaturation_max", 13, "float", "0.5"), *_AUGMENTATION_POLICIES,
    ], []),
    ("ResizeParameter", [
        ("prob", 1, "float", "1"), ("resize_mode", 2, "enum:ResizeParameter.Resize_mode", "WARP"),
        ("height", 3, "uint32", "0"), ("width", 4, "uint32", "0"), ("height_scale", 8, "uint32", "0"),
        ("width_scale", 9, "uint32", "0"), ("pad_mode", 5, "enum:ResizeParameter.Pad_mode", "CONSTANT"),
        ("pad_value", 6, "float", None, REPEATED),
        ("interp_mode", 7, "enum:ResizeParameter.Interp_mode", None, REPEATED),
    ], [("Resize_mode", ("WARP=1", "FIT_SMALL_SIZE=2", "FIT_LARGE_SIZE_AND_PAD=3")),
        ("Pad_mode", ("CONSTANT=1", "MIRRORED=2", "REPEAT_NEAREST=3")),
        ("Interp_mode", ("LINEAR=1", "AREA=2", "NEAREST=3", "CUBIC=4", "LANCZOS4=5"))]),
    ("DistortionParameter", [
        (name, number, "float", "0") for number, name in enumerate(
            ("brightness_prob", "brightness_delta", "contrast_prob", "contrast_lower", "contrast_upper", "hue_prob",
             "hue_delta", "saturation_prob", "saturation_lower", "saturation_upper", "random_order_prob"), start=1)
    ], []),
    ("ExpansionParameter", [("prob", 1, "float", "1"), ("max_expand_ratio", 2, "float", "1")], []),
    # Caffe 2 datasets (NVcaffe reads them beside LMDB's Datums).
    ("C2TensorProto", [
        ("dims", 1, "int64", None, REPEATED), ("data_type", 2, "enum:C2TensorProto.DataType", "FLOAT"),
        ("float_data", 3, "float", None, PACKED), ("int32_data", 4, "int32", None, PACKED),
        ("byte_data", 5, "bytes", None), ("string_data", 6, "bytes", None, REPEATED),
        ("double_data", 9, "double", None, PACKED), ("int64_data", 10, "int64", None, PACKED),
        ("name", 7, "string", None),
    ], [("DataType", ("UNDEFINED=0", "FLOAT=1", "INT32=2", "BYTE=3", "STRING=4", "BOOL=5", "UINT8=6", "INT8=7",
                      "UINT16=8", "INT16=9", "INT64=10", "FLOAT16=12", "DOUBLE=13"))]),
    ("C2TensorProtos", [("protos", 1, "C2TensorProto", None, REPEATED)], []),
    # NVcaffe's TensorRT inference layer.
    ("TRTParameter", [
        ("trt_mode", 1, "enum:TRTParameter.TRTMode", "INT8"), ("top_k", 2, "uint32", "1"),
        ("deploy", 3, "string", None, REQUIRED), ("model", 4, "string", None, REQUIRED),
        ("deploy_outputs", 5, "string", None, REPEATED), ("calibrator", 6, "string", None),
    ], [("TRTMode", ("FP32=0", "FP16=1", "INT8=2"))]),
]

def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """pycaffe's caffe.proto, renamed into package `nvcaffe` and patched to NVcaffe 0.17.3's messages."""
    proto = descriptor_pb2.FileDescriptorProto.FromString(caffe_pb2.DESCRIPTOR.serialized_pb)
    proto.name, proto.package = FILE_NAME, PACKAGE
    kept = [message for message in proto.message_type if message.name not in _REMOVED_MESSAGES]
    del proto.message_type[:]
    proto.message_type.extend(kept)
    for message in proto.message_type:
        _rename_types(message, f".{caffe_pb2.DESCRIPTOR.package}.", f".{PACKAGE}.")
    by_name = {message.name: message for message in proto.message_type}
    for name, fields, enums in _NEW_MESSAGES:
        message = proto.message_type.add(name=name)
        message.field.extend(_field(spec) for spec in fields)
        message.enum_type.extend(_enum(enum, values) for enum, values in enums)
        by_name[name] = message
    mapping = by_name["DetectNetGroundTruthParameter"].nested_type.add(name="ClassMapping")
    mapping.field.extend([_field(("src", 1, "uint32", None, REQUIRED)), _field(("dst", 2, "uint32", None, REQUIRED))])
    for name, patch in _PATCH.items():
        message = by_name[name]
        removed = set(patch.get("remove", ()))
        added = [_field(spec) for spec in patch.get("add", ())]
        numbers = {field.number for field in added}
        kept_fields = [f for f in message.field if f.name not in removed and f.number not in numbers]
        del message.field[:]
        message.field.extend([*kept_fields, *added])
        message.enum_type.extend(_enum(enum, values) for enum, values in patch.get("enums", ()))
        for enum_name, values in patch.get("values", ()):
            enum = next(enum for enum in message.enum_type if enum.name == enum_name)
            enum.value.extend(_enum(enum_name, values).value)
    proto.enum_type.add().CopyFrom(_enum("Type", TYPE_ENUM))
    proto.enum_type.add().CopyFrom(_enum("Packing", PACKING_ENUM))
    proto.enum_type.add().CopyFrom(_enum("DatumTypeInfo", ("DatumTypeInfo_DATUM=0", "DatumTypeInfo_ANNOTATED_DATUM=1")))
    return proto


def _rename_types(message: descriptor_pb2.DescriptorProto, old: str, new: str) -> None:
    for field in message.field:
        if field.type_name.startswith(old):
            field.type_name = new + field.type_name[len(old):]
    for nested in message.nested_type:
        _rename_types(nested, old, new)


def _build() -> None:
    pool = descriptor_pool.Default()
    try:
        descriptor = pool.FindFileByName(FILE_NAME)
    except KeyError:
        descriptor = pool.AddSerializedFile(_file_descriptor().SerializeToString())
    namespace = sys.modules[__name__].__dict__
    namespace["DESCRIPTOR"] = descriptor
    builder.BuildMessageAndEnumDescriptors(descriptor, namespace)
    builder.BuildTopDescriptorsAndMessages(descriptor, __name__, namespace)


_build()


def __getattr__(name: str) -> Any:  # the generated names, for type checkers that cannot see them
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
