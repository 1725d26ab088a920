"""A DIGITS dataset in a net's data layers, as DIGITS sets them up: which data layers read the training set and
which the validation set (by the net each is in, so DIGITS' stage rules work too), and the layers rewritten for the
dataset's format (Caffe's Data layer reads LevelDB unless told; an HDF5 dataset needs HDF5Data layers).

This is net manipulation a job's definition needs, whoever asks for it (the New model form maps its fields with
it, web/pages/model_job.py); errors name the part of the dataset they concern (`TRAIN`, `VAL`, `FORMAT`), and the
caller words where that is on its side.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from google.protobuf import text_format

from ...core.errors import NetError
from ...core.proto import caffe_pb2
from ...core.prototxt import parse_net
from .data_sources import DATA_SOURCE_FIELDS

TRAIN = "train"
"""The training set: read by the data layers of the training net."""
VAL = "val"
"""The validation set: read by the data layers of the validation nets."""
FORMAT = "format"
"""The dataset's format ("lmdb" or "hdf5"), which sets how the data layers read."""
LMDB = "lmdb"
HDF5 = "hdf5"


class DataLayerError(ValueError):
    """The dataset does not fit the network's data layers; `part` says which part of the dataset (TRAIN, VAL or
    FORMAT) the caller shows the message beside."""

    def __init__(self, part: str, message: str) -> None:
        super().__init__(message)
        self.part = part
        self.message = message


def data_layer_phases(layers: Iterable[Mapping[str, Any]]) -> dict[str, set[str]]:
    """The data layers that read a source, by name, with the phases ("TRAIN", "TEST") of the nets they are in:
    from an estimate document's layer rows (`name`, `type`, `phase`), which list each net's layers after its
    NetStateRule filtering (so a DIGITS stage rule puts a layer in one net only)."""
    phases: dict[str, set[str]] = {}
    for layer in layers:
        if layer["type"] in DATA_SOURCE_FIELDS:
            phases.setdefault(layer["name"], set()).add(layer["phase"])
    return phases


def dataset_parts(phases: Mapping[str, Collection[str]], *, validation: bool, two_sets: bool) -> dict[str, str]:
    """Which part of the dataset each data layer reads: a layer of the training net the training set (TRAIN), one
    of the validation nets only the validation set (VAL) when there is one (`validation`; without it a validation
    net keeps the sources its prototxt names). `two_sets`: the validation set is another than the training set,
    which a layer in both nets cannot read. DataLayerError when no layer of the training net reads a dataset."""
    parts: dict[str, str] = {}
    for name, seen in phases.items():
        if "TRAIN" in seen and "TEST" in seen and validation and two_sets:
            raise DataLayerError(
                VAL,
                f"the data layer “{name}” is in both the training and the validation net, so it cannot read "
                "two datasets: give it include rules (a phase, or DIGITS' stages \"train\" and \"val\")",
            )
        if "TRAIN" in seen:
            parts[name] = TRAIN
        elif validation:
            parts[name] = VAL
    if TRAIN not in parts.values():
        raise DataLayerError(TRAIN, "the network's training net has no data layer that reads a dataset")
    return parts


def net_for_format(net_text: str, net_source: str, layer_names: Collection[str], data_format: str) -> str:
    """The network text with the data layers `layer_names` set to read `data_format`: an LMDB dataset needs
    `backend: LMDB` on a Data layer, an HDF5 dataset HDF5Data layers (with the same batch size, as DIGITS does).
    The text is rewritten only when a layer changes (comments do not survive a rewrite)."""
    try:
        net = parse_net(net_text, net_source)
    except NetError:  # pragma: no cover - the caller's estimate parsed the same text already
        return net_text
    changed = False
    for layer in net.layer:
        if layer.name not in layer_names:
            continue
        if data_format == LMDB:
            if layer.type == "HDF5Data":
                raise DataLayerError(FORMAT, f"the data layer “{layer.name}” reads HDF5 files: choose HDF5")
            if layer.type == "Data" and layer.data_param.backend != caffe_pb2.DataParameter.LMDB:
                layer.data_param.backend = caffe_pb2.DataParameter.LMDB
                changed = True
        elif layer.type == "Data":
            changed = to_hdf5(layer) or changed
    return text_format.MessageToString(net) if changed else net_text


def to_hdf5(layer: Any) -> bool:
    """A Data layer turned into an HDF5Data layer with the same batch size (DIGITS does the same for HDF5)."""
    if layer.HasField("transform_param") and layer.transform_param.ListFields():
        raise DataLayerError(
            FORMAT,
            f"the data layer “{layer.name}” transforms its data (transform_param), which Caffe's HDF5Data layer "
            "cannot do: choose LMDB, or scale in the network (a Power layer, as LeNet does)",
        )
    batch = layer.data_param.batch_size
    layer.ClearField("data_param")
    layer.ClearField("transform_param")
    layer.type = "HDF5Data"
    layer.hdf5_data_param.batch_size = batch
    return True
