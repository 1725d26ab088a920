"""The node side of a job backend that runs attempts on other hosts (jobs.backends.ray).

    python -m digits_memplugin.jobs.backends.node attempts/N/attempt.json --folder JOBDIR [--env K=V ...]
        Run one attempt on this host exactly as the local backend does: today's runner under today's
        AttemptProcess (its death signal, the OOM classification with this host's /proc/vmstat, the watchdog, the
        memory cap all stay here). Each record and each new line of Caffe's log is printed on stdout as one JSON
        line, and last the attempt's result (`outcome`), from which the server rebuilds the AttemptResult.
        A file `cancel` in the attempt's folder cancels the attempt as the local backend's cancel does (a snapshot,
        then the stop; the server writes it first and stops the Ray job only if that takes too long, or at once
        while Ray still holds it pending); SIGTERM (Ray's stop, SIGKILL 3 s later) stops it at once, without one.
    python -m digits_memplugin.jobs.backends.node --agent ROOT [--interval S]
        The node's agent, started with the node: writes this host's devices (devices.read_devices, NVML) to
        ROOT/nodes/<host>.json every few seconds, which the server reads to show and plan every host's GPUs.
    python -m digits_memplugin.jobs.backends.node --probe FILE TOKEN
        Exit 0 when FILE holds TOKEN: the server's check that this node sees the shared job folder.

The host's name is MEMPLUGIN_NODE_NAME, else the machine's host name; the shared folder's path on this host is
MEMPLUGIN_SHARED_DIR where it differs from the server's. Standard library and the plugin only: no Ray import.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...core import nonfinite
from ...core.divergence import DEFAULT_POLICY
from ...core.oom import Outcome
from ...devices.cluster import NODES_FOLDER
from ...devices.reader import read_devices
from .attempt_process import CANCEL_SECONDS, AttemptProcess, AttemptResult

TAG = "memplugin"
"""Every line the wrapper prints is a JSON object with this key: "record", "log" or "outcome"."""
CANCEL_FILE = "cancel"
AGENT_SECONDS = 2.0
CANCEL_POLL_SECONDS = 0.5


def node_name() -> str:
    return os.environ.get("MEMPLUGIN_NODE_NAME") or socket.gethostname()


def shared_path(server_path: str, server_root: str | None) -> Path:
    """A path the server gave, on this host: under MEMPLUGIN_SHARED_DIR instead of `server_root` where it is set."""
    local_root = os.environ.get("MEMPLUGIN_SHARED_DIR")
    if local_root and server_root:
        relative = os.path.relpath(server_path, server_root)
        if not relative.startswith(".."):
            return Path(local_root) / relative
    return Path(server_path)


# --- the result, as a line and back --------------------------------------------------------------------------------


def result_to_json(result: AttemptResult) -> dict[str, Any]:
    document = dataclasses.asdict(result)
    document["outcome"] = result.outcome.to_dict()
    return document


def result_from_json(document: dict[str, Any]) -> AttemptResult:
    """The AttemptResult the node printed; KeyError/TypeError/ValueError when it is not one (the caller says the
    attempt failed)."""
    return AttemptResult(**{**document, "outcome": Outcome.from_dict(document["outcome"])})


class _Printer:
    """One JSON line per call, whole even when the records' and the logs' threads print at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, kind: str, payload: dict[str, Any]) -> None:
        line = nonfinite.dumps({TAG: kind, **payload}, separators=(",", ":"))
        with self._lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


def run_attempt(
    spec_file: str, folder: Path, environment: dict[str, str], grace: float, stall: float | None,
    cancel_seconds: float = CANCEL_SECONDS,
) -> int:
    spec_path = folder / spec_file
    data = json.loads(spec_path.read_text(encoding="utf-8"))
    emit = _Printer()
    process = AttemptProcess(
        folder, spec_file, data["log"], environment=environment,
        on_record=lambda record: emit("record", {"record": record}),
        on_log=lambda lines: emit("log", {"lines": lines}),
        grace_seconds=grace, stall_seconds=stall, divergence=data.get("divergence", DEFAULT_POLICY),
        cancel_seconds=cancel_seconds,
    )
    cancel_file = spec_path.parent / CANCEL_FILE
    done = threading.Event()

    def watch_cancel() -> None:
        while not done.wait(CANCEL_POLL_SECONDS):
            if cancel_file.exists():
                process.cancel()

    signal.signal(signal.SIGTERM, lambda number, frame: process.cancel(snapshot=False))
    process.start()
    if cancel_file.exists():  # stopped while Ray still held it pending
        process.cancel()
    threading.Thread(target=watch_cancel, daemon=True).start()
    emit("started", {"host": node_name(), "pid": process.pid})
    peak = _GpuPeak(lambda: process.pid) if data.get("device", {}).get("kind") == "gpu" else None
    if peak is not None:
        threading.Thread(target=peak.follow, args=(done,), daemon=True).start()
    result = process.wait()
    done.set()
    if peak is not None and peak.bytes is not None:  # what the server samples for a local child, sampled here
        result = dataclasses.replace(result, peak_bytes=max(result.peak_bytes or 0, peak.bytes))
    emit("outcome", {"result": result_to_json(result)})
    return 0


