"""pace: the speed of an attempt and its time left, from its (iteration, seconds) records."""

from __future__ import annotations

import math

import pytest

from digits_memplugin.jobs.events.pace import Pace, Window, format_duration, format_rate, pace, recent


def test_no_speed_until_two_records_say_how_fast() -> None:
    assert pace([], 100) is None
    assert pace([(1, 2.0)], 100) is None
    assert pace([(1, 2.0), (1, 3.0)], 100) is None  # no iteration done between them
    assert pace([(1, 2.0), (2, 2.0)], 100) is None  # no time between them


def test_speed_and_time_left_at_a_steady_pace() -> None:
    points = [(i, 10.0 + i / 4) for i in range(1, 41)]  # 4 it/s, from a child that took 10 s to start
    assert pace(points, 100) == Pace(4.0, 15.0)
    assert pace(points, 40) == Pace(4.0, 0.0)
    assert pace(points, 30) == Pace(4.0, 0.0)  # past max_iter (a shortened run): nothing left, never negative


def test_the_speed_follows_the_last_minute() -> None:
    slow = [(i, float(i)) for i in range(0, 121)]  # 1 it/s for two minutes
    fast = [(120 + 2 * k, 120.0 + k) for k in range(1, 121)]  # then 2 it/s for two minutes
    measured = pace(slow + fast, 1000)
    assert measured is not None and measured.iterations_per_second == pytest.approx(2.0)
    wider = pace(slow + fast, 1000, window=240)
    assert wider is not None and wider.iterations_per_second == pytest.approx(1.5)


def test_a_long_pause_between_the_last_two_records_still_gives_a_speed() -> None:
    # A test pass of five minutes between two iterations: the speed is that of the last stretch, not none.
    measured = pace([(10, 5.0), (11, 305.0)], 111)
    assert measured is not None and measured.iterations_per_second == pytest.approx(1 / 300)
    assert measured.seconds_left == pytest.approx(100 * 300)


def test_recent_keeps_what_pace_needs() -> None:
    points = [(i, float(i)) for i in range(0, 1000)]
    kept = recent(points)
    assert kept[0] == (939, 939.0) and kept[-1] == (999, 999.0)
    assert pace(kept, 2000) == pace(points, 2000)
    assert recent([]) == [] and recent([(1, 1.0)]) == [(1, 1.0)]
    assert recent([(1, 1.0), (2, 500.0)]) == [(1, 1.0), (2, 500.0)]


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0 s"), (0.4, "0 s"), (44.6, "45 s"), (59.6, "1 min 00 s"), (185, "3 min 05 s"), (6000, "1 h 40 min"),
    (3 * 86400 + 4 * 3600 + 59, "3 d 4 h"), (-3, "0 s"), (math.inf, "unknown"), (math.nan, "unknown"),
])
def test_durations_read_as_people_say_them(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_rates_have_three_significant_digits() -> None:
    assert format_rate(45.234) == "45.2 it/s"
    assert format_rate(0.58712) == "0.587 it/s"
    assert format_rate(99.94) == "99.9 it/s"
    assert format_rate(1234.7) == "1235 it/s"


def test_a_window_keeps_what_pace_needs_however_fast_the_records_come() -> None:
    """The server follows every running attempt with one: a LeNet attempt reports hundreds of records a second, and
    the job documents must not re-read a progress file for its speed."""
    window = Window()
    points = [(i, 2.0 + i / 500) for i in range(1, 100_001)]  # 500 it/s for 200 s
    for iteration, seconds in points:
        window.add(iteration, seconds)
        assert len(window.points) <= Window.MAX_POINTS + 2
    assert window.points[-1] == points[-1]  # the newest is always kept
    measured, exact = window.pace(200_000), pace(points, 200_000)
    assert measured is not None and exact is not None
    assert measured.iterations_per_second == pytest.approx(exact.iterations_per_second, rel=0.01)
    assert measured.seconds_left == pytest.approx(exact.seconds_left, rel=0.01)
    window.add(5, 3.0)  # an older record (seen twice): ignored
    assert window.points[-1] == points[-1]


def test_a_window_gives_a_speed_from_its_second_record() -> None:
    window = Window()
    window.add(1, 2.0)
    assert window.pace(100) is None
    window.add(2, 2.1)
    measured = window.pace(100)
    assert measured is not None and measured.iterations_per_second == pytest.approx(10.0)
    assert measured.seconds_left == pytest.approx(9.8)
