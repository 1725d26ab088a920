"""The collector pause around an estimate: paused inside, restored after, errors and threads included."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from digits_memplugin.core.collector import paused_collector
from digits_memplugin.core.errors import NetError
from digits_memplugin.core.estimate import EstimateRequest, estimate

NET = """
name: "tiny"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 4 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 2 } }
"""


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_an_estimate_runs_with_the_collector_paused_and_resumes_it() -> None:
    seen: list[bool] = []

    def load(path: str) -> tuple[str, str]:  # called from inside the estimate, for the solver's `net:` file
        seen.append(gc.isenabled())
        return NET, path

    document = estimate(EstimateRequest(solver='net: "tiny.prototxt"'), load=load)
    assert document["total_bytes"] > 0
    assert seen == [False]
    assert gc.isenabled()


def test_an_estimate_that_fails_resumes_the_collector() -> None:
    with pytest.raises(NetError):
        estimate(EstimateRequest(net="layer { name: 'x' type: 'NoSuchLayer' top: 'x' }"))
    assert gc.isenabled()


def test_a_collector_turned_off_by_someone_else_stays_off() -> None:
    gc.disable()
    estimate(EstimateRequest(net=NET))
    with paused_collector():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_nested_pauses_resume_only_when_the_outermost_ends() -> None:
    with paused_collector():
        with paused_collector():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_concurrent_pauses_resume_when_the_last_one_leaves() -> None:
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    states: dict[str, bool] = {}

    def first() -> None:
        with paused_collector():
            first_in.set()
            second_in.wait(5)
        states["after first left"] = gc.isenabled()
        first_out.set()

    def second() -> None:
        first_in.wait(5)
        with paused_collector():
            second_in.set()
            first_out.wait(5)
            states["second still inside"] = gc.isenabled()
        states["after second left"] = gc.isenabled()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert states == {"after first left": False, "second still inside": False, "after second left": True}
