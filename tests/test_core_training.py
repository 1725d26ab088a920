"""training_definition: the nets a solver trains and tests, held to Caffe's Solver::InitTrainNet / InitTestNets.

Each solver below is also given to pycaffe (`caffe.get_solver`, in a child process): the layers Caffe keeps in its
train net and in each test net must be the ones we keep, and where Caffe aborts on a CHECK we raise a NetError
naming the solver field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import ZOO
from test_core_netstate import run_pycaffe, skeleton

from digits_memplugin.core.errors import NetError
from digits_memplugin.core.net import Net
from digits_memplugin.core.proto import caffe_pb2
from digits_memplugin.core.training import TrainingDefinition, training_definition
from digits_memplugin.estimate.files import confined_loader


def relu(name: str, rule: str = "") -> str:
    return f'layer {{ name: "{name}" type: "ReLU" bottom: "data" top: "{name}" {rule} }}\n'


STAGED = (
    'name: "staged"\n'
    'layer { name: "input" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }\n'
    + relu("train_only", "include { phase: TRAIN }")
    + relu("test_only", "include { phase: TEST }")
    + relu("stage_a", 'include { stage: "a" }')
    + relu("stage_b", 'include { stage: "b" }')
    + relu("not_a", 'exclude { stage: "a" }')
    + relu("level1", "include { min_level: 1 }")
    + relu("level_le0", "include { max_level: 0 }")
    + relu("from_net", 'include { stage: "from_net" }')
)
NET_STATE = 'state { stage: "from_net" level: 1 }\n'
TAIL = 'base_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 1\n'


def inline(field: str, text: str) -> str:
    return f"{field} {{\n{text}}}\n"


# name -> solver text; the files named are written next to it.
SOLVERS: dict[str, str] = {
    "net-file-two-instances": (
        'net: "staged.prototxt"\ntest_iter: 1\ntest_iter: 2\ntest_interval: 10\n'
        'train_state { stage: "a" level: 1 }\ntest_state { stage: "b" }\ntest_state { stage: "a" level: 2 }\n'
    ),
    "net-file-no-test": 'net: "staged.prototxt"\n',
    "net-param-one-test": inline("net_param", STAGED) + "test_iter: 5\ntest_interval: 100\n",
    "train-and-test-files": (
        'train_net: "staged.prototxt"\ntest_net: "staged.prototxt"\ntest_net: "with_state.prototxt"\n'
        "test_iter: 1\ntest_iter: 1\ntest_interval: 1\n"
        'test_state { stage: "a" }\ntest_state { level: 0 }\n'
    ),
    "train-and-test-params": (
        inline("train_net_param", STAGED) + inline("test_net_param", STAGED) + inline("test_net_param", STAGED)
        + "test_iter: 1\ntest_iter: 1\ntest_interval: 1\n"
    ),
    "explicit-then-generic": (
        'net: "staged.prototxt"\n' + inline("test_net_param", STAGED)
        + "test_iter: 1\ntest_iter: 1\ntest_iter: 1\ntest_interval: 1\n"
        + 'test_state { stage: "b" }\ntest_state { }\ntest_state { stage: "a" }\n'
    ),
    "net-state-merged": 'net: "with_state.prototxt"\ntest_iter: 1\ntest_interval: 1\ntrain_state { level: 0 }\n',
    "net-state-changes-phase": 'net: "test_phase.prototxt"\n',
    "solver-type-enum": 'net: "staged.prototxt"\nsolver_type: ADAM\ntest_iter: 1\ntest_interval: 1\n',
}

# name -> (solver text, the solver field our error names, what Caffe's CHECK says)
FAILING_SOLVERS: dict[str, tuple[str, str | None, str]] = {
    "no-train-net": ("test_iter: 1\ntest_interval: 1\n", None, "SolverParameter must specify a train net"),
    "two-train-nets": (
        'net: "staged.prototxt"\n' + inline("train_net_param", STAGED), None, "must not contain more than one"
    ),
    "too-few-test-iter-for-explicit-nets": (
        (
            'train_net: "staged.prototxt"\ntest_net: "staged.prototxt"\ntest_net: "staged.prototxt"\n'
            "test_iter: 1\ntest_interval: 1\n"
        ),
        "test_iter",
        "test_iter must be specified for each test network",
    ),
    "too-many-test-iter-without-generic-net": (
        'train_net: "staged.prototxt"\ntest_net: "staged.prototxt"\ntest_iter: 1\ntest_iter: 1\ntest_interval: 1\n',
        "test_iter",
        "test_iter must be specified for each test network",
    ),
    "too-few-test-iter-with-generic-net": (
        'net: "staged.prototxt"\n' + inline("test_net_param", STAGED) + inline("test_net_param", STAGED)
        + "test_iter: 1\ntest_interval: 1\n",
        "test_iter",
        "test_iter must be specified for each test network",
    ),
    "test-state-count": (
        'net: "staged.prototxt"\ntest_iter: 1\ntest_iter: 1\ntest_interval: 1\ntest_state { stage: "a" }\n',
        "test_state",
        "test_state must be unspecified or specified once per test net",
    ),
    "test-interval-zero": ('net: "staged.prototxt"\ntest_iter: 1\n', "test_interval", "test_interval() > 0"),
    "test-interval-negative": (
        'net: "staged.prototxt"\ntest_iter: 1\ntest_interval: -5\n', "test_interval", "test_interval() > 0"
    ),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("solvers")
    (root / "staged.prototxt").write_text(STAGED)
    (root / "with_state.prototxt").write_text(NET_STATE + STAGED)
    (root / "test_phase.prototxt").write_text("state { phase: TEST }\n" + STAGED)
    for name, text in SOLVERS.items():
        (root / f"{name}.solver").write_text(text + TAIL)
    for name, (text, _, _) in FAILING_SOLVERS.items():
        (root / f"{name}.solver").write_text(text + TAIL)
    return root


@pytest.fixture(scope="module")
def caffe_nets(folder: Path) -> dict[str, dict[str, Any]]:
    names = [*SOLVERS, *FAILING_SOLVERS]
    results = run_pycaffe([{"kind": "solver", "path": f"{name}.solver"} for name in names], folder)
    return dict(zip(names, results))


def stages(state: Any) -> list[str]:
    """A NetDefinition's state as a list of stages (None: no state given)."""
    return [] if state is None else list(state.stage)


