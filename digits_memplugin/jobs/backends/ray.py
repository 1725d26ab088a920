"""Attempts as Ray jobs on a cluster of hosts, talked to over the Ray Jobs REST API only.

Why HTTP and never `ray.init`: the server runs under gevent, where Ray's grpc client hangs; urllib's sockets are
monkey-patched, so every call here yields to the hub, and each has a timeout. Nothing here imports Ray.

Each attempt is one Ray job, submission id `<job>-<attempt>` (Ray refuses an id used before), whose entrypoint is
the node wrapper (jobs.backends.node) on the host the scheduler chose: a GPU is pinned by the per-GPU custom resource
`memplugin_gpu:<UUID>` (each node declares one per GPU, sized jobs-per-GPU: `num_gpus` cannot choose a GPU) plus
our own CUDA_VISIBLE_DEVICES; a host's CPU by `memplugin_cpu:<host>`. The wrapper prints the attempt's records,
Caffe's log lines and its result as JSON lines; the manager follows the job's log and rebuilds the result.

While a job's log is short it is read whole at each poll (Ray reads the file then: a record arrives within a
poll). A long job prints a record per iteration, and reading its log again each second would grow without bound:
past TAIL_AFTER_CHARS it is followed through Ray's log-tail websocket instead, each new chunk once, at the cost of
Ray's tail cadence (it looks at the file every one to two seconds). Where the websocket cannot be opened, the whole
log stays the way (from where the last read ended).

A cancel is a `cancel` file in the attempt's folder, which the wrapper looks for twice a second and answers as the
local backend's cancel does (the runner snapshots and stops); Ray's stop (SIGTERM, SIGKILL 3 s later: no time for a
snapshot) follows only when the attempt has not ended within the cancel's bound, or at once while Ray still holds
the job pending (it leaves a job stopped while pending pending, and the wrapper, once it starts, sees the file and
ends at once). A kill is both at once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import shlex
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import websocket

from ...core import nonfinite
from ...core.errors import MemPluginError
from ...core.oom import OUTCOME_CANCELLED, OUTCOME_FAILED, Outcome
from ...devices.cluster import ClusterDeviceReader, cpu_host, gpu_resource, host_resource
from ...devices.reader import CPU, DeviceReader
from ..store.datafolder import kill_leftover
from ..store.records import Attempt
from .attempt_process import MAX_LINE, AttemptResult
from .local import RAY, Launch
from .node import CANCEL_FILE, TAG, result_from_json

log = logging.getLogger(__name__)

HTTP_SECONDS = 10.0
"""Each request to the Ray dashboard waits this long at most."""
POLL_SECONDS = 1.0
"""Ray itself reads a job's log once a second: polling faster finds nothing new."""
UNREACHABLE_SECONDS = 120.0
"""A cluster that answers nothing for this long ends the attempt as failed (stopped on the cluster if it can be)."""
PENDING_CANCEL_SECONDS = 10.0
"""A cancelled job still pending after this long is left to its cancel file and ended here."""
OUTCOME_SECONDS = 5.0
"""After Ray says the job ended, how long its last log lines (the result) may take to appear."""
STOP_WAIT_SECONDS = 3.0
"""Ray's SIGTERM-to-SIGKILL wait on stop: the wrapper's own grace stays under it, so that it can report."""
TAIL_AFTER_CHARS = 256 * 1024
"""A log this long is followed through Ray's tail: reading it whole at each poll would cost more than the tail's
second or two of lateness (docs/benchmarks.md, "Job backends")."""
TAIL_RETRY_SECONDS = 30.0
"""After the log-tail websocket could not be opened, the log is polled whole for this long before trying again."""
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


class RayError(MemPluginError):
    """The Ray cluster refused a request or cannot be reached; the message says which."""


class TailClosed(Exception):
    """Ray closed a job's log tail: the job has ended (or the dashboard went away)."""


