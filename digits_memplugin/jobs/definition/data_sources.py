"""A net's data layers and their sources: which field of each data layer names its source, which phases a layer
feeds, and the sources a request's `data` gives put in place (by layer name, or by phase as DIGITS assigns its
training and validation databases)."""

from __future__ import annotations

from typing import Any

from ...core.errors import NetError
from ...core.proto import caffe_pb2

DATA_SOURCE_FIELDS = {
    "Data": "data_param",
    "HDF5Data": "hdf5_data_param",
    "ImageData": "image_data_param",
    "AnnotatedData": "data_param",
}
SOURCE_FIELDS = frozenset(f"{param}.source" for param in DATA_SOURCE_FIELDS.values())


class DataSourceError(NetError):
    """A data source the request's `data` gave (not the net's own text) cannot be used: the request's `data` field
    is at fault, and the API says so rather than pointing at the net."""


def data_phases(layer: Any) -> set[str]:
    """The phases ("train", "test") a data layer feeds, from its include rules: a phase, or DIGITS' stages (its
    solver trains with stage "train" and validates with stage "val"); a layer with neither feeds both."""
    phases = {"train" if rule.phase == caffe_pb2.TRAIN else "test" for rule in layer.include if rule.HasField("phase")}
    if phases:
        return phases
    stages = {stage for rule in layer.include for stage in rule.stage}
    return ({"train"} if "train" in stages else set()) | ({"test"} if "val" in stages else set()) or {"train", "test"}


def apply_data(params: list[Any], data: dict[str, str]) -> set[int]:
    """Replace data sources: a key names a layer, or a phase ("train", "test": that phase's data layers, as DIGITS
    assigns its train and validation databases). A layer's own name wins over its phase. The layers whose source
    was replaced, by id() (names are not unique: LeNet's TRAIN and TEST data layers are both "mnist")."""
    phase_keys = {key.lower(): key for key in data if key.lower() in ("train", "test")}
    used: set[str] = set()
    replaced: set[int] = set()
    for param in params:
        for layer in param.layer:
            field = DATA_SOURCE_FIELDS.get(layer.type)
            key = None
            if layer.name in data:
                key = layer.name
            elif field is not None and phase_keys:
                names = data_phases(layer)
                matching = [phase_keys[name] for name in sorted(names) if name in phase_keys]
                if len(matching) > 1:
                    raise NetError(
                        f"data layer {layer.name!r} is in both phases; give its source by its name, not by phase",
                        layer=layer.name, layer_type=layer.type, field="data",
                    )
                key = matching[0] if matching else None
            if key is None:
                continue
            if field is None:
                raise NetError(
                    f"data names layer {layer.name!r}, a {layer.type} layer, which reads no data source",
                    layer=layer.name, layer_type=layer.type, field="data",
                )
            getattr(layer, field).source = data[key]
            if layer.type == "Data" and not layer.data_param.HasField("backend"):
                # Unset means LevelDB, which this Caffe is built without; DIGITS sets LMDB for its datasets too.
                layer.data_param.backend = caffe_pb2.DataParameter.LMDB
            used.add(key)
            replaced.add(id(layer))
    unused = sorted(set(data) - used)
    if unused:
        raise NetError(f"data names layers or phases the net does not have: {', '.join(unused)}", field="data")
    return replaced
