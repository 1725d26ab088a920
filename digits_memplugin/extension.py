"""`init_app`: mounts the plugin on a host Flask app the way DIGITS loads an extension.

State lives in ``app.extensions["memplugin"]`` (never in module globals), so several apps can carry the plugin in
one process, each with its own settings.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from flask import Flask
from flask_socketio import SocketIO

from .devices import DeviceReader, gevent_threadpool_runner, run_inline, simulate_gpus
from .settings import Settings
from .web.blueprint import create_blueprint
from .web.namespace import DevicePusher, MemPluginNamespace

EXTENSION_KEY = "memplugin"


@dataclasses.dataclass
class MemPlugin:
    """What the plugin keeps per host app."""

    settings: Settings
    socketio: SocketIO
    devices: DeviceReader
    """Reads the devices; under gevent through its threadpool, so NVML never blocks the hub."""
    device_pusher: DevicePusher
    """Pushes the `devices` event to the socketio clients that subscribed, while there are any."""


def init_app(app: Flask, socketio: SocketIO | None = None, **options: Any) -> MemPlugin:
    """Mount the blueprint under ``url_prefix`` (default ``/memplugin``) and the socketio namespace.

    `options` override the app's ``MEMPLUGIN_*`` config keys (``url_prefix="/gpu"`` sets ``MEMPLUGIN_URL_PREFIX``).
    When the host has no SocketIO object, one is created on the app.
    """
    if EXTENSION_KEY in app.extensions:
        raise RuntimeError("digits_memplugin.init_app was already called for this app")
    settings = Settings.from_config(app.config, options)
    app.config.update(settings.config_items())
    settings.data_dir.mkdir(parents=True, exist_ok=True)

    if socketio is None:
        socketio = SocketIO(app, async_mode=settings.async_mode)
    socketio.on_namespace(MemPluginNamespace(settings.socketio_namespace))

    if settings.simulate_gpus is not None:
        simulate_gpus(settings.simulate_gpus)
    reader = DeviceReader(gevent_threadpool_runner() if socketio.async_mode == "gevent" else run_inline)
    pusher = DevicePusher(
        socketio, settings.socketio_namespace, settings.devices_poll_seconds, lambda: reader.read().to_json()
    )

    app.register_blueprint(create_blueprint(), url_prefix=settings.url_prefix)
    plugin = MemPlugin(settings=settings, socketio=socketio, devices=reader, device_pusher=pusher)
    app.extensions[EXTENSION_KEY] = plugin
    return plugin


def get_plugin(app: Flask) -> MemPlugin:
    """The plugin state of `app`; a clear error when `init_app` was not called."""
    try:
        return app.extensions[EXTENSION_KEY]  # type: ignore[no-any-return]
    except KeyError:
        raise RuntimeError("digits_memplugin.init_app(app) has not been called for this app") from None