def kept(net: Net) -> list[str]:
    return [layer.name for layer in net.layers if layer.type != "Split"]


def ours(folder: Path, name: str) -> TrainingDefinition:
    text = (folder / f"{name}.solver").read_text()
    return training_definition(solver_text=text, solver_source=f"{name}.solver", load=confined_loader(folder))


@pytest.mark.parametrize("name", list(SOLVERS))
def test_nets_and_layers_match_caffes_solver(folder: Path, caffe_nets: dict[str, dict[str, Any]], name: str) -> None:
    caffe = caffe_nets[name]
    assert "fatal" not in caffe, caffe
    train, tests = ours(folder, name).build()
    assert kept(train) == caffe["train"]
    assert [kept(test) for test in tests] == caffe["tests"]


def test_the_solvers_tell_states_apart(caffe_nets: dict[str, dict[str, Any]]) -> None:
    """The comparison above is only as strong as the nets differ: the states give different layer sets."""
    layer_sets = {tuple(net) for name in SOLVERS for net in (caffe_nets[name]["train"], *caffe_nets[name]["tests"])}
    assert len(layer_sets) >= 6
    assert caffe_nets["net-state-changes-phase"]["train"].count("test_only") == 1  # the net's state wins the phase
    assert len(caffe_nets["explicit-then-generic"]["tests"]) == 3


@pytest.mark.parametrize("name", list(FAILING_SOLVERS))
def test_solvers_caffe_refuses_are_net_errors(folder: Path, caffe_nets: dict[str, dict[str, Any]], name: str) -> None:
    _, field, check = FAILING_SOLVERS[name]
    assert check in caffe_nets[name].get("fatal", ""), caffe_nets[name]
    with pytest.raises(NetError) as raised:
        ours(folder, name)
    assert raised.value.field == field
    assert raised.value.source == f"{name}.solver"


def test_test_states_and_iters_are_recorded(folder: Path) -> None:
    definition = ours(folder, "explicit-then-generic")
    assert definition.test_iters == [1, 1, 1]
    assert [stages(test.state) for test in definition.tests] == [["b"], [], ["a"]]
    assert [test.source for test in definition.tests] == [
        "explicit-then-generic.solver (test_net_param #0)", "staged.prototxt", "staged.prototxt"
    ]
    assert ours(folder, "solver-type-enum").solver_type == "Adam"


def test_generic_instances_keep_their_own_states(folder: Path) -> None:
    """The instances may share one parsed net (build_net never changes it), never one state."""
    definition = ours(folder, "net-file-two-instances")
    first, second = definition.tests
    assert first is not second and first is not definition.train
    assert second.state is not None
    assert [stages(first.state), stages(second.state), second.state.level] == [["b"], ["a"], 2]
    assert stages(definition.train.state) == ["a"]


