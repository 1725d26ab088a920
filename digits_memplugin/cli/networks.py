"""`digits-memplugin networks [--write FOLDER]`: the standard networks the package ships (DIGITS' "Standard
Networks"), with a solver to start from for each: where they are installed, and copies to edit and train.

A user of the command line needs files: `train` takes a net and a solver prototxt. The New model page offers the
same networks by name and has solver fields instead.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "networks",
        help="list the bundled networks (LeNet, AlexNet) with a solver for each, or write copies of them",
        description=(
            "List the standard networks this package ships, in DIGITS' style (data layers chosen by the stages "
            "train and val, the classifier's num_output left for --classes), each with a solver to start from and "
            "the path of both files. With --write, copy them into FOLDER to edit or to train with `train`."
        ),
    )
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help="networks to list or write (default: all), e.g. lenet"
    )
    parser.add_argument("--write", type=Path, metavar="FOLDER", help="write NAME.prototxt and NAME_solver.prototxt here")
    parser.add_argument("--force", action="store_true", help="with --write: replace files that exist")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..networks import STANDARD_NETWORKS, standard_network
    from . import CommandError

    try:
        chosen = [standard_network(name) for name in args.names] or list(STANDARD_NETWORKS)
    except KeyError as error:
        raise CommandError(error.args[0]) from None
    if args.write is None:
        for network in chosen:
            print(f"{network.key}: {network.title}. {network.description}")
            print(f"  dataset: {network.dataset}")
            print(f"  net:     {network.path}")
            print(f"  solver:  {network.solver_path}")
        return 0
    folder: Path = args.write
    files = [(folder / n.filename, n.text) for n in chosen] + [(folder / n.solver_filename, n.solver_text) for n in chosen]
    existing = [path for path, _ in files if path.exists() or path.is_symlink()]
    if existing and not args.force:
        raise CommandError(f"{existing[0]} exists; give --force to replace it")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for path, text in files:
            if path.is_symlink():
                path.unlink()  # replace the link, never write through it
            path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise CommandError(f"cannot write into {folder}: {error.strerror or error}") from None
    for network in chosen:
        net, solver = folder / network.filename, folder / network.solver_filename
        print(f"wrote {net} and {solver}, for {network.dataset}")
        print(f"  train: digits-memplugin train {net} {solver} --classes {network.classes} --data train=TRAIN --data test=VAL")
    return 0
