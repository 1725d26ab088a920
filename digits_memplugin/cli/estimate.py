"""`digits-memplugin estimate`: a net's training memory, per category and layer, and the batch that fits."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..core.test_net_modes import TEST_NET_APART, TEST_NET_AUTO, TEST_NET_SHARED

ENGINES = ("cpu", "gpu", "gpu-cudnn")
TEST_NET_CHOICES = (TEST_NET_AUTO, TEST_NET_SHARED, TEST_NET_APART)
"""--test-net's words, the default first (core.test_net_modes)."""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "estimate",
        help="predict a net's training memory and the batch size that fits",
        description=(
            "Predict the memory one Caffe training job takes (train net, test nets, solver state) from its "
            "prototxt, per category and per layer. With --free-bytes, also the largest batch that fits and a "
            "plan (batch_size x iter_size) that keeps the wanted effective batch."
        ),
    )
    parser.add_argument("net", type=Path, metavar="NET", help="net prototxt (train_val)")
    parser.add_argument("--solver", type=Path, help="solver prototxt (its net/train_net fields are replaced by NET)")
    parser.add_argument(
        "--batch", type=batch_or_auto,
        help='batch size of the TRAIN data layers (default: the net\'s), or "auto": the largest that fits as a job\'s '
        '"auto" is capped (a twentieth of the training set, at most 256; with --free-bytes)',
    )
    parser.add_argument(
        "--train-items", type=positive_int, metavar="N",
        help="items in the training set, for the cap of --batch auto (default: read from the net's training data "
        "layer when its LMDB or HDF5 list is here)",
    )
    parser.add_argument("--test-batch", type=positive_int, help="batch size of the TEST data layers")
    parser.add_argument("--engine", choices=ENGINES, default="cpu", help="what trains the net (default: %(default)s)")
    parser.add_argument(
        "--free-bytes", type=size, metavar="B",
        help="free memory of the device, e.g. 8GiB; a number without a unit counts bytes and must be at least 1 MiB",
    )
    parser.add_argument(
        "--safety-margin", type=float, default=None,
        help="fraction of free memory kept back (default: as jobs plan: 0.03 on the CPU, 0.05 on GPUs)",
    )
    parser.add_argument(
        "--data-shape",
        action="append",
        default=[],
        metavar="TOP=C,H,W",
        help="item shape of a data top whose dataset is not readable here (repeatable; TOP or LAYER/TOP)",
    )
    parser.add_argument("--classes", type=positive_int, help="classes, for DIGITS networks that leave num_output unset")
    parser.add_argument(
        "--test-net", choices=TEST_NET_CHOICES, default=TEST_NET_AUTO,
        help="where the plan puts the test nets (with --free-bytes), as a job's --test-net: \"shared\" beside the "
        "train net as Caffe keeps them, \"apart\" in a tester process of their own so that the train net has the "
        "memory alone, or \"auto\" (the default): apart only where that trains a larger batch or fewer iter_size "
        "passes",
    )
    parser.add_argument(
        "--no-pycaffe", action="store_true", help="do not ask pycaffe for the shapes of layer types the estimator lacks"
    )
    parser.add_argument("--json", action="store_true", help="print the JSON document the REST API returns")
    parser.set_defaults(run=run)


def batch_or_auto(text: str) -> int | str:
    return "auto" if text.strip().lower() == "auto" else positive_int(text)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


SMALLEST_BARE_SIZE = 1024**2
"""A number without a unit counts bytes, as the REST API's integers do, but only from 1 MiB (the least a memory cap
may be): below that, "8" or "512" is someone meaning GiB or MiB (nvidia-smi's unit), and 8 bytes is no device's
memory. Sizes that small still go with their unit ("512B")."""


