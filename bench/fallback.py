"""The out-of-memory fallback against the rules other tools use, on real capped training attempts.

For each zoo net and memory cap, every policy starts from a batch that does not fit (the wanted batch: a power of
two at least twice the true largest) and tries batches until one trains:

* ours: the planner's batch for the cap, then core.planning.fallback's recalibration after each failure (job manager rules);
* halving: the batch halves after each failure (Accelerate's find_executable_batch_size before 0.21);
* x0.9: the batch shrinks by 10% after each failure (Accelerate's current rule);
* power: from batch 2, doubling while it trains; the last batch that trained (Lightning's BatchSizeFinder "power").

An attempt is a real training child (jobs.child.runner) under the cap (RLIMIT_DATA): the solver is built, the test pass
at start runs, then one training iteration: the peak is reached by then (Caffe frees nothing). Whether a batch
fits a (net, cap) is measured once and cached, with its duration and the failure's numbers, so that all the
policies are judged on the same ground truth; the true largest batch is found by bisection on the same cache.
"Time" is the sum of the measured durations of the attempts a policy made (and, for ours, the estimator's time),
i.e. the wall time until training runs.

    .venv/bin/python bench/fallback.py [--only NAME,NAME] [--no-write] [--cache PATH]

Writes the table into docs/benchmarks.md between the `fallback` markers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from google.protobuf import text_format
from report import replace_section
from zoo_cases import CASES_BY_NAME

from digits_memplugin.core.oom import OUTCOME_OUT_OF_MEMORY, OUTCOME_SUCCESS
from digits_memplugin.core.planning.fallback import Failure, Policy, decide
from digits_memplugin.core.planning.job_plan import CPU_SAFETY_MARGIN
from digits_memplugin.core.prototxt import parse_net
from digits_memplugin.jobs.backends.attempt_process import AttemptProcess
from digits_memplugin.jobs.child.attempt_spec import AttemptDevice, AttemptSpec
from digits_memplugin.jobs.child.runner import THREAD_STACK_BYTES
from digits_memplugin.jobs.definition.attempt_files import test_iters, write_attempt
from digits_memplugin.jobs.definition.definition import JobDefinition
from digits_memplugin.jobs.definition.loading import load_definition
from digits_memplugin.measure.runner import prepare_net

MiB = 1 << 20
CASES: list[tuple[str, int]] = [
    ("caffe_lenet", 64 * MiB),
    ("caffe_lenet", 256 * MiB),
    ("digits_lenet", 96 * MiB),
    ("caffe_cifar10_quick", 64 * MiB),
    ("caffe_cifar10_quick", 256 * MiB),
    ("caffe_cifar10_full", 128 * MiB),
    ("caffe_cifar10_full", 384 * MiB),
    ("caffe_mnist_autoencoder", 64 * MiB),
    ("caffe_mnist_autoencoder", 192 * MiB),
    ("caffe_mnist_siamese", 64 * MiB),
    ("caffe_mnist_siamese", 256 * MiB),
    ("squeezenet_v1.1", 1024 * MiB),
]
POLICIES = ("ours", "halving", "x0.9", "power")


@dataclasses.dataclass
class Trial:
    fits: bool
    seconds: float
    status: str
    requested_bytes: int | None = None
    peak_bytes: int | None = None


class Case:
    """One (net, cap): its definition on synthetic data, and its trials (cached on disk)."""

    def __init__(self, name: str, cap: int, workdir: Path, cache: dict[str, Any]) -> None:
        self.name, self.cap = name, cap
        zoo = CASES_BY_NAME[name]
        net_text, solver_text = zoo.texts()
        self.folder = workdir / f"{name}-{cap // MiB}"
        data = self.folder / "data"
        prepared = prepare_net(parse_net(net_text, zoo.net), data, zoo.data_shapes)
        # Nets without a solver get SGD with DIGITS' stages (harmless for nets without stage rules).
        solver = solver_text or (
            'base_lr: 0.01 lr_policy: "fixed" test_iter: 1 test_interval: 100 max_iter: 1 '
            'train_state { stage: "train" } test_state { stage: "val" }'
        )
        self.definition: JobDefinition = load_definition(
            text_format.MessageToString(prepared), solver, folder=self.folder, roots=[data],
            data_shapes=zoo.data_shapes, classes=zoo.classes, max_iter=1,
        )
        self.cache = cache.setdefault(f"{name}@{cap}", {})
        self.runs = 0

    @property
    def overhead(self) -> int:
        return self.definition.threads * THREAD_STACK_BYTES

    def footprint(self, batch: int, test_batch: int | None) -> int:
        return self.definition.estimator("cpu").report(batch, test_batch)[0].total_bytes

    def trial(self, batch: int, test_batch: int | None = None) -> Trial:
        key = f"{batch}/{test_batch}"
        if key not in self.cache:
            self.cache[key] = dataclasses.asdict(self._run(batch, test_batch))
        return Trial(**self.cache[key])

    def _run(self, batch: int, test_batch: int | None) -> Trial:
        """One real attempt under the cap: construction, the test pass at start, one training iteration."""
        self.runs += 1
        attempt = f"attempts/{self.runs}"
        files = write_attempt(
            self.definition, self.folder, attempt, batch_size=batch, iter_size=1, test_batch=test_batch, gpu=None
        )
        spec = AttemptSpec(
            job_id=self.name, attempt=self.runs, solver=files.solver, log=f"{attempt}/caffe.log",
            progress=f"{attempt}/progress.jsonl", device=AttemptDevice("cpu"), batch_size=batch, iter_size=1,
            resume=None, memory_cap=self.cap, max_iter=1,
            test_interval=1 if self.definition.training.tests else 0,
            test_iter=tuple(1 for _ in test_iters(self.definition, test_batch)),  # one pass holds all the memory
            test_initialization=True, snapshot=0, snapshot_after_train=False,
            snapshot_prefix=files.snapshot_prefix, snapshot_format="BINARYPROTO",
            schedule=self.definition.schedule.to_dict(), read_paths=files.reads, write_paths=files.writes,
        )
        spec.write(self.folder / attempt / "attempt.json")
        log = f"{attempt}/caffe.log"
        trained = []

        def on_record(record: dict[str, Any]) -> None:
            if record.get("event") == "iteration":
                trained.append(time.monotonic())

        process = AttemptProcess(
            self.folder, f"{attempt}/attempt.json", log,
            environment={"CUDA_VISIBLE_DEVICES": "", "OPENBLAS_NUM_THREADS": "1"}, on_record=on_record,
        )
        started = time.monotonic()
        process.start()
        result = process.wait()
        ended = trained[0] if trained else time.monotonic()
        status = result.outcome.status
        if status not in (OUTCOME_SUCCESS, OUTCOME_OUT_OF_MEMORY):
            raise RuntimeError(f"{self.name} batch {batch}: {status}: {result.outcome.message}")
        found = result.outcome.out_of_memory
        return Trial(
            fits=status == OUTCOME_SUCCESS, seconds=round(ended - started, 3), status=status,
            requested_bytes=None if found is None else found.requested_bytes, peak_bytes=result.peak_bytes,
        )


def true_largest(case: Case, wanted: int) -> int:
    """Bisection on real trials: the largest batch that trains (1 is assumed to)."""
    lo, hi = 1, wanted
    if not case.trial(1).fits:
        raise RuntimeError(f"{case.name}: batch 1 does not fit {case.cap // MiB} MiB; pick a larger cap")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if case.trial(mid).fits else (lo, mid)
    return lo


@dataclasses.dataclass
class Outcome:
    failed: int
    seconds: float
    batch: int
    iter_size: int = 1


def ours(case: Case, wanted: int | None, policy: Policy) -> Outcome:
    """The job manager's rules (jobs/scheduling/attempt_loop.py): decide, run, recalibrate from the failure, decide again."""
    failures: list[Failure] = []
    seconds = 0.0
    limit = case.cap - case.overhead
    for made in range(policy.max_attempts):
        began = time.monotonic()
        decision = decide(
            policy, case.footprint, wanted, limit, failures, attempts_made=made,
            test_batch=case.definition.test_batch, test_iter=case.definition.test_iter,
        )
        seconds += time.monotonic() - began
        if decision.plan is None:
            raise RuntimeError(f"{case.name}: {decision.message}")
        test_batch = decision.test_plan["batch_size"] if decision.test_plan else None
        trial = case.trial(decision.plan.batch_size, test_batch)
        seconds += trial.seconds
        if trial.fits:
            return Outcome(len(failures), seconds, decision.plan.batch_size, decision.plan.iter_size)
        failures.append(
            Failure(
                decision.plan.batch_size, test_batch or case.definition.test_batch, limit,
                requested_bytes=trial.requested_bytes,
                used_bytes=None if trial.peak_bytes is None else max(0, trial.peak_bytes - case.overhead),
            )
        )
    raise RuntimeError(f"{case.name}: no batch within {policy.max_attempts} attempts")


