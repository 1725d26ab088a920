"""How fast a training attempt goes and how long the rest of it takes, from its iteration records.

Every iteration record the training child writes carries `iteration` and `seconds` (since the child started).
The speed is measured over the last `WINDOW_SECONDS` of them, so that it follows a change of pace (another job
starting on the device, a resumed attempt) while test passes inside the window are counted in, as they will be
for the iterations left. Pure functions over (iteration, seconds) pairs of one attempt: the command line calls
them, and the job manager keeps a bounded `Window` of them per running attempt, from which the job documents and
events give the speed and the time left.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Sequence

Point = tuple[int, float]
"""(iteration, seconds since the attempt's child started), as an iteration record has them."""

WINDOW_SECONDS = 60.0


@dataclasses.dataclass(frozen=True)
class Pace:
    iterations_per_second: float
    seconds_left: float
    """At that speed, for the iterations up to max_iter."""


def pace(points: Sequence[Point], max_iter: int, window: float = WINDOW_SECONDS) -> Pace | None:
    """The speed over the last `window` seconds of `points` (one attempt's, in order) and the time left to
    `max_iter` at that speed; None until two points at different times and iterations say how fast it goes.

    When the two latest points are further apart than `window` (a long test pass between them), the speed is
    measured between those two."""
    if len(points) < 2:
        return None
    last_iteration, last_seconds = points[-1]
    start = _window_start(points, window)
    first_iteration, first_seconds = points[start]
    elapsed = last_seconds - first_seconds
    done = last_iteration - first_iteration
    if not (elapsed > 0 and done > 0 and math.isfinite(elapsed)):
        return None
    rate = done / elapsed
    return Pace(rate, max(0, max_iter - last_iteration) / rate)


def recent(points: Sequence[Point], window: float = WINDOW_SECONDS) -> list[Point]:
    """The points `pace` still needs: those of the last `window` seconds, and the one before them. Keeping only
    these bounds what a follower of a long job holds."""
    if not points:
        return []
    return list(points[_window_start(points, window):])


class Window:
    """The points `pace` needs of one attempt, bounded however fast it goes: those of the last `window` seconds
    (and the one before them), at least `window / MAX_POINTS` seconds apart, the newest always kept. A server
    follows every running attempt with one (a LeNet attempt reports hundreds of iterations a second), so that a
    job's speed is computed from at most MAX_POINTS points, never from its progress file."""

    MAX_POINTS = 120

    def __init__(self, window: float = WINDOW_SECONDS) -> None:
        self.window = window
        self.spacing = window / self.MAX_POINTS
        self.points: list[Point] = []

    def add(self, iteration: int, seconds: float) -> None:
        """A record's (iteration, seconds); one older than the newest (a record seen twice) is ignored."""
        points = self.points
        if points and (seconds < points[-1][1] or iteration < points[-1][0]):
            return
        if len(points) >= 2 and seconds - points[-2][1] < self.spacing:
            points[-1] = (iteration, seconds)  # too close to the one before: the newest replaces it
        else:
            points.append((iteration, seconds))
        start = _window_start(points, self.window)
        if start > 0:
            del points[:start]

    def pace(self, max_iter: int) -> Pace | None:
        return pace(self.points, max_iter, self.window)


def _window_start(points: Sequence[Point], window: float) -> int:
    """Index of the oldest point no older than `window` before the last, and never the last itself."""
    start = bisect.bisect_left(points, points[-1][1] - window, key=lambda point: point[1])
    return min(start, len(points) - 2) if len(points) > 1 else 0


def format_duration(seconds: float) -> str:
    """A time left as people say it: "45 s", "3 min 05 s", "1 h 40 min", "2 d 3 h"."""
    if not math.isfinite(seconds):
        return "unknown"
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def format_rate(iterations_per_second: float) -> str:
    """Iterations a second with three significant digits ("45.2 it/s", "0.587 it/s"), whole ones from 100."""
    if iterations_per_second >= 100:
        return f"{round(iterations_per_second)} it/s"
    return f"{iterations_per_second:.3g} it/s"
