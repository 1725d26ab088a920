"""`digits-memplugin serve`: the standalone app on gevent's WSGI server, websockets included."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ..jobs.backends import JOB_BACKENDS
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
    parser.add_argument(
        "--dataset-root",
        action="append",
        type=Path,
        metavar="DIR",
        help="a folder training jobs may read datasets from (repeatable; default: <data-dir>/datasets)",
    )
    parser.add_argument(
        "--api-token-file",
        type=Path,
        metavar="FILE",
        help="a file holding the API token that writing requests must carry (kept out of the command line, which "
        "other users can read); also MEMPLUGIN_API_TOKEN in the environment",
    )
    parser.add_argument(
        "--auth-reads",
        action="store_true",
        help="with a token: reading (pages, GET endpoints, live events) needs it too",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="a host name browsers reach this server by (repeatable; '.example.org' for its subdomains too): "
        "requests naming another host are refused, which keeps other sites out through DNS rebinding. An IP "
        "address, localhost, this machine's name and --host are always allowed; also MEMPLUGIN_ALLOWED_HOSTS "
        "(comma-separated) in the environment",
    )
    parser.add_argument(
        "--read-timeout",
        type=float,
        metavar="SECONDS",
        help="close a connection whose request line and headers take longer than this to arrive, or whose body "
        "pauses this long (default: 30)",
    )
    parser.add_argument(
        "--caffe-root", type=Path, metavar="DIR",
        help="the Caffe build that trains: its build/tools/caffe and, where it has one, its python/ (DIGITS' "
        "CAFFE_ROOT); also MEMPLUGIN_CAFFE_ROOT, then CAFFE_ROOT and CAFFE_HOME in the environment (default: the "
        "bundled pycaffe)",
    )
    parser.add_argument(
        "--backend", choices=JOB_BACKENDS, default=None,
        help="where training runs: 'local' (children of this server, the default) or 'ray' (a Ray cluster's "
        "hosts; docs/scale-out.md); also MEMPLUGIN_JOB_BACKEND in the environment",
    )
    parser.add_argument(
        "--ray-address", metavar="URL",
        help="the Ray dashboard (Jobs REST API), e.g. http://head:8265; also MEMPLUGIN_RAY_ADDRESS. Its token, "
        "when the cluster runs with RAY_AUTH_MODE=token: MEMPLUGIN_RAY_TOKEN in the environment",
    )
    parser.add_argument(
        "--shared-dir", type=Path, metavar="DIR",
        help="the folder every host sees, for job folders and device reports (default: --data-dir)",
    )
    parser.add_argument(
        "--message-queue", metavar="URL",
        help="Flask-SocketIO's message queue for several web workers, e.g. redis://127.0.0.1:6379/0",
    )
    parser.set_defaults(run=run)


WILDCARD_ADDRESSES = ("0.0.0.0", "::", "")


def _allowed_hosts(args: argparse.Namespace) -> list[str]:
    """--allowed-host names, MEMPLUGIN_ALLOWED_HOSTS from the environment, and --host when it is a name."""
    names = list(args.allowed_host or [])
    names += os.environ.get("MEMPLUGIN_ALLOWED_HOSTS", "").replace(",", " ").split()
    if args.host not in WILDCARD_ADDRESSES and not _is_address(args.host):
        names.append(args.host)
    return names


def _is_address(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _token(args: argparse.Namespace) -> str | None:
    from . import CommandError

    if args.api_token_file is not None:
        try:
            return args.api_token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            raise CommandError(f"cannot read the API token from {args.api_token_file}: {error}") from None
    return os.environ.get("MEMPLUGIN_API_TOKEN") or None


_SCALE_OUT = (
    ("backend", "JOB_BACKEND"), ("ray_address", "RAY_ADDRESS"), ("shared_dir", "SHARED_DIR"),
    ("message_queue", "MESSAGE_QUEUE"), (None, "RAY_TOKEN"), (None, "RAY_PYTHON"),
)
"""The scale-out settings `serve` takes: (its option, the setting's MEMPLUGIN_* name)."""


def run(args: argparse.Namespace) -> int:
    from gevent import monkey

    monkey.patch_all()

    from ..host.app import create_app
    from ..host.server import serve
    from ..host.settings import ConfigError
    from . import CommandError

    config: dict[str, Any] = {"MEMPLUGIN_DATA_DIR": args.data_dir, "MEMPLUGIN_ASYNC_MODE": "gevent"}
    if args.simulate_gpus:
        config["MEMPLUGIN_SIMULATE_GPUS"] = args.simulate_gpus
    if args.dataset_root:
        config["MEMPLUGIN_DATASET_ROOTS"] = [str(root) for root in args.dataset_root]
    token = _token(args)
    if token is not None:
        config["MEMPLUGIN_API_TOKEN"] = token
    config["MEMPLUGIN_AUTH_READS"] = args.auth_reads
    if args.auth_reads and token is None:
        raise CommandError("--auth-reads needs a token (--api-token-file or MEMPLUGIN_API_TOKEN)")
    if args.host not in ("127.0.0.1", "localhost", "::1") and token is None:
        print(
            f"digits-memplugin serve: warning: listening on {args.host} without an API token: anyone who can reach "
            "this port can start and cancel training jobs (see docs/security.md)",
            file=sys.stderr,
        )
    config["MEMPLUGIN_ALLOWED_HOSTS"] = _allowed_hosts(args)
    for option, key in _SCALE_OUT:  # the option, else the environment (secrets: the environment only)
        value = (getattr(args, option) if option else None) or os.environ.get(f"MEMPLUGIN_{key}")
        if value:
            config[f"MEMPLUGIN_{key}"] = value
    if args.read_timeout is not None:
        config["MEMPLUGIN_READ_TIMEOUT_SECONDS"] = args.read_timeout
    caffe_root = args.caffe_root or os.environ.get("MEMPLUGIN_CAFFE_ROOT")
    if caffe_root:
        config["MEMPLUGIN_CAFFE_ROOT"] = caffe_root
    if args.host in WILDCARD_ADDRESSES:
        import socket

        print(
            f"digits-memplugin serve: note: listening on every address; requests must name this server by an IP "
            f"address, as localhost or as {socket.gethostname()}: give any other name it is reached by with "
            "--allowed-host NAME (requests naming other hosts are refused, against DNS rebinding)",
            file=sys.stderr,
        )
    try:
        app = create_app(config)
    except ConfigError as error:
        raise CommandError(str(error)) from None
    serve(app, args.host, args.port)
    return 0