def shrinking(case: Case, wanted: int, step: Callable[[int], int]) -> Outcome:
    batch, failed, seconds = wanted, 0, 0.0
    while True:
        trial = case.trial(batch)
        seconds += trial.seconds
        if trial.fits:
            return Outcome(failed, seconds, batch)
        failed += 1
        batch = max(1, min(batch - 1, step(batch)))


def power(case: Case, wanted: int) -> Outcome:
    batch, last, failed, seconds = 2, 0, 0, 0.0
    while batch <= 4 * wanted:
        trial = case.trial(batch)
        seconds += trial.seconds
        if not trial.fits:
            failed += 1
            break
        last, batch = batch, batch * 2
    if last == 0:  # not even 2: Lightning would give up; take 1 to compare
        seconds += case.trial(1).seconds
        last = 1
    return Outcome(failed, seconds, last)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated net names")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    parser.add_argument("--cache", type=Path, default=REPO / "var" / "bench" / "fallback-trials.json")
    args = parser.parse_args()
    cache: dict[str, Any] = json.loads(args.cache.read_text()) if args.cache.is_file() else {}
    policy = Policy(safety_margin=CPU_SAFETY_MARGIN)  # what the job manager uses on the CPU
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as workdir:
        for name, cap in CASES:
            if args.only and name not in args.only.split(","):
                continue
            case = Case(name, cap, Path(workdir), cache)
            estimated = decide(policy, case.footprint, None, cap - case.overhead,
                               test_batch=case.definition.test_batch, test_iter=case.definition.test_iter)
            if estimated.plan is None:
                raise RuntimeError(f"{name}: {estimated.message}")
            wanted = 1 << math.ceil(math.log2(2 * estimated.plan.batch_size + 1))
            while case.trial(wanted).fits:
                wanted *= 2
            truth = true_largest(case, wanted)
            results = {
                "ours": ours(case, None, policy),
                "ours (keep)": ours(case, wanted, policy),
                "halving": shrinking(case, wanted, lambda b: b // 2),
                "x0.9": shrinking(case, wanted, lambda b: int(b * 0.9)),
                "power": power(case, wanted),
            }
            rows.append({"name": name, "cap": cap, "wanted": wanted, "truth": truth, "results": results})
            args.cache.parent.mkdir(parents=True, exist_ok=True)
            args.cache.write_text(json.dumps(cache, indent=1, sort_keys=True))
            print(f"{name} @ {cap // MiB} MiB: wanted {wanted}, largest {truth}: " + ", ".join(
                f"{label} {r.failed} failed {r.seconds:.1f}s batch {r.batch}x{r.iter_size}" for label, r in results.items()
            ), flush=True)
    body = render(rows, time.monotonic() - started)
    print(body)
    if not args.no_write:
        replace_section(REPO / "docs" / "benchmarks.md", "fallback", body)
    return 0


def render(rows: list[dict[str, Any]], elapsed: float) -> str:
    labels = ["ours", "halving", "x0.9", "power"]
    lines = [
        (
            "Command: `.venv/bin/python bench/fallback.py` (every attempt a real CPU training child under an "
            f"RLIMIT_DATA cap; trials cached per net, cap and batch; {elapsed:.0f} s this run)."
        ),
        "",
        (
            "Each cell: failed attempts / seconds until training runs / final batch (its share of the true "
            "largest). \"ours\" is the job manager's policy with batch \"auto\"; \"keep\" is the same policy asked "
            "to keep the wanted effective batch (batch x iter_size >= wanted), which trains at the batch shown."
        ),
        "",
        "| net | cap | wanted | true largest | " + " | ".join(labels) + " | ours, keep |",
        "|---|---:|---:|---:|" + "---|" * (len(labels) + 1),
    ]
    for row in rows:
        cells = []
        for label in labels:
            r = row["results"][label]
            cells.append(f"{r.failed} / {r.seconds:.1f} s / {r.batch} ({r.batch / row['truth']:.0%})")
        keep = row["results"]["ours (keep)"]
        cells.append(f"{keep.failed} / {keep.seconds:.1f} s / {keep.batch} x {keep.iter_size}")
        lines.append(f"| {row['name']} | {row['cap'] // MiB} MiB | {row['wanted']} | {row['truth']} | " + " | ".join(cells) + " |")
    lines += ["", "| policy | mean failed | cases with no failure | mean seconds | mean final / largest | worst |",
              "|---|---:|---:|---:|---:|---:|"]
    for label in [*labels, "ours (keep)"]:
        results = [(row["results"][label], row["truth"]) for row in rows]
        shares = [r.batch / truth for r, truth in results]
        no_failure = sum(1 for r, _ in results if r.failed == 0)
        lines.append(
            f"| {label} | {statistics.mean(r.failed for r, _ in results):.2f} | {no_failure} of {len(results)} | "
            f"{statistics.mean(r.seconds for r, _ in results):.1f} | {statistics.mean(shares):.1%} | {min(shares):.1%} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
