"""NetStateRule semantics (phase, stage, not_stage, min_level, max_level) held to real Caffe.

Every comparison builds the same net with pycaffe in a child process (Caffe aborts on a failed CHECK, so never
in the test process) and compares the layers Caffe keeps with the layers `core.net.filter_layers` keeps.
`run_pycaffe` is shared with the upgrade and training tests.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import ZOO

from digits_memplugin.core.errors import NetError
from digits_memplugin.core.layers.base import PHASE_TEST, PHASE_TRAIN
from digits_memplugin.core.net import build_net, filter_layers, net_state, state_meets_rule
from digits_memplugin.core.proto import caffe_pb2
from digits_memplugin.core.prototxt import parse_net
from digits_memplugin.core.sourcemap import layer_lines

# ------------------------------------------------------------------------------------------ the pycaffe child

CHILD = r'''
import json, os, sys
import caffe
caffe.set_mode_cpu()

def names(net):
    return [name for name, layer in zip(net._layer_names, net.layers) if layer.type != "Split"]

def save_without_blobs(net, out):
    """Net::ToProto keeps every layer's LayerParameter as Caffe upgraded and set it up; its weights are dropped
    here on the wire (LayerParameter field 7), so the parent's pure-Python protobuf reads a small message."""
    tmp = out + ".full"
    net.save(tmp)
    data = open(tmp, "rb").read()
    os.remove(tmp)

    def varint(buf, pos):
        value = shift = 0
        while True:
            byte = buf[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value, pos

    def fields(buf):
        pos = 0
        while pos < len(buf):
            start = pos
            tag, pos = varint(buf, pos)
            kind = tag & 7
            if kind == 0:
                _, pos = varint(buf, pos)
            elif kind == 1:
                pos += 8
            elif kind == 5:
                pos += 4
            elif kind == 2:
                size, pos = varint(buf, pos)
                yield tag >> 3, kind, buf[start:pos], pos, pos + size
                pos += size
                continue
            else:
                raise ValueError(kind)
            yield tag >> 3, kind, buf[start:pos], None, None

    out_bytes = bytearray()
    for number, kind, head, begin, end in fields(data):
        if number == 100 and kind == 2:
            layer = bytearray()
            for n, k, h, b, e in fields(data[begin:end]):
                if n == 7:
                    continue
                layer += h if b is None else h + data[begin:end][b:e]
            size = len(layer)
            tag = bytearray()
            value = (100 << 3) | 2
            while True:
                byte = value & 0x7F
                value >>= 7
                tag.append(byte | (0x80 if value else 0))
                if not value:
                    break
            length = bytearray()
            while True:
                byte = size & 0x7F
                size >>= 7
                length.append(byte | (0x80 if size else 0))
                if not size:
                    break
            out_bytes += tag + length + layer
        else:
            out_bytes += head + (data[begin:end] if begin is not None else b"")
    open(out, "wb").write(bytes(out_bytes))

def run(job):
    kind = job["kind"]
    if "memory_limit" in job:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (job["memory_limit"], job["memory_limit"]))
    if kind == "net":
        net = caffe.Net(job["path"], getattr(caffe, job["phase"]), level=job["level"], stages=job["stages"])
        return {"layers": names(net), "blobs": {name: list(blob.shape) for name, blob in net.blobs.items()}}
    if kind == "types":
        return {"types": list(caffe.layer_type_list())}
    if kind == "solver":
        solver = caffe.get_solver(job["path"])
        return {"train": names(solver.net), "tests": [names(net) for net in solver.test_nets]}
    if kind == "save":
        net = caffe.Net(job["path"], getattr(caffe, job["phase"]))
        save_without_blobs(net, job["out"])
        return {"saved": job["out"]}
    raise ValueError(kind)

