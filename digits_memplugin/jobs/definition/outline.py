"""What a clone of a stored job needs of its net and solver when they are large, made in an estimate worker.

A job's net and solver as submitted may each be up to 4 MiB; parsing such a text takes seconds of one core, and the
clone page (web/pages/job_clone.py) is a read that anyone allowed to read may ask for again and again: a 3.6 MB net held
the server's one thread 2.6 s a page. A large net is never one of the standard networks (theirs are a few KB) and a
large solver never one the form's settings make, so all the page needs of them is small: the type and phases of
the layers the request's `data` names, and the solver with the request's max_iter written in. `outline` makes that
in a worker (jobs.scheduling.planning runs it: `Planner.outline`); the answer crosses the pipe as a few strings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from google.protobuf import text_format

from ...core.errors import NetError
from ...core.prototxt import parse_net, parse_solver
from .data_sources import data_phases
from .definition import NET_SOURCE, SOLVER_SOURCE


@dataclasses.dataclass(frozen=True)
class Outline:
    """A large net's data layers by the names the request's data gives, and a large solver as the form pastes it."""

    layers: dict[str, tuple[str, tuple[str, ...]]] | None
    """For each name in `data` that names a layer: its type and the phases it feeds (jobs.definition.data_sources.data_phases).
    None when the net does not parse."""
    solver_text: str | None
    """The solver with `max_iter` written in (the text as it is when it does not parse, or max_iter is its own)."""


def outline(net_text: str | None, solver_text: str | None, names: Iterable[str], max_iter: int | None) -> Outline:
    """The `Outline` of the texts (None for a text not to look at: it stays with the caller)."""
    layers: dict[str, tuple[str, tuple[str, ...]]] | None = None
    wanted = set(names)
    if net_text is not None:
        try:
            net = parse_net(net_text, NET_SOURCE)
        except NetError:
            net = None
        if net is not None:
            layers = {layer.name: (layer.type, tuple(sorted(data_phases(layer))))
                      for layer in net.layer if layer.name in wanted}
    text = solver_text
    if solver_text is not None and max_iter is not None:
        try:
            solver = parse_solver(solver_text, SOLVER_SOURCE)
        except NetError:
            solver = None
        if solver is not None and solver.max_iter != max_iter:
            solver.max_iter = max_iter
            text = text_format.MessageToString(solver)
    return Outline(layers, text)