class LogTail:
    """One open log-tail websocket of a Ray job: its log from the start, then each chunk as Ray reads it."""

    def __init__(self, connection: websocket.WebSocket) -> None:
        self.connection = connection

    def read(self, timeout: float) -> str | None:
        """The next chunk of the log; None when none came within `timeout`; TailClosed once Ray closed it."""
        self.connection.settimeout(max(timeout, 0.01))
        try:
            data = self.connection.recv()
        except (websocket.WebSocketTimeoutException, TimeoutError):
            return None
        except (websocket.WebSocketException, OSError) as error:
            raise TailClosed(str(error)) from None
        if not data:  # a close frame
            raise TailClosed("closed by Ray")
        return data.decode("utf-8", errors="replace") if isinstance(data, bytes) else str(data)

    def close(self) -> None:
        with contextlib.suppress(websocket.WebSocketException, OSError):
            self.connection.close(timeout=1)


class RayJobsClient:
    """The few Ray Jobs REST calls the backend makes, with a bearer token when the cluster asks for one
    (RAY_AUTH_MODE=token)."""

    def __init__(self, address: str, token: str | None = None, timeout: float = HTTP_SECONDS) -> None:
        self.address = address.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.address + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            text = error.read().decode("utf-8", errors="replace").strip().splitlines()
            raise RayError(f"Ray {method} {path}: HTTP {error.code}: {text[-1] if text else error.reason}") from None
        except (OSError, ValueError) as error:  # URLError, timeouts, refused connections, a reply not JSON
            raise RayError(f"Ray {method} {path} at {self.address}: {error}") from None

    def submit(self, submission_id: str, entrypoint: str, *, resources: Mapping[str, float],
               metadata: Mapping[str, str]) -> str:
        body = {"submission_id": submission_id, "entrypoint": entrypoint, "metadata": dict(metadata)}
        if resources:
            body["entrypoint_resources"] = dict(resources)
        return str(self._call("POST", "/api/jobs/", body)["submission_id"])

    def status(self, submission_id: str) -> dict[str, Any]:
        return dict(self._call("GET", f"/api/jobs/{submission_id}"))

    def logs(self, submission_id: str) -> str:
        return str(self._call("GET", f"/api/jobs/{submission_id}/logs").get("logs") or "")

    def tail(self, submission_id: str) -> LogTail:
        """Ray's log-tail websocket of the job (what `ray job logs --follow` reads); RayError when it cannot be
        opened. Opening, the handshake and each read are bounded by the client's timeout."""
        url = "ws" + self.address.removeprefix("http") + f"/api/jobs/{submission_id}/logs/tail"
        header = [f"Authorization: Bearer {self.token}"] if self.token else []
        try:
            return LogTail(websocket.create_connection(url, timeout=self.timeout, header=header))
        except (websocket.WebSocketException, OSError) as error:
            raise RayError(f"Ray's log tail of {submission_id} at {self.address}: {error}") from None

    def stop(self, submission_id: str) -> bool:
        return bool(self._call("POST", f"/api/jobs/{submission_id}/stop").get("stopped"))

    def nodes(self) -> list[dict[str, Any]]:
        """The cluster's nodes that are alive, with their resources (Ray's state API)."""
        reply = self._call("GET", "/api/v0/nodes?detail=1&limit=1000")
        rows = reply.get("data", {}).get("result", {}).get("result", [])
        return [row for row in rows if row.get("state") == "ALIVE"]