# Caffe is imported once; each job runs in a fork of this process, so a CHECK that aborts costs one fork.
jobs = json.load(sys.stdin)
for index, job in enumerate(jobs):
    result_path, log_path = f".job{index}.json", f".job{index}.log"
    pid = os.fork()
    if pid == 0:
        os.dup2(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        try:
            result = run(job)
        except MemoryError:
            result = {"fatal": "std::bad_alloc (MemoryError: the job's memory limit)"}
        except BaseException as error:
            result = {"error": repr(error)}
        with open(result_path, "w") as out:
            json.dump(result, out)
        os._exit(0)
    os.waitpid(pid, 0)
    if os.path.exists(result_path):
        result = json.load(open(result_path))
        os.remove(result_path)
    else:
        log = open(log_path, errors="replace").read().splitlines()
        fatal = [line for line in log if line.startswith("F")]
        result = {"fatal": fatal[0] if fatal else "\n".join(log[-20:])}
    os.remove(log_path)
    print(json.dumps(result), flush=True)
'''


def run_pycaffe(jobs: Sequence[dict[str, Any]], cwd: Path, timeout: float = 300.0) -> list[dict[str, Any]]:
    """Run the jobs with pycaffe in a child process, each in a fork of it. A job Caffe aborts on gives
    {"fatal": "<glog F line>"}. Paths in jobs are relative to `cwd` (Caffe's working directory)."""
    env = {**os.environ, "GLOG_minloglevel": "2", "OMP_NUM_THREADS": "1"}
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        check=False, input=json.dumps(list(jobs)), capture_output=True, text=True, errors="replace", cwd=cwd,
        env=env, timeout=timeout,
    )
    results = [json.loads(line) for line in child.stdout.splitlines()]
    if child.returncode != 0 or len(results) != len(jobs):
        raise RuntimeError(f"the pycaffe child failed:\n{child.stderr[-3000:]}")
    errors = [result["error"] for result in results if "error" in result]
    if errors:
        raise RuntimeError(f"pycaffe jobs raised: {errors}")
    return results


# ------------------------------------------------------------------------------------------ nets with rules

INPUT = 'layer { name: "input" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 } } }\n'


def rule_text(rule: dict[str, Any]) -> str:
    parts = []
    if "phase" in rule:
        parts.append(f"phase: {rule['phase']}")
    for key in ("min_level", "max_level"):
        if key in rule:
            parts.append(f"{key}: {rule[key]}")
    parts += [f'stage: "{s}"' for s in rule.get("stage", ())]
    parts += [f'not_stage: "{s}"' for s in rule.get("not_stage", ())]
    return " ".join(parts)


def ruled_layer(name: str, include: Sequence[dict[str, Any]] = (), exclude: Sequence[dict[str, Any]] = ()) -> str:
    """A layer Caffe can always build (its only bottom is the net input), carrying the given rules."""
    rules = "".join(f" include {{ {rule_text(r)} }}" for r in include)
    rules += "".join(f" exclude {{ {rule_text(r)} }}" for r in exclude)
    return f'layer {{ name: "{name}" type: "ReLU" bottom: "data" top: "{name}"{rules} }}\n'


def single_rules() -> list[dict[str, Any]]:
    """Every single rule over two stages and three levels, each field present or absent."""
    rules = []
    for phase, min_level, max_level, stage, not_stage in itertools.product(
        (None, "TRAIN", "TEST"), (None, 0, 1), (None, 0, 1), ((), ("a",), ("a", "b")), ((), ("b",), ("a",))
    ):
        rule: dict[str, Any] = {"stage": stage, "not_stage": not_stage}
        if phase is not None:
            rule["phase"] = phase
        if min_level is not None:
            rule["min_level"] = min_level
        if max_level is not None:
            rule["max_level"] = max_level
        rules.append(rule)
    return rules


def random_rule(rng: random.Random) -> dict[str, Any]:
    rule: dict[str, Any] = {
        "stage": rng.sample(["a", "b", "c"], rng.randint(0, 2)),
        "not_stage": rng.sample(["a", "b", "c"], rng.randint(0, 2)),
    }
    if rng.random() < 0.5:
        rule["phase"] = rng.choice(["TRAIN", "TEST"])
    if rng.random() < 0.4:
        rule["min_level"] = rng.randint(-2, 2)
    if rng.random() < 0.4:
        rule["max_level"] = rng.randint(-2, 2)
    return rule


@functools.cache
def rules_net() -> str:
    """One net with a layer per single rule (included by it, or excluded by it), layers with several rules, and
    layers with none."""
    text = 'name: "rules"\n' + INPUT + ruled_layer("plain")
    for i, rule in enumerate(single_rules()):
        text += ruled_layer(f"inc{i}", include=[rule]) + ruled_layer(f"exc{i}", exclude=[rule])
    rng = random.Random(20240611)
    for i in range(150):
        rules = [random_rule(rng) for _ in range(rng.randint(2, 4))]
        text += ruled_layer(f"multi_inc{i}", include=rules) if i % 2 else ruled_layer(f"multi_exc{i}", exclude=rules)
    return text


STATES = [
    (phase, level, list(stages))
    for phase in (PHASE_TRAIN, PHASE_TEST)
    for level in (-1, 0, 1, 2)
    for stages in ((), ("a",), ("b",), ("a", "b"), ("c", "a"))
]


@functools.cache
def _parsed(net_text: str) -> Any:
    return parse_net(net_text)


def our_kept(net_text: str, phase: str, level: int, stages: Sequence[str]) -> list[str]:
    """The layers we keep for the state pycaffe's Net(path, phase, level, stages) builds."""
    param = _parsed(net_text)
    state = net_state(param, phase, caffe_pb2.NetState(level=level, stage=list(stages)))
    return [layer.name for _, layer in filter_layers(param, state, "net.prototxt", layer_lines(net_text))]


@pytest.fixture(scope="module")
def caffe_kept_by_state(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int, tuple[str, ...]], list[str]]:
    folder = tmp_path_factory.mktemp("rules")
    (folder / "rules.prototxt").write_text(rules_net())
    jobs = [
        {"kind": "net", "path": "rules.prototxt", "phase": phase, "level": level, "stages": stages}
        for phase, level, stages in STATES
    ]
    results = run_pycaffe(jobs, folder)
    return {(phase, level, tuple(stages)): result["layers"] for (phase, level, stages), result in zip(STATES, results)}


@pytest.mark.parametrize(("phase", "level", "stages"), STATES, ids=str)
def test_filter_keeps_what_caffe_keeps(
    caffe_kept_by_state: dict[tuple[str, int, tuple[str, ...]], list[str]], phase: str, level: int, stages: list[str]
) -> None:
    caffe_layers = caffe_kept_by_state[(phase, level, tuple(stages))]
    ours = our_kept(rules_net(), phase, level, stages)
    assert ours == caffe_layers
    # The net is built to tell the rules apart: each state keeps some of the ruled layers and drops others.
    assert 100 < len(ours) < 800


def test_the_rule_table_covers_every_outcome() -> None:
    """Each single rule both passes and fails for some state, so the comparison above can catch any field."""
    for rule_fields in single_rules():
        rule = caffe_pb2.NetStateRule()
        rule.stage.extend(rule_fields["stage"])
        rule.not_stage.extend(rule_fields["not_stage"])
        for key in ("phase", "min_level", "max_level"):
            if key in rule_fields:
                setattr(rule, key, getattr(caffe_pb2, rule_fields[key]) if key == "phase" else rule_fields[key])
        outcomes = {
            state_meets_rule(caffe_pb2.NetState(phase=getattr(caffe_pb2, p), level=lv, stage=s), rule)
            for p, lv, s in STATES
        }
        impossible = rule_fields["stage"] and set(rule_fields["stage"]) & set(rule_fields["not_stage"])
        impossible = impossible or ("min_level" in rule_fields and "max_level" in rule_fields
                                    and rule_fields["min_level"] > rule_fields["max_level"])
        empty = not (rule_fields["stage"] or rule_fields["not_stage"] or set(rule_fields) - {"stage", "not_stage"})
        assert outcomes == ({False} if impossible else {True} if empty else {True, False}), rule_fields


@pytest.mark.parametrize(
    ("rule", "state", "meets"),
    [
        ({}, {}, True),
        ({"phase": caffe_pb2.TRAIN}, {"phase": caffe_pb2.TEST}, False),
        ({"phase": caffe_pb2.TEST}, {}, True),  # NetState's phase defaults to TEST
        ({"min_level": 0}, {}, True),  # level defaults to 0
        ({"min_level": 1}, {"level": 0}, False),
        ({"max_level": -1}, {"level": 0}, False),
        ({"max_level": 0}, {"level": 0}, True),
        ({"stage": ["a", "b"]}, {"stage": ["b"]}, False),  # every stage is needed
        ({"stage": ["a", "b"]}, {"stage": ["b", "a", "c"]}, True),
        ({"not_stage": ["a", "b"]}, {"stage": ["b"]}, False),  # any not_stage breaks it
        ({"not_stage": ["a"]}, {"stage": ["b"]}, True),
        ({"stage": ["a"], "not_stage": ["a"]}, {"stage": ["a"]}, False),
    ],
)
def test_state_meets_rule_cases(rule: dict[str, Any], state: dict[str, Any], meets: bool) -> None:
    assert state_meets_rule(caffe_pb2.NetState(**state), caffe_pb2.NetStateRule(**rule)) is meets


def test_net_state_merges_the_net_state_then_the_solver_state() -> None:
    """Solver::InitTrainNet: phase, then the net's own state (which may even change the phase), then the solver's."""
    param = parse_net('state { stage: "from_net" level: 3 }\n' + INPUT)
    state = net_state(param, PHASE_TRAIN, caffe_pb2.NetState(stage=["from_solver"], level=5))
    assert (state.phase, state.level, list(state.stage)) == (caffe_pb2.TRAIN, 5, ["from_net", "from_solver"])
    state = net_state(param, PHASE_TRAIN)
    assert (state.phase, state.level) == (caffe_pb2.TRAIN, 3)
    overriding = parse_net("state { phase: TEST }\n" + INPUT)
    assert net_state(overriding, PHASE_TRAIN).phase == caffe_pb2.TEST


# ------------------------------------------------------------------------------------------ include + exclude


def test_include_and_exclude_together_is_an_error_naming_the_layer_like_caffe(tmp_path: Path) -> None:
    text = INPUT + "\n" + ruled_layer("both", include=[{"phase": "TRAIN"}], exclude=[{"stage": ["x"]}])
    (tmp_path / "both.prototxt").write_text(text)
    [result] = run_pycaffe(
        [{"kind": "net", "path": "both.prototxt", "phase": "TRAIN", "level": 0, "stages": []}], tmp_path
    )
    assert "Specify either include rules or exclude rules; not both" in result["fatal"]
    param = parse_net(text)
    with pytest.raises(NetError) as raised:
        filter_layers(param, net_state(param, PHASE_TRAIN), "both.prototxt", layer_lines(text))
    error = raised.value
    assert (error.layer, error.layer_type, error.line, error.field) == ("both", "ReLU", 3, "include")
    assert str(error).startswith("both.prototxt:3: layer 'both' (ReLU): include: ")
    # The check is Caffe's: it applies to every layer, even one no state would keep.
    with pytest.raises(NetError):
        build_net(param, PHASE_TEST, source="both.prototxt", lines=layer_lines(text))


# ------------------------------------------------------------------------------------------ DIGITS networks

DIGITS_NETS = sorted(ZOO.glob("digits_*/*.prototxt"))
DIGITS_STATES = [
    (PHASE_TRAIN, ["train"]),
    (PHASE_TEST, ["val"]),
    (PHASE_TEST, ["deploy"]),
    (PHASE_TRAIN, []),
    (PHASE_TEST, []),
    (PHASE_TEST, ["train", "val"]),
]


def skeleton(net_text: str) -> str:
    """The net's layers with their names and rules, each made a layer Caffe builds without data or shapes."""
    param = parse_net(net_text)
    out = caffe_pb2.NetParameter()
    out.layer.add().CopyFrom(parse_net(INPUT).layer[0])
    for layer in param.layer:
        copy = out.layer.add(name=layer.name, type="ReLU", bottom=["data"], top=[f"{layer.name}__top"])
        copy.include.extend(layer.include)
        copy.exclude.extend(layer.exclude)
    return str(out)


@pytest.mark.skipif(not DIGITS_NETS, reason="the zoo is not available")
def test_digits_standard_networks_filter_like_caffe(tmp_path: Path) -> None:
    jobs, expected = [], []
    for index, path in enumerate(DIGITS_NETS):
        text = path.read_text()
        (tmp_path / f"net{index}.prototxt").write_text(skeleton(text))
        for phase, stages in DIGITS_STATES:
            jobs.append({"kind": "net", "path": f"net{index}.prototxt", "phase": phase, "level": 0, "stages": stages})
            expected.append(our_kept(text, phase, 0, stages))
    results = run_pycaffe(jobs, tmp_path)
    assert [result["layers"][1:] for result in results] == expected  # after the skeleton's own input layer
    assert all(result["layers"][0] == "input" for result in results)


@pytest.mark.skipif(not DIGITS_NETS, reason="the zoo is not available")
@pytest.mark.parametrize("path", DIGITS_NETS, ids=lambda p: p.parent.name)
def test_digits_stages_pick_the_data_layer_and_the_head(path: Path) -> None:
    text = path.read_text()
    types = {layer.name: layer.type for layer in parse_net(text).layer}

    def kept_types(phase: str, stages: list[str]) -> set[str]:
        return {types[name] for name in our_kept(text, phase, 0, stages)}

    train = our_kept(text, PHASE_TRAIN, 0, ["train"])
    val = our_kept(text, PHASE_TEST, 0, ["val"])
    deploy = our_kept(text, PHASE_TEST, 0, ["deploy"])
    assert "train-data" in train and "val-data" not in train
    assert "val-data" in val and "train-data" not in val
    assert not {"train-data", "val-data"} & set(deploy)
    assert "SoftmaxWithLoss" in kept_types(PHASE_TRAIN, ["train"]) & kept_types(PHASE_TEST, ["val"])
    assert "Accuracy" in kept_types(PHASE_TEST, ["val"])
    assert {"SoftmaxWithLoss", "Accuracy", "Data"}.isdisjoint(kept_types(PHASE_TEST, ["deploy"]))
    assert "Softmax" in kept_types(PHASE_TEST, ["deploy"]) - kept_types(PHASE_TRAIN, ["train"])
