"""Reading net and solver definitions: protobuf text format through caffe_pb2, upgraded the way Caffe upgrades.

No hand-written parser: `google.protobuf.text_format` does the parsing, so anything Caffe's own text parser
accepts is accepted here, and errors carry the parser's line and column.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from google.protobuf import text_format
from google.protobuf.message import Message

from .errors import NetError, PrototxtSyntaxError
from .proto import caffe_pb2
from .upgrade import upgrade_net, upgrade_solver


@dataclasses.dataclass(frozen=True)
class ParseLimits:
    """Bounds on what a definition may hold, so that hostile input costs bounded time and memory."""

    max_bytes: int = 4 * 1024 * 1024
    """Largest prototxt text accepted (GoogLeNet's train_val is 40 KB)."""
    max_layers: int = 5000
    """Most layers in one net (ResNet-1001 has about 3000)."""


DEFAULT_LIMITS = ParseLimits()


def _check_text(text: str | bytes, source: str, limits: ParseLimits) -> str:
    if isinstance(text, bytes):
        if len(text) > limits.max_bytes:
            raise NetError(f"is {len(text)} bytes; the limit is {limits.max_bytes}", source=source)
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise PrototxtSyntaxError(f"is not UTF-8 text (byte {error.start})", source=source) from None
    if len(text) > limits.max_bytes:
        raise NetError(f"is {len(text)} characters; the limit is {limits.max_bytes}", source=source)
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise PrototxtSyntaxError("contains a NUL character", source=source, line=line)
    return text


def _parse(text: str, message: Message, source: str) -> None:
    try:
        text_format.Parse(text, message, allow_unknown_extension=False)
    except text_format.ParseError as error:
        line, column = error.GetLine(), error.GetColumn()
        detail = str(error)
        # The parser prefixes its message with "line:column : "; the location is carried separately.
        prefix = f"{line}:{column} : "
        detail = detail.removeprefix(prefix)
        raise PrototxtSyntaxError(detail, source=source, line=line, column=column) from None
    except (RecursionError, OverflowError, ValueError) as error:
        raise PrototxtSyntaxError(f"cannot be parsed: {error}", source=source) from None


def parse_net(
    text: str | bytes, source: str = "net.prototxt", limits: ParseLimits = DEFAULT_LIMITS
) -> Any:  # caffe_pb2.NetParameter
    """Parse a NetParameter and upgrade it as Caffe's UpgradeNetAsNeeded does (V1 layers, input fields...)."""
    net = caffe_pb2.NetParameter()
    _parse(_check_text(text, source, limits), net, source)
    upgrade_net(net, source)
    check_net_size(net, source, limits)
    return net


def check_net_size(net: Any, source: str, limits: ParseLimits = DEFAULT_LIMITS) -> None:
    if len(net.layer) > limits.max_layers:
        raise NetError(f"has {len(net.layer)} layers; the limit is {limits.max_layers}", source=source)


def parse_solver(
    text: str | bytes, source: str = "solver.prototxt", limits: ParseLimits = DEFAULT_LIMITS
) -> Any:  # caffe_pb2.SolverParameter
    """Parse a SolverParameter and upgrade its legacy `solver_type` enum; inline nets are upgraded too."""
    solver = caffe_pb2.SolverParameter()
    _parse(_check_text(text, source, limits), solver, source)
    upgrade_solver(solver, source)
    for field in ("net_param", "train_net_param"):
        if solver.HasField(field):
            upgrade_net(getattr(solver, field), f"{source} ({field})")
            check_net_size(getattr(solver, field), source, limits)
    for index, net in enumerate(solver.test_net_param):
        upgrade_net(net, f"{source} (test_net_param #{index})")
        check_net_size(net, source, limits)
    return solver
