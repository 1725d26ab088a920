"""Fuzz the loader and the estimator for many examples: the strategies of tests/test_core_fuzz.py, longer.

Each strategy runs for N examples (default 20000) through the same checks as the tests: nothing but a
MemPluginError may escape parse_net, parse_solver or estimate, and no input may take longer than HANG_SECONDS.
Then the differential one: random nets pycaffe also builds (each in a fork of one child process), which must be
refused by both or built by both with the same blob shapes (default 2000 nets).
Prints the inputs tried per target (known bugs counted apart) and the failures.

    .venv/bin/python bench/fuzz.py [--examples N] [--differential N] [--only raw,soup,nets,zoo,caffe] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import test_core_fuzz as fuzz
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from test_core_netstate import run_pycaffe


def strategies() -> dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], None]]]:
    found: dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], None]]] = {
        "raw": (fuzz.RAW_TEXT, fuzz.check_text),
        "soup": (fuzz.TOKEN_SOUP, fuzz.check_text),
        "nets": (fuzz.random_request(), fuzz.check_request),
    }
    if fuzz.ZOO_NETS:
        found["zoo"] = (fuzz.zoo_mutation(), lambda fields: fuzz.check_request(fields, "estimate(mutated zoo net)"))
    return found


def run(name: str, strategy: st.SearchStrategy[Any], check: Callable[[Any], None], examples: int, at: int) -> bool:
    """Run one strategy; True when no input failed."""

    @seed(at)
    @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(strategy)
    def fuzz_one(value: Any) -> None:
        check(value)

    try:
        fuzz_one()
    except Exception:  # noqa: BLE001 - a fuzzer reports whatever escaped, then goes on with the next strategy
        print(f"FAILED {name}:")
        traceback.print_exc(file=sys.stdout)
        return False
    return True


def differential(count: int, derandomize: bool) -> bool:
    """Random nets built by pycaffe and by build_net; True when they agree on every one."""
    with tempfile.TemporaryDirectory() as folder:
        [result] = run_pycaffe([{"kind": "types"}], Path(folder))
        types = sorted((set(result["types"]) & set(fuzz.known_types())) - fuzz.NOT_BUILDABLE)
        texts = fuzz.collect(fuzz.random_caffe_net(types), count, derandomize=derandomize)
        differences = fuzz.differences_with_caffe(texts, Path(folder))
    for difference in differences:
        print("DIFFERENCE:", json.dumps(difference, indent=1))
    return not differences


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=20000, help="examples per strategy (default 20000)")
    parser.add_argument("--differential", type=int, default=2000, help="random nets pycaffe builds (default 2000)")
    parser.add_argument("--only", help="comma-separated strategies: raw, soup, nets, zoo, caffe")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (default 0)")
    args = parser.parse_args()
    available = strategies()
    chosen = args.only.split(",") if args.only else [*available, "caffe"]
    unknown = set(chosen) - set(available) - {"caffe"}
    if unknown:
        parser.error(f"unknown strategies {sorted(unknown)}; known: {', '.join(available)}")
    failures = 0
    started = time.monotonic()
    for name in chosen:
        before = sum(fuzz.TRIED.values())
        t0 = time.monotonic()
        if name == "caffe":
            ok = differential(args.differential, derandomize=False)
        else:
            strategy, check = available[name]
            ok = run(name, strategy, check, args.examples, args.seed)
        failures += not ok
        print(f"{name}: {sum(fuzz.TRIED.values()) - before} calls, {time.monotonic() - t0:.0f} s, "
              f"{'ok' if ok else 'FAILED'}", flush=True)
    print(f"\ninputs tried per target: {dict(fuzz.TRIED)}")
    print(f"total calls: {sum(fuzz.TRIED.values())}, strategies failed: {failures}, "
          f"{time.monotonic() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
