"""The test nets apart (issue 28) against shared, and `auto`'s choice, on real capped CPU jobs side by side.

For each case (a zoo net, its wanted train batch, a test interval) the same job runs once per `test_net` mode
(shared, apart, auto) in one run, through a JobManager on the CPU under a real memory cap (RLIMIT_DATA, the job's
`memory_cap`), on synthetic LMDBs of the net's item shape; the modes take turns (their order rotates each repeat) so
that the machine's drift falls on each alike. The cap is the net's own: the smallest whole MiB at which the planner
(JobManager.preview) trains the wanted batch in one pass with the test nets apart, where shared, which holds the test
nets beside the train net, needs more iter_size passes. On this machine (no GPU) the tester shares the trainer's
device: at each test interval the trainer snapshots and stops, a tester tests the snapshot, and a new trainer
resumes from it. Reported per case and mode:

* the train batch planned (batch_size x iter_size) and the one trained (auto: each attempt's, it may replan);
* one training iteration alone, per effective sample (what the larger batch gains, pauses and tests aside);
* the set-up per test interval as the back end measures it (TesterReport.setup_seconds: the trainer's snapshot,
  exit and restart, and the tester's start; shared: none), and as the wall clock shows it here (`pause_walls`);
* the time per effective training sample: the job's wall time (started to finished: construction, training, every
  test pass and pause, any retry) over the samples it trained forward (iterations x batch_size x iter_size); and
  its children's CPU time (user + sys) per sample, less bent by other work on the machine;
* which placement `auto` ended with (measured on the job's first interval; past STOP_COST_LIMIT it replans shared),
  and whether that is the faster of shared and apart as measured here.

The intervals vary so that both outcomes can occur: "short" where the pauses should cost more than apart's larger
batch gains, "medium" where the batch should pay for them though they are not under 5% of an interval, "long"
where the set-up is under 5%. Every job is bounded (`--job-seconds`, then cancelled), and the run by `--budget`
(no repeat starts past it; the table says which did not run).

    .venv/bin/python bench/test_net_apart.py [--repeats 2] [--only NAME,NAME] [--quick] [--no-write] [--raw PATH]

`--quick` is a rehearsal (shorter intervals, one repeat, the docs left alone). Writes the tables into
docs/benchmarks.md between the `test-net-apart` markers, and every run's figures to var/bench/test-net-apart.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from google.protobuf import text_format
from report import replace_section
from test_jobs_fixtures import write_lmdb
from zoo_cases import CASES_BY_NAME

from digits_memplugin.core.layers.base import PARAMS, PHASE_TRAIN
from digits_memplugin.core.planning.apart import STOP_COST_LIMIT
from digits_memplugin.core.planning.job_plan import CPU_SAFETY_MARGIN
from digits_memplugin.core.proto import caffe_pb2
from digits_memplugin.core.prototxt import parse_net
from digits_memplugin.devices.reader import DeviceReader
from digits_memplugin.jobs.definition.request import JobRequest, parse_job_request
from digits_memplugin.jobs.manager import JobManager, ManagerConfig
from digits_memplugin.jobs.store.records import FINAL_STATES, Attempt, Job

MiB = 1 << 20
MODES = ("shared", "apart", "auto")
SECTION = "test-net-apart"
SNAPSHOT_ROOM = 3.0
"""Room kept in each job's safety margin for a snapshot, in copies of the weights: writing a `.caffemodel` (and a
`.solverstate`) on the CPU copies every param blob into a message first (Blob::ToProto, growing a repeated field;
peak RSS +1.7x the weights for AlexNet here, +2.2x for LeNet, next to nothing with HDF5 snapshots), which the
planner does not count. With no room, at the planner's own caps, the apart trainer of the MNIST siamese net ran out
of memory at its first interval's snapshot and AlexNet under shared at its final one, at batch 1, five times; with
room for two copies, auto's shared attempt after its replan (a trainer resumed from a snapshot) still did."""


