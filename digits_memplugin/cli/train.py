"""`digits-memplugin train NET SOLVER`: one training job in the foreground, with the server's job manager.

The job is stored in the data folder like a job submitted to the web app (its attempts, logs and snapshots are
there afterwards), placed on a device where its plan fits, retried with a smaller batch after an out-of-memory
failure. Progress is printed as it comes; Ctrl-C cancels the job. Exit status 0 when training finished, 1 when
the job failed or was cancelled.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from ..core.divergence import DEFAULT_POLICY, POLICIES
from .estimate import positive_int, size


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a net in the foreground, with the out-of-memory fallback",
        description=(
            "Train a Caffe net with its solver as a job of the job manager: on a device where the planned batch "
            "fits, retried with a smaller batch (and a larger iter_size, keeping the effective batch) after an "
            "out-of-memory failure, resumed from the last snapshot. Progress is printed; Ctrl-C cancels."
        ),
    )
    parser.add_argument("net", type=Path, metavar="NET", help="net prototxt (train_val)")
    parser.add_argument("solver", type=Path, metavar="SOLVER", help="solver prototxt (its net fields are replaced)")
    parser.add_argument(
        "--device", default="auto", help='"auto" (next available), "cpu", a GPU index or UUID (default: %(default)s)'
    )
    parser.add_argument("--batch", type=batch, help='effective batch to keep, or "auto" (default: the net\'s own)')
    parser.add_argument(
        "--data-dir", type=Path, default=Path("var"), help="jobs database and job folders (default: ./%(default)s)"
    )
    parser.add_argument(
        "--dataset-root",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="folder the net may read data from (repeatable; default: the current folder)",
    )
    parser.add_argument(
        "--data", action="append", default=[], metavar="KEY=PATH",
        help='data source of a layer (by name) or of a phase ("train", "test"), e.g. train=mnist_train_lmdb',
    )
    parser.add_argument("--max-iter", type=positive_int, help="train this many iterations instead of the solver's")
    parser.add_argument("--classes", type=positive_int, help="classes, for DIGITS networks that leave num_output unset")
    parser.add_argument("--memory-cap", type=size, metavar="B", help="memory cap of a CPU job, e.g. 2GiB")
    parser.add_argument("--max-attempts", type=positive_int, help="attempts before giving up (default: 5)")
    parser.add_argument(
        "--safety-margin", type=float, help="fraction of free memory kept back (default: 0.03 on the CPU, 0.05 on GPUs)"
    )
    parser.add_argument(
        "--start", choices=("plan", "wanted"), default="plan",
        help='first attempt at the planned batch (default) or at the wanted batch as given ("wanted")',
    )
    parser.add_argument(
        "--divergence", choices=POLICIES, default=DEFAULT_POLICY,
        help='when a loss or output becomes NaN or infinite: "stop" the job with DIGITS\' advice (try a lower '
             'learning rate; the default), or "continue" training to the end as Caffe does',
    )
    parser.add_argument(
        "--stall-seconds", type=positive_seconds, default=600.0, metavar="S",
        help="end an attempt that writes no progress and no log line for this long (default: %(default)g)",
    )
    parser.add_argument(
        "--caffe-root", type=Path, metavar="DIR",
        help="the Caffe build that trains (its build/tools/caffe, and its python/ where it has one); also "
        "MEMPLUGIN_CAFFE_ROOT, then CAFFE_ROOT and CAFFE_HOME in the environment (default: the bundled pycaffe)",
    )
    parser.add_argument("--json", action="store_true", help="print the job document (with attempts) at the end")
    parser.set_defaults(run=run)


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 1 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be at least 1 second, got {text!r}")
    return value


def batch(text: str) -> int | str:
    return "auto" if text == "auto" else positive_int(text)


def run(args: argparse.Namespace) -> int:
    import time

    from ..core import nonfinite
    from ..devices import DeviceReader
    from ..jobs.config import gpu_engine_for
    from ..jobs.errors import DataFolderInUse, JobValidationError
    from ..jobs.manager import JobManager, ManagerConfig
    from ..jobs.request import parse_job_request
    from ..jobs.throttle import EventThrottle
    from . import CommandError

    body: dict[str, Any] = {
        "net": _read(args.net), "solver": _read(args.solver), "device": args.device, "divergence": args.divergence,
    }
    for key, value in (
        ("batch", args.batch), ("max_iter", args.max_iter), ("classes", args.classes), ("memory_cap", args.memory_cap),
    ):
        if value is not None:
            body[key] = value
    data = {}
    for item in args.data:
        key, _, value = item.partition("=")
        if not key or not value:
            raise CommandError(f"--data {item}: write KEY=PATH")
        data[key] = value
    if data:
        body["data"] = data
    fallback: dict[str, Any] = {"start": args.start}
    if args.max_attempts is not None:
        fallback["max_attempts"] = args.max_attempts
    if args.safety_margin is not None:
        fallback["safety_margin"] = args.safety_margin
    body["fallback"] = fallback
    request, errors = parse_job_request(body, default_attempts=5)
    if request is None:
        raise CommandError(_errors(errors))

    roots = tuple(root.absolute() for root in args.dataset_root) or (Path.cwd(),)
    caffe, preload = _caffe(args.caffe_root or os.environ.get("MEMPLUGIN_CAFFE_ROOT"))
    print(f"training with {caffe.label}: {caffe.abilities}, {caffe.runner} runner", flush=True)
    printer = Printer()
    manager = JobManager(
        ManagerConfig(data_dir=args.data_dir.absolute(), dataset_roots=roots, stall_seconds=args.stall_seconds,
                      caffe=caffe, preload=preload, gpu_engine=gpu_engine_for(caffe)),
        DeviceReader(),
        on_event=EventThrottle(printer, 2.0),
    )
    try:
        manager.start()
    except DataFolderInUse as error:
        raise CommandError(f"{error}; give another --data-dir") from None
    try:
        try:
            job = manager.submit(request)
        except JobValidationError as error:
            raise CommandError(_errors(error.errors)) from None
        print(f"job {job.id} in {manager.folder(job.id)}", flush=True)
        try:
            job = manager.wait(job.id)
        except KeyboardInterrupt:
            print("cancelling...", flush=True)
            manager.cancel(job.id)
            job = manager.wait(job.id, timeout=60)
        time.sleep(0)  # let the last events print
        if args.json:
            print(nonfinite.dumps(manager.document(job.id), indent=2))
        else:
            print(f"{job.status}: {job.message}", flush=True)
        return 0 if job.status == "done" else 1
    finally:
        manager.stop()


class Printer:
    """Job manager events as lines for a terminal."""

    def __call__(self, name: str, payload: dict[str, Any]) -> None:
        line = self.line(name, payload)
        if line:
            print(line, flush=True)

    @staticmethod
    def line(name: str, payload: dict[str, Any]) -> str | None:
        from ..core import nonfinite
        from ..sizes import format_size

        if name == "job_attempt":
            head = (
                f"attempt {payload['number']} on {payload['device']}: batch {payload['batch_size']} x iter_size "
                f"{payload['iter_size']} = {payload['effective_batch']}"
            )
            if payload["status"] == "running":
                resumed = f", resumed from {payload['resumed_from']}" if payload["resumed_from"] else ""
                return f"{head}, estimated {format_size(payload['estimated_bytes'])} of {format_size(payload['limit_bytes'])}{resumed}"
            return f"{head}: {payload['status']}: {payload['message']} (peak {format_size(payload['peak_bytes'])})"
        if name == "job_progress":
            event = payload.get("event")
            if event == "iteration":
                return (
                    f"  iteration {payload['iteration']}: loss {nonfinite.text(payload.get('loss'))}, "
                    f"lr {nonfinite.text(payload.get('lr'))}"
                )
            if event == "test":
                outputs = ", ".join(f"{k} = {v}" for k, v in payload.get("outputs", {}).items())
                return f"  test net {payload['net']} at iteration {payload['iteration']}: {outputs}"
            if event == "snapshot":
                return f"  snapshot at iteration {payload['iteration']}: {payload['state']}"
            if event == "diverged":
                return f"  {payload.get('message')}"
            return None
        if name == "job" and payload.get("status") in ("queued",) and payload.get("message"):
            return f"{payload['message']}"
        return None


def _caffe(root: Path | str | None) -> tuple[Any, str | None]:
    """The Caffe that trains (and, for its binary, the capped-start library), or the command's error saying why not."""
    from ..caffe_build import BINARY, CaffeBuildError, find_caffe
    from ..jobs.preload import PreloadError, ensure_library
    from . import CommandError

    try:
        caffe = find_caffe(root)
        return caffe, str(ensure_library()) if caffe.runner == BINARY else None
    except (CaffeBuildError, PreloadError) as error:
        raise CommandError(str(error)) from None


def _read(path: Path) -> str:
    from . import CommandError

    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CommandError(f"cannot read {path}: {error}") from None


def _errors(errors: dict[str, Any]) -> str:
    parts = []
    for key, value in errors.items():
        message = value.get("message") if isinstance(value, dict) and "message" in value else value
        parts.append(f"{key}: {message}")
    return "; ".join(parts)