class RayAttempt:
    """One attempt submitted as a Ray job (jobs.backends.local.AttemptHandle)."""

    def __init__(self, client: RayJobsClient, submission_id: str, launch: Launch, *, poll_seconds: float) -> None:
        self.client = client
        self.submission_id = submission_id
        self.launch = launch
        self.poll_seconds = poll_seconds
        self.host: str | None = None
        self._lock = threading.Lock()
        self._cancel_at: float | None = None
        self._state: Any = None
        """Ray's last word on the job's status ("PENDING", "RUNNING", ...)."""
        self._offset = 0
        """Characters of the job's log already read (from the tail or from a whole read)."""
        self._partial = ""
        self._stream: LogTail | None = None
        self._stream_position = 0
        self._stream_failed_at: float | None = None
        self._result: AttemptResult | None = None
        self._tail: list[str] = []

    @property
    def handle(self) -> str:
        return f"ray:{self.submission_id}"

    @property
    def pid(self) -> int | None:
        return None  # on another host: its GPU memory comes from its own node's records

    @property
    def cancelled(self) -> bool:
        return self._cancel_at is not None

    def cancel(self) -> None:
        with self._lock:
            if self._cancel_at is not None:
                return
            self._cancel_at = time.monotonic()
        cancel_file = self.launch.folder / Path(self.launch.spec_file).parent / CANCEL_FILE
        try:  # first, and at once: a wrapper that starts after this ends as soon as it looks
            cancel_file.touch()
        except OSError as error:
            log.warning("%s: cannot write %s (%s)", self.handle, cancel_file, error)
        # Not under the caller's lock (the manager's): the request may take up to its timeout.
        threading.Thread(target=self._stop_if_overdue, daemon=True).start()

    def kill(self) -> None:
        self.cancel()
        threading.Thread(target=self._stop, daemon=True).start()

    def _stop_if_overdue(self) -> None:
        """Ray's stop, once the wrapper has had the time to snapshot and stop by itself (the cancel file), or at once
        while the job is pending (nothing to snapshot yet)."""
        deadline = time.monotonic() + self.launch.cancel_seconds + self.launch.grace_seconds + 2 * self.poll_seconds
        while time.monotonic() < deadline and self._state not in TERMINAL and self._result is None:
            if self._state == "PENDING":
                break
            time.sleep(min(0.5, self.poll_seconds))
        if self._state not in TERMINAL and self._result is None:
            self._stop()

    def _stop(self) -> None:
        try:
            self.client.stop(self.submission_id)
        except RayError as error:  # the cancel file stops it all the same once the wrapper looks
            log.warning("%s: Ray's stop failed (%s)", self.handle, error)

    def wait(self) -> AttemptResult:
        """Follow the job's status and log until it ends and its result is read (every wait bounded)."""
        try:
            return self._follow()
        finally:
            self._close_stream()

    def _follow(self) -> AttemptResult:
        last_contact = time.monotonic()
        ended_at: float | None = None
        status: dict[str, Any] = {}
        while True:
            try:
                status = self.client.status(self.submission_id)
                self._state = status.get("status")
                waited = self._read_logs(status.get("status"))
                last_contact = time.monotonic()
            except RayError as error:
                waited = False
                if time.monotonic() - last_contact > UNREACHABLE_SECONDS:
                    self.cancel()
                    return self._failed(f"the Ray cluster stopped answering: {error}")
            if self._result is not None:
                return self._result
            state = status.get("status")
            if state in TERMINAL:
                ended_at = ended_at or time.monotonic()
                if time.monotonic() - ended_at > OUTCOME_SECONDS:
                    return self._without_outcome(status)
            elif (
                state == "PENDING" and self._cancel_at is not None
                and time.monotonic() - self._cancel_at > PENDING_CANCEL_SECONDS
            ):
                return self._ended(Outcome(OUTCOME_CANCELLED, "cancelled before the cluster started it"), -1)
            if not waited:
                time.sleep(self.poll_seconds)

    def _read_logs(self, state: Any) -> bool:
        """Read what is new in the job's log: while a long log's job runs, from the tail for up to a poll's time
        (True: the poll's time was spent waiting there); else (a short log, a job not running yet or ended, no
        tail) the whole log once (False)."""
        if state in TERMINAL:  # the whole log, read now, has the result at once (Ray's tail reads up to 2 s late)
            self._close_stream()
        elif (
            self._stream is None and state == "RUNNING" and self._offset >= TAIL_AFTER_CHARS
            and self._may_open_stream()
        ):
            try:
                self._stream, self._stream_position = self.client.tail(self.submission_id), 0
            except RayError as error:
                self._stream_failed_at = time.monotonic()
                log.warning("%s: reading the whole log at each poll (%s)", self.handle, error)
        if self._stream is None:
            self._take(self.client.logs(self.submission_id), 0, whole=True)
            return False
        deadline = time.monotonic() + self.poll_seconds
        while self._result is None:
            try:
                chunk = self._stream.read(deadline - time.monotonic())
            except TailClosed:  # the job ended: a last whole read at the next poll finds anything after it
                self._close_stream()
                return True
            if chunk is None:
                break
            self._stream_position = self._take(chunk, self._stream_position, whole=False)
            if time.monotonic() >= deadline:
                break
        return True

    def _may_open_stream(self) -> bool:
        return self._stream_failed_at is None or time.monotonic() - self._stream_failed_at > TAIL_RETRY_SECONDS

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _take(self, text: str, start: int, *, whole: bool) -> int:
        """Read the lines of `text`, which begins at character `start` of the log, past what was read already;
        the position after it. A whole log shorter than what was read is not ours to shorten: read it again."""
        if whole and len(text) < self._offset:
            self._offset, self._partial = 0, ""
        end = start + len(text)
        if end > self._offset:
            chunk = text[max(self._offset - start, 0):]
            self._offset = end
            lines = (self._partial + chunk).split("\n")
            self._partial = lines.pop()
            for line in lines:
                self._line(line)
        return end

    def _line(self, line: str) -> None:
        try:
            message = nonfinite.loads(line) if line.startswith("{") else None
        except json.JSONDecodeError:
            message = None
        if not isinstance(message, dict) or TAG not in message:
            self._tail = [*self._tail[-20:], line[:MAX_LINE]]  # Ray's own lines, a traceback of the wrapper
            return
        kind = message[TAG]
        if kind == "record" and isinstance(message.get("record"), dict):
            self.launch.on_record(message["record"])
        elif kind == "log" and isinstance(message.get("lines"), list):
            self._tail = [*self._tail, *message["lines"]][-20:]
            self.launch.on_log([str(text)[:MAX_LINE] for text in message["lines"]])
        elif kind == "started":
            self.host = message.get("host")
        elif kind == "outcome":
            try:
                self._result = result_from_json(message["result"])
            except (KeyError, TypeError, ValueError) as error:
                self._result = self._failed(f"the node's result cannot be read: {error}")

    def _without_outcome(self, status: Mapping[str, Any]) -> AttemptResult:
        """The job ended and its wrapper said nothing of how: stopped before it could, or it never ran."""
        if self.cancelled:
            return self._ended(Outcome(OUTCOME_CANCELLED, "cancelled"), status.get("driver_exit_code"))
        detail = status.get("message") or "no message"
        tail = "\n".join(self._tail[-5:])
        return self._failed(f"the Ray job {self.submission_id} ended {status.get('status')}: {detail}"
                            + (f"\n{tail}" if tail else ""))

    def _failed(self, message: str) -> AttemptResult:
        return self._ended(Outcome(OUTCOME_FAILED, message), -1)

    @staticmethod
    def _ended(outcome: Outcome, returncode: Any) -> AttemptResult:
        code = returncode if isinstance(returncode, int) else -1
        return AttemptResult(code, outcome, 0, None, None, False, None)


