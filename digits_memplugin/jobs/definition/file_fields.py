"""Which fields of a job's layers name files, and how each is handled (`HANDLED_FIELDS`).

Caffe opens whatever paths a prototxt names, so every string field of every layer that names a file is examined by
name (fork-only layers are covered too): known readers and writers are handled (jobs.definition.confiner at
submission, jobs.definition.recheck at each attempt); any other path-like field, and the layers that run code or
read files no one checks, are refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ...core.training import TrainingDefinition

# (message name, field name) -> how the field is handled. Anything else that looks like a path is refused.
READ_FILE = "read file"
READ_DB = "read database"
HDF5_LIST = "hdf5 list"
IMAGE_LIST = "image list"
WRITE_FILE = "write file"
WRITE_DIR = "write folder"
FILE_NAME = "file name"
HANDLED_FIELDS: dict[tuple[str, str], str] = {
    ("DataParameter", "source"): READ_DB,
    ("DataParameter", "mean_file"): READ_FILE,
    ("TransformationParameter", "mean_file"): READ_FILE,
    ("HDF5DataParameter", "source"): HDF5_LIST,
    ("ImageDataParameter", "source"): IMAGE_LIST,
    ("ImageDataParameter", "mean_file"): READ_FILE,
    ("ImageDataParameter", "root_folder"): IMAGE_LIST,
    ("InfogainLossParameter", "source"): READ_FILE,
    ("AnnotatedDataParameter", "label_map_file"): READ_FILE,
    ("DetectionEvaluateParameter", "name_size_file"): READ_FILE,
    ("SaveOutputParameter", "label_map_file"): READ_FILE,
    ("SaveOutputParameter", "name_size_file"): READ_FILE,
    ("VideoDataParameter", "video_file"): READ_FILE,
    ("HDF5OutputParameter", "file_name"): WRITE_FILE,
    ("DetectionOutputParameter", "save_file"): WRITE_FILE,
    ("SaveOutputParameter", "output_directory"): WRITE_DIR,
    ("SaveOutputParameter", "output_name_prefix"): FILE_NAME,
}
PATH_LIKE = re.compile(r"file|source|folder|directory|path|prefix|module")
REFUSED_LAYERS = {
    "Python": "Python layers import and run code on the server; they are not allowed in jobs",
    "WindowData": "WindowData's window files are not supported in jobs; convert the data to LMDB or HDF5",
}


def unique_params(training: TrainingDefinition) -> list[Any]:
    """Each NetParameter once: a generic net serves as the train net and the test nets (one object)."""
    seen: dict[int, Any] = {}
    for net in (training.train, *training.tests):
        seen.setdefault(id(net.param), net.param)
    return list(seen.values())


def string_fields(message: Any, path: str = "") -> Iterator[tuple[Any, Any, str]]:
    """(message, field descriptor, dotted path) of every set string field, nested messages included."""
    for field, value in message.ListFields():
        dotted = f"{path}.{field.name}" if path else field.name
        if field.type == field.TYPE_MESSAGE:
            items = value if field.label == field.LABEL_REPEATED else [value]
            for item in items:
                yield from string_fields(item, dotted)
        elif field.type == field.TYPE_STRING and field.label != field.LABEL_REPEATED:
            yield message, field, dotted
