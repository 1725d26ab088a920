"""The estimate pool's messages: one pickle each, after its length, between the server and its own workers only.

NetError and its subclasses have keyword-only constructors, which pickle's default cannot call: `_Pickler` sends
them as their class, arguments and state. The server reads with a deadline from a non-blocking pipe
(`read_message`); a worker reads its requests blocking (`read_request`), since it has nothing else to do.
"""

from __future__ import annotations

import copyreg
import io
import os
import pickle
import struct
from typing import Any

from ..core.errors import NetError
from .pipes import CHUNK, wait

_HEADER = struct.Struct("!Q")


def _rebuild_error(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> BaseException:
    error = cls.__new__(cls)
    BaseException.__init__(error, *args)
    error.__dict__.update(state)
    return error


class _Pickler(pickle.Pickler):
    """Pickles NetError and its subclasses (keyword-only constructors, which pickle's default cannot call)."""

    dispatch_table = copyreg.dispatch_table

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, NetError):
            return _rebuild_error, (type(obj), obj.args, dict(obj.__dict__))
        return NotImplemented


def dumps(value: Any) -> bytes:
    """`value` as one message: its pickle, after the pickle's length."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    data = buffer.getvalue()
    return _HEADER.pack(len(data)) + data


def _read_exactly(fd: int, count: int, deadline: float) -> bytes:
    parts: list[bytes] = []
    while count:
        try:
            data = os.read(fd, min(count, CHUNK))
        except BlockingIOError:
            wait(fd, False, deadline)
            continue
        if not data:
            raise EOFError
        parts.append(data)
        count -= len(data)
    return b"".join(parts)


def read_message(fd: int, deadline: float) -> Any:
    """The next message from the non-blocking pipe `fd`: TimeoutError at `deadline`, EOFError once it is closed."""
    (length,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size, deadline))
    return pickle.loads(_read_exactly(fd, length, deadline))  # our own child's answer


def read_request(fd: int) -> Any:
    """The next message from the blocking pipe `fd` (a worker's stdin); EOFError once it is closed."""
    (length,) = _HEADER.unpack(_blocking_read(fd, _HEADER.size))
    return pickle.loads(_blocking_read(fd, length))  # our own parent's request


def _blocking_read(fd: int, count: int) -> bytes:
    parts: list[bytes] = []
    while count:
        data = os.read(fd, min(count, CHUNK))
        if not data:
            raise EOFError
        parts.append(data)
        count -= len(data)
    return b"".join(parts)
