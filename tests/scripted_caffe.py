"""A scripted stand-in for a `caffe` binary this machine cannot have: NVcaffe (it needs CUDA to build) and GPU
builds of BVLC Caffe. It is NOT Caffe: it trains nothing. It answers what the plugin asks of a Caffe build at start-up
(`-version`, `device_query --gpu=0`) as the build it stands for would, and `train` prints recorded log lines of
that build (tests/caffe_logs/*.log) to stderr, as `caffe train` writes glog with GLOG_logtostderr=1, then ends as
that build ended (an exit status, glog's abort, or a hang).

`caffe_root(folder, ...)` (used by the tests) makes a Caffe root whose build/tools/caffe is this script; its
behaviour is in scripted.json beside it:

    {"version": "0.17.4", "cuda": true, "log": "/path/to/recorded.log", "end": 0 | "abort" | "hang",
     "line_seconds": 0.0, "pycaffe": false}

Lines starting with "#" in a log say where its lines come from and are not printed. A "Snapshotting ... file P"
line creates P (empty) in the working directory, as Caffe's snapshot would, so that a job's snapshot exists.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path

TOOLS = Path("build") / "tools"
SNAPSHOT = re.compile(r"Snapshotting (?:solver state )?to (?:binary proto|HDF5) file (\S+)")


def caffe_root(folder: Path, *, version: str, cuda: bool, log: Path | None = None, end: int | str = 0,
               line_seconds: float = 0.0) -> Path:
    """A Caffe root at `folder` whose `caffe` is this scripted stand-in (not a Caffe: see the module)."""
    tools = folder / TOOLS
    tools.mkdir(parents=True, exist_ok=True)
    binary = tools / "caffe"
    binary.write_text(f"#!{sys.executable}\n" + Path(__file__).read_text(encoding="utf-8"), encoding="utf-8")
    binary.chmod(0o755)
    if log is not None:  # inside the root, which a confined attempt may read (a Caffe's own files)
        kept = tools / f"recorded-{log.name}"
        kept.write_bytes(log.read_bytes())
        log = kept
    settings = {"version": version, "cuda": cuda, "log": str(log) if log else None, "end": end,
                "line_seconds": line_seconds}
    (tools / "scripted.json").write_text(json.dumps(settings), encoding="utf-8")
    return folder


def _settings() -> dict[str, object]:
    return json.loads((Path(sys.argv[0]).resolve().parent / "scripted.json").read_text(encoding="utf-8"))


def main(argv: list[str]) -> int:
    settings = _settings()
    if argv[:1] in (["-version"], ["--version"]):
        print(f"caffe version {settings['version']}")
        return 0
    if argv[:1] == ["device_query"]:
        if settings["cuda"]:
            print("F0101 00:00:00.000000     1 common.cpp:152] Check failed: error == cudaSuccess (100 vs. 0)  "
                  "no CUDA-capable device is detected", file=sys.stderr)
        else:
            print("F0101 00:00:00.000000     1 common.hpp:73] Cannot use GPU in CPU-only Caffe: check mode.",
                  file=sys.stderr)
        sys.stderr.flush()
        os.abort()
    if argv[:1] != ["train"] or not settings.get("log"):
        print(f"scripted caffe: nothing scripted for {argv}", file=sys.stderr)
        return 1
    for line in Path(str(settings["log"])).read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            continue
        print(line, file=sys.stderr, flush=True)
        snapshot = SNAPSHOT.search(line)
        if snapshot:
            Path(snapshot.group(1)).parent.mkdir(parents=True, exist_ok=True)
            Path(snapshot.group(1)).touch()
        time.sleep(float(settings.get("line_seconds") or 0))  # type: ignore[arg-type]  # the script's pace: a slow Caffe
    end = settings.get("end", 0)
    if end == "abort":
        os.abort()
    if end == "hang":
        signal.pause()
    return int(end)  # type: ignore[call-overload]


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
