"""The core stays plain Python: importing all of it loads no web, async, NVML, SQLite or process module, and not
Caffe's C++ library (caffe_pb2 is loaded on its own)."""

from __future__ import annotations

import json
import subprocess
import sys

FORBIDDEN = ["flask", "flask_socketio", "gevent", "pynvml", "sqlite3", "subprocess", "caffe", "caffe._caffe"]


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
