"""The core stays plain Python: importing all of it loads no web, async, NVML, SQLite, dataset or process module,
and not Caffe's C++ library (caffe_pb2 is loaded on its own); its modules import one another without a cycle, and
estimating does no I/O at all (no file opened, no process started, no socket)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from digits_memplugin import core

FORBIDDEN = [
    "flask", "flask_socketio", "socketio", "engineio", "werkzeug", "gevent", "pynvml", "sqlite3", "subprocess",
    "lmdb", "h5py", "caffe", "caffe._caffe",
]
CORE = Path(core.__file__).parent


def test_importing_every_core_module_loads_nothing_it_must_not() -> None:
    code = f"""
import json, pkgutil, importlib, sys
import digits_memplugin.core as core
names = [m.name for m in pkgutil.walk_packages(core.__path__, "digits_memplugin.core.")]
for name in names:
    importlib.import_module(name)
print(json.dumps({{"modules": names, "loaded": sorted(set({FORBIDDEN!r}) & set(sys.modules))}}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert "digits_memplugin.core.estimate" in report["modules"]
    assert "digits_memplugin.core.layers.vision" in report["modules"]
    assert report["loaded"] == []
    # the estimator really works without them
    code = (
        "import sys\n"
        "from digits_memplugin.core.estimate import EstimateRequest, estimate\n"
        "net = 'layer { name: \"d\" type: \"Input\" top: \"d\" input_param { shape { dim: 2 dim: 3 } } }'\n"
        "print(estimate(EstimateRequest(net=net))['total_bytes'] > 0, 'caffe' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.split() == ["True", "False"]


def _core_imports() -> dict[str, set[str]]:
    """Each core module's imports of other core modules, at any depth of its code (a function-level import is an
    import too: it only hides a cycle until the function runs)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(CORE.rglob("*.py")):
        parts = path.relative_to(CORE).with_suffix("").parts
        package = ("core", *parts[:-1])
        name = ".".join(("core", *parts)).removesuffix(".__init__")
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = list(package[: len(package) - node.level + 1])
                target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                if target.startswith("core"):
                    candidates = [f"{target}.{alias.name}" for alias in node.names] + [target]
                    imported.update(candidates)
        graph[name] = imported
    modules = set(graph)
    return {name: {target for target in targets if target in modules and target != name} for name, targets in graph.items()}


def test_core_modules_import_one_another_without_a_cycle() -> None:
    graph = _core_imports()
    assert "core.layers.recurrent" in graph and "core.net" in graph
    visiting: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> None:
        if name in done:
            return
        assert name not in visiting, "import cycle: " + " -> ".join([*visiting[visiting.index(name):], name])
        visiting.append(name)
        for target in sorted(graph[name]):
            if not target.endswith("__init__"):
                visit(target)
        visiting.pop()
        done.add(name)

    for name in sorted(graph):
        # A package's __init__ re-exporting its modules is not a cycle of the modules themselves.
        if name.count(".") and name in ("core.layers",):
            continue
        visit(name)


def test_no_core_module_imports_inside_a_function() -> None:
    hidden = []
    for path in sorted(CORE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                hidden += [
                    f"{path.relative_to(CORE)}:{node.lineno}" for node in ast.walk(function)
                    if isinstance(node, (ast.Import, ast.ImportFrom))
                ]
    assert hidden == []


AUDIT = """
import json, sys
from digits_memplugin.core.estimate import EstimateRequest, estimate
nets = json.loads(sys.stdin.read())
events = []
watching = False
WATCHED = ("open", "subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.fork", "socket.", "import")

def hook(event, args):
    if watching and event.startswith(WATCHED):
        events.append(event + " " + repr(args)[:120])

sys.addaudithook(hook)
watching = True
for net, shapes, batch in nets:
    estimate(EstimateRequest(net=net, data_shapes=shapes, batch=batch, free_bytes=8 << 30, engine="gpu-cudnn",
                             budgets={"gpu0": 8 << 30, "cpu": 4 << 30}, curve_batches=(1, 2, 64)))
watching = False
print(json.dumps(events))
"""


def test_estimating_does_no_io() -> None:
    """An audit hook in a fresh process records every file opened, process started, socket made and module
    imported while nets are estimated (first and later estimates, planning, curves, a recurrent net's inner net):
    there must be none."""
    from zoo_cases import ZOO

    lstm = (
        'layer { name: "x" type: "Input" top: "x" top: "cont" top: "t" input_param { shape { dim: 6 dim: 2 dim: 5 } '
        'shape { dim: 6 dim: 2 } shape { dim: 6 dim: 2 dim: 4 } } }\n'
        'layer { name: "l" type: "LSTM" bottom: "x" bottom: "cont" top: "l" recurrent_param { num_output: 4 } }\n'
        'layer { name: "loss" type: "EuclideanLoss" bottom: "l" bottom: "t" }\n'
    )
    lenet = (ZOO / "caffe_lenet" / "lenet_train_test.prototxt").read_text()
    googlenet = (ZOO / "caffe_googlenet" / "train_val.prototxt").read_text()
    nets = [(lenet, {"data": [1, 28, 28]}, 64), (lenet, {"data": [1, 28, 28]}, 500000),
            (googlenet, {"data": [3, 256, 256]}, 4096), (lstm, {}, None)]
    result = subprocess.run([sys.executable, "-c", AUDIT], input=json.dumps(nets), capture_output=True, text=True,
                            timeout=300, check=True)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
