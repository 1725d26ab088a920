"""`digits-memplugin serve`: the standalone app on gevent's WSGI server, websockets included."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .devices import gpu_spec


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve the web app", description="Serve the standalone web app (gevent, websockets)."
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=5000, help="port to bind (default: %(default)s; 0 picks one)")
    parser.add_argument(
        "--data-dir", type=Path, default=Path("var"), help="SQLite store and job folders (default: ./%(default)s)"
    )
    parser.add_argument(
        "--simulate-gpus",
        metavar="SPEC",
        type=gpu_spec,
        help="demo mode: fake GPUs of these sizes instead of the driver's, e.g. '2x24GiB' or '24GiB,16GiB'; "
        "every page says so",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gevent import monkey

    monkey.patch_all()

    from ..app import create_app
    from ..server import serve

    config: dict[str, Any] = {"MEMPLUGIN_DATA_DIR": args.data_dir, "MEMPLUGIN_ASYNC_MODE": "gevent"}
    if args.simulate_gpus:
        config["MEMPLUGIN_SIMULATE_GPUS"] = args.simulate_gpus
    app = create_app(config)
    serve(app, args.host, args.port)
    return 0
