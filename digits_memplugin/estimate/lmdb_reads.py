"""An LMDB read in the dataset reader process: its first record's item shape, its record count, its size on disk.

LMDB is handed only the checked data file (files.open_regular), as a single-file environment with no lock file,
through /proc/self/fd. Its map must not reach past the file's end (a page there is a SIGBUS): the file's size is
checked against the pages its meta page says it holds before it is mapped, and a shorter file is refused.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from ..core.errors import NetError
from ..core.layers.data import DataSpec
from ..core.proto import caffe_pb2
from .datasets import LMDB_DATA_FILE, DatasetInfo
from .files import open_regular


def lmdb_task(path: str, layer: str, name: str, roots: list[str] | None, seconds: float) -> dict[str, Any]:
    return _read_lmdb(Path(path), layer, None if roots is None else [Path(root) for root in roots], name).to_json()


def _read_lmdb(path: Path, layer: str, roots: list[Path] | None, name: str) -> DatasetInfo:
    import lmdb

    field = "data_param.source"
    where: dict[str, Any] = {"layer": layer, "layer_type": "Data", "field": field}
    shown = f"{name.rstrip('/')}/{LMDB_DATA_FILE}"
    if not path.is_dir():
        raise NetError(f"LMDB {name} does not exist (an LMDB is a folder)", **where)
    fd = open_regular(path / LMDB_DATA_FILE, name=shown, roots=roots, **where)
    try:
        facts = os.fstat(fd)
        end = _lmdb_pages_end(fd)
        if end is not None and facts.st_size < end:
            raise NetError(
                f"{shown} is truncated: it holds {facts.st_size} bytes but its pages run to {end} bytes (a copy that has "
                "not finished?); not read",
                **where,
            )
        try:
            # The checked file itself, as a single-file environment with no lock file (nothing else is opened).
            env = lmdb.open(f"/proc/self/fd/{fd}", subdir=False, readonly=True, lock=False, readahead=False)
        except lmdb.Error as error:
            raise NetError(f"cannot open LMDB {shown}: {_lmdb_reason(error)}", **where) from None
        try:
            disk_bytes = min(facts.st_size, facts.st_blocks * 512)
            entries = int(env.stat()["entries"])
            with env.begin() as txn:
                cursor = txn.cursor()
                if not cursor.first():
                    raise NetError(f"LMDB {name} is empty", **where)
                value = cursor.value()
        except lmdb.Error as error:
            raise NetError(f"cannot read LMDB {shown}: {_lmdb_reason(error)}", **where) from None
        finally:
            env.close()
    finally:
        os.close(fd)
    datum = caffe_pb2.Datum()
    try:
        datum.ParseFromString(value)
    except DecodeError as error:
        raise NetError(f"the first record of {name} is not a Caffe Datum ({error})", layer=layer, field=field) from None
    if datum.encoded:
        raise NetError(
            f"{name} holds encoded (PNG/JPEG) images, whose size is only known after decoding; give the image "
            "shape explicitly",
            layer=layer,
            layer_type="Data",
            field=field,
        )
    shape = (datum.channels, datum.height, datum.width)
    itemsize = 4 if len(datum.float_data) and not datum.data else 1
    return DatasetInfo({"data": DataSpec(shape, stored_itemsize=itemsize)}, entries, disk_bytes)


# LMDB's file format (mdb.c, as the lmdb package builds it for this machine): each meta page is a page header
# (pgno, pad, flags, lower, upper) followed by MDB_meta (magic, version, address, mapsize, the free and main
# MDB_db records (pad = the page size in the free one, flags, depth, branch/leaf/overflow pages, entries, root),
# last_pg, txnid). The two meta pages are pages 0 and 1.
_PAGE_HEADER = struct.Struct("@NHHHH")
_META = struct.Struct("@IIPN" + "IHHNNNNN" * 2 + "NN")
_P_META = 0x08
_LMDB_MAGIC = 0xBEEFC0DE
_LMDB_VERSION = 1


def _lmdb_meta(data: bytes) -> tuple[int, int, int] | None:
    """(page size, last page, txnid) of one meta page, or None when it is not a valid one."""
    if len(data) < _PAGE_HEADER.size + _META.size:
        return None
    flags = _PAGE_HEADER.unpack_from(data)[2]
    meta = _META.unpack_from(data, _PAGE_HEADER.size)
    if not flags & _P_META or meta[0] != _LMDB_MAGIC or meta[1] != _LMDB_VERSION:
        return None
    return meta[4], meta[-2], meta[-1]


def _lmdb_pages_end(fd: int) -> int | None:
    """The bytes LMDB's pages take, (last page + 1) x page size, from the meta page LMDB reads by (the one with the
    larger txnid, as mdb_env_pick_meta picks it); a file at least this long is mapped no further than its end.
    None when the header is not LMDB's: LMDB refuses such a file itself (MDB_INVALID), reading it with pread."""
    size = _PAGE_HEADER.size + _META.size
    first = _lmdb_meta(os.pread(fd, size, 0))
    if first is None:
        return None
    page_size = first[0]
    if not 512 <= page_size <= 1 << 16 or page_size & (page_size - 1):
        return None
    second = _lmdb_meta(os.pread(fd, size, page_size))
    if second is None:
        return 2 * page_size if os.fstat(fd).st_size < page_size + size else None
    last_page = second[1] if second[2] > first[2] else first[1]
    return (last_page + 1) * page_size


def _lmdb_reason(error: Exception) -> str:
    """LMDB's reason without the path it names (/proc/self/fd/N means nothing to a user)."""
    return re.sub(r"/proc/self/fd/\d+:\s*", "", str(error)) or type(error).__name__