@dataclasses.dataclass(frozen=True)
class Net:
    """A zoo net as the benchmark trains it."""

    name: str
    wanted: int
    """The train batch asked for (`batch`): the effective batch every plan keeps (batch_size x iter_size >= it)."""
    item: tuple[int, int, int]
    """The LMDB items' shape (channels, height, width)."""
    test_iter: int = 2
    """Test batches per test pass (at the net's own test batch)."""
    crop: int | None = None
    """A crop_size replacing the net's (a reduced input), or None."""
    train_items: int = 1000
    test_items: int = 200
    note: str = ""

    @property
    def label(self) -> str:
        return self.name + (f" ({self.crop} x {self.crop} crops)" if self.crop else "")


@dataclasses.dataclass(frozen=True)
class Case:
    net: Net
    interval: int
    """test_interval (the snapshot interval of the test nets apart)."""
    intervals: int
    """max_iter = interval x intervals (a test at 0 and at each interval)."""
    kind: str
    """"short": the pauses should cost more than apart's batch gains; "medium": apart's batch should pay for its
    pauses, though they are not under 5% of the interval; "long": the set-up is under 5% of the interval."""
    first: bool = False
    """Run before the others in each repeat (the close cases, which most need their repeats within the budget)."""

    @property
    def key(self) -> str:
        return f"{self.net.name}@{self.interval}"


LENET = Net("caffe_lenet", 512, (1, 28, 28))
CIFAR = Net("caffe_cifar10_quick", 256, (3, 32, 32))
SIAMESE = Net("caffe_mnist_siamese", 256, (2, 28, 28), note="its data layer read from LMDB (the zoo's is LevelDB)")
ALEXNET = Net("caffe_alexnet", 32, (3, 136, 136), test_iter=1, crop=128, train_items=256, test_items=50,
              note="128 x 128 crops of 136 x 136 items (the zoo's 227 of 256) so that it trains on two cores; its "
              "own test batch 50")
CASES = [
    Case(LENET, 10, 3, "short"),
    Case(LENET, 160, 2, "long", first=True),
    Case(CIFAR, 4, 3, "short"),
    Case(SIAMESE, 10, 3, "short"),
    Case(ALEXNET, 1, 3, "short"),
    Case(ALEXNET, 8, 5, "medium", first=True),  # 5 intervals: room for auto to time one shared and go back apart
]
QUICK = {"caffe_lenet@10": 4, "caffe_cifar10_quick@4": 2, "caffe_mnist_siamese@10": 4, "caffe_alexnet@1": 1,
         "caffe_alexnet@8": 2, "caffe_lenet@160": 16}
"""--quick: each case's interval (one repeat): the machinery, not the figures."""


# --- the nets and their data ------------------------------------------------------------------------------------


def net_text(net: Net) -> tuple[str, str]:
    """The zoo net and solver, with the data layers reading LMDBs (sources come from the job's `data`) and the
    mean file the one written beside the data; a reduced crop where the net asks for one."""
    zoo = CASES_BY_NAME[net.name]
    text, solver = zoo.texts()
    assert solver is not None, net.name
    param = parse_net(text, zoo.net)
    for layer in param.layer:
        if layer.type != "Data":
            continue
        layer.data_param.backend = caffe_pb2.DataParameter.LMDB
        if layer.transform_param.mean_file:
            layer.transform_param.mean_file = f"{net.name}_mean.binaryproto"
        if net.crop:
            layer.transform_param.crop_size = net.crop
    return text_format.MessageToString(param), solver


def write_data(net: Net, root: Path) -> None:
    write_lmdb(root / f"{net.name}_train_lmdb", records=net.train_items, shape=net.item)
    write_lmdb(root / f"{net.name}_test_lmdb", records=net.test_items, shape=net.item)
    mean = caffe_pb2.BlobProto()
    mean.shape.dim.extend([1, *net.item])
    mean.data.extend([100.0] * (net.item[0] * net.item[1] * net.item[2]))
    (root / f"{net.name}_mean.binaryproto").write_bytes(mean.SerializeToString())


def margin_for(cap: int, params: int) -> float:
    """The job's safety margin under `cap`: the CPU's own, and room for a snapshot's copy of the weights."""
    return round(CPU_SAFETY_MARGIN + SNAPSHOT_ROOM * params / cap, 4)


