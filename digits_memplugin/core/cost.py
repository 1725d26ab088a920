"""What an estimate costs: predicted from the definition before it runs, metered and bounded while it runs.

An estimate is pure Python, so where it runs nothing else runs: in the server's one thread (estimate_pool.py keeps
small ones there) it stops every other request. Its cost grows with the layers it sets up, not with the text it
reads: 8 KB of LSTM layers unrolled over 500 timesteps is 150,000 layers to set up per build (10 s here), and each
point of `curve_batches` and each step of the planner's search builds them again (30 s for a 3 KB net with eight
points; issue 23, item 4). So:

- `estimate_cost` predicts, from the parsed definition and the request's shape alone, how many layers an estimate
  sets up at most: each net's layers, a layer holding a net (a recurrent layer) counted as that net at the
  estimator's largest unroll (`LayerRule.layers_held`), times the most builds the report, the curve, the linear
  model and the planner's searches make. It also says whether a layer has no rule, so that pycaffe must shape it in a
  child process. The estimate pool routes by this prediction, not by the text's size.
- `Meter` counts the layers an estimate sets up as it goes and stops it with `TimeUp` past its deadline: the bound
  on an estimate run in the server, whatever the prediction missed.
- `MAX_BUILD_LAYERS` bounds one build (a net and the nets its layers hold): a batch whose build would pass it
  cannot be built (`BuildLimitError`, which the planner treats as it treats the unroll limit), so no estimate,
  anywhere, holds more than that many layers of one net in memory.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

__all__ = [
    "BuildLimitError", "EstimateCost", "Meter", "TimeUp", "estimate_cost", "held_bytes", "layers_in", "net_layers",
]

from .errors import BuildLimitError

MAX_BUILD_LAYERS = 50_000
"""Layers one build of one net may set up, those of the nets its layers hold included. A built layer is about
5.7 KB of Python objects (tracemalloc, with its blobs, context and memory rows), so one build holds at most about
280 MB; 50,000 is 20 LSTM layers of 500 timesteps, a hundred times the LRCN nets Caffe's examples unroll (two LSTMs
of 20 timesteps)."""

BYTES_PER_LAYER = 5_700
"""Memory a built layer holds while its net is kept (tracemalloc over LSTM nets of 300 to 30,000 layers)."""
PARSED_BYTES_PER_CHAR = 28
"""Memory a parsed and prepared definition holds per character of its text (RSS over 40 GoogLeNets)."""

PLAN_BUILDS = 2 * math.ceil(math.log2(1 << 20)) + 4
"""Builds of the train net one device's plan makes at most: batch 1, a second point, the affine guess and one above
it, then (when the guess fails, as it does for half the zoo's nets and for every recurrent one) a doubling and a
bisection over the search's 20 halvings. Measured: 5 to 67 over the zoo and LSTM nets (bench/flood.py)."""
TEST_PLAN_BUILDS = 4
"""Builds of the test nets one device's plan makes beyond the report's (the test batch planned on its own)."""
LINEAR_MODEL_BUILDS = 2
"""The curve's linear model builds batches 1 and 2."""


class TimeUp(Exception):
    """An estimate ran past its deadline (`Meter`); its caller runs it again somewhere it may take longer."""

    def __init__(self, layers: int) -> None:
        super().__init__(f"the estimate ran past its deadline after setting up {layers} layers")
        self.layers = layers


class Meter:
    """The layers one estimate sets up, counted as each build goes, with an optional deadline on a clock.

    The net builder calls `start_build` for each net it builds for a caller, `add` before setting up a net's layers
    (those of a net a layer holds count toward the build that holds it) and `tick` before each layer. A meter is
    used by one estimate at a time."""

    def __init__(
        self,
        *,
        deadline: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        build_limit: int = MAX_BUILD_LAYERS,
    ) -> None:
        self.deadline = deadline
        """When the estimate must stop, on `clock`; None: never."""
        self._clock = clock
        self.build_limit = build_limit
        self.layers = 0
        """Layers set up so far, in every build."""
        self.builds = 0
        """Nets built for callers (a net a layer holds is part of its holder's build)."""
        self.largest_build = 0
        """The most layers one build set up."""
        self._build = 0

    @classmethod
    def within(cls, seconds: float, clock: Callable[[], float] = time.monotonic) -> Meter:
        """A meter whose deadline is `seconds` from now."""
        return cls(deadline=clock() + seconds, clock=clock)

    def start_build(self) -> None:
        self.builds += 1
        self._build = 0

    def add(self, layers: int) -> int | None:
        """Count `layers` about to be set up in the current build: None when the build stays within the limit,
        else the layers it would reach (nothing is counted then)."""
        reached = self._build + layers
        if reached > self.build_limit:
            return reached
        self._build = reached
        self.layers += layers
        self.largest_build = max(self.largest_build, reached)
        return None

    def tick(self) -> None:
        """Before each layer: stop with TimeUp once the deadline has passed."""
        if self.deadline is not None and self._clock() > self.deadline:
            raise TimeUp(self.layers)


@dataclasses.dataclass(frozen=True)
class EstimateCost:
    """What an estimate will cost at most, in layers set up, and whether it needs pycaffe."""

    train_layers: int
    """Layers one build of the train net sets up at most."""
    test_layers: int
    """Layers one build of all the test nets sets up at most."""
    train_builds: int
    test_builds: int
    pycaffe: bool
    """A layer has no rule: pycaffe shapes it, in a child process of its own."""
    unrolls: bool
    """A layer holds a net it unrolls (a recurrent layer), counted at its largest unroll."""

    @property
    def layers(self) -> int:
        """Layers the whole estimate sets up at most."""
        return self.train_layers * self.train_builds + self.test_layers * self.test_builds

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "layers": self.layers}