class _GpuPeak:
    """The child's GPU memory at its largest, from NVML's process list on this host (CUDA cannot tell the child)."""

    def __init__(self, pid: Callable[[], int | None]) -> None:
        self.pid = pid
        """The process that trains (the child, or the caffe it runs once it has said so)."""
        self.bytes: int | None = None

    def follow(self, done: threading.Event, seconds: float = 1.0) -> None:
        while not done.wait(seconds):
            for gpu in read_devices().gpus:
                for process in gpu.processes or ():
                    if process.pid == self.pid() and process.used_memory is not None:
                        self.bytes = max(self.bytes or 0, process.used_memory)


# --- the agent and the probe -------------------------------------------------------------------------------------


def node_report() -> dict[str, Any]:
    return {"host": node_name(), "time": time.time(), **read_devices().to_json()}


def _simulated_gpus(spec: str) -> None:
    """Fake GPUs (tests, demos) with UUIDs of this host's own, as real GPUs have across hosts."""
    from ...devices.fake_nvml import FakeNvml
    from ...devices.reader import install_library

    fake = FakeNvml.from_spec(spec)
    tag = hashlib.sha256(node_name().encode()).hexdigest()[:8]
    for gpu in fake.gpus:
        gpu.uuid = f"GPU-{tag}{gpu.uuid[12:]}"
    install_library(fake)


def run_agent(root: Path, interval: float, once: bool = False) -> int:
    folder = root / NODES_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    spec = os.environ.get("MEMPLUGIN_SIMULATE_GPUS")
    if spec:
        _simulated_gpus(spec)
    target = folder / f"{node_name()}.json"
    while True:
        temporary = target.with_name(f".{target.name}.{os.getpid()}")
        temporary.write_text(json.dumps(node_report()), encoding="utf-8")
        os.replace(temporary, target)
        if once:
            return 0
        time.sleep(interval)


def probe(path: Path, token: str) -> int:
    try:
        found = path.read_text(encoding="utf-8").strip()
    except OSError as error:
        print(f"{node_name()}: cannot read {path}: {error}")
        return 1
    print(f"{node_name()}: {'sees' if found == token else 'sees another'} {path}")
    return 0 if found == token else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m digits_memplugin.jobs.backends.node", description=__doc__.split("\n")[0])
    parser.add_argument("spec", nargs="?", help="the attempt's attempt.json, relative to --folder")
    parser.add_argument("--folder", help="the job's folder, as the server sees it")
    parser.add_argument("--root", help="the shared folder as the server sees it (MEMPLUGIN_SHARED_DIR maps it here)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="the child's environment")
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--stall", type=float, default=None)
    parser.add_argument("--cancel-seconds", type=float, default=CANCEL_SECONDS)
    parser.add_argument("--agent", metavar="ROOT", help="write this host's devices to ROOT/nodes/ every --interval")
    parser.add_argument("--interval", type=float, default=AGENT_SECONDS)
    parser.add_argument("--once", action="store_true", help="the agent writes once and exits")
    parser.add_argument("--probe", nargs=2, metavar=("FILE", "TOKEN"))
    args = parser.parse_args(argv)
    if args.probe:
        return probe(shared_path(args.probe[0], args.root), args.probe[1])
    if args.agent:
        return run_agent(Path(args.agent), args.interval, args.once)
    if not args.spec or not args.folder:
        parser.error("an attempt needs its attempt.json and --folder")
    environment = dict(item.split("=", 1) for item in args.env)
    return run_attempt(args.spec, shared_path(args.folder, args.root), environment, args.grace, args.stall,
                       args.cancel_seconds)


if __name__ == "__main__":
    sys.exit(main())