def params_bytes(manager: JobManager, case: Case) -> int:
    """The train net's weights (bytes of param data), as the estimator counts them."""
    preview = manager.preview(request(case, "shared", 1 << 34, case.interval), "cpu")
    report = preview.definition.estimator("cpu").report(case.net.wanted, None)[0]
    return sum(layer.categories.get(PARAMS, 0) for layer in report.layers if layer.phase == PHASE_TRAIN)


def request(case: Case, mode: str, cap: int, interval: int, params: int | None = None) -> JobRequest:
    net = case.net
    text, solver = net_text(net)
    body: dict[str, Any] = {
        "net": text, "solver": solver, "name": f"{case.key} {mode}", "device": "cpu", "batch": net.wanted,
        "data": {"train": f"{net.name}_train_lmdb", "test": f"{net.name}_test_lmdb"},
        "max_iter": interval * case.intervals, "test_interval": interval, "test_iter": net.test_iter,
        "test_net": mode, "memory_cap": cap,
    }
    if params is not None:
        body["fallback"] = {"safety_margin": margin_for(cap, params)}
    parsed, errors = parse_job_request(body, default_attempts=5)
    if parsed is None:
        raise RuntimeError(f"{case.key}: {errors}")
    return parsed


def plan_of(
    manager: JobManager, case: Case, mode: str, cap: int, interval: int, params: int
) -> tuple[int, int] | None:
    if margin_for(cap, params) >= 0.9:
        return None  # a cap the weights' copy alone nearly fills
    decision = manager.preview(request(case, mode, cap, interval, params), "cpu").decision
    return None if decision.plan is None else (decision.plan.batch_size, decision.plan.iter_size)


def choose_cap(
    manager: JobManager, case: Case, interval: int, params: int
) -> tuple[int, tuple[int, int], tuple[int, int]]:
    """The smallest whole MiB at which apart plans the wanted batch in one pass (bisection on the planner), with
    the plans of apart and shared there; shared must need more passes there, or the case shows nothing."""
    whole = (case.net.wanted, 1)
    lo, hi = 8, 64

    def plan(mode: str, mib: int) -> tuple[int, int] | None:
        return plan_of(manager, case, mode, mib * MiB, interval, params)

    while plan("apart", hi) != whole:
        lo, hi = hi, hi * 2
        if hi > 16384:
            raise RuntimeError(f"{case.key}: apart does not plan {whole} under 16 GiB")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if plan("apart", mid) == whole else (mid, hi)
    apart, shared = plan("apart", hi), plan("shared", hi)
    assert apart is not None
    if shared is None or shared[1] <= 1:
        raise RuntimeError(f"{case.key}: at {hi} MiB shared plans {shared}: the test net holds nothing back")
    return hi * MiB, apart, shared