class RayBackend:
    """Attempts on a Ray cluster (jobs.backends.local.Backend). `shared_root` is the data folder's path on the server,
    which every node sees (at MEMPLUGIN_SHARED_DIR on a node where it is mounted elsewhere)."""

    name = RAY

    def __init__(
        self, address: str, shared_root: Path, *, token: str | None = None, python: str | None = None,
        client: RayJobsClient | None = None, poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self.client = client or RayJobsClient(address, token)
        self.shared_root = shared_root
        self.python = python or sys.executable
        self.poll_seconds = poll_seconds

    def entrypoint(self, launch: Launch) -> str:
        grace = min(launch.grace_seconds, STOP_WAIT_SECONDS - 1.0)
        words = [
            self.python, "-m", "digits_memplugin.jobs.backends.node", launch.spec_file, "--folder", str(launch.folder),
            "--root", str(self.shared_root), "--grace", str(grace), "--cancel-seconds", str(launch.cancel_seconds),
        ]
        if launch.stall_seconds is not None:
            words += ["--stall", str(launch.stall_seconds)]
        for name, value in sorted(launch.environment.items()):
            words += ["--env", f"{name}={value}"]
        return shlex.join(words)

    @staticmethod
    def resources(device: str) -> dict[str, float]:
        """Where the attempt may run: the GPU's own resource, a host's CPU resource, or anywhere ("cpu")."""
        if device == CPU:
            return {}
        host = cpu_host(device)
        return {host_resource(host): 1.0} if host is not None else {gpu_resource(device): 1.0}

    def launch(self, launch: Launch) -> RayAttempt:
        submission_id = f"{launch.spec.job_id}-{launch.spec.attempt}"
        self.client.submit(
            submission_id, self.entrypoint(launch), resources=self.resources(launch.device),
            metadata={"memplugin_job": launch.spec.job_id, "memplugin_attempt": str(launch.spec.attempt)},
        )
        return RayAttempt(self.client, submission_id, launch, poll_seconds=self.poll_seconds)

    def reap(self, attempts: Sequence[Attempt], jobs_root: Path) -> None:
        for attempt in attempts:
            kind, _, name = (attempt.handle or "").partition(":")
            if kind != "ray":
                kill_leftover(attempt, jobs_root)
                continue
            attempt_folder = jobs_root / attempt.job_id / Path(attempt.log).parent
            with contextlib.suppress(OSError):
                (attempt_folder / CANCEL_FILE).touch()
            try:
                self.client.stop(name)
                log.warning("stopped Ray job %s left by a previous server (job %s)", name, attempt.job_id)
            except RayError as error:
                log.warning("Ray job %s left by a previous server: %s", name, error)

    def device_reader(self, local: DeviceReader) -> DeviceReader:
        return ClusterDeviceReader(self.shared_root, local)

    def check(self, timeout: float = 120.0) -> list[str]:
        """The hosts of the cluster, each having shown it sees the shared folder: a probe file read by a Ray job
        on every node. RayError naming the nodes that cannot (the server must not start then)."""
        nodes = self.client.nodes()
        hosts = sorted({host for node in nodes for host in _hosts(node)})
        if not hosts:
            raise RayError(
                "no node of the Ray cluster declares a memplugin_cpu:<host> resource; start each node with "
                "`ray start ... --resources '{\"memplugin_cpu:<host>\": 1}'` (docs/scale-out.md)"
            )
        token = secrets.token_hex(8)
        probe = self.shared_root / f".probe-{token}"
        probe.write_text(token, encoding="utf-8")
        try:
            submitted = {}
            for host in hosts:
                submission_id = f"memplugin-probe-{token}-{host}"
                command = shlex.join([self.python, "-m", "digits_memplugin.jobs.backends.node", "--probe", str(probe), token,
                                      "--root", str(self.shared_root)])
                self.client.submit(submission_id, command, resources={host_resource(host): 0.001},
                                   metadata={"memplugin_probe": host})
                submitted[host] = submission_id
            deadline = time.monotonic() + timeout
            failed: dict[str, str] = {}
            pending = dict(submitted)
            while pending and time.monotonic() < deadline:
                for host, submission_id in list(pending.items()):
                    status = self.client.status(submission_id)
                    if status.get("status") in TERMINAL:
                        pending.pop(host)
                        if status["status"] != "SUCCEEDED":
                            lines = self.client.logs(submission_id).strip().splitlines()
                            failed[host] = lines[-1] if lines else str(status.get("message"))
                time.sleep(0.5)
            for host, submission_id in pending.items():
                self.client.stop(submission_id)
                failed[host] = "the probe did not run in time"
        finally:
            probe.unlink(missing_ok=True)
        if failed:
            raise RayError(
                f"the shared job folder {self.shared_root} is not visible on every node: "
                + "; ".join(f"{host}: {reason}" for host, reason in sorted(failed.items()))
            )
        return hosts

    def close(self) -> None:
        pass


def _hosts(node: Mapping[str, Any]) -> list[str]:
    prefix = host_resource("")
    return [name[len(prefix):] for name in (node.get("resources_total") or {}) if name.startswith(prefix)]


__all__ = ["LogTail", "RayAttempt", "RayBackend", "RayError", "RayJobsClient", "TailClosed"]
