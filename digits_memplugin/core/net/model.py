"""The net as built: its blobs, params and layers with their shapes and backward flags (what `build_net` returns
and the memory model reads)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..layers import LayerContext, LayerRule, LayerSetup, Shape, count_of
from ..layers.base import FLOAT_BYTES


@dataclasses.dataclass
class Blob:
    id: int
    name: str
    shape: Shape
    producer: int
    loss_weight: float = 0.0
    data_of: int | None = None
    """Id of the blob whose data this one shares (Flatten, Reshape, Split tops); None when it owns its data."""
    diff_of: int | None = None
    """Id of the blob whose diff this one shares (Flatten, Reshape tops); None when it owns its diff."""
    need_backward: bool = False
    capacity: int = 0
    """Elements of its buffers: the largest count it had (an in-place layer may reshape it larger)."""

    @property
    def count(self) -> int:
        return count_of(self.shape)


@dataclasses.dataclass
class Param:
    id: int
    layer: int
    index: int
    shape: Shape
    name: str
    lr_mult: float
    owner: int | None = None
    """Id of the param this one shares storage with (same ParamSpec name earlier in the net), None when owned."""

    @property
    def count(self) -> int:
        return count_of(self.shape)


@dataclasses.dataclass
class Layer:
    index: int
    name: str
    type: str
    param: Any
    rule: LayerRule | None
    ctx: LayerContext
    setup: LayerSetup
    bottoms: list[int]
    tops: list[int]
    params: list[int] = dataclasses.field(default_factory=list)
    need_backward: bool = False
    bottom_need_backward: list[bool] = dataclasses.field(default_factory=list)
    param_need_backward: list[bool] = dataclasses.field(default_factory=list)
    source_index: int | None = None
    line: int | None = None
    from_oracle: bool = False
    top_counts: list[int] = dataclasses.field(default_factory=list)
    """Each top's count right after this layer's set-up (what Caffe's "Memory required for data" adds up)."""


@dataclasses.dataclass
class Net:
    name: str
    phase: str
    layers: list[Layer]
    blobs: list[Blob]
    params: list[Param]
    force_backward: bool
    param: Any = None
    """The NetParameter the net was built from (before filtering), for `input_net`."""

    @property
    def memory_required_for_data(self) -> int:
        """Caffe's "Memory required for data" log line: every top's count, in-place tops counted again."""
        return sum(count for layer in self.layers for count in layer.top_counts) * FLOAT_BYTES

    def blob(self, name: str) -> Blob:
        for blob in reversed(self.blobs):
            if blob.name == name:
                return blob
        raise KeyError(name)
