"""`init_app`: mounts the plugin on a host Flask app the way DIGITS loads an extension.

State lives in ``app.extensions["memplugin"]`` (never in module globals), so several apps can carry the plugin in
one process, each with its own settings.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from flask import Flask
from flask_socketio import SocketIO

from ..devices.reader import DeviceReader, gevent_threadpool_runner, run_inline, simulate_gpus
from ..estimate.pool import EstimatePool, default_workers
from ..jobs.backends.local import LOCAL, Backend, LocalBackend
from ..jobs.child.caffe_build import BINARY, CaffeBuild, CaffeBuildError, devices_document, find_caffe
from ..jobs.child.preload import PreloadError, ensure_library
from ..jobs.manager import JobManager, ManagerConfig
from ..web.access import SESSION_SAMESITE, Authorizer, protect_session_cookie
from ..web.blueprint import create_blueprint
from ..web.socket.namespace import DevicePusher, MemPluginNamespace, job_event_emitter
from ..web.socket.socket_json import tolerate_long_numbers
from ..web.socket.throttle import ClientRateLimiter, EventThrottle
from .settings import ConfigError, Settings

log = logging.getLogger(__name__)

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
    caffe: CaffeBuild
    """The Caffe that trains (caffe_build.py), read at start-up."""
    jobs: JobManager
    """Training jobs of this app. Started at its first use (`started_jobs`), so an app that never trains runs
    nothing in the background; `close` stops it and the training children with it."""
    estimates: EstimatePool
    """Runs estimates of large texts in worker processes, off the server's thread (estimate_pool.py)."""
    authorize: Authorizer | None = None
    """The host's own access decision (see web/access.py); None: the API token, if one is set, decides."""

    def started_jobs(self) -> JobManager:
        """The job manager, started if it was not yet (which marks jobs a killed server left as interrupted)."""
        if not self.jobs.started:
            self.jobs.start()
        return self.jobs

    def close(self) -> None:
        """Stop the background work of the plugin: running training attempts end as interrupted (resumable)."""
        self.jobs.stop()
        self.estimates.close()


def init_app(
    app: Flask, socketio: SocketIO | None = None, *, authorize: Authorizer | None = None, **options: Any
) -> MemPlugin:
    """Mount the blueprint under ``url_prefix`` (default ``/memplugin``) and the socketio namespace.

    `options` override the app's ``MEMPLUGIN_*`` config keys (``url_prefix="/gpu"`` sets ``MEMPLUGIN_URL_PREFIX``).
    When the host has no SocketIO object, one is created on the app. `authorize`, when given, is the host's own
    login: called in each request's context with "read" or "write", it decides instead of MEMPLUGIN_API_TOKEN.
    The app's session cookie gets SameSite=Lax unless the host set SESSION_COOKIE_SAMESITE itself (a signed-in
    session lives in it); the plugin's responses carry frame-ancestors 'self' (web/frame_guard.py).
    """
    if EXTENSION_KEY in app.extensions:
        raise RuntimeError("digits_memplugin.init_app was already called for this app")
    if authorize is not None and not callable(authorize):
        raise TypeError("authorize must be a callable taking 'read' or 'write' and returning a bool")
    settings = Settings.from_config(app.config, options)
    app.config.update(settings.config_items())
    if protect_session_cookie(app.config):
        log.info("the session cookie is sent with SameSite=%s (SESSION_COOKIE_SAMESITE was not set)", SESSION_SAMESITE)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if settings.dataset_roots is None:
        # The default dataset folder, made at start so that the page can tell a new user where to put data (the
        # page names it, and `digits-memplugin sample-dataset` writes into it); configured roots are left as given.
        (settings.data_dir / "datasets").mkdir(exist_ok=True)

    if socketio is None:
        socketio = SocketIO(app, async_mode=settings.async_mode, message_queue=settings.message_queue)
    if socketio.server is not None:  # a host's SocketIO not bound to an app yet has no server to adjust
        tolerate_long_numbers(socketio.server)
    socketio.on_namespace(
        MemPluginNamespace(
            settings.socketio_namespace,
            ClientRateLimiter(settings.client_events_per_second, settings.client_event_burst),
            all_clients=ClientRateLimiter(settings.socket_events_per_second, int(2 * settings.socket_events_per_second)),
            max_connections=settings.max_socket_connections,
        )
    )

    caffe, preload = _caffe(settings)
    if settings.simulate_gpus is not None:
        simulate_gpus(settings.simulate_gpus)
    reader = DeviceReader(gevent_threadpool_runner() if socketio.async_mode == "gevent" else run_inline)
    pusher = DevicePusher(
        socketio, settings.socketio_namespace, settings.devices_poll_seconds,
        lambda: devices_document(plugin.devices.read(), caffe),
    )

    throttle = EventThrottle(
        job_event_emitter(socketio, settings.socketio_namespace),
        settings.job_events_per_second,
        spawn=socketio.start_background_task,
        sleep=socketio.sleep,
    )
    backend = _backend(settings)
    estimates = EstimatePool(
        settings.estimate_workers or default_workers(), settings.estimate_queue,
        inline_bytes=settings.estimate_inline_bytes, fallback=settings.pycaffe_fallback,
    )
    jobs = JobManager(
        ManagerConfig.from_settings(settings, caffe, preload), reader, on_event=throttle,
        spawn=socketio.start_background_task,
        oracle=_pycaffe_oracle() if settings.pycaffe_fallback else None, backend=backend,
        offload=estimates,  # a job's costly build or plan (a recurrent net) runs in its workers too
    )
    reader = jobs.devices  # the panel, the form and the planner see what jobs may be placed on (every host's)

    app.register_blueprint(create_blueprint(), url_prefix=settings.url_prefix)
    plugin = MemPlugin(
        settings=settings, socketio=socketio, devices=reader, device_pusher=pusher, caffe=caffe, jobs=jobs,
        authorize=authorize, estimates=estimates,
    )
    app.extensions[EXTENSION_KEY] = plugin
    return plugin


