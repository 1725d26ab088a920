"""Socket.IO packets whose JSON holds an integer Python will not convert (more than 4300 digits), and events whose
data holds a number that is not finite.

python-socketio decodes a packet's JSON before any handler runs; `json.loads` raises ValueError on such a number,
so the packet was dropped with a traceback in the log and no answer. The server's packet class is replaced, for
this server only, by one that reads such numbers as `inputs.LongNumber` (what the REST API does), so the event
reaches its handler and is refused there like any other wrong value. JSON that is malformed still fails as before.

The same class writes the events: a NaN or an infinity (a diverged loss) goes out as core.nonfinite's strings,
"NaN", "Infinity", "-Infinity", as the REST API writes it, instead of the bare tokens Python's json writes and the
browser's JSON.parse refuses (the whole event would be lost).
"""

from __future__ import annotations

import json
from typing import Any

from ...core import inputs, nonfinite


class _TolerantJSON:
    """The packet class's JSON module, reading a too-long integer instead of failing the packet."""

    def __init__(self, base: Any) -> None:
        self._base = base

    def dumps(self, data: Any, *args: Any, **kwargs: Any) -> Any:
        return self._base.dumps(nonfinite.encode(data), *args, **kwargs)

    def loads(self, text: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._base.loads(text, *args, **kwargs)
        except json.JSONDecodeError:
            raise
        except ValueError:  # "Exceeds the limit (4300 digits) for integer string conversion"
            return inputs.loads(text)


def tolerate_long_numbers(server: Any) -> None:
    """Give `server` (a python-socketio Server) a packet class that reads integers of any length and writes
    non-finite numbers as strings; idempotent.
    The class attribute python-socketio sets for `json=` is shared by every server, so a subclass is set on this
    server instance instead."""
    base = server.packet_class
    if getattr(base, "memplugin_tolerant", False):
        return
    server.packet_class = type(
        f"Tolerant{base.__name__}", (base,), {"json": _TolerantJSON(base.json), "memplugin_tolerant": True}
    )
