"""Non-finite numbers in documents (core.nonfinite) and a diverging training (core.divergence, core.oom.classify):
the pure parts, on the records the runner writes. The real diverging jobs are in test_jobs_divergence.py."""

from __future__ import annotations

import json
import math
import signal
from typing import Any

import pytest

from digits_memplugin.core import nonfinite, oom
from digits_memplugin.core.divergence import CONTINUE, STOP, Divergence, DivergenceWatch, find

DIGITS_SENTENCE = 'Network outputted NaN for "loss" (Train phase). Try decreasing your learning rate.'
"""DIGITS' words (digits/model/tasks/caffe_train.py: 'Network outputted NaN for "%s" (%s phase). Try decreasing
your learning rate.')."""


def strict(text: str) -> Any:
    """json.loads as JSON.parse reads: the bare NaN / Infinity tokens are an error."""
    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_dumps_writes_non_finite_numbers_as_strings_at_any_depth() -> None:
    record = {"loss": math.nan, "lr": 0.01, "outputs": {"loss": math.inf, "list": [1.0, -math.inf], "m": {"mean": math.nan}}}
    text = nonfinite.dumps(record, sort_keys=True)
    assert strict(text) == {
        "loss": "NaN", "lr": 0.01, "outputs": {"list": [1.0, "-Infinity"], "loss": "Infinity", "m": {"mean": "NaN"}},
    }
    assert "NaN," not in text.replace('"NaN"', "")


def test_dumps_encodes_what_default_converts() -> None:
    class Float32:  # what numpy.float32 is to json: not a float
        def __init__(self, value: float) -> None:
            self.value = value

    assert strict(nonfinite.dumps({"x": Float32(math.nan)}, default=lambda item: item.value)) == {"x": "NaN"}


def test_encode_leaves_finite_documents_untouched() -> None:
    document = {"a": [1, 2.5, {"b": "NaN-ish"}], "c": None}
    assert nonfinite.encode(document) is document


def test_loads_reads_the_bare_tokens_other_writers_leave_as_the_strings() -> None:
    document = nonfinite.loads('{"loss": NaN, "up": Infinity, "down": -Infinity, "name": "NaN"}')
    assert document == {"loss": "NaN", "up": "Infinity", "down": "-Infinity", "name": "NaN"}
    assert strict(nonfinite.dumps(document)) == document


def test_number_reads_numbers_and_the_three_strings_only() -> None:
    assert nonfinite.number(2) == 2.0 and nonfinite.number(0.5) == 0.5
    assert math.isnan(nonfinite.number("NaN") or 0.0)
    assert nonfinite.number("Infinity") == math.inf and nonfinite.number("-Infinity") == -math.inf
    for other in (None, True, "nan", "inf", "1.5", {"mean": 1.0}, [1.0]):
        assert nonfinite.number(other) is None, other
    assert nonfinite.text("NaN") == "NaN" and nonfinite.text(0.123456789) == "0.123457" and nonfinite.text(None) == "n/a"


def iteration(loss: Any, iteration: int = 4, **outputs: Any) -> dict[str, Any]:
    return {"event": "iteration", "iteration": iteration, "lr": 50.0, "loss": loss, "outputs": {"loss": loss, **outputs}}


def test_find_names_the_first_non_finite_output_and_its_phase_in_digits_words() -> None:
    found = find(iteration("NaN"))
    assert found == Divergence("Train", "loss", "NaN", 4)
    assert found.digits_message == DIGITS_SENTENCE
    assert found.stopped_message.startswith(DIGITS_SENTENCE) and "iteration 4" in found.stopped_message
    test = {"event": "test", "iteration": 20, "net": 1, "outputs": {"accuracy": 0.1, "loss": "Infinity"}, "loss": "Infinity"}
    assert find(test) == Divergence("Test", "loss", "Infinity", 20, 1)
    assert find(test).digits_message == (  # type: ignore[union-attr]
        'Network outputted Infinity for "loss" (Test phase, test net 1). Try decreasing your learning rate.'
    )
    # Outputs of many values: a list, or the mean of a long one; a float NaN (a runner's own record) too.
    assert find(iteration(1.0, prob=[0.5, "NaN"])) == Divergence("Train", "prob", "NaN", 4)
    assert find(iteration(1.0, big={"mean": math.nan, "count": 40})) == Divergence("Train", "big", "NaN", 4)
    # The weighted loss, when no output says it.
    assert find({"event": "iteration", "iteration": 2, "loss": "-Infinity", "outputs": {}}) == Divergence(
        "Train", "loss", "-Infinity", 2
    )


def test_find_passes_finite_records_and_records_without_outputs() -> None:
    assert find(iteration(2.3)) is None
    assert find({"event": "iteration", "iteration": 1, "loss": None, "outputs": {"loss": None}}) is None
    assert find({"event": "snapshot", "iteration": 4, "model": "NaN"}) is None
    assert find({"event": "started", "loss": "NaN"}) is None


def test_the_watch_stops_once_under_stop_and_never_under_continue() -> None:
    stop = DivergenceWatch(STOP)
    assert [stop.see(iteration(loss, n)) for n, loss in enumerate([2.3, 76.4, "NaN", "NaN"], 1)] == [
        False, False, True, False,
    ]
    assert stop.first == Divergence("Train", "loss", "NaN", 3)
    train_on = DivergenceWatch(CONTINUE)
    assert not any(train_on.see(iteration(loss, n)) for n, loss in enumerate([2.3, "NaN", "NaN"], 1))
    assert train_on.first == Divergence("Train", "loss", "NaN", 2)
    with pytest.raises(ValueError, match="stop, continue"):
        DivergenceWatch("ignore")


def test_classify_a_stopped_divergence_is_diverged_whatever_the_exit() -> None:
    divergence = Divergence("Train", "loss", "NaN", 4)
    for returncode, signal_name in ((0, None), (-signal.SIGTERM, "SIGTERM"), (-signal.SIGABRT, "SIGABRT")):
        outcome = oom.classify(returncode, "double free or corruption (out)\n", divergence=divergence)
        assert outcome.status == oom.OUTCOME_DIVERGED and not outcome.retry
        assert outcome.message == divergence.stopped_message and outcome.signal == signal_name
        assert outcome.out_of_memory is None and outcome.divergence == divergence
        assert oom.Outcome.from_dict(json.loads(json.dumps(outcome.to_dict()))) == outcome


def test_classify_a_divergence_the_job_trains_on_is_classified_as_usual() -> None:
    divergence = Divergence("Train", "loss", "NaN", 4)
    done = oom.classify(0, "", finished=True, divergence=divergence, train_on=True)
    assert done.status == oom.OUTCOME_SUCCESS and done.divergence == divergence
    # Freeing a net whose pooling wrote before its buffers aborts after the runner said it finished: still done.
    aborted = oom.classify(-signal.SIGABRT, "double free or corruption (out)\n", finished=True, divergence=divergence,
                           train_on=True)
    assert aborted.status == oom.OUTCOME_SUCCESS and "SIGABRT" in aborted.message
    # A real out-of-memory after the divergence is still one.
    oom_line = "F20261202 09:26:08.945708 20235 syncedmem.hpp:25] Check failed: *ptr host allocation of size 64 failed"
    assert oom.classify(-signal.SIGABRT, oom_line, divergence=divergence, train_on=True).status == oom.OUTCOME_OUT_OF_MEMORY
