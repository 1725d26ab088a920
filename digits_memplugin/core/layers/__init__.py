"""Layer rules, one module per family; importing this package registers them all."""

from . import common, data, detectnet, loss, neuron, normalization, recurrent, shaping, ssd, vision
from .base import Buffer as Buffer
from .base import DeferToPycaffe as DeferToPycaffe
from .base import LayerContext as LayerContext
from .base import LayerRule as LayerRule
from .base import LayerSetup as LayerSetup
from .base import Shape as Shape
from .base import count_of as count_of
from .base import known_types as known_types
from .base import rule_for as rule_for
from .data import DataSpec as DataSpec

__all__ = ["common", "data", "detectnet", "loss", "neuron", "normalization", "recurrent", "shaping", "ssd", "vision"]
