"""core.schedule: Caffe's learning-rate policies, held to the "Iteration N, lr = X" lines real pycaffe logs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from digits_memplugin.core.errors import NetError
from digits_memplugin.core.prototxt import parse_solver
from digits_memplugin.core.schedule import LearningRate

NET = """
name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "target"
  dummy_data_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 1 }
                     data_filler { type: "gaussian" } data_filler { type: "gaussian" } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip" inner_product_param { num_output: 1
  weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }
"""

ITERATIONS = 40
# Each policy with parameters that make it change within 40 iterations.
POLICIES = {
    "fixed": 'lr_policy: "fixed"',
    "step": 'lr_policy: "step" gamma: 0.5 stepsize: 7',
    "exp": 'lr_policy: "exp" gamma: 0.93',
    "inv": 'lr_policy: "inv" gamma: 0.1 power: 0.75',
    "multistep": 'lr_policy: "multistep" gamma: 0.3 stepvalue: 5 stepvalue: 5 stepvalue: 12 stepvalue: 9',
    "poly": 'lr_policy: "poly" power: 1.7',
    "sigmoid": 'lr_policy: "sigmoid" gamma: -0.2 stepsize: 20',
}
LR_LINE = re.compile(r"solver\.cpp:\d+\] Iteration (\d+), lr = (\S+)")


def solver_text(net_path: Path, policy: str) -> str:
    return f'net: "{net_path}" base_lr: 0.05 max_iter: {ITERATIONS} display: 1 solver_mode: CPU {POLICIES[policy]}\n'


@pytest.fixture(scope="module")
def caffe_rates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[int, float]]:
    """Every policy trained for real by pycaffe, one solver after the other in one child; its glog lines parsed."""
    folder = tmp_path_factory.mktemp("schedule")
    (folder / "net.prototxt").write_text(NET)
    for policy in POLICIES:
        (folder / f"{policy}.prototxt").write_text(solver_text(folder / "net.prototxt", policy))
    script = textwrap.dedent(
        f"""
        import sys, caffe
        caffe.set_mode_cpu()
        for policy in {list(POLICIES)!r}:
            sys.stderr.write("POLICY " + policy + "\\n"); sys.stderr.flush()
            solver = caffe.get_solver(policy + ".prototxt")
            solver.step({ITERATIONS})
        """
    )
    env = {**os.environ, "GLOG_logtostderr": "1", "GLOG_minloglevel": "0", "OPENBLAS_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=True
    )
    rates: dict[str, dict[int, float]] = {}
    current = None
    for line in result.stderr.splitlines():
        if line.startswith("POLICY "):
            current = rates.setdefault(line.split()[1], {})
        match = LR_LINE.search(line)
        if match and current is not None:
            current[int(match.group(1))] = float(match.group(2))
    return rates


@pytest.mark.slow
@pytest.mark.parametrize("policy", list(POLICIES))
def test_rates_match_caffe_log_lines(policy: str, caffe_rates: dict[str, dict[int, float]], tmp_path: Path) -> None:
    logged = caffe_rates[policy]
    assert sorted(logged) == list(range(ITERATIONS))  # one line per iteration: display 1
    schedule = LearningRate.from_solver(parse_solver(solver_text(tmp_path / "net.prototxt", policy)))
    for iteration, rate in logged.items():
        # Caffe prints six significant digits of a float.
        assert schedule.rate(iteration) == pytest.approx(rate, rel=2e-5, abs=1e-12), iteration
    assert len(set(logged.values())) > (1 if policy != "fixed" else 0)


def test_multistep_passes_repeated_and_unsorted_stepvalues_one_iteration_at_a_time() -> None:
    schedule = LearningRate("multistep", 1.0, gamma=0.5, stepvalues=(5, 5, 12, 9))
    assert [schedule.current_step(i) for i in (0, 4, 5, 6, 11, 12, 13)] == [0, 0, 1, 2, 2, 3, 4]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('lr_policy: "cosine"', "lr_policy"),
        ('lr_policy: "step" gamma: 0.1', "stepsize"),
        ('lr_policy: "poly" power: 1', "max_iter"),
    ],
)
def test_policies_caffe_would_abort_on_are_refused(text: str, field: str) -> None:
    with pytest.raises(NetError) as raised:
        LearningRate.from_solver(parse_solver('net: "n.prototxt" base_lr: 0.1 ' + text))
    assert raised.value.field == field


def test_negative_iterations_are_refused() -> None:
    with pytest.raises(ValueError):
        LearningRate().rate(-1)
