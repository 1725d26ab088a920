"""NVcaffe's schema (NVIDIA/caffe, branch caffe-0.17, src/caffe/proto/caffe.proto) as a second caffe_pb2.

DIGITS trains with NVIDIA's fork of Caffe, whose caffe.proto renumbers and adds fields (per-layer storage types,
DetectNet's parameters, SSD's resize and distortion policies). Its messages are built here, at import, from the
BVLC schema caffe_pb2 already carries plus a declaration of what NVcaffe 0.17 changes (`_PATCH`): no protoc run,
no generated file to keep in step, and neither Caffe imported. The package is renamed `nvcaffe` (file
`nvcaffe/caffe.proto`) so that both schemas live in protobuf's default descriptor pool without clashing.

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
_SCALARS = {
    "float": F.TYPE_FLOAT, "double": F.TYPE_DOUBLE, "int32": F.TYPE_INT32, "int64": F.TYPE_INT64,
    "uint32": F.TYPE_UINT32, "bool": F.TYPE_BOOL, "string": F.TYPE_STRING, "bytes": F.TYPE_BYTES,
}

Field = tuple[Any, ...]
"""(name, number, type, default or None[, label]): `type` a scalar name, `enum:X` or a message name."""


def _field(spec: Field) -> descriptor_pb2.FieldDescriptorProto:
    name, number, kind, default, *rest = spec
    field = F(name=name, number=number, label=rest[0] if rest else OPTIONAL)
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

# What NVcaffe 0.17 has that BVLC (as pycaffe's caffe.proto carries it) has not, and what it lacks. Per message:
# fields removed by name, fields added (a number BVLC uses for another field is removed first), enums added.
_TYPE_FIELD_DEFAULT = "FLOAT"
_PATCH: dict[str, dict[str, Any]] = {
    "BlobProto": {"add": [("raw_data_type", 10, "enum:Type", None), ("raw_diff_type", 11, "enum:Type", None),
                          ("raw_data", 12, "bytes", None), ("raw_diff", 13, "bytes", None)]},
    "Datum": {"add": [("record_id", 8, "uint32", "0")]},
    "AnnotatedDatum": {"add": [("record_id", 4, "uint32", "0")]},
    "NetParameter": {"add": [
        ("default_forward_type", 11, "enum:Type", "FLOAT"), ("default_backward_type", 12, "enum:Type", "FLOAT"),
        ("default_forward_math", 13, "enum:Type", "FLOAT"), ("default_backward_math", 14, "enum:Type", "FLOAT"),
        ("global_grad_scale", 15, "float", "1"), ("default_conv_algos_override", 17, "string", "-1,-1,-1"),
        ("reduce_buckets", 18, "int32", "6"), ("default_cudnn_math_override", 19, "int32", "-1"),
    ]},
    "SolverParameter": {"remove": ["eval_type", "ap_version"], "add": [
        ("eval_type", 241, "string", "classification"), ("ap_version", 242, "string", "Integral"),
        ("show_per_class_result", 244, "bool", "false"), ("rampup_interval", 41, "int32", "0"),
        ("rampup_lr", 42, "float", "0"), ("min_lr", 43, "float", "0"),
        ("momentum_policy", 46, "string", "fixed"), ("max_momentum", 47, "float", "0.99"),
        ("momentum_power", 48, "float", "1"), ("local_lr_auto", 49, "bool", "false"),
        ("local_gw_ratio", 50, "float", "0.001"), ("plateau_winsize", 243, "int32", None, REPEATED),
        ("solver_data_type", 44, "enum:Type", "FLOAT"), ("store_blobs_in_old_format", 45, "bool", "false"),
    ]},
    "SolverState": {"add": [("minimum_loss", 5, "float", "1e+38"), ("iter_last_event", 6, "int32", "0")]},
    "LayerParameter": {
        "remove": ["bn_param", "parameter_param", "recurrent_param", "resize_param", "inception_param",
                   "upsample_param", "hardsigmoid_param", "unsqueeze_param", "relu6_param", "pad_param",
                   "bilinear_interpolate_param", "max_unpool_param", "pixelshuffle_param", "proposal_param",
                   "psroi_pooling_param"],
        "add": [
            ("forward_type", 145, "enum:Type", "FLOAT"), ("backward_type", 146, "enum:Type", "FLOAT"),
            ("forward_math", 147, "enum:Type", "FLOAT"), ("backward_math", 148, "enum:Type", "FLOAT"),
            ("debug", 149, "bool", "false"), ("cudnn_math_override", 150, "int32", "-1"),
            ("detectnet_groundtruth_param", 6801, "DetectNetGroundTruthParameter", None),
            ("detectnet_augmentation_param", 6802, "DetectNetAugmentationParameter", None),
        ],
    },
    "TransformationParameter": {
        "remove": ["crop_h", "crop_w", "old_resize_param", "noise_param", "emit_constraint"],
        "add": [
            ("img_rand_resize_lower", 10, "uint32", "0"), ("img_rand_resize_upper", 11, "uint32", "0"),
            ("var_sz_img_enabled", 12, "bool", "false"), ("crop_h", 211, "uint32", "0"),
            ("crop_w", 212, "uint32", "0"), ("use_gpu_transform", 8, "bool", "false"),
            ("random_seed", 9, "int64", "-1"), ("display", 20, "bool", "false"), ("num_labels", 21, "int32", "0"),
            ("resize_param", 208, "ResizeParameter", None), ("noise_param", 209, "NoiseParameter", None),
            ("distort_param", 213, "DistortionParameter", None), ("expand_param", 214, "ExpansionParameter", None),
            ("emit_constraint", 210, "EmitConstraint", None),
        ],
    },
    "AnnotatedDataParameter": {"add": [("anno_type", 3, "enum:AnnotatedDatum.AnnotationType", None)]},
    "BatchNormParameter": {
        "remove": ["weight_filler", "bias_filler", "use_alpha_beta", "do_all_reduce"],
        "add": [("scale_filler", 5, "FillerParameter", None), ("bias_filler", 6, "FillerParameter", None),
                ("scale_bias", 7, "bool", "false"), ("engine", 15, "enum:BatchNormParameter.Engine", "DEFAULT")],
        "enums": [("Engine", ("DEFAULT=0", "CAFFE=1", "CUDNN=2"))],
    },
    "ConvolutionParameter": {
        "remove": ["width_group", "height_group"],
        "add": [("cudnn_convolution_algo_seeker", 19,
                 "enum:ConvolutionParameter.CuDNNConvolutionAlgorithmSeeker", "FINDEX"),
                ("conv_algos_override", 20, "string", "-1,-1,-1")],
        "enums": [("CuDNNConvolutionAlgorithmSeeker", ("GET=0", "FINDEX=1"))],
    },
    "DataParameter": {
        "remove": ["prefetch"],
        "add": [("prefetch", 10, "uint32", "0"), ("threads", 11, "uint32", "0"), ("parser_threads", 12, "uint32", "0"),
                ("cache", 13, "bool", "false"), ("shuffle", 14, "bool", "false")],
    },
    "DetectionEvaluateParameter": {"add": [("resize_param", 6, "ResizeParameter", None)]},
    "SaveOutputParameter": {"add": [("resize_param", 7, "ResizeParameter", None)]},
    "DetectionOutputParameter": {"remove": ["thresholds", "save_file"], "add": [("save_file", 12, "string", None)]},
    "DropoutParameter": {
        "add": [("engine", 2, "enum:DropoutParameter.Engine", "DEFAULT"), ("random_seed", 3, "int64", "-1")],
        "enums": [("Engine", ("DEFAULT=0", "CAFFE=1", "CUDNN=2"))],
    },
    "ELUParameter": {"add": [("lambda", 2, "float", "1")]},
    "PoolingParameter": {"remove": ["ceil_mode"]},
    "VideoDataParameter": {"add": [("skip_frames", 4, "uint32", "0")]},
    "V1LayerParameter": {"remove": ["bn_param", "batch_norm_param"]},
}

_REMOVED_MESSAGES = {
    "ProposalParameter", "PSROIPoolingParameter", "BNParameter", "ParameterParameter", "RecurrentParameter",
    "InceptionColumnParameter", "InceptionParameter", "ResizeParameter", "UpsampleParameter", "HardSigmoidParameter",
    "UnsqueezeParameter", "ReLU6Parameter", "PadParameter", "BilinearInterpolateParameter", "MaxUnPoolParameter",
    "PixelShuffleParameter",
}
"""Messages of pycaffe's schema that NVcaffe 0.17 has not (its ResizeParameter is a different message, below)."""

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
]


def _file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """pycaffe's caffe.proto, renamed into package `nvcaffe` and patched to NVcaffe 0.17's messages."""
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
    proto.enum_type.add().CopyFrom(_enum("Type", TYPE_ENUM))
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