def size(text: str) -> int:
    """Bytes: a number with a unit (8GiB, as the REST API's size strings), or a byte count of at least 1 MiB."""
    from ..core.sizes import parse_size

    if text.strip().isdigit() and len(text.strip()) <= 20:
        value = int(text)
        if value < SMALLEST_BARE_SIZE:
            raise argparse.ArgumentTypeError(
                f"{text.strip()} has no unit: write one, e.g. {text.strip()}GiB or {text.strip()}MiB (a number without "
                f"a unit counts bytes, and must then be at least {SMALLEST_BARE_SIZE}, 1 MiB)"
            )
        return value
    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from ..core.errors import NetError
    from ..core.estimate import EstimateRequest, estimate
    from ..core.prototxt import parse_net
    from ..estimate.datasets import shapes_from_sources
    from ..estimate.files import confined_loader
    from . import CommandError

    net_text = _read(args.net)
    solver_text = _read(args.solver) if args.solver else None
    given = data_shapes(args.data_shape)
    auto = args.batch == "auto"
    try:
        net = parse_net(net_text, str(args.net))
        found = shapes_from_sources([net], Path.cwd())
        train_items = args.train_items or (_train_items(net) if auto else None)
        request = EstimateRequest(
            net=net_text,
            solver=solver_text,
            net_source=str(args.net),
            solver_source=str(args.solver) if args.solver else "solver.prototxt",
            batch=None if auto else args.batch,
            test_batch=args.test_batch,
            auto=auto,
            train_items=train_items,
            engine=args.engine,
            free_bytes=args.free_bytes,
            safety_margin=args.safety_margin,
            data_shapes={**found, **given},
            classes=args.classes,
            test_net=args.test_net,
        )
        load = confined_loader(args.solver.resolve().parent) if args.solver else None
        oracle = None if args.no_pycaffe else _oracle()
        document = estimate(request, load=load, oracle=oracle)
        if auto and document["max_batch_size"] and document["max_batch_size"] != document["batch_size"]:
            # "auto" is the largest batch that fits within its cap: the report at that batch, as a job trains it
            document = estimate(dataclasses.replace(request, batch=document["max_batch_size"]), load=load,
                                oracle=oracle)
    except NetError as error:
        raise CommandError(command_line_words(error, classes_given=args.classes is not None)) from None
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(render(document, test_net=args.test_net))
    return 0


def _train_items(net: Any) -> int | None:
    """Items of the training set the net's TRAIN data layers name, when one is here (relative to the current folder):
    the smallest, as a job counts them (jobs.definition.loading.phase_items)."""
    from ..jobs.definition.loading import phase_items

    return phase_items([net], [Path.cwd()], "train", base=Path.cwd())


def data_shapes(items: list[str]) -> dict[str, tuple[int, ...]]:
    """`--data-shape TOP=C,H,W` items as the data_shapes of a request; CommandError naming a malformed one."""
    from ..estimate.datasets import parse_shape
    from . import CommandError

    given: dict[str, tuple[int, ...]] = {}
    for item in items:
        key, _, value = item.partition("=")
        if not key.strip():
            raise CommandError(f"--data-shape {item}: name the top, as TOP=C,H,W")
        try:
            given[key.strip()] = parse_shape(value)
        except ValueError as error:
            raise CommandError(f"--data-shape {item}: {error}") from None
    return given


def command_line_words(error: Exception, *, classes_given: bool) -> str:
    """The error, with the flag that gives what is missing (the core's messages name no flag: the web form has a
    field instead): a data shape (--data-shape), or the class count of a DIGITS network (--classes)."""
    missing = getattr(error, "missing_shape", None)
    if missing is not None:
        key, example = missing
        return f"{error}; on the command line: --data-shape {key}={example}"
    if getattr(error, "field", None) == "inner_product_param.num_output" and not classes_given:
        return (
            f"{error}; DIGITS networks leave num_output unset for the dataset's number of classes: give it with "
            "--classes N"
        )
    return str(error)


def _read(path: Path) -> str:
    from . import CommandError

    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CommandError(f"cannot read {path}: {error}") from None


def _oracle() -> Any:
    try:
        from ..estimate.pycaffe_shapes import pycaffe_oracle
    except ImportError:  # pragma: no cover - the fallback module is optional
        return None
    return pycaffe_oracle


