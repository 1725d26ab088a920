"""The plugin's configuration: `MEMPLUGIN_*` keys of the host app's config, read once into a frozen object.

Reading the keys once (in `init_app`) means a typo'd or ill-typed value fails at start-up with its key named,
not later inside a request.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..core import fields
from ..core.errors import FieldErrors
from ..core.sizes import parse_gpu_spec, parse_size
from ..jobs.backends import JOB_BACKENDS

CONFIG_PREFIX = "MEMPLUGIN_"
MIN_TOKEN_LENGTH = 16
ASYNC_MODES = (None, "threading", "gevent", "eventlet", "gevent_uwsgi")


class ConfigError(ValueError):
    """A `MEMPLUGIN_*` setting has a value the plugin cannot use."""


@dataclasses.dataclass(frozen=True)
class Settings:
    """Plugin settings; each field is read from the config key `MEMPLUGIN_<FIELD NAME IN CAPITALS>`."""

    url_prefix: str = "/memplugin"
    """Where the blueprint is mounted in the host app."""
    socketio_namespace: str = "/memplugin"
    """The socketio namespace for live events."""
    data_dir: Path = Path("var")
    """SQLite store and job folders. Relative paths are taken from the current directory at start-up."""
    async_mode: str | None = None
    """flask-socketio async mode when the plugin creates the SocketIO object (None: let it choose)."""
    devices_poll_seconds: float = 2.0
    """How often the `devices` event is pushed to the socketio clients that subscribed to it."""
    simulate_gpus: str | None = None
    """Demo mode: run against fake GPUs of these sizes ("2x24GiB", "24GiB,16GiB") instead of the driver's.
    It replaces NVML for the whole process, and every page says the GPUs are simulated. Never on by default."""
    max_request_bytes: int = 4 * 1024 * 1024
    """Largest request body the JSON API reads (prototxt texts included); bigger ones get 413."""
    api_token: str | None = None
    """When set, writing requests need it (``Authorization: Bearer``, or a page session signed in with it)."""
    auth_reads: bool = False
    """With api_token set, reading requests (pages, GET endpoints, socketio) need it too."""
    allowed_hosts: tuple[str, ...] = ()
    """Host names requests may name in their Host header, besides localhost, an IP address and the machine's own
    name (`hostname`): the names a server bound to 0.0.0.0 is reached by. ".example.org" allows its subdomains
    too; "*" allows any name (no protection against DNS rebinding: only behind a proxy that checks Host itself).
    A list, or one string of names separated by commas or spaces."""
    read_timeout_seconds: float = 30.0
    """The standalone server (`serve`): how long a request's line and headers may take to arrive, and how long its
    body may pause between two reads, before the connection is closed (a connection idle between two requests is
    closed after it too). Websockets, once open, are not timed."""
    pycaffe_fallback: bool = True
    """Ask pycaffe (in a child process) for the shapes of layer types the estimator has no rule for."""
    dataset_roots: tuple[Path, ...] | None = None
    """Folders training jobs may read data from (LMDB, HDF5 and list files, mean files); None: <data_dir>/datasets.
    A net naming a path outside them is refused before anything runs."""
    jobs_per_gpu: int = 1
    """Training jobs run at once on one GPU."""
    jobs_per_cpu: int = 1
    """Training jobs run at once on the CPU (when jobs train without a GPU)."""
    cpu_memory_cap: int | None = None
    """Bytes a CPU training attempt may allocate (enforced on the child with RLIMIT_DATA); None: the memory
    available (MemAvailable, or the cgroup's limit). Accepts sizes such as "8GiB"."""
    job_safety_margin: float | None = None
    """Fraction of a device's free memory training jobs keep back (the fallback recovers from what it misses);
    None: 3% on the CPU, where the estimate is held to what Caffe allocates, 5% on GPUs."""
    job_max_attempts: int = 5
    """Attempts a training job gets before out-of-memory failures end it."""
    caffe_root: Path | None = None
    """The Caffe build that trains (its build/tools/caffe and, where it has one, its python/), as DIGITS' CAFFE_ROOT;
    None: CAFFE_ROOT, else CAFFE_HOME from the environment, else the bundled pycaffe (caffe_build.py). Read at
    start-up: one that cannot run stops the server with the reason."""
    gpu_engine: str | None = None
    """How GPU jobs are estimated: "gpu-cudnn" (Caffe built with cuDNN) or "gpu"; None: what the Caffe that trains
    has (cuDNN, or CUDA without it; a Caffe without CUDA trains no GPU job, and its GPU estimates are those of a
    CUDA + cuDNN build)."""
    job_events_per_second: float = 4.0
    """At most this many `job_progress` and `job_log` events per second per job reach socketio clients."""
    max_queued_jobs: int = 100
    """Training jobs that may wait in the queue at once; a submission (or a resume) beyond it is refused with a
    message that says so, before anything is written."""
    store_busy_seconds: float = 10.0
    """How long a write to the jobs database waits while another process holds its lock (a backup, a sqlite3
    session) before the request gets an error that says so; a job's end is retried until it is stored."""
    client_events_per_second: float = 20.0
    """Events one socketio client may send per second, on average (subscriptions and the like)."""
    client_event_burst: int = 40
    """Events one socketio client may send at once before `client_events_per_second` applies."""
    job_nice: int = 10
    """The nice value training children run at (0-19): where training takes every core, the server's pages, API
    and events keep the CPU first (bench/load.py measures the difference)."""
    job_stall_seconds: float = 600.0
    """A training attempt that sends no record and writes no log line for this long is ended by the watchdog and
    classified (an allocation retried for ever is out of memory, and the fallback goes on; anything else fails).
    Records come every iteration and every 10 s of a test pass, so only a stuck child stays silent this long."""
    job_cancel_seconds: float = 60.0
    """How long a cancelled training attempt has to finish its step, write its snapshot and stop (it is asked
    with SIGINT, as `caffe train` understands it) before it is stopped with SIGTERM, then SIGKILL, without one."""
    estimate_inline_bytes: int = 16 * 1024
    """Estimates whose prototxt texts hold more characters than this run in a worker process (estimate_pool.py),
    not in the server's one thread; smaller ones stay in the server, where repeated estimates of a net are cached.
    0 sends every estimate to a worker."""
    estimate_workers: int | None = None
    """Worker processes for large estimates; None: half the cores, 1 to 4."""
    estimate_queue: int = 8
    """Large estimates that may wait for a worker; one more is a 503 with Retry-After."""
    max_socket_connections: int = 500
    """Socket.IO connections to the plugin's namespace at once, all clients together; more are refused."""
    socket_events_per_second: float = 200.0
    """Events the server handles from all socketio clients together, per second on average (a burst of twice as
    many); the rest are refused as a client over its own rate is, so that many clients each within their own
    rate cannot stall the server."""
    max_stored_jobs: int = 1000
    """Jobs kept in the data folder, whatever their state; a submission beyond it is a 400 saying to delete some."""
    max_stored_bytes: int = 20 * 1024**3
    """Bytes the jobs' folders may hold (as du counts them); a submission while they hold more is a 507 saying to
    delete some. Accepts sizes such as "50GiB"."""

    job_backend: str = "local"
    """Where training attempts run: "local" (children of this server, on this host's devices) or "ray" (Ray jobs
    on a cluster's hosts, jobs.backends.ray; docs/scale-out.md)."""
    ray_address: str | None = None
    """The Ray dashboard's address, "http://head:8265" (the Jobs REST API; never exposed beyond the cluster)."""
    ray_token: str | None = None
    """The cluster's token when Ray runs with RAY_AUTH_MODE=token (sent as ``Authorization: Bearer``)."""
    shared_dir: Path | None = None
    """The folder every host sees (NFS or the like) that holds the job folders and the nodes' device reports;
    None: the data folder. With the Ray backend the server refuses to start while a node cannot see it."""
    ray_python: str | None = None
    """The Python on the nodes that runs the node wrapper (the same path on every host); None: this server's."""
    message_queue: str | None = None
    """Flask-SocketIO's message queue ("redis://host:6379/0"), so that events reach browsers from any of several
    web workers, which then share the data folder: the first to start its job manager leads (runs the jobs), the
    others follow (jobs.manager); None: one worker, and a second one on the folder is refused."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> Settings:
        """Build settings from a Flask config, with `overrides` (init_app keyword arguments) taking precedence."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        overrides = dict(overrides or {})
        unknown = sorted(set(overrides) - set(known))
        if unknown:
            raise ConfigError(f"unknown memplugin option(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        values: dict[str, Any] = {}
        for name, field in known.items():
            key = CONFIG_PREFIX + name.upper()
            values[name] = COERCE[name](key, overrides.get(name, config.get(key, field.default)))
        return cls(**values)

    def config_items(self) -> dict[str, Any]:
        """The settings as `MEMPLUGIN_*` config keys (what `init_app` writes back into the app config)."""
        return {CONFIG_PREFIX + f.name.upper(): getattr(self, f.name) for f in dataclasses.fields(self)}



Coerce = Callable[[str, Any], Any]
"""A setting's check: (its config key, the value given) -> the value it keeps; ConfigError saying what is wrong."""


def _rule(check: Callable[..., Any], must: str, *, optional: bool = False, **bounds: Any) -> Coerce:
    """A setting checked by a core.fields check, refused as `<KEY> must be <must>, got <value>` (None kept as None
    when `optional`)."""

    def coerce(key: str, value: Any) -> Any:
        if optional and value is None:
            return None
        try:
            return check(key, value, **bounds)
        except FieldErrors:
            raise ConfigError(f"{key} must be {must}, got {value!r}") from None

    return coerce


def _at_least(low: int) -> Coerce:
    return _rule(fields.integer, f"a whole number of at least {low}", low=low)


def _mount_path(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.startswith("/") or (value.endswith("/") and value != "/"):
        raise ConfigError(f"{key} must be a path starting with '/' and not ending with '/', got {value!r}")
    return value


def _path(must: str, *, optional: bool = False) -> Coerce:
    """A folder's path, made absolute (from the current directory at start-up)."""

    def coerce(key: str, value: Any) -> Path | None:
        if optional and value is None:
            return None
        if not isinstance(value, (str, os.PathLike)) or not str(value):
            raise ConfigError(f"{key} must be {must}, got {value!r}")
        return Path(value).absolute()

    return coerce


def _dataset_roots(key: str, value: Any) -> tuple[Path, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(item, (str, os.PathLike)) and str(item) for item in value):
        raise ConfigError(f"{key} must be a path or a list of paths, got {value!r}")
    return tuple(Path(item).absolute() for item in value)


def _caffe_root(key: str, value: Any) -> Path | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{key} must be the path of a Caffe build's root folder, got {value!r}")
    return Path(value).expanduser().absolute()


def _simulate_gpus(key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{key} must be a GPU spec such as '2x24GiB' or '24GiB,16GiB', got {value!r}")
    try:
        parse_gpu_spec(value)
    except ValueError as error:
        raise ConfigError(f"{key}: {error}") from None
    return value.strip()


def _api_token(key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value.strip()) < MIN_TOKEN_LENGTH or value != value.strip():
        raise ConfigError(f"{key} must be a string of at least {MIN_TOKEN_LENGTH} characters without surrounding "
                          "spaces (a guessable token is no protection)")
    return value


def _size(example: str, *, optional: bool = False) -> Coerce:
    """A number of bytes of at least 1 MiB, or a size with its unit (`example`)."""
    whole = _rule(fields.integer, f"a number of bytes of at least 1 MiB (or a size like '{example}')",
                  optional=optional, low=1024 * 1024)

    def coerce(key: str, value: Any) -> int | None:
        if isinstance(value, str):
            try:
                value = parse_size(value)
            except ValueError as error:
                raise ConfigError(f"{key}: {error}") from None
        return whole(key, value)  # type: ignore[no-any-return]

    return coerce


def _url(*schemes: str) -> Coerce:
    def coerce(key: str, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value.startswith(schemes):
            raise ConfigError(f"{key} must be a URL starting with {' or '.join(schemes)}, got {value!r}")
        return value.rstrip("/")

    return coerce


_HOST_NAME = re.compile(r"(\*|\.?[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*)")


def _host_names(key: str, value: Any) -> tuple[str, ...]:
    """MEMPLUGIN_ALLOWED_HOSTS: names without ports, lowercased, a final dot dropped ("gpu1.lab." is "gpu1.lab")."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = value.replace(",", " ").split()
    if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{key} must be a list of host names or one string of them, got {value!r}")
    names = []
    for item in value:
        name = item.strip().lower()
        name = name[:-1] if name.endswith(".") and name != "." else name
        if not _HOST_NAME.fullmatch(name):
            raise ConfigError(f"{key}: {item!r} is not a host name (a name such as 'gpu1.lab.example', "
                              "'.lab.example' for its subdomains too, or '*'; no port, no scheme)")
        names.append(name)
    return tuple(dict.fromkeys(names))


SECONDS_ABOVE_0 = _rule(fields.number, "a number of seconds greater than 0", above=0)
COUNT = _at_least(1)
TRUE_OR_FALSE = _rule(fields.boolean, "True or False")
COERCE: dict[str, Coerce] = {
    "url_prefix": _mount_path,
    "socketio_namespace": _mount_path,
    "data_dir": _path("a non-empty path"),
    "async_mode": _rule(fields.choice, f"one of {ASYNC_MODES}", options=ASYNC_MODES),
    "devices_poll_seconds": SECONDS_ABOVE_0,
    "simulate_gpus": _simulate_gpus,
    "max_request_bytes": _rule(fields.integer, "a number of bytes of at least 1024", low=1024),
    "api_token": _api_token,
    "auth_reads": TRUE_OR_FALSE,
    "allowed_hosts": _host_names,
    "read_timeout_seconds": _rule(fields.number, "a number of seconds from 1 to 3600", low=1, high=3600),
    "pycaffe_fallback": TRUE_OR_FALSE,
    "dataset_roots": _dataset_roots,
    "jobs_per_gpu": COUNT,
    "jobs_per_cpu": COUNT,
    "cpu_memory_cap": _size("8GiB", optional=True),
    "job_safety_margin": _rule(fields.number, "a fraction in [0, 1)", optional=True, low=0, below=1),
    "job_max_attempts": COUNT,
    "caffe_root": _caffe_root,
    "gpu_engine": _rule(fields.choice, "'gpu' or 'gpu-cudnn' (or None: the Caffe that trains decides)",
                        options=(None, "gpu", "gpu-cudnn")),
    "job_events_per_second": _rule(fields.number, "a number greater than 0", above=0),
    "max_queued_jobs": COUNT,
    "store_busy_seconds": _rule(fields.number, "a number of seconds of at least 0", low=0),
    "client_events_per_second": _rule(fields.number, "a number greater than 0", above=0),
    "client_event_burst": COUNT,
    "job_nice": _rule(fields.integer, "a whole number from 0 to 19", low=0, high=19),
    "job_stall_seconds": _rule(fields.number, "a number of seconds of at least 1", low=1),
    "job_cancel_seconds": _rule(fields.number, "a number of seconds of at least 0", low=0),
    "estimate_inline_bytes": _at_least(0),
    "estimate_workers": _rule(fields.integer, "a whole number from 1 to 64 (or None: half the cores)", optional=True,
                              low=1, high=64),
    "estimate_queue": _at_least(0),
    "max_socket_connections": COUNT,
    "socket_events_per_second": _rule(fields.number, "a number of at least 1", low=1),
    "max_stored_jobs": COUNT,
    "max_stored_bytes": _size("50GiB"),
    "job_backend": _rule(fields.choice, " or ".join(map(repr, JOB_BACKENDS)), options=JOB_BACKENDS),
    "ray_address": _url("http://", "https://"),
    "ray_token": _rule(fields.string, "a non-empty string or None", optional=True, nonblank=True),
    "shared_dir": _path("a path", optional=True),
    "ray_python": _rule(fields.string, "a non-empty string or None", optional=True, nonblank=True),
    "message_queue": _url("redis://", "rediss://", "amqp://"),
}
"""Each setting's check, by field name (tests/test_settings.py checks that every field has one)."""
