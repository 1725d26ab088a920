"""What a net handed to pycaffe may hold: no layer that opens a file or imports code, and no field naming a path.

The estimator asks pycaffe (a child process, `digits_memplugin.estimate.pycaffe_shapes`) for the shapes of layer types it
has no rule for, and Caffe's layers open what their parameters name as they are set up: HDF5Output creates (so
truncates) `file_name`, DetectionOutput deletes and re-creates `save_output_param.output_directory` and reads a label
map and a name-size file, a data transformer reads `mean_file`, data layers open their `source`, InfogainLoss reads
its matrix, a Python layer imports `python_param.module` and calls it. An estimate must do none of that, so:

* a layer that *needs* what it opens to be set up (`opened_field`) never reaches pycaffe: the net builder stands an
  Input layer of its computed shapes in for it when a rule shaped it, and refuses it when none can;
* every other layer reaches pycaffe `sanitized`: every path-bearing field cleared (none of them changes a shape);
* `check_net` is the last gate, just before a child is started: it refuses a net that still holds either.
"""

from __future__ import annotations

from typing import Any

from .errors import NetError, UnsupportedLayerError

PATH_FIELDS: tuple[str, ...] = (
    "transform_param.mean_file",
    "data_param.source",
    "data_param.mean_file",
    "annotated_data_param.label_map_file",
    "detection_evaluate_param.name_size_file",
    "detection_output_param.save_output_param",
    "detection_output_param.save_file",
    "hdf5_data_param.source",
    "hdf5_output_param.file_name",
    "image_data_param.source",
    "image_data_param.mean_file",
    "image_data_param.root_folder",
    "infogain_loss_param.source",
    "python_param.module",
    "python_param.layer",
    "video_data_param.video_file",
    "window_data_param.source",
    "window_data_param.mean_file",
    "window_data_param.root_folder",
)
"""Every field of a LayerParameter (this Caffe's caffe.proto) that names a file, a folder or a module: a message field
(save_output_param) stands for everything in it. tests/test_hardening_estimate.py holds this list to the proto."""

OPENS: dict[str, str] = {
    "Data": "data_param.source",
    "AnnotatedData": "data_param.source",
    "ImageData": "image_data_param.source",
    "WindowData": "window_data_param.source",
    "HDF5Data": "hdf5_data_param.source",
    "HDF5Output": "hdf5_output_param.file_name",
    "InfogainLoss": "infogain_loss_param.source",
    "VideoData": "video_data_param.video_file",
    "Python": "python_param.module",
}
"""Layer types whose set-up opens (or imports) what a field names, and cannot be set up without it: clearing the
field does not make them safe, it makes Caffe abort."""


def opened_field(layer: Any) -> str | None:
    """The field `layer` opens (or imports) as Caffe sets it up, when it cannot be set up without it; else None.
    InfogainLoss reads its matrix from the file only without a third bottom; VideoData opens a camera when it
    names no file."""
    field = OPENS.get(layer.type)
    if field == "infogain_loss_param.source" and len(layer.bottom) >= 3:
        return None
    return field


def sanitized(layer: Any) -> Any:
    """A copy of `layer` as pycaffe may see it: its include/exclude rules and every path-bearing field cleared,
    except the one it opens (`opened_field`: such a layer must not reach pycaffe at all, and `check_net` says so)."""
    copy = type(layer)()
    copy.CopyFrom(layer)
    copy.ClearField("include")
    copy.ClearField("exclude")
    keep = opened_field(layer)
    for path in PATH_FIELDS:
        if path == keep:
            continue
        message_name, field = path.split(".")
        if copy.HasField(message_name):
            getattr(copy, message_name).ClearField(field)
    return copy


def path_fields_set(layer: Any) -> list[str]:
    """The path-bearing fields `layer` sets (non-empty)."""
    found = []
    for path in PATH_FIELDS:
        message_name, field = path.split(".")
        if not layer.HasField(message_name):
            continue
        message = getattr(layer, message_name)
        value = getattr(message, field)
        if message.DESCRIPTOR.fields_by_name[field].message_type is not None:
            if message.HasField(field):
                found.append(path)
        elif value:
            found.append(path)
    return found


def refusal(layer: Any, field: str) -> UnsupportedLayerError:
    """Why `layer`, which opens `field` to be set up, cannot be shaped by pycaffe here."""
    if layer.type == "Python":
        why = "a Python layer is never handed to pycaffe: it would import and run python_param.module"
    else:
        why = (f"the estimator has no rule for this layer, and pycaffe would have to open {field} to shape it; "
               "an estimate never opens a file")
    return UnsupportedLayerError(why, layer=layer.name, layer_type=layer.type, field=field)


def check_net(net_param: Any) -> None:
    """Refuse (NetError) a net that holds a layer opening a file or importing code, or a path-bearing field: the last
    check before pycaffe builds it."""
    for layer in net_param.layer:
        field = opened_field(layer)
        if field is not None:
            raise refusal(layer, field)
        found = path_fields_set(layer)
        if found:
            raise NetError(
                f"names a file or folder ({', '.join(found)}); a net handed to pycaffe names none",
                layer=layer.name, layer_type=layer.type, field=found[0],
            )
