"""The `digits-memplugin` command. Each subcommand lives in its own module with `add_parser` and `run`.

Subcommand modules import only argparse at module level: `--help` stays fast, and `serve` can monkey-patch with
gevent before anything else loads.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from .._version import __version__

# Subcommand modules, in the order `--help` lists them.
COMMANDS = ("serve", "estimate", "train", "devices", "networks", "sample-dataset")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="digits-memplugin",
        description="GPU memory planning and out-of-memory-safe training for Caffe nets.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"{__name__}.{name.replace('-', '_')}")
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`... | head`): nothing more to say, and no traceback
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the interpreter's own flush at exit fails no more
        return 141  # what a shell reports for a command killed by SIGPIPE (128 + 13)
    except CommandError as error:
        print(f"digits-memplugin {args.command}: error: {error}", file=sys.stderr)
        return 2


class CommandError(Exception):
    """A subcommand cannot do what was asked; the message says why (printed without a traceback)."""
