"""Net::FilterNet: which layers a phase and state keep (NetStateRule's include/exclude semantics)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import NetError
from ..flavour import flavour_of, schema
from ..layers.base import PHASE_TEST, PHASE_TRAIN
from ..proto import caffe_pb2

PHASES = {PHASE_TRAIN: caffe_pb2.TRAIN, PHASE_TEST: caffe_pb2.TEST}


def net_state(net_param: Any, phase: str, extra_state: Any | None = None) -> Any:
    """The NetState Caffe uses: the phase, merged with the net's own state and the solver's train/test state."""
    state = schema(flavour_of(net_param)).NetState()
    state.phase = PHASES[phase]
    state.MergeFrom(net_param.state)
    if extra_state is not None:
        # By value: an NVcaffe solver's state may meet a BVLC net (NetState is the same message in both schemas).
        state.MergeFromString(extra_state.SerializeToString())
    return state


def state_meets_rule(state: Any, rule: Any) -> bool:
    """Net::StateMeetsRule."""
    if rule.HasField("phase") and rule.phase != state.phase:
        return False
    if rule.HasField("min_level") and state.level < rule.min_level:
        return False
    if rule.HasField("max_level") and state.level > rule.max_level:
        return False
    stages = set(state.stage)
    if any(stage not in stages for stage in rule.stage):
        return False
    return not any(stage in stages for stage in rule.not_stage)


def filter_layers(net_param: Any, state: Any, source: str, lines: Sequence[int | None]) -> list[tuple[int, Any]]:
    """Net::FilterNet: the (index, layer) pairs the state includes, in order."""
    kept = []
    for index, layer in enumerate(net_param.layer[:]):
        include, exclude = layer.include[:], layer.exclude[:]
        if include and exclude:
            raise NetError(
                "specify either include rules or exclude rules, not both",
                source=source,
                line=line_of(lines, index),
                layer=layer.name,
                layer_type=layer.type,
                field="include",
            )
        included = not include
        if any(state_meets_rule(state, rule) for rule in exclude):
            included = False
        if any(state_meets_rule(state, rule) for rule in include):
            included = True
        if included:
            kept.append((index, layer))
    return kept


def line_of(lines: Sequence[int | None], index: int | None) -> int | None:
    """The line layer `index` of the NetParameter is written at, when known."""
    if index is None or index >= len(lines):
        return None
    return lines[index]
