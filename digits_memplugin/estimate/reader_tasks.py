"""What the dataset reader processes (dataset_reader.py) run, by name: the LMDB and HDF5 reads."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .hdf5_reads import hdf5_list_task, hdf5_task
from .lmdb_reads import lmdb_task


def _reader_imports() -> None:
    """What the tasks import, imported before the reader is confined (its filter lets no extension module load)."""
    for module in ("h5py", "h5py.h5d", "h5py.h5l", "lmdb"):
        importlib.import_module(module)


READER_TASKS: dict[str, Callable[..., dict[str, Any]]] = {
    "lmdb": lmdb_task, "hdf5": hdf5_task, "hdf5_list": hdf5_list_task,
}
"""What dataset_reader's processes run, by name."""
READER_IMPORTS = _reader_imports
