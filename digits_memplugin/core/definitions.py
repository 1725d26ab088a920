"""The process's cache of parsed definitions (`DEFINITIONS`; each estimate worker has its own), bounded in entries
and in the bytes they hold."""

from __future__ import annotations

import threading

from .cost import held_bytes
from .estimator import kept_layers
from .prototxt import ParseLimits
from .training import Loader, TrainingDefinition, fill_num_classes, training_definition

MAX_CACHED_DEFINITIONS = 32
MAX_CACHED_BYTES = 128 << 20
"""What the definition cache may keep, by its estimate of the bytes held (`cost.held_bytes`): parsed texts and
kept reports, the oldest dropped first."""


def parsed_definition(
    net: str | None,
    solver: str | None,
    net_source: str,
    solver_source: str,
    limits: ParseLimits,
    classes: int | None,
    load: Loader | None = None,
) -> TrainingDefinition:
    """A definition parsed, upgraded and prepared from its texts (read through `load` when given), its classes
    filled in."""
    definition = training_definition(
        net, solver, net_source=net_source, solver_source=solver_source, load=load, limits=limits
    )
    if classes is not None:
        fill_num_classes(definition, classes)
    return definition


DefinitionKey = tuple[str | None, str | None, str, str, ParseLimits, int | None]


class DefinitionCache:
    """Parsed, upgraded and prepared nets by their texts: the form re-estimates the same net at other batches and
    for other devices many times, and parsing is most of the cost of a cold estimate. Nothing mutates a cached
    definition afterwards (classes are filled in before it is cached); errors are not cached.

    It keeps at most `entries` definitions and, by its estimate of what they hold (`cost.held_bytes`: the parsed
    text and the reports estimators keep on a definition), at most `max_bytes`, the least recently used dropped
    first. What a definition holds grows after it is cached (an estimate keeps a report on it), so `settle`, which
    every estimate calls when it ends, drops again what no longer fits."""

    def __init__(self, entries: int = MAX_CACHED_DEFINITIONS, max_bytes: int = MAX_CACHED_BYTES) -> None:
        self.entries = entries
        self.max_bytes = max_bytes
        self._cached: dict[DefinitionKey, TrainingDefinition] = {}
        self._lock = threading.Lock()

    def get(
        self,
        net: str | None,
        solver: str | None,
        net_source: str,
        solver_source: str,
        limits: ParseLimits,
        classes: int | None,
    ) -> TrainingDefinition:
        key = (net, solver, net_source, solver_source, limits, classes)
        with self._lock:
            definition = self._cached.pop(key, None)
            if definition is not None:
                self._cached[key] = definition  # the most recently used
                return definition
        definition = parsed_definition(net, solver, net_source, solver_source, limits, classes)
        with self._lock:
            self._cached[key] = definition
        self.settle()
        return definition

    def settle(self) -> None:
        """Drop the least recently used definitions until the rest fit (the newest always stays)."""
        with self._lock:
            held = {key: self._held(key, definition) for key, definition in self._cached.items()}
            total = sum(held.values())
            while len(self._cached) > 1 and (len(self._cached) > self.entries or total > self.max_bytes):
                oldest = next(iter(self._cached))
                del self._cached[oldest]
                total -= held.pop(oldest)

    @staticmethod
    def _held(key: DefinitionKey, definition: TrainingDefinition) -> int:
        return held_bytes(len(key[0] or "") + len(key[1] or ""), kept_layers(definition))

    @property
    def held(self) -> int:
        """The bytes the cached definitions hold, by the cache's estimate."""
        with self._lock:
            return sum(self._held(key, definition) for key, definition in self._cached.items())

    def __len__(self) -> int:
        with self._lock:
            return len(self._cached)

    def clear(self) -> None:
        with self._lock:
            self._cached.clear()


DEFINITIONS = DefinitionCache()
"""The process's cache of parsed definitions (each estimate worker has its own)."""