# --- one job ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    mode: str
    status: str
    message: str
    wall: float
    cpu: float
    samples: int
    attempts: list[dict[str, Any]]
    setup: float | None = None
    interval_seconds: float | None = None
    stop_cost: float | None = None
    pause_walls: list[float] = dataclasses.field(default_factory=list)
    step: float | None = None
    """Median seconds of one training iteration alone (between two iteration records with nothing between)."""

    @property
    def ok(self) -> bool:
        return self.status == "done" and self.samples > 0

    @property
    def per_sample(self) -> float:
        return self.wall / self.samples

    @property
    def cpu_per_sample(self) -> float:
        return self.cpu / self.samples

    @property
    def ended_with(self) -> str:
        """The placement the job trained its last attempt with."""
        return str(self.attempts[-1]["test_net"]) if self.attempts else "-"

    @property
    def replanned(self) -> bool:
        return any(a["status"] == "replanned" for a in self.attempts)

    @property
    def trained(self) -> str:
        return " then ".join(f"{a['batch_size']} x {a['iter_size']}" for a in self.attempts)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def records(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def pause_walls(folder: Path) -> list[float]:
    """Each pause's wall time, from the attempt's records: from the paused trainer's last record of training (its
    last iteration, or its construction) to the next trainer's construction, less the tester's forward passes
    (from its construction to its `tested`), which the test nets shared run too."""
    trainer = records(folder / "progress.jsonl")
    tested = {}
    constructed_at: dict[int, float] = {}
    for record in records(folder / "tester" / "progress.jsonl"):
        if record["event"] == "constructed":
            constructed_at[record["iteration"]] = record["time"]
        elif record["event"] == "tested" and record["iteration"] in constructed_at:
            tested[record["iteration"]] = record["time"] - constructed_at[record["iteration"]]
    walls = []
    last: float | None = None
    paused: int | None = None
    for record in trainer:
        event = record["event"]
        if event == "constructed" and paused is not None and last is not None:
            walls.append(record["time"] - last - tested.get(paused, 0.0))
            paused = None
        if event in ("constructed", "iteration"):
            last = record["time"]
        elif event == "paused":
            paused = record["iteration"]
    return walls


def step_seconds(folders: Sequence[Path]) -> float | None:
    """The median time of one training iteration alone: between two consecutive iteration records of one trainer
    process with no other record (a test, a snapshot, a pause) between them."""
    steps = []
    for folder in folders:
        previous = None
        for record in records(folder / "progress.jsonl"):
            if record["event"] == "iteration" and previous is not None and previous["event"] == "iteration":
                steps.append(record["time"] - previous["time"])
            previous = record
    return median(steps)


def run_job(
    manager: JobManager, case: Case, mode: str, cap: int, interval: int, params: int, bound: float
) -> Run:
    before = children_cpu()
    job = manager.submit(request(case, mode, cap, interval, params))
    ended = manager.wait(job.id, timeout=bound)
    if ended.status not in FINAL_STATES:
        manager.cancel(job.id)
        ended = manager.wait(job.id, timeout=120)
    cpu = children_cpu() - before
    attempts = manager.attempts(job.id)
    run = Run(mode, ended.status, ended.message or "", wall=job_wall(ended), cpu=cpu,
              samples=trained_samples(attempts), attempts=[attempt_row(a) for a in attempts])
    if attempts:  # the placement the job ended with (auto's last attempt)
        run.step = step_seconds([manager.folder(job.id) / "attempts" / str(attempts[-1].number)])
    first_apart = next((a for a in attempts if a.test_net == "apart" and a.tester), None)
    if first_apart is not None:
        tester = first_apart.tester or {}
        run.setup, run.interval_seconds = tester.get("setup_seconds"), tester.get("interval_seconds")
        run.stop_cost = tester.get("stop_cost")
        run.pause_walls = pause_walls(manager.folder(job.id) / "attempts" / str(first_apart.number))
    manager.delete(job.id)  # the snapshots (AlexNet's are 140 MB each) go with it
    return run


def job_wall(job: Job) -> float:
    if job.started_at is None or job.finished_at is None:
        return float("nan")
    return job.finished_at - job.started_at


def trained_samples(attempts: Sequence[Attempt]) -> int:
    """The effective samples the job's training went forward by: each attempt's iterations past where the job had
    got to (an attempt resumed from an earlier snapshot trains some again), times its batch_size x iter_size."""
    reached, samples = 0, 0
    for attempt in sorted(attempts, key=lambda a: a.number):
        if attempt.end_iteration is None:
            continue
        samples += max(0, attempt.end_iteration - max(attempt.start_iteration, reached)) * (
            attempt.batch_size * attempt.iter_size)
        reached = max(reached, attempt.end_iteration)
    return samples


def attempt_row(attempt: Attempt) -> dict[str, Any]:
    return {"status": attempt.status, "test_net": attempt.test_net, "batch_size": attempt.batch_size,
            "iter_size": attempt.iter_size, "start": attempt.start_iteration, "end": attempt.end_iteration,
            "message": attempt.message}


# --- the run ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class CaseResult:
    case: Case
    interval: int
    cap: int
    params: int
    plans: dict[str, tuple[int, int] | None]
    runs: dict[str, list[Run]] = dataclasses.field(default_factory=lambda: {mode: [] for mode in MODES})


def measure(cases: Sequence[Case], repeats: int, quick: bool, job_seconds: float, budget: float,
            workdir: Path) -> tuple[list[CaseResult], float, list[str]]:
    root = workdir / "datasets"
    root.mkdir()
    for net in {case.net.name: case.net for case in cases}.values():
        write_data(net, root)
    manager = JobManager(ManagerConfig(data_dir=workdir / "data", dataset_roots=(root,), poll_seconds=0.2),
                         DeviceReader())
    manager.start()
    started = time.monotonic()
    notes: list[str] = []
    try:
        results = []
        for case in cases:
            interval = QUICK[case.key] if quick else case.interval
            params = params_bytes(manager, case)
            cap, apart, shared = choose_cap(manager, case, interval, params)
            plans = {mode: plan_of(manager, case, mode, cap, interval, params) for mode in MODES}
            results.append(CaseResult(case, interval, cap, params, plans))
            print(f"{case.key}: cap {cap // MiB} MiB, margin {margin_for(cap, params):.1%}: shared {shared}, "
                  f"apart {apart}, auto {plans['auto']}", flush=True)
        for repeat in range(1 if quick else repeats):
            for index, result in sorted(enumerate(results), key=lambda item: not item[1].case.first):
                case = result.case
                if time.monotonic() - started > budget:
                    notes.append(f"{case.key}: repeat {repeat + 1} not run (past the {budget:.0f} s budget)")
                    continue
                shift = (repeat + index) % len(MODES)
                for mode in MODES[shift:] + MODES[:shift]:
                    run = run_job(manager, case, mode, result.cap, result.interval, result.params, job_seconds)
                    result.runs[mode].append(run)
                    print(summary(case, run), flush=True)
        return results, time.monotonic() - started, notes
    finally:
        manager.stop()


def summary(case: Case, run: Run) -> str:
    pauses = ", ".join(f"{w:.2f}" for w in run.pause_walls)
    cost = "" if run.setup is None else (
        f"; set-up {run.setup:.2f} s / interval {run.interval_seconds} s = {run.stop_cost or 0:.1%}; pauses [{pauses}]"
    )
    return (f"  {case.key} {run.mode}: {run.status}, {run.trained} ({run.ended_with}), {run.samples} samples in "
            f"{run.wall:.1f} s = {run.per_sample * 1e3:.3f} ms/sample, cpu {run.cpu_per_sample * 1e3:.3f}, "
            f"step {run.step or 0:.3f} s{cost}" + "".join(
                f"\n    attempt {a['test_net']} {a['batch_size']} x {a['iter_size']} {a['start']}-{a['end']}: "
                f"{a['status']}: {(a['message'] or '')[:300]}" for a in run.attempts))


# --- the tables -------------------------------------------------------------------------------------------------


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def spread(values: Sequence[float], scale: float = 1e3) -> str:
    if not values:
        return "-"
    mid = statistics.median(values) * scale
    if len(values) == 1:
        return f"{mid:.3f}"
    return f"{mid:.3f} ({min(values) * scale:.3f}-{max(values) * scale:.3f})"


def plan_words(plan: tuple[int, int] | None) -> str:
    return "-" if plan is None else f"{plan[0]} x {plan[1]}"


def step_per_sample(run: Run) -> float | None:
    """One iteration's training alone per effective sample, in the job's last attempt (the placement it ended
    with) at its batch_size x iter_size."""
    if run.step is None or not run.attempts:
        return None
    last = run.attempts[-1]
    return run.step / (last["batch_size"] * last["iter_size"])


def verdict(result: CaseResult) -> dict[str, Any]:
    """Which of shared and apart was faster here (median time per effective sample), by how much, whether their
    repeats overlap, what apart's batch gains in training alone, and what auto measured and ended with."""
    good = {mode: [run for run in result.runs[mode] if run.ok] for mode in MODES}
    per = {mode: [run.per_sample for run in good[mode]] for mode in MODES}
    found: dict[str, Any] = {"per": per}
    if not per["shared"] or not per["apart"]:
        return found
    shared, apart = median(per["shared"]), median(per["apart"])
    assert shared is not None and apart is not None
    faster, slower = ("apart", "shared") if apart < shared else ("shared", "apart")
    found["faster"] = faster
    found["ratio"] = apart / shared
    found["clear"] = max(per[faster]) < min(per[slower])
    steps = {mode: median([x for x in map(step_per_sample, good[mode]) if x is not None]) for mode in MODES}
    found["gain"] = None if not steps["shared"] or steps["apart"] is None else 1 - steps["apart"] / steps["shared"]
    endings = [run.ended_with for run in good["auto"]]
    found["auto"] = endings
    auto = median(per["auto"])
    found["auto_ratio"] = None if auto is None else auto / min(shared, apart)
    found["auto_cost"] = median([run.stop_cost for run in good["auto"] if run.stop_cost is not None])
    return found


def render(results: Sequence[CaseResult], elapsed: float, command: str, notes: Sequence[str]) -> str:
    lines = [
        (f"Command: `{command}` ({elapsed:.0f} s this run, {os.cpu_count()} cores shared with other work, no GPU; "
         "every job a real training run of the bundled CPU pycaffe through a JobManager, under its cap "
         "(RLIMIT_DATA)). **CPU figures only**: with no second device the tester shares the trainer's, so the "
         "trainer stops at every test interval; the placement on another device (a second GPU, where training goes "
         "on while the tester runs) is not measured here, nor any GPU's batch-size speed-up."),
        "",
        ("Per case and mode: the train batch planned for the cap (batch_size x iter_size) and the one trained (auto: "
         "each attempt's); one iteration's training alone per effective sample (between two iteration records with "
         "nothing between; auto: in its last attempt); the set-up per test interval as the back end measures it "
         "(TesterReport.setup_seconds; shared: none), and the wall each pause really took (the trainer's last "
         "record before it to the next trainer's construction, less the tester's own forward passes, which shared "
         "runs too); the stop cost the back end measured (set-up over one interval's training); the job's wall time "
         "(construction, training, every test pass and pause, any retry) and its children's CPU time, per effective "
         "training sample. Times per sample are ms, median over the repeats (min-max); \"vs shared\" is the ratio of medians."),
        "",
        ("| case | cap (margin) | mode | planned | trained | training alone | set-up per interval | wall per pause "
         "| stop cost | wall per sample | vs shared | CPU per sample | runs |"),
        "|---|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        case = result.case
        good = {mode: [run for run in result.runs[mode] if run.ok] for mode in MODES}
        shared_median = median([run.per_sample for run in good["shared"]])
        for mode in MODES:
            runs = good[mode]
            failed = [run for run in result.runs[mode] if not run.ok]
            setups = [run.setup for run in runs if run.setup is not None]
            walls = [w for w in (median(run.pause_walls) for run in runs if run.pause_walls) if w is not None]
            costs = [run.stop_cost for run in runs if run.stop_cost is not None]
            wall = median([run.per_sample for run in runs])
            trained = sorted({run.trained for run in runs}) or ["-"]
            ratio = "-" if wall is None or not shared_median else f"{wall / shared_median:.2f}"
            alone = [x for x in map(step_per_sample, runs) if x is not None]
            ran = f"{len(runs)}" + (f" ({len(failed)} failed: {failed[0].status}: {failed[0].message[:160]})"
                                    if failed else "")
            lines.append(
                f"| {case.net.label}, wanted {case.net.wanted}, test every {result.interval} of "
                f"{result.interval * case.intervals} ({case.kind}) | {result.cap // MiB} MiB "
                f"({margin_for(result.cap, result.params):.1%}) | {mode} | {plan_words(result.plans[mode])} | "
                f"{' / '.join(trained)} | {spread(alone)} | {'-' if mode == 'shared' else _seconds(setups)} | "
                f"{'-' if mode == 'shared' else _seconds(walls)} | "
                f"{'-' if not costs else _percent(costs)} | {spread([run.per_sample for run in runs])} | {ratio} | "
                f"{spread([run.cpu_per_sample for run in runs])} | {ran} |"
            )
    lines += [
        "",
        (f"`auto` chooses apart where it trains a larger batch or fewer passes (every case here) and keeps it only "
         f"while the set-up per interval, measured on the job's first interval, is under {STOP_COST_LIMIT:.0%} of "
         "the interval's training; past it the attempt ends \"replanned\" and the job goes on shared from the "
         "snapshot, timing one interval so, and goes back apart where an interval apart, its stop included, was "
         "faster. \"Faster\" is the lower median wall time per effective sample of shared and apart (\"clear\" "
         "when their repeats do not overlap); \"apart's batch gains\" is one training iteration's time alone, "
         "1 - apart / shared: apart pays where the set-up per interval is under about that share of an interval."),
        "",
        ("| case | apart's batch gains | stop cost auto measured | auto ended with | faster, as measured | "
         "apart / shared | clear | auto picked the faster | auto / the faster |"),
        "|---|---:|---:|---|---|---:|---|---|---:|",
    ]
    for result in results:
        case = result.case
        found = verdict(result)
        where = f"{case.net.name}, every {result.interval} ({case.kind})"
        if "faster" not in found:
            lines.append(f"| {where} | - | - | - | not measured | - | - | - | - |")
            continue
        endings = found["auto"]
        ended = " / ".join(sorted(set(endings))) if endings else "-"
        right = ("-" if not endings else "yes" if all(e == found["faster"] for e in endings)
                 else "**no**" if all(e != found["faster"] for e in endings) else "mixed")
        cost = "-" if found["auto_cost"] is None else f"{found['auto_cost']:.1%}"
        gain = "-" if found["gain"] is None else f"{found['gain']:+.0%}"
        auto_ratio = "-" if found["auto_ratio"] is None else f"{found['auto_ratio']:.2f}"
        lines.append(
            f"| {where} | {gain} | {cost} | {ended} | {found['faster']} | {found['ratio']:.2f} | "
            f"{'yes' if found['clear'] else 'no (repeats overlap)'} | {right} | {auto_ratio} |"
        )
    net_notes = [f"{net.label}: {net.note}." for net in {r.case.net.name: r.case.net for r in results}.values()
                 if net.note]
    margin = (f"Each job's safety margin is the CPU's {CPU_SAFETY_MARGIN:.0%} plus {SNAPSHOT_ROOM:g} copies of the "
              "train net's weights over the cap: room for a `.caffemodel` snapshot, which the planner does not "
              "count (see SNAPSHOT_ROOM in the script).")
    lines += ["", *[f"- {note}" for note in [margin, *net_notes, *notes]]]
    return "\n".join(lines)


def _percent(values: Sequence[float]) -> str:
    mid = statistics.median(values)
    if len(values) == 1:
        return f"{mid:.1%}"
    return f"{mid:.1%} ({min(values):.1%}-{max(values):.1%})"


def _seconds(values: Sequence[float]) -> str:
    if not values:
        return "-"
    mid = statistics.median(values)
    if len(values) == 1 or min(values) == max(values):
        return f"{mid:.2f} s"
    return f"{mid:.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="repeats of each case's three jobs")
    parser.add_argument("--only", help="comma-separated net names")
    parser.add_argument("--quick", action="store_true", help="a rehearsal: short jobs, one repeat, docs left alone")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    parser.add_argument("--job-seconds", type=float, default=600.0, help="a job past this is cancelled")
    parser.add_argument("--budget", type=float, default=1200.0, help="no repeat starts past this many seconds")
    parser.add_argument("--raw", type=Path, default=REPO / "var" / "bench" / "test-net-apart.json",
                        help="where every run's figures are written (JSON)")
    args = parser.parse_args()
    cases = [case for case in CASES if not args.only or case.net.name in args.only.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="memplugin-test-net-apart-"))
    try:
        results, elapsed, notes = measure(cases, args.repeats, args.quick, args.job_seconds, args.budget, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    command = ".venv/bin/python bench/test_net_apart.py" + "".join(f" {arg}" for arg in sys.argv[1:])
    body = render(results, elapsed, command, notes)
    print(body)
    if args.raw:
        args.raw.parent.mkdir(parents=True, exist_ok=True)
        args.raw.write_text(json.dumps([{"case": r.case.key, "cap": r.cap, "interval": r.interval, "plans": r.plans,
                                         "runs": {m: [dataclasses.asdict(x) for x in runs] for m, runs in
                                                  r.runs.items()}} for r in results], indent=1))
    if not (args.no_write or args.quick):
        replace_section(REPO / "docs" / "benchmarks.md", SECTION, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