# ------------------------------------------------------------------------------------------ files a solver names


def test_a_solver_net_path_that_escapes_its_folder_is_refused(folder: Path, tmp_path: Path) -> None:
    solver = tmp_path / "job" / "solver.prototxt"
    solver.parent.mkdir()
    (tmp_path / "outside.prototxt").write_text(STAGED)
    for field in ("net", "train_net"):
        with pytest.raises(NetError, match="outside the solver's folder"):
            training_definition(
                solver_text=f'{field}: "../outside.prototxt"\n', load=confined_loader(solver.parent)
            )
    with pytest.raises(NetError, match="outside the solver's folder"):
        training_definition(
            solver_text=f'train_net: "{folder / "staged.prototxt"}"\ntest_net: "/etc/passwd"\n'
            "test_iter: 1\ntest_interval: 1\n",
            load=confined_loader(folder),
        )


def test_without_a_loader_a_named_file_is_a_clear_error() -> None:
    with pytest.raises(NetError) as raised:
        training_definition(solver_text='net: "train_val.prototxt"\n')
    assert raised.value.field == "net"
    assert "give its text instead" in str(raised.value)


def test_a_net_file_with_syntax_errors_names_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "broken.prototxt").write_text('name: "b"\nlayer {\n  bogus: 1\n}\n')
    with pytest.raises(NetError) as raised:
        training_definition(solver_text='net: "broken.prototxt"\n', load=confined_loader(tmp_path))
    assert (raised.value.source, raised.value.line, raised.value.column) == ("broken.prototxt", 3, 3)


# ------------------------------------------------------------------------------------------ a net given directly


def test_the_given_net_is_the_train_and_generic_net_whatever_the_solver_names() -> None:
    definition = training_definition(
        STAGED, 'net: "elsewhere.prototxt"\ntest_iter: 1\ntest_interval: 1\ntest_state { stage: "a" }\n'
    )
    train, [test] = definition.build()
    assert "train_only" in kept(train) and "stage_a" in kept(test)


def test_a_net_alone_with_digits_stages_gets_digits_states() -> None:
    text = (ZOO / "digits_lenet" / "lenet.prototxt").read_text() if ZOO.is_dir() else None
    if text is None:
        pytest.skip("the zoo is not available")
    definition = training_definition(text)
    assert stages(definition.train.state) == ["train"]
    assert [stages(test.state) for test in definition.tests] == [["val"]]
    assert definition.test_iters == [1]


def test_a_net_alone_has_a_test_net_only_when_it_has_test_layers() -> None:
    assert len(training_definition(STAGED).tests) == 1
    no_test = STAGED.replace('include { phase: TEST }', 'include { phase: TRAIN }')
    assert training_definition(no_test).tests == []


@pytest.mark.skipif(not ZOO.is_dir(), reason="the zoo is not available")
def test_digits_solver_states_build_what_caffe_builds(tmp_path: Path) -> None:
    """DIGITS trains with train_state { stage: "train" } and validates with test_state { stage: "val" }."""
    paths = sorted(ZOO.glob("digits_*/*.prototxt"))
    jobs = []
    for index, path in enumerate(paths):
        (tmp_path / f"net{index}.prototxt").write_text(skeleton(path.read_text()))
        (tmp_path / f"solver{index}.prototxt").write_text(
            f'net: "net{index}.prototxt"\ntest_iter: 1\ntest_interval: 1\n'
            'train_state { stage: "train" }\ntest_state { stage: "val" }\n' + TAIL
        )
        jobs.append({"kind": "solver", "path": f"solver{index}.prototxt"})
    results = run_pycaffe(jobs, tmp_path)
    for index, result in enumerate(results):
        definition = training_definition(
            solver_text=(tmp_path / f"solver{index}.prototxt").read_text(), load=confined_loader(tmp_path)
        )
        train, tests = definition.build()
        assert kept(train) == result["train"]
        assert [kept(test) for test in tests] == result["tests"]
        assert "train-data" in result["train"] and "val-data" in result["tests"][0]


def test_states_are_netstate_messages(folder: Path) -> None:
    definition = ours(folder, "net-file-two-instances")
    assert isinstance(definition.train.state, caffe_pb2.NetState)
    assert (list(definition.train.state.stage), definition.train.state.level) == (["a"], 1)
