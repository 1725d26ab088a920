"""The batch-independent half of Net::Init: a net filtered for a phase, its splits inserted, each layer read out
of its LayerParameter once (`PreparedNet`), so that estimating at many batches walks the protobuf once."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ..flavour import flavour_of
from ..layers import LayerRule, rule_for
from ..layers.base import InputDefault
from .filtering import filter_layers, line_of, net_state
from .splits import insert_splits


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """One layer as Net::Init sees it, read out of its LayerParameter once: everything that does not depend on the
    batch size, so that estimating at many batch sizes does not walk the protobuf messages again."""

    orig: int | None
    """Index in the NetParameter the layer came from; None for an inserted Split layer."""
    param: Any
    line: int | None
    name: str
    type: str
    bottoms: tuple[str, ...]
    tops: tuple[str, ...]
    propagate_down: tuple[bool, ...]
    loss_weight: tuple[float, ...]
    param_specs: tuple[tuple[str, float, int], ...]
    """(name, lr_mult, share_mode) of each ParamSpec given."""
    rule: LayerRule | None


@dataclasses.dataclass(frozen=True)
class PreparedNet:
    """A net filtered for a phase and state, with Caffe's Split layers inserted: the batch-independent half of
    Net::Init. `build_net` shapes it for a batch."""

    net_param: Any
    phase: str
    source: str
    lines: tuple[int | None, ...]
    filtered: list[tuple[int, Any]]
    layers: tuple[LayerSpec, ...]
    memos: tuple[dict[Any, Any], ...]
    """One `LayerContext.memo` per layer, shared by every build of this prepared net."""
    input_defaults: Mapping[str, InputDefault] = dataclasses.field(default_factory=dict)
    """Blob name -> what the data top of that name holds when no shape is given for it, declared by the rule of a
    layer that reads it (`LayerRule.input_defaults`)."""


def prepare_net(
    net_param: Any,
    phase: str,
    *,
    source: str = "net.prototxt",
    lines: Sequence[int | None] = (),
    state: Any | None = None,
) -> PreparedNet:
    """Filter `net_param` for `phase` (merged with the solver's `state`) and insert the Split layers."""
    net_state_ = net_state(net_param, phase, state)
    filtered = filter_layers(net_param, net_state_, source, lines)
    layers_in = insert_splits([(index, layer) for index, layer in filtered], source, lines)
    specs = []
    flavour = flavour_of(net_param)
    for orig, param in layers_in:
        specs.append(
            LayerSpec(
                orig=orig,
                param=param,
                line=line_of(lines, orig),
                name=param.name,
                type=param.type,
                bottoms=tuple(param.bottom[:]),
                tops=tuple(param.top[:]),
                propagate_down=tuple(bool(flag) for flag in param.propagate_down[:]),
                loss_weight=tuple(param.loss_weight[:]),
                param_specs=tuple((spec.name, spec.lr_mult, spec.share_mode) for spec in param.param[:]),
                rule=rule_for(param.type, flavour),
            )
        )
    defaults: dict[str, InputDefault] = {}
    for spec in specs:
        if spec.rule is None or spec.orig is None:
            continue
        written = net_param.layer[spec.orig].bottom  # as written: a Split layer may feed the bottom by now
        for index, default in spec.rule.input_defaults(spec.param).items():
            if index < len(written):
                defaults.setdefault(written[index], default)
    return PreparedNet(
        net_param, phase, source, tuple(lines), filtered, tuple(specs), tuple({} for _ in specs), defaults
    )
