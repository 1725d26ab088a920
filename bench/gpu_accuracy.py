"""The device check's figures (bench/device_check.py's JSON) against the estimate, as the table docs/benchmarks.md
shows ("The GPU path on a GPU").

For each run: the estimate of the same nets (the bundle's DummyData-fed templates at the run's batch) on the run's
engine, with the CUDA context (`cuda_context_bytes`, 300 MiB by default, or --context) and without it; against NVML's
usedGpuMemory of the caffe process (everything the process holds on the device) and the probe's count of Caffe's
own cudaMalloc bytes (what the estimate without the context models). Their difference is what the device adds per
process (context, cuBLAS and cuDNN handles and workspaces of their own): its median is the calibration for
`cuda_context_bytes` the table proposes. For each search: the largest batch the estimate predicts for the free
memory measured then (no safety margin, and with the planner's 5%) against the largest batch that trained and the
smallest that failed, with the out-of-memory line Caffe wrote.

    .venv/bin/python bench/gpu_accuracy.py device_check.json [--context BYTES] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from accuracy import within_bounds
from device_check import _loader
from report import replace_section

from digits_memplugin.core.layers.base import WORKSPACE
from digits_memplugin.core.memory import DEFAULT_CUDA_CONTEXT_BYTES, MemoryOptions
from digits_memplugin.core.planning.planner import MAX_BATCH, MemoryCurve, max_batch, usable_bytes
from digits_memplugin.core.training import TrainingDefinition, training_definition

MiB = 1024 * 1024
GPU_SAFETY_MARGIN = 0.05


def definition_at(report: dict[str, Any], name: str, engine: str, batch: int) -> TrainingDefinition:
    texts = report["nets"][name][engine]
    token = str(report["plan"]["batch_token"])
    return training_definition(texts["train"].replace(token, str(batch)), texts["solver"], load=_loader(texts),
                               net_source=f"{name}/train.prototxt")


def estimate(report: dict[str, Any], name: str, engine: str, batch: int, context: int) -> tuple[int, int]:
    """(bytes with the context, workspace bytes) of the bundle's net at `batch`."""
    definition = definition_at(report, name, engine, batch)
    memory, _, _ = definition.memory(MemoryOptions(engine=engine, solver_type=definition.solver_type,
                                                   l1_regularization=definition.l1_regularization,
                                                   cuda_context_bytes=context))
    return memory.total_bytes, memory.categories[WORKSPACE]


def predicted_largest(report: dict[str, Any], name: str, engine: str, free: int, context: int, margin: float) -> int:
    def bytes_at(batch: int) -> int:
        return estimate(report, name, engine, batch, context)[0]

    return max_batch(MemoryCurve(bytes_at), usable_bytes(free, margin), limit=MAX_BATCH)


def _mib(value: int | None) -> str:
    return "" if value is None else f"{value / MiB:,.1f}"


def _pct(estimated: int, measured: int | None) -> str:
    return "" if not measured else f"{(estimated - measured) / measured:+.1%}"


