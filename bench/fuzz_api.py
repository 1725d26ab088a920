"""Fuzz the REST API for many examples: the targets of tests/test_fuzz_api.py, longer.

Each target (POST /estimate as JSON and as bytes, POST /jobs as JSON, bytes and multipart, the job endpoints with
real and random ids, any method on any API path, GET /devices, the New model form's JSON twin and plain POST, the
HTML pages, every socket.io event) runs for N examples (default 5000) against one app in a temporary folder, with
the same check as the tests: never a 5xx, never a stack trace, every API error JSON with a message, every socket
request answered and the connection kept. Their text includes lone surrogates, integers of 5000 digits and digits
other than 0-9 (issue 18, item 10). Prints the inputs tried and the statuses per target (a socket target's
"statuses" are the events that answered), and every failure with its input.

    .venv/bin/python bench/fuzz_api.py [--examples N] [--only estimate_json,jobs_json,...] [--seed S]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import test_fuzz_api as fuzz
from fuzz import run as run_strategy  # bench/fuzz.py: one hypothesis target, its failure printed

from digits_memplugin.host.extension import get_plugin


def run(name: str, examples: int, at: int, client: Any, ids: list[str]) -> bool:
    """One target for `examples` inputs; True when none failed."""
    strategy, target = fuzz.TARGETS[name]
    if name in fuzz.TAKE_IDS:
        return run_strategy(name, strategy, lambda value: target(client, value, ids), examples, at)
    return run_strategy(name, strategy, lambda value: target(client, value), examples, at)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=5000, help="inputs per target (default: %(default)s)")
    parser.add_argument("--only", default="", help=f"comma-separated targets of {', '.join(fuzz.TARGETS)}")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(fuzz.TARGETS)
    unknown = sorted(set(names) - set(fuzz.TARGETS))
    if unknown:
        parser.error(f"unknown targets: {', '.join(unknown)}")
    started = time.monotonic()
    ok = True
    with tempfile.TemporaryDirectory(prefix="fuzz-api-") as folder:
        app = fuzz.fuzz_app(Path(folder))
        client = app.test_client()
        ids = [client.post(f"{fuzz.API}/jobs", json=fuzz.VALID_JOB).get_json()["id"] for _ in range(3)]
        try:
            for name in names:
                ok = run(name, args.examples, args.seed, client, ids) and ok
        finally:
            get_plugin(app).close()
    document = {"tried": dict(fuzz.TRIED), "total": sum(fuzz.TRIED.values()),
                "statuses": {name: dict(sorted(c.items(), key=str)) for name, c in sorted(fuzz.STATUSES.items())},
                "seconds": round(time.monotonic() - started, 1), "examples_per_target": args.examples}
    print(json.dumps(document, indent=1))
    print(f"{'no failures' if ok else 'FAILURES (above)'}: {document['total']} requests in {document['seconds']} s")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
