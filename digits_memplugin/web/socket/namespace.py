"""The plugin's socketio namespace. Features add their events (devices, jobs) here.

Devices: a client emits ``subscribe_devices`` and gets a ``devices`` event at once, then one every
MEMPLUGIN_DEVICES_POLL_SECONDS while it stays subscribed; ``unsubscribe_devices`` or a disconnect ends that. The
payload is the document ``GET <prefix>/api/devices`` returns. NVML is read once per tick for all subscribers, and
not at all while nobody is subscribed.

Jobs: ``subscribe_jobs`` joins the room ``jobs`` (every job's ``job`` and ``job_deleted`` events, and the
``job_attempt`` events) and answers with a ``jobs`` event, the document GET <prefix>/api/jobs returns;
``subscribe_job`` with ``{"id": ...}`` joins ``job:<id>`` (that job's events, ``job_progress`` and ``job_log``
included) and answers with a ``job`` event, the document GET <prefix>/api/jobs/<id> returns. The job manager's
events reach the rooms through `job_event_emitter`, after the throttle (web/socket/throttle.py).

Limits: each client may send MEMPLUGIN_CLIENT_EVENT_BURST events at once, then MEMPLUGIN_CLIENT_EVENTS_PER_SECOND on
average (a token bucket per connection, web/socket/throttle.py's ClientRateLimiter), and all clients together
MEMPLUGIN_SOCKET_EVENTS_PER_SECOND (a burst of twice as many: one more bucket, shared), so that no number of clients
each within its own rate can stall the server. An event over either rate is not handled; the first one of a run of
refused events is answered with a ``rate_limited`` event saying when to try again. At most
MEMPLUGIN_MAX_SOCKET_CONNECTIONS clients are connected to the namespace at once; one more is refused.

The buckets count what an event costs the server, not only that it came (`event_cost`): every event is one, and
a ``subscribe_jobs`` page 3 (its queries) and one more per `ROWS_PER_EVENT` (5) jobs it may list, taken before it
is handled (an event is handled while its client has a token, and may leave a debt) and given back for the rows it
did not list. A page of 500 jobs (a 350 KB answer, 22 to 26 ms of the server's one thread, a hundred times a
`subscribe_job`) costs 103, more than a client's burst of 40: ten clients each sending 40 of them get four pages
between them at once, then about two a second, each client at most one every 5 s, and are told ``rate_limited``
for the rest (they used to get 400 pages, 10 s of a server that answered nothing else; issue 23, item 3).

The `jobs` room also gets ``job_iteration`` ``{"id", "iteration", "iterations_per_second", "seconds_left"}`` for
each (throttled) iteration record, so the list's iteration, speed and time left follow training without the whole
record (the `job` event comes only at changes of state and at
snapshots).

``subscribe_jobs`` takes ``{"limit": N, "before": id}`` as GET <prefix>/api/jobs does (newest first, pages of 50 by
default), and answers with that page.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

from flask import request
from flask_socketio import Namespace, SocketIO, emit, join_room, leave_room
from socketio.exceptions import ConnectionRefusedError as SocketRefused

from ... import __version__
from ...core.errors import MemPluginError
from ...core.fields import is_whole
from ...core.inputs import shown
from ...jobs.events.reporter import PACE_FIELDS
from ...jobs.manager import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE
from ..access import socket_allowed, socket_host_allowed
from ..plugin_state import current_plugin
from .throttle import ClientRateLimiter

DEVICES_EVENT = "devices"
DEVICES_ROOM = "devices"
JOBS_ROOM = "jobs"
# Which rooms each job manager event goes to: the list's room, and the job's own room.
JOB_EVENT_ROOMS = {
    "job": (True, True),
    "job_deleted": (True, True),
    "job_attempt": (True, True),
    "job_progress": (False, True),
    "job_log": (False, True),
}


JOB_ITERATION_EVENT = "job_iteration"
"""To the list's room: a job's latest iteration, from its progress records (which go to the job's own room only)."""


def job_room(job_id: str) -> str:
    return f"job:{job_id}"


def job_event_emitter(socketio: SocketIO, namespace: str) -> Callable[[str, dict[str, Any]], None]:
    """The job manager's `on_event`, turned into socketio emits to the `jobs` room and the job's own room."""

    def emit_job_event(name: str, payload: dict[str, Any]) -> None:
        to_list, to_job = JOB_EVENT_ROOMS.get(name, (False, True))
        job_id = str(payload.get("job_id") or payload.get("id") or "")
        rooms = ([JOBS_ROOM] if to_list else []) + ([job_room(job_id)] if to_job and job_id else [])
        if rooms:
            socketio.emit(name, payload, to=rooms, namespace=namespace)
        iteration = payload.get("iteration")
        if name == "job_progress" and payload.get("event") == "iteration" and isinstance(iteration, int) and job_id:
            pace = {key: payload.get(key) for key in PACE_FIELDS}
            socketio.emit(JOB_ITERATION_EVENT, {"id": job_id, "iteration": iteration, **pace}, to=JOBS_ROOM,
                          namespace=namespace)

    return emit_job_event


class DevicePusher:
    """One background task per app that emits `devices` to the subscribers' room, running only while it has any.

    Subscribers are counted here rather than asked of the socketio server, so that the task's decision to stop and
    a new subscription cannot cross: both happen under one lock, and a subscription after the stop starts a new task.
    """

    def __init__(
        self, socketio: SocketIO, namespace: str, interval: float, read: Callable[[], dict[str, Any]]
    ) -> None:
        self._socketio = socketio
        self._namespace = namespace
        self._interval = interval
        self.read = read
        self._lock = threading.Lock()
        self._subscribers: set[str] = set()
        self._task: Any = None

    @property
    def interval(self) -> float:
        return self._interval

    @property
    def running(self) -> bool:
        return self._task is not None

    @property
    def subscribers(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._subscribers)

    def add(self, sid: str) -> None:
        with self._lock:
            self._subscribers.add(sid)
            if self._task is None:
                self._task = self._socketio.start_background_task(self._run)

    def discard(self, sid: str) -> None:
        with self._lock:
            self._subscribers.discard(sid)

    def wait_stopped(self, timeout: float) -> bool:
        """Wait for the task to end (it ends within one interval of the last subscriber leaving); True if it has."""
        task = self._task
        if task is not None:
            task.join(timeout)
        return self._task is None

    def _run(self) -> None:
        while True:
            self._socketio.sleep(self._interval)
            with self._lock:
                if not self._subscribers:
                    self._task = None
                    return
            self._socketio.emit(DEVICES_EVENT, self.read(), to=DEVICES_ROOM, namespace=self._namespace)


RATE_LIMITED_EVENT = "rate_limited"
ALL_CLIENTS = ""
"""The key of the bucket every client's events share."""
UNLIMITED_EVENTS = frozenset({"connect", "disconnect"})
"""Events the server raises itself, not a client's messages: never counted against a client."""
ROWS_PER_EVENT = 5
"""Jobs listed that cost the server about what one cheap event does. Server CPU per event, 1000 jobs stored, this
2-core machine: `subscribe_job` 0.18 to 0.3 ms; `subscribe_jobs` listing no job 0.55 ms, 1 job 1.2 ms, 10 jobs
1.8 ms, 50 4.4 ms, 500 22 to 26 ms (reading the rows, the documents, encoding and sending them): 0.05 ms a job."""
PAGE_COST = 3
"""What a page costs besides its jobs (its queries: the jobs counted, `before` looked up), in cheap events."""


def event_cost(event: str, data: Any) -> int:
    """What a client's event costs, in cheap events: 1, and for `subscribe_jobs` PAGE_COST and one more per
    ROWS_PER_EVENT jobs its page may list (its `limit`; a limit the manager will refuse reads nothing: 1)."""
    if event != "subscribe_jobs":
        return 1
    limit = _page_of(data)[0]
    if not is_whole(limit) or not 1 <= limit <= MAX_PAGE_SIZE:
        return 1
    return listing_cost(limit)


def listing_cost(rows: int) -> int:
    """The cost of an answer that lists `rows` jobs: PAGE_COST, and one more per ROWS_PER_EVENT jobs."""
    return PAGE_COST + math.ceil(rows / ROWS_PER_EVENT)


class MemPluginNamespace(Namespace):  # type: ignore[misc]
    """Live events of the plugin, under the namespace set by MEMPLUGIN_SOCKETIO_NAMESPACE."""

    def __init__(
        self,
        namespace: str,
        limiter: ClientRateLimiter,
        *,
        all_clients: ClientRateLimiter | None = None,
        max_connections: int | None = None,
    ) -> None:
        super().__init__(namespace)
        self.limiter = limiter
        self.all_clients = all_clients
        """One bucket for every client's events together (None: no such limit)."""
        self.max_connections = max_connections
        self._told: set[str] = set()
        """Clients already sent `rate_limited` for their current run of refused events."""
        self._connected: set[str] = set()
        self._connections_lock = threading.Lock()

    @property
    def connections(self) -> int:
        with self._connections_lock:
            return len(self._connected)

    def trigger_event(self, event: str, *args: Any) -> Any:
        """Every client event passes the client's rate limit first, charged its cost (the bucket is checked before
        any handler runs, so a flood costs a dictionary lookup per event, not a job list)."""
        sid = str(args[0]) if args else ""
        if event not in UNLIMITED_EVENTS:
            refusal = self._refusal(sid, event_cost(event, args[1] if len(args) > 1 else None))
            if refusal is not None:
                if sid not in self._told:
                    self._told.add(sid)
                    self.socketio.emit(RATE_LIMITED_EVENT, {"event": event, **refusal}, to=sid, namespace=self.namespace)
                return None
            self._told.discard(sid)
        return super().trigger_event(event, *args)

    def _refusal(self, sid: str, cost: int) -> dict[str, Any] | None:
        """Why the client's event, costing `cost`, is not handled now (its own rate first, then everyone's), or
        None; a refused event takes nothing from either bucket."""
        costs = f"; a page of jobs counts {PAGE_COST}, and one more per {ROWS_PER_EVENT} jobs it may list" if cost > 1 else ""
        if not self.limiter.allow(sid, cost):
            return {
                "error": f"more than {self.limiter.burst} events at once or {self.limiter.per_second:g} a second"
                f"{costs}; this one was not handled",
                "retry_after": round(self.limiter.retry_after(sid), 3),
            }
        if self.all_clients is not None and not self.all_clients.allow(ALL_CLIENTS, cost):
            self.limiter.refund(sid, cost)
            return {
                "error": f"the server takes at most {self.all_clients.per_second:g} events a second from all its "
                f"clients together (MEMPLUGIN_SOCKET_EVENTS_PER_SECOND){costs}; this one was not handled",
                "retry_after": round(self.all_clients.retry_after(ALL_CLIENTS), 3),
            }
        return None

    def _refund(self, sid: str, charged: int, used: int) -> None:
        """Give back to both buckets what an event was charged beyond what it turned out to cost."""
        self.limiter.refund(sid, charged - used)
        if self.all_clients is not None:
            self.all_clients.refund(ALL_CLIENTS, charged - used)

    def on_connect(self, auth: Any = None) -> None:
        """Refuse a connection naming a host this server does not answer to (DNS rebinding), then one the access
        rules do not allow to read (a token in `auth` counts as the bearer)."""
        host_ok, why = socket_host_allowed()
        if not host_ok:
            raise ConnectionRefusedError(why)
        if not socket_allowed(auth):
            raise ConnectionRefusedError("unauthorized: this server needs its API token")
        with self._connections_lock:
            if self.max_connections is not None and len(self._connected) >= self.max_connections:
                raise SocketRefused(  # socketio's own refusal: the client is told why
                    f"the server has {len(self._connected)} live connections, the most it takes "
                    "(MEMPLUGIN_MAX_SOCKET_CONNECTIONS); try again later"
                )
            self._connected.add(request.sid)  # type: ignore[attr-defined]
        emit("hello", {"version": __version__})

    def on_disconnect(self, reason: Any = None) -> None:
        sid = request.sid  # type: ignore[attr-defined]
        _pusher().discard(sid)
        self.limiter.forget(sid)
        self._told.discard(sid)
        with self._connections_lock:
            self._connected.discard(sid)

    def on_subscribe_devices(self, data: Any = None) -> None:
        """Join the `devices` room; the first reading goes to this client at once, not after a poll interval."""
        pusher = _pusher()
        join_room(DEVICES_ROOM)
        pusher.add(request.sid)  # type: ignore[attr-defined]
        emit(DEVICES_EVENT, pusher.read())

    def on_unsubscribe_devices(self, data: Any = None) -> None:
        leave_room(DEVICES_ROOM)
        _pusher().discard(request.sid)  # type: ignore[attr-defined]

    def on_subscribe_jobs(self, data: Any = None) -> None:
        """Join the `jobs` room; the page of the list asked for ({"limit", "before"}) comes at once as a `jobs`
        event (a `job_error` event when it cannot be given: a bad page, a damaged or locked database, another server
        on the data folder)."""
        sid = request.sid  # type: ignore[attr-defined]
        charged = event_cost("subscribe_jobs", data)
        try:
            page = current_plugin().started_jobs().page(*_page_of(data))
        except MemPluginError as error:
            self._refund(sid, charged, 1)
            emit("job_error", {"id": None, "error": str(error)})
            return
        self._refund(sid, charged, listing_cost(len(page.jobs)))
        join_room(JOBS_ROOM)
        emit("jobs", page.to_json())

    def on_unsubscribe_jobs(self, data: Any = None) -> None:
        leave_room(JOBS_ROOM)

    def on_subscribe_job(self, data: Any = None) -> None:
        """Join the room of one job ({"id": ...}); its document comes at once as a `job` event, or a `job_error`
        event saying why not (no such job, whatever the id holds; the jobs cannot be read)."""
        job_id = data.get("id") if isinstance(data, dict) else None
        try:
            document = current_plugin().started_jobs().document(str(job_id))
        except MemPluginError as error:
            emit("job_error", {"id": None if job_id is None else shown(job_id), "error": str(error)})
            return
        join_room(job_room(str(job_id)))
        emit("job", document)

    def on_unsubscribe_job(self, data: Any = None) -> None:
        job_id = data.get("id") if isinstance(data, dict) else None
        if job_id is not None:
            leave_room(job_room(str(job_id)))


def _page_of(data: Any) -> tuple[Any, Any]:
    """subscribe_jobs' {"limit": N, "before": id}, either left out (the newest jobs, the default page size);
    the manager checks them."""
    if not isinstance(data, dict):
        return DEFAULT_PAGE_SIZE, None
    return data.get("limit", DEFAULT_PAGE_SIZE), data.get("before")


def _pusher() -> DevicePusher:
    return current_plugin().device_pusher