def _at_auto_cap(document: dict[str, Any]) -> bool:
    """Whether the cap of "auto" chose the largest batch (memory had room for more)."""
    cap = document.get("auto_cap")
    if not cap or document.get("max_batch_limited_by") != "max_batch":
        return False
    return bool((document["max_batch_size"] or 0) >= cap["batch_size"])


def placement_lines(plan: dict[str, Any], asked: str = TEST_NET_AUTO) -> list[str]:
    """Where a plan puts the test nets, in words: the planner's note where it says why (it chose, or the Caffe that
    trains cannot keep them apart), else the placement `asked` for; with them apart, what the tester needs."""
    from ..core.sizes import format_size

    test_net = plan.get("test_net")
    if test_net is None or plan.get("test_batch_size") is None:  # no plan, or a net without test nets
        return []
    lines = []
    note = plan.get("test_net_note")
    if note:
        lines.append(note)
    elif asked == test_net == TEST_NET_APART:
        lines.append("test nets apart, in a tester process of their own (--test-net apart)")
    elif asked == test_net == TEST_NET_SHARED:
        lines.append("test nets shared, beside the train net as Caffe keeps them (--test-net shared)")
    if test_net == TEST_NET_APART and plan.get("tester_bytes") is not None:
        lines.append(
            f"tester: {format_size(plan['tester_bytes'])} for the test nets at their own batch "
            f"{plan['test_batch_size']}, on the same device: training stops at each test interval while it tests "
            "that interval's snapshot"
        )
    return lines


def render(document: dict[str, Any], top_layers: int = 12, *, test_net: str = TEST_NET_AUTO) -> str:
    """The estimate as a table a person reads: totals, categories, the largest layers, the plan and where it puts
    the test nets (`test_net`: the placement asked for)."""
    from ..core.sizes import format_size

    lines = [
        f"{document.get('flavour', 'bvlc')} caffe, engine {document['engine']}, solver {document['solver_type']}, "
        f"batch {document['batch_size']}"
        + (f", test batch {document['test_batch_size']}" if document["test_batch_size"] else ""),
        f"total: {format_size(document['total_bytes'])} ({document['total_bytes']} bytes)",
        "",
        f"{'category':<18} {'bytes':>14} {'':>10}",
    ]
    for name, value in document["categories"].items():
        if value:
            lines.append(f"{name:<18} {value:>14} {format_size(value):>10}")
    lines += ["", f"{'largest layers':<28} {'type':<18} {'phase':<6} {'bytes':>14}"]
    layers = sorted(document["layers"], key=lambda layer: -layer["bytes"])[:top_layers]
    for layer in layers:
        lines.append(f"{layer['name'][:28]:<28} {layer['type'][:18]:<18} {layer['phase']:<6} {layer['bytes']:>14}")
    if document["plan"] is not None:
        plan = document["plan"]
        lines += [
            "",
            (f"free {format_size(document['free_bytes'])}, usable {format_size(document['usable_bytes'])} "
            f"after a {document['safety_margin']:.0%} margin"),
            f"largest batch that fits: {document['max_batch_size']}"
            + ("  (Caffe's INT_MAX blob limit)" if document.get("max_batch_limited_by") == "blob_limit" else "")
            + (f"  (auto: {document['auto_cap']['note']})" if _at_auto_cap(document) else ""),
            f"plan: batch_size {plan['batch_size']} x iter_size {plan['iter_size']} = {plan['effective_batch']}"
            + ("" if plan["fits"] else "  (DOES NOT FIT, even at batch 1)"),
        ]
        if document.get("test_plan"):
            test = document["test_plan"]
            lines.append(f"test nets: batch_size {test['batch_size']}, test_iter {test['test_iter']}")
        lines += placement_lines(document, test_net)
    if document.get("blob_limit"):
        lines += ["", f"{document['blob_limit']['message']}."]
    for assumption in document["assumptions"]:
        lines.append(f"assumes: {assumption}")
    return "\n".join(lines)