def net_layers(layers: Iterable[Any]) -> tuple[int, bool, bool]:
    """(layers set up at most, whether a layer has no rule, whether a layer holds a net) for a prepared net's
    layer specs (`core.net.LayerSpec`: `.rule` and `.param`)."""
    total, pycaffe, holds = 0, False, False
    for spec in layers:
        if spec.rule is None:
            total, pycaffe = total + 1, True
            continue
        held = spec.rule.layers_held(spec.param)
        total += 1 + held
        holds = holds or held > 0
    return total, pycaffe, holds


def estimate_cost(
    train: Iterable[Any], tests: Sequence[Iterable[Any]] = (), *, curve_points: int = 0, plans: int = 0
) -> EstimateCost:
    """The most an estimate costs whose train net has the prepared layers `train` and whose test nets have
    `tests` (`core.net.PreparedNet.layers`), with `curve_points` distinct batches in its curve and `plans` devices
    to plan for (the request's free memory counts as one)."""
    train_layers, pycaffe, holds = net_layers(train)
    test_layers = 0
    for net in tests:
        layers, test_pycaffe, test_holds = net_layers(net)
        test_layers, pycaffe, holds = test_layers + layers, pycaffe or test_pycaffe, holds or test_holds
    train_builds = 1 + (curve_points + LINEAR_MODEL_BUILDS if curve_points else 0) + plans * PLAN_BUILDS
    return EstimateCost(
        train_layers=min(train_layers, MAX_BUILD_LAYERS),
        test_layers=min(test_layers, MAX_BUILD_LAYERS * len(tests)),
        train_builds=train_builds,
        test_builds=(1 + plans * TEST_PLAN_BUILDS) if tests else 0,
        pycaffe=pycaffe,
        unrolls=holds,
    )


def layers_in(net: Any) -> int:
    """Layers a built net holds (`core.net.Net`), those of the nets its layers hold included."""
    total = 0
    for layer in net.layers:
        total += 1
        subnet = layer.setup.subnet if layer.setup is not None else None
        if subnet is not None:
            total += layers_in(subnet.net)
    return total


def held_bytes(text_chars: int, kept_layers: int) -> int:
    """What a cached definition holds, estimated: its parsed text and the layers of the reports kept on it."""
    return text_chars * PARSED_BYTES_PER_CHAR + kept_layers * BYTES_PER_LAYER
