"""How long the New model page takes to show the estimate at a batch the user types, in a real browser.

Starts `digits-memplugin serve --simulate-gpus 2x24GiB` on 127.0.0.1, opens the form in Debian's Chromium (Playwright,
headless), pastes LeNet as a custom network, then `--rounds` times types a new batch into the batch field and times,
in the page, from the input event to GPU 0's row showing the estimate the REST API gives for that batch. The
figure includes the page's 300 ms debounce (it waits for typing to pause) and the three estimates (one per device).
The goal this replaces in the browser tests: the panel shows the new estimate within half a second.

Writes the table into docs/benchmarks.md between the `page` markers.

    .venv/bin/python bench/page_latency.py [--rounds 20] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

import requests
from browser_fixtures import CHROMIUM, CHROMIUM_ARGS, TYPE_BATCH_UNTIL_ESTIMATE
from playwright.sync_api import sync_playwright
from report import replace_section
from test_jobs_restart import serve

from digits_memplugin.networks import standard_network

LENET = standard_network("lenet").text
SOLVER = 'type: "SGD"\ntrain_state { stage: "train" }\n'


def measure(rounds: int) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="memplugin-page-") as folder:
        server = serve(Path(folder) / "data", Path(folder) / "serve.log", "--simulate-gpus", "2x24GiB")
        base, process = server.url, server.process
        try:
            api = base + "memplugin/api/"
            gpu0 = requests.get(api + "devices", timeout=30).json()["devices"][0]
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
                page = browser.new_page()
                page.goto(base + "memplugin/models/new")
                page.wait_for_selector("#device-list > li[data-verdict]")
                page.get_by_label("Custom network", exact=True).check()
                page.fill("#item_shape", "1,28,28")
                page.fill("#classes", "10")
                page.fill("#custom_network", LENET)
                page.wait_for_selector("#device-list > li[data-verdict='fits']")
                times = []
                for index in range(rounds):
                    batch = 1000 + 37 * index
                    body = {"net": LENET, "solver": SOLVER, "data_shapes": {"data": [1, 28, 28]}, "classes": 10,
                            "engine": "gpu-cudnn", "device": gpu0["key"], "batch": batch}
                    expected = requests.post(api + "estimate", json=body, timeout=30).json()["total_bytes"]
                    times.append(page.evaluate(TYPE_BATCH_UNTIL_ESTIMATE, [gpu0["key"], str(expected), batch]))
                browser.close()
        finally:
            process.terminate()
            process.wait(30)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    times = sorted(measure(args.rounds))
    p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
    command = ".venv/bin/python bench/page_latency.py" + (f" --rounds {args.rounds}" if args.rounds != 20 else "")
    text = "\n".join([
        f"Command: `{command}` ({os.cpu_count()} cores, headless Chromium, 2 simulated GPUs and the CPU).",
        "",
        "| typed batch to GPU 0's new estimate on the page | rounds | median | p90 | slowest |",
        "|---|---:|---:|---:|---:|",
        (f"| LeNet (custom network), 300 ms debounce included | {len(times)} | {statistics.median(times):.0f} ms | "
         f"{p90:.0f} ms | {times[-1]:.0f} ms |"),
    ])
    print(text)
    if not args.no_write:
        replace_section(REPO / "docs" / "benchmarks.md", "page", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
