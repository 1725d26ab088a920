"""caffe_pb2, loaded from the installed pycaffe without importing the `caffe` package.

`import caffe.proto.caffe_pb2` would run `caffe/__init__.py`, which loads Caffe's C++ library, glog and
scikit-image into the process: heavy for a web server and unwanted in the core. The generated module is plain
Python, so it is loaded from its file under its canonical name; a later `import caffe` finds it in `sys.modules`
and uses the same descriptors.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from .errors import MemPluginError

MODULE_NAME = "caffe.proto.caffe_pb2"


def _load() -> ModuleType:
    if MODULE_NAME in sys.modules:
        return sys.modules[MODULE_NAME]
    spec = importlib.util.find_spec("caffe")
    if spec is None or not spec.submodule_search_locations:
        raise MemPluginError("pycaffe is not installed: run `make install` (scripts/build-pycaffe.sh builds it)")
    path = Path(next(iter(spec.submodule_search_locations))) / "proto" / "caffe_pb2.py"
    module_spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if module_spec is None or module_spec.loader is None or not path.is_file():
        raise MemPluginError(f"pycaffe's caffe_pb2 is missing at {path}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[MODULE_NAME] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[MODULE_NAME]
        raise
    return module


caffe_pb2 = _load()
