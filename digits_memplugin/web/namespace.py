"""The plugin's socketio namespace. Features add their events (devices, jobs) here."""

from __future__ import annotations

from flask_socketio import Namespace, emit

from .. import __version__


class MemPluginNamespace(Namespace):  # type: ignore[misc]
    """Live events of the plugin, under the namespace set by MEMPLUGIN_SOCKETIO_NAMESPACE."""

    def on_connect(self) -> None:
        emit("hello", {"version": __version__})