def tables(report: dict[str, Any], context: int | None) -> tuple[list[str], dict[str, Any]]:
    context_bytes = DEFAULT_CUDA_CONTEXT_BYTES if context is None else context
    rows = []
    overheads = []
    for run in report["runs"]:
        name, engine, batch = run["net"], run["engine"], run["batch"]
        with_context, workspace = estimate(report, name, engine, batch, context_bytes)
        without = with_context - context_bytes
        nvml, probe = run.get("nvml_process_peak_bytes"), run.get("probe_peak_bytes")
        if run["trained"] and nvml and probe:
            overheads.append(nvml - probe)
        status = "trained" if run["trained"] else ("out of memory" if run.get("oom") else "failed")
        probe_ok = "" if not probe else ("yes" if within_bounds(without, probe) else "**no**")
        rows.append(
            f"| {name} | {engine} | {batch} | {status} | {_mib(nvml)} | {_mib(run.get('memgetinfo_peak_used_bytes'))} "
            f"| {_mib(with_context)} | {_pct(with_context, nvml)} | {_mib(probe)} | {_mib(without)} "
            f"| {_pct(without, probe)} | {probe_ok} | {_mib(run.get('probe_workspace_at_peak_bytes'))} "
            f"| {_mib(workspace)} | {_mib(nvml - probe if nvml and probe else None)} |"
        )
    calibrated = int(statistics.median(overheads)) if overheads else None
    searches = []
    for found in report["searches"]:
        name, engine, free = found["net"], found["engine"], found["free_bytes_at_start"]
        bare = predicted_largest(report, name, engine, free, context_bytes, 0.0)
        planned = predicted_largest(report, name, engine, free, context_bytes, GPU_SAFETY_MARGIN)
        calibrated_plan = (predicted_largest(report, name, engine, free, calibrated, 0.0)
                           if calibrated is not None else None)
        oom = found["oom_lines"][0] if found["oom_lines"] else ""
        searches.append(
            f"| {name} | {engine} | {found['memory']} | {_mib(free)} | {bare:,} | {planned:,} "
            f"| {'' if calibrated_plan is None else f'{calibrated_plan:,}'} | {found['largest_trained'] or '-'} "
            f"| {found['smallest_failed'] or '-'} | {len(found['runs'])} | `{oom.strip()[:160]}` |"
        )
    lines = [
        f"Source: `{report.get('source', 'device_check.json')}`, {report['note']}.",
        (f"Machine: {report['machine']['gpu'].get('name')}, driver {report['machine']['gpu'].get('driver')}, "
        f"{_mib(report['machine']['gpu'].get('memory_total'))} MiB; caffe started with "
        f"{report['machine']['caffe_started_with']}; {report.get('seconds')} s in all."),
        "",
        (f"Estimates with a CUDA context of {context_bytes / MiB:,.0f} MiB (`cuda_context_bytes`) against NVML's "
        "usedGpuMemory of the caffe process (peak of 10 ms polls) and cudaMemGetInfo's total - free (the probe's "
        "peak); without it against the probe's count of Caffe's own cudaMalloc bytes. \"device adds\" = NVML - "
        "probe: the context and what the CUDA libraries allocate for themselves."),
        "",
        ("| net | engine | batch | run | NVML process | cudaMemGetInfo used | estimate | error | probe (Caffe's "
        "cudaMalloc) | estimate, no context | error | within | workspace, probe | workspace, model | device adds |"),
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
        *rows,
        "",
        (f"Median of \"device adds\" over the {len(overheads)} runs that trained: "
         f"{_mib(calibrated)} MiB, the `cuda_context_bytes` these runs calibrate."
         if calibrated is not None else "No run trained with both readings: nothing to calibrate."),
        "",
        ("The largest batch (MiB; predicted by the estimate for the free memory at the search's start, with no "
        f"margin, with the planner's {GPU_SAFETY_MARGIN:.0%}, and with the calibrated context):"),
        "",
        ("| net | engine | memory | free | predicted | planned (5%) | predicted, calibrated | largest trained | "
        "smallest failed | runs | out-of-memory line |"),
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
        *searches,
    ]
    if report.get("skipped"):
        lines += ["", f"Skipped for time: {', '.join(report['skipped'])}."]
    return lines, {"calibrated_context_bytes": calibrated}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path, help="bench/device_check.py's JSON")
    parser.add_argument("--context", type=int, help="cuda_context_bytes for the estimate (default 300 MiB)")
    parser.add_argument("--section", help="the docs/benchmarks.md section to write (default gpu-device, or "
                        "gpu-device-rehearsal for a rehearsal's file)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    report = json.loads(args.report.read_text())
    report.setdefault("source", str(args.report))
    lines, summary = tables(report, args.context)
    command = f"Command: `.venv/bin/python bench/gpu_accuracy.py {args.report}`"
    text = "\n".join([command + ".", "", *lines])
    print(text)
    print(json.dumps(summary))
    if not args.no_write:
        section = args.section or ("gpu-device-rehearsal" if report["rehearsal"] else "gpu-device")
        replace_section(REPO / "docs" / "benchmarks.md", section, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