def _caffe(settings: Settings) -> tuple[CaffeBuild, str | None]:
    """The Caffe that trains, read now: one that cannot train stops the start with the reason. A Caffe trained
    through its binary needs the capped-start library (jobs/child/preload.py): built now too, not at the first job."""
    try:
        caffe = find_caffe(settings.caffe_root)
    except CaffeBuildError as error:
        raise ConfigError(f"the Caffe that would train cannot be used: {error}") from None
    preload = None
    if caffe.runner == BINARY:
        try:
            preload = str(ensure_library())
        except PreloadError as error:
            raise ConfigError(f"{caffe.label} trains through its binary, but {error}") from None
    log.info("training with %s: %s, %s runner", caffe.label, caffe.abilities, caffe.runner)
    return caffe, preload


def _backend(settings: Settings) -> Backend:
    """The job backend the settings name. The Ray backend checks first that every node sees the shared folder
    (a probe file read by a Ray job on each host): a server whose jobs would fail on some node does not start."""
    if settings.job_backend == LOCAL:
        return LocalBackend()
    from ..jobs.backends.ray import RayBackend, RayError

    if settings.ray_address is None:
        raise ConfigError("MEMPLUGIN_JOB_BACKEND 'ray' needs MEMPLUGIN_RAY_ADDRESS (http://head:8265)")
    shared = settings.shared_dir or settings.data_dir.absolute()
    shared.mkdir(parents=True, exist_ok=True)
    backend = RayBackend(settings.ray_address, shared, token=settings.ray_token, python=settings.ray_python)
    try:
        hosts = backend.check()
    except RayError as error:
        raise ConfigError(f"the Ray backend cannot start: {error}") from None
    log.info("Ray backend at %s: hosts %s see %s", settings.ray_address, ", ".join(hosts), shared)
    return backend


def _pycaffe_oracle() -> Any:
    """pycaffe's shapes for layer types the estimator has no rule for (optional module)."""
    try:
        from ..estimate.pycaffe_shapes import pycaffe_oracle
    except ImportError:  # pragma: no cover - the fallback module is optional
        return None
    return pycaffe_oracle


def get_plugin(app: Flask) -> MemPlugin:
    """The plugin state of `app`; a clear error when `init_app` was not called."""
    try:
        return app.extensions[EXTENSION_KEY]  # type: ignore[no-any-return]
    except KeyError:
        raise RuntimeError("digits_memplugin.init_app(app) has not been called for this app") from None
