"""`digits-memplugin train NET SOLVER`: one training job in the foreground, with the server's job manager.

The job is stored in the data folder like a job submitted to the web app (its attempts, logs and snapshots are
there afterwards), placed on a device where its plan fits, retried with a smaller batch after an out-of-memory
failure. Reporter is printed as it comes; Ctrl-C cancels the job. Exit status 0 when training finished, 1 when
the job failed or was cancelled.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core.divergence import DEFAULT_POLICY, POLICIES
from ..core.oom import OUTCOME_REPLANNED
from ..core.test_net_modes import SAME_DEVICE, TEST_NET_APART, TEST_NET_AUTO
from .estimate import TEST_NET_CHOICES, data_shapes, positive_int, size


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a net in the foreground, with the out-of-memory fallback",
        description=(
            "Train a Caffe net with its solver as a job of the job manager: on a device where the planned batch "
            "fits, retried with a smaller batch (and a larger iter_size, keeping the effective batch) after an "
            "out-of-memory failure, resumed from the last snapshot. With --test-net apart a tester process tests "
            "each test interval's snapshot, so that the train net has the memory alone. Progress is printed; Ctrl-C "
            "cancels."
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
    parser.add_argument(
        "--data-shape", action="append", default=[], metavar="TOP=C,H,W",
        help="item shape of a data top whose dataset's shape cannot be read (repeatable; TOP or LAYER/TOP), as estimate",
    )
    parser.add_argument("--max-iter", type=positive_int, help="train this many iterations instead of the solver's")
    parser.add_argument(
        "--epochs", type=positive_int, metavar="N",
        help="train N passes over the training set instead (as DIGITS asks: N x training items / batch iterations), "
        "validating once per epoch on one pass over the validation set",
    )
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
        "--test-net", choices=TEST_NET_CHOICES, default=TEST_NET_AUTO,
        help='where the test nets live: "shared" beside the train net, as Caffe keeps them; "apart" in a tester '
        "process of its own that tests each test interval's snapshot, so that the train net has the memory alone "
        "(on the same device training stops while it tests); \"auto\" (the default): apart only where that trains a "
        "larger batch or fewer iter_size passes, and stopping for the tester costs under 5%% of the training",
    )
    parser.add_argument(
        "--tester-device", metavar="DEVICE",
        help=f'where the tester runs when the test nets are apart: "auto" (another GPU with room for it, else the '
        f'trainer\'s device; the default), "{SAME_DEVICE}" (the trainer\'s device), "cpu", a GPU index or UUID',
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
    from ..devices.reader import DeviceReader
    from ..jobs.config import gpu_engine_for
    from ..jobs.definition.request import parse_job_request
    from ..jobs.errors import DataFolderInUse, InvalidDefinition, JobValidationError
    from ..jobs.manager import JobManager, ManagerConfig
    from . import CommandError

    body: dict[str, Any] = {
        "net": _read(args.net), "solver": _read(args.solver), "device": args.device, "divergence": args.divergence,
        "test_net": args.test_net,
    }
    for key, value in (
        ("batch", args.batch), ("max_iter", args.max_iter), ("epochs", args.epochs), ("classes", args.classes),
        ("memory_cap", args.memory_cap), ("tester_device", args.tester_device),
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
    shapes = data_shapes(args.data_shape)
    if shapes:
        body["data_shapes"] = {key: list(value) for key, value in shapes.items()}
    fallback: dict[str, Any] = {"start": args.start}
    if args.max_attempts is not None:
        fallback["max_attempts"] = args.max_attempts
    if args.safety_margin is not None:
        fallback["safety_margin"] = args.safety_margin
    body["fallback"] = fallback
    request, errors = parse_job_request(body, default_attempts=5)
    if request is None:
        raise CommandError(_errors(errors, args))

    roots = tuple(root.absolute() for root in args.dataset_root) or (Path.cwd(),)
    caffe, preload = _caffe(args.caffe_root or os.environ.get("MEMPLUGIN_CAFFE_ROOT"))
    print(f"training with {caffe.label}: {caffe.abilities}, {caffe.runner} runner", flush=True)
    printer = Printer(display=_display(body["solver"]))
    manager = JobManager(
        ManagerConfig(data_dir=args.data_dir.absolute(), dataset_roots=roots, stall_seconds=args.stall_seconds,
                      caffe=caffe, preload=preload, gpu_engine=gpu_engine_for(caffe)),
        DeviceReader(),
        on_event=printer,
    )
    printer.folder_of = manager.folder
    try:
        manager.start()
    except DataFolderInUse as error:
        raise CommandError(f"{error}; give another --data-dir") from None
    try:
        try:
            job = manager.submit(request)
        except InvalidDefinition as error:
            if error.field == "epochs":  # --epochs on a training set whose size cannot be read
                raise CommandError(f"--epochs: {error.error.message}") from None
            raise CommandError(definition_words(error.error, args, roots)) from None
        except JobValidationError as error:
            raise CommandError(_errors(error.errors, args)) from None
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
    """Job manager events as lines for a terminal: attempts as they start and end; an iteration at regular steps
    (`display`, the solver's, else a hundredth of the run), the first and the last of each attempt too, with
    "of max_iter", the speed and the time left; tests; snapshots by their path on disk (`folder_of` gives a job's
    folder)."""

    def __init__(self, display: int = 0, folder_of: Callable[[str], Path] | None = None) -> None:
        self.display = display
        self.folder_of = folder_of
        self._jobs: dict[str, _Followed] = {}

    def __call__(self, name: str, payload: dict[str, Any]) -> None:
        line = self.line(name, payload)
        if line:
            print(line, flush=True)

    def line(self, name: str, payload: dict[str, Any]) -> str | None:
        if name == "job":
            followed = self._jobs.setdefault(str(payload.get("id")), _Followed())
            if isinstance(payload.get("max_iter"), int):
                followed.max_iter = payload["max_iter"]
            if payload.get("status") in ("queued",) and payload.get("message"):
                return f"{payload['message']}"
            if payload.get("status") == "running":
                return self._plan_notes(followed, str(payload.get("message") or ""))
            return None
        if name == "job_attempt":
            return self._attempt(payload)
        if name == "job_progress":
            event = payload.get("event")
            if event == "iteration":
                return self._iteration(payload)
            if event == "test":  # the runner's, or with the test nets apart a tester's: the same record
                outputs = ", ".join(f"{k} = {_value(v)}" for k, v in payload.get("outputs", {}).items())
                return f"  test net {payload['net']} at iteration {payload['iteration']}: {outputs}"
            if event == "snapshot":
                return (
                    f"  snapshot at iteration {payload['iteration']}: {self._path(payload, payload['model'])} "
                    f"(solver state {self._path(payload, payload['state'])})"
                )
            if event == "paused":  # the snapshot was printed as it was written; "test_due" names it again
                return f"  paused at iteration {payload['iteration']} for the tester; training resumes once it has tested"
            if event == "diverged":
                return f"  {payload.get('message')}"
            return None
        return None

    def _plan_notes(self, followed: _Followed, message: str) -> str | None:
        """What the job's message ("attempt N: <the plan's message>") says of the attempt's plan that its line
        does not: the cap of "auto" when that chose the batch, and where the plan put the test nets and why (the
        planner's note, core.planning.apart); each once per attempt that says it."""
        number, colon, said = message.partition(": ")
        if not colon or not number.startswith("attempt ") or number == followed.noted:
            return None
        lines = []
        cap = said.partition("; auto capped at ")[2].partition(TEST_NET_NOTE)[0]
        if cap and cap != followed.auto_cap:
            followed.auto_cap = cap
            lines.append(f"  batch auto: capped at {cap}")
        placement = said.partition(TEST_NET_NOTE)[2]
        if placement:
            lines.append(f"  test nets {placement}")
        if not lines:
            return None
        followed.noted = number
        return "\n".join(lines)

    def _attempt(self, payload: dict[str, Any]) -> str:
        """An attempt's line as it starts (its plan, and with the test nets apart where its tester runs) and as it
        ends (how, and what its tester did)."""
        from ..core.sizes import format_size

        head = (
            f"attempt {payload['number']} on {payload['device']}: batch {payload['batch_size']} x iter_size "
            f"{payload['iter_size']} = {payload['effective_batch']}"
        )
        tester = payload.get("tester") if payload.get("test_net") == TEST_NET_APART else None
        if payload["status"] == "running":
            resumed = f", resumed from {self._path(payload, payload['resumed_from'])}" if payload["resumed_from"] else ""
            line = (f"{head}, estimated {format_size(payload['estimated_bytes'])} of "
                    f"{format_size(payload['limit_bytes'])}{resumed}")
            return line + (f"\n  {tester_words(tester)}" if isinstance(tester, dict) else "")
        message = str(payload.get("message") or "")
        # A replanned attempt's message says it all ("replanned at iteration 8: ..."): no status word before it.
        ended = message if payload["status"] == OUTCOME_REPLANNED and message else f"{payload['status']}: {message}"
        line = f"{head}: {ended} (peak {format_size(payload['peak_bytes'])})"
        return line + (f"\n  {tester_report(tester)}" if isinstance(tester, dict) else "")

    def _iteration(self, payload: dict[str, Any]) -> str | None:
        """The line of an iteration record when it is one to print (and the first whose loss is not finite); every
        record counts for the speed."""
        from ..core import nonfinite
        from ..jobs.events.pace import format_duration, format_rate, pace, recent

        followed = self._jobs.setdefault(str(payload.get("job_id")), _Followed())
        iteration = int(payload["iteration"])
        if payload.get("attempt") != followed.attempt:  # a new attempt: its own speed, from its own records
            followed.attempt, followed.points, followed.printed = payload.get("attempt"), [], None
            followed.non_finite = False
        seconds = payload.get("seconds")
        if isinstance(seconds, (int, float)):
            followed.points.append((iteration, float(seconds)))
            if len(followed.points) > 4096:
                followed.points = recent(followed.points)
        total = followed.max_iter
        step = print_step(total, self.display)
        last = followed.printed
        loss = payload.get("loss")
        first_non_finite = nonfinite.is_non_finite(loss) and not followed.non_finite
        if last is not None and iteration != total and iteration // step <= last // step and not first_non_finite:
            return None
        followed.printed = iteration
        followed.non_finite = followed.non_finite or first_non_finite
        parts = [f"loss {nonfinite.text(loss, '.4g')}", f"lr {nonfinite.text(payload.get('lr'), '.4g')}"]
        if total is not None:
            measured = pace(followed.points, total)
            if measured is not None:
                parts.append(format_rate(measured.iterations_per_second))
                if iteration < total:
                    parts.append(f"{format_duration(measured.seconds_left)} left")
        of = f" of {total}" if total is not None else ""
        return f"  iteration {iteration}{of}: {', '.join(parts)}"

    def _path(self, payload: dict[str, Any], relative: str) -> str:
        """A path the records give relative to the job's folder, as a path on this machine."""
        if self.folder_of is None:
            return relative
        return str(self.folder_of(str(payload.get("job_id"))) / relative)


@dataclasses.dataclass
class _Followed:
    """What the printer knows of one job: its length, and its current attempt's iteration records."""

    max_iter: int | None = None
    attempt: int | None = None
    points: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    printed: int | None = None
    """The last iteration printed in this attempt."""
    non_finite: bool = False
    """A loss that is not finite was printed in this attempt (the first one always is, whatever the step)."""
    auto_cap: str | None = None
    """The cap of "auto" last printed."""
    noted: str | None = None
    """The attempt ("attempt N") whose plan's notes were printed last."""


TEST_NET_NOTE = "; test nets "
"""Where the planner's note on the test nets' placement begins in a plan's message (core.planning.apart: "test nets
apart (...)", "test nets shared: ..."); it ends the message."""


def tester_words(tester: dict[str, Any]) -> str:
    """Where an attempt's tester runs and what it was planned to need (its row as the attempt starts)."""
    from ..core.sizes import format_size

    estimated = f", estimated {format_size(tester['estimated_bytes'])}" if tester.get("estimated_bytes") else ""
    if tester.get("same_device"):
        return (f"test nets apart: a tester on the trainer's device{estimated}; training stops at each test interval "
                "while it tests that interval's snapshot")
    return f"test nets apart: a tester on {tester.get('device')}{estimated}, testing each snapshot while training goes on"


def tester_report(tester: dict[str, Any]) -> str:
    """What an attempt's tester did (jobs.scheduling.apart_run.TesterReport, kept on the attempt's row)."""
    from ..core.sizes import format_size

    tested = tester.get("tested") or []
    where = "on the trainer's device" if tester.get("same_device") else f"on {tester.get('device')}"
    parts = [f"tester {where}: tested " + (
        f"{len(tested)} snapshot{'s' if len(tested) != 1 else ''} (iteration{'s' if len(tested) != 1 else ''} "
        f"{', '.join(map(str, tested))})" if tested else "no snapshot"
    )]
    if tester.get("pauses"):
        parts.append(f"training stopped {tester['pauses']} time{'s' if tester['pauses'] != 1 else ''} for it")
    if isinstance(tester.get("stop_cost"), (int, float)):
        parts.append(f"each stop cost {tester['setup_seconds']:.1f} s, {tester['stop_cost']:.1%} of an interval's "
                     f"{tester['interval_seconds']:.1f} s of training")
    parts.append(f"peak {format_size(tester.get('peak_bytes'))}")
    return ", ".join(parts)


def print_step(max_iter: int | None, display: int) -> int:
    """Every how many iterations a line is printed: the solver's `display` (Caffe prints its loss then), else a
    hundredth of the run rounded to 1, 2 or 5 x 10^n (Caffe's LeNet example: 100 of 10,000)."""
    if display > 0:
        return display
    if not max_iter or max_iter < 100:
        return 1
    target = max_iter / 100
    scale = 10 ** (len(str(int(target))) - 1)
    return max(step for step in (scale, 2 * scale, 5 * scale) if step <= target)


def _value(value: Any) -> str:
    """A loss or a test output to four significant digits (a list item by item, a long output's mean)."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, (int, float)):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, dict) and "mean" in value:
        return f"mean {_value(value['mean'])} of {value.get('count')}"
    return str(value)


def _display(solver_text: str) -> int:
    """The solver's `display` (0 where unset, or where the solver does not parse: submitting it says why)."""
    from ..core.errors import NetError
    from ..core.prototxt import parse_solver

    try:
        return max(0, int(parse_solver(solver_text).display))
    except NetError:
        return 0


def _caffe(root: Path | str | None) -> tuple[Any, str | None]:
    """The Caffe that trains (and, for its binary, the capped-start library), or the command's error saying why not."""
    from ..jobs.child.caffe_build import BINARY, CaffeBuildError, find_caffe
    from ..jobs.child.preload import PreloadError, ensure_library
    from . import CommandError

    try:
        caffe = find_caffe(root)
        return caffe, str(ensure_library()) if caffe.runner == BINARY else None
    except (CaffeBuildError, PreloadError) as error:
        raise CommandError(str(error)) from None


def _read(path: Path) -> str:
    from . import CommandError

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CommandError(f"cannot read {path}: {error}") from None
    if not text.strip():
        raise CommandError(f"{path} is empty")
    return text


FLAGS = {
    "batch": "--batch", "data": "--data", "data_shapes": "--data-shape", "classes": "--classes",
    "max_iter": "--max-iter", "memory_cap": "--memory-cap", "device": "--device", "epochs": "--epochs",
    "test_net": "--test-net", "tester_device": "--tester-device",
}
"""The flag that gives each field of the job request."""
NAMED_IN_MESSAGES = ("test_net", "tester_device")
"""Fields whose refusals name each other by the request's word ("give test_net 'apart' with it"): said with their
flags instead (words that are no field elsewhere in a message, unlike "device" or "batch")."""
FALLBACK_FLAGS = {"max_attempts": "--max-attempts", "safety_margin": "--safety-margin", "start": "--start"}


def _errors(errors: dict[str, Any], args: argparse.Namespace) -> str:
    """The request's errors in the command line's terms: the NET or SOLVER file, or the flag, of each."""
    parts = []
    for key, value in errors.items():
        message = value.get("message") if isinstance(value, dict) and "message" in value else value
        if key == "fallback" and isinstance(value, dict):
            parts += [f"{FALLBACK_FLAGS.get(k, k)}: {v}" for k, v in value.items()]
            continue
        where = {"net": str(args.net), "solver": str(args.solver)}.get(key) or FLAGS.get(key, key)
        if key in NAMED_IN_MESSAGES and isinstance(message, str):
            for field in NAMED_IN_MESSAGES:
                message = re.sub(rf"\b{field}\b", FLAGS[field], message)
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


def definition_words(error: Any, args: argparse.Namespace, roots: tuple[Path, ...]) -> str:
    """A definition error as the command line says it: in the user's own files (the job's folder keeps them as
    net.prototxt and solver.prototxt), a data layer without a dataset pointed at --data, a dataset outside the
    roots with the roots named and --dataset-root, a missing shape or class count with its flag."""
    import copy

    from ..core.errors import NetError
    from ..jobs.definition.data_sources import DATA_SOURCE_FIELDS, DataSourceError
    from ..jobs.definition.definition import NET_SOURCE, SOLVER_SOURCE
    from .estimate import command_line_words

    error = copy.copy(error)
    source = error.source or ""
    if isinstance(error, DataSourceError):  # a source --data gave, not the net's text
        error.source = "--data"
    elif source == NET_SOURCE or (error.source is None and error.layer is not None):
        error.source = str(args.net)
    elif source.startswith(SOLVER_SOURCE):
        error.source = str(args.solver) + source[len(SOLVER_SOURCE):]
    if error.missing_shape is not None and error.layer_type in DATA_SOURCE_FIELDS:
        unsourced = _unsourced_data_layer(args, error.layer)
        if unsourced is not None:
            by_phase = " or ".join(f"--data {phase}=PATH" for phase in _phases(unsourced))
            return str(NetError(
                f"no dataset given: give it with {by_phase} (this layer's phase) or --data {unsourced.name}=PATH, "
                f"PATH being {DATASET_KINDS.get(unsourced.type, 'its dataset')} in {_roots(roots)}",
                source=error.source, line=error.line, layer=error.layer, layer_type=error.layer_type,
                field=f"{DATA_SOURCE_FIELDS[unsourced.type]}.source",
            ))
    text = command_line_words(error, classes_given=args.classes is not None)
    if "dataset folders" in error.message:
        text += f" (the dataset folders here: {_roots(roots)}; --dataset-root DIR adds one)"
    return text


DATASET_KINDS = {
    "Data": "an LMDB folder", "AnnotatedData": "an LMDB folder", "HDF5Data": "a list file of HDF5 files",
    "ImageData": "a list file of images and labels",
}
"""What --data names for each kind of data layer."""


def _roots(roots: tuple[Path, ...]) -> str:
    return ", ".join(str(root) for root in roots)


def _unsourced_data_layer(args: argparse.Namespace, name: str | None) -> Any:
    """The user's data layer called `name` when it names no dataset and no --data gives it one, else None."""
    from ..core.errors import NetError
    from ..core.prototxt import parse_net
    from ..jobs.definition.data_sources import DATA_SOURCE_FIELDS

    try:
        net = parse_net(_read(args.net), str(args.net))
    except NetError:
        return None
    keys = {item.partition("=")[0] for item in args.data}
    phases = {key.lower() for key in keys}
    for layer in net.layer:
        field = DATA_SOURCE_FIELDS.get(layer.type)
        if layer.name != name or field is None or getattr(layer, field).source:
            continue
        if name not in keys and not phases & set(_phases(layer)):
            return layer
    return None


def _phases(layer: Any) -> list[str]:
    from ..jobs.definition.data_sources import data_phases

    return sorted(data_phases(layer))
