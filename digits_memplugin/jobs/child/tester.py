"""The tester child: the test nets of an attempt evaluated apart from its train net, on one snapshot's weights, so
that the train net can have its device alone (issue 28, `test_net: apart`).

Usage: ``python -m digits_memplugin.jobs.child.tester TESTER_JSON`` (jobs.child.tester_spec) with the job's folder
as working directory.

It runs in the conditions of the training child (jobs.child.child_process): it dies with the server, lowers its
priority, sends fd 2 to its own log, confines itself before pycaffe is loaded (reads the job's folder and the
dataset paths its spec names, writes only beneath its write folders), runs on the CPU or a GPU, and caps its data
segment above its baseline once the BLAS is warmed up. Then it builds each test net with phase TEST (only the
TEST-phase layers) from the snapshot's weights, one at a time, runs test_iter forward passes at the net's own batch,
and averages the outputs as Solver::Test does (jobs.child.runner's `averaged_test`, the runner's own code).

Records on stdout and in its progress file, as the runner writes them (jobs.child.runner.Reporter): started,
constructed, testing (during a long pass), then one "test" record per net, with the fields the runner's have
(iteration: the snapshot's; net; outputs; loss), and "tested" (with the memory figures at their largest); or
"stopped", or "error". The test records are sent
only once every net has been tested: a tester stopped (SIGINT, as the runner is; SIGTERM or SIGKILL end it
outright) or failed part-way has reported no test result at all, so that a snapshot is tested whole or not at all.
Exit status 0 after "tested" or "stopped", 3 after "error". A non-finite output is reported as it is: whether the
job stops on it is the manager's decision (core.divergence), made from the same records.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ...core.divergence import CONTINUE
from .child_process import STOP, become_child, log_line, start_caffe
from .runner import Reporter, averaged_test, read_spec, run_reported
from .tester_spec import TesterSpec

SOURCE = "tester.py"
"""The source file glog's lines of this child name."""


def evaluate_snapshot(spec: TesterSpec, report: Reporter) -> list[Any]:
    """Load the snapshot's weights into each test net, test them all, and report the results. The nets are built,
    tested and freed one at a time: LMDB refuses a second environment on one database in a process (two test nets
    reading one LMDB would hang), and one at a time the tester's peak is its largest net's
    (core.test_nets.apart_tester_memory). Nothing is left for the caller to free (jobs.child.runner.run_reported)."""
    weights = Path(spec.weights)
    if not weights.is_file():  # Caffe would abort on it (a CHECK), with no record to say why
        raise FileNotFoundError(f"the snapshot's weights {spec.weights} are not there")
    started = start_caffe(spec.device, spec.memory_cap, spec.read_paths, spec.write_paths)
    memory = started.memory
    report(
        "started", pid=os.getpid(), baseline_bytes=memory.baseline, memory_cap=spec.memory_cap,
        weights=spec.weights, iteration=spec.iteration, blas=started.blas, confinement=started.confinement,
    )
    caffe = started.caffe
    results = []
    peak: dict[str, int] = {}
    for index, test in enumerate(spec.nets):
        net = caffe.Net(test.net, caffe.TEST, level=test.level, stages=list(test.stages), weights=spec.weights)
        if index == 0:
            report("constructed", iteration=spec.iteration, **memory.fields())
        result = averaged_test(net, index, test.test_iter, report, SOURCE)
        peak = _larger(peak, memory.fields())
        del net  # its buffers freed before the next net is built (malloc reuses them)
        if result is None:
            report("stopped", iteration=spec.iteration, **memory.fields())
            return []
        results.append(result)
    for index, result in enumerate(results):
        report("test", iteration=spec.iteration, net=index, **result)
    report("tested", iteration=spec.iteration, nets=len(results), **peak)
    log_line(f"Tested {spec.weights} (iteration {spec.iteration}).", SOURCE)
    return []


def _larger(peak: dict[str, int], now: dict[str, int]) -> dict[str, int]:
    """Each memory figure at its largest so far (the nets are freed in turn, so the last reading is not the peak)."""
    return {key: max(value, peak.get(key, value)) for key, value in now.items()}


def main(argv: list[str]) -> int:
    STOP.install()  # first: a stop that comes while pycaffe loads is honoured before the first forward pass
    spec = read_spec(argv, "tester TESTER_JSON", TesterSpec.read, "tester spec")
    if isinstance(spec, int):
        return spec
    become_child(spec.nice, Path(spec.log))
    report = Reporter(sys.stdout, Path(spec.progress), CONTINUE)
    return run_reported(report, lambda: (0, evaluate_snapshot(spec, report)))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
