"""Which Caffe trains: the bundled pycaffe, or the Caffe build the settings name, found as DIGITS finds it, and what
it can do, read once at start-up.

DIGITS 6 (digits/config/caffe.py) takes the Caffe of CAFFE_ROOT, else of CAFFE_HOME: its `build/tools/caffe` and its
`python/`; reads the version from pycaffe's `__version__`, else from `caffe -version`, else from the name of the
libcaffe it links; and calls a version between 0.9 and 0.99 NVcaffe (NVIDIA's fork numbers itself 0.x, BVLC 1.0.0).
Here MEMPLUGIN_CAFFE_ROOT (`serve --caffe-root`, `train --caffe-root`) comes before both; with none of them the
bundled pycaffe trains, as before.

What a build can do is read from the build itself, every check with a bounded time (`PROBE_SECONDS`):

* that its binary runs and its version: `caffe -version` (gflags prints "caffe version 1.0.0");
* whether its pycaffe imports in this Python (a child process: importing it loads Caffe's C++ library). A Caffe
  whose pycaffe does (the bundled one, a build for this Python) trains through the pycaffe runner; any other,
  through its `caffe` binary (jobs/child/binary_runner.py);
* CUDA: what `caffe device_query` says with no GPU visible: a CPU_ONLY build says "Cannot use GPU in CPU-only
  Caffe", a CUDA build fails to find a device instead. This holds whether it links the CUDA runtime statically or
  not. For the bundled pycaffe (no binary), the libraries its extension links;
* cuDNN: the libraries it links as the dynamic loader resolves them (`ldd`): libcudnn among them.

A Caffe that cannot be run, or does not answer in time, is a `CaffeBuildError` naming the path: the server and the
`train` command refuse to start rather than fail at the first job.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import os
import re
import resource
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...core.errors import MemPluginError

BVLC = "bvlc"
NVCAFFE = "nvcaffe"
"""The flavours, as core.flavour names them."""
PYCAFFE, BINARY = "pycaffe", "binary"
"""How jobs train: pycaffe's solver driven by jobs/child/runner.py, or `caffe train` followed by jobs/child/binary_runner.py."""
SETTING = "MEMPLUGIN_CAFFE_ROOT"
ENVIRONMENT = ("CAFFE_ROOT", "CAFFE_HOME")
"""Read as DIGITS reads them, in this order, when the setting is not given."""
BUNDLED = "bundled"
BUNDLED_BINARY_ROOT = Path(sys.prefix) / "share" / "digits-memplugin" / "caffe" / "cpu"
BUNDLED_CUDA_ROOT = Path(sys.prefix) / "share" / "digits-memplugin" / "caffe" / "cuda"
"""The bundled CUDA + cuDNN build (`make install CAFFE_CUDA=1`, by itself where an NVIDIA driver is found)."""
BUNDLED_CUDA = "the bundled CUDA build"
NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")
"""There where an NVIDIA driver is loaded (the Makefile's test for building the CUDA root, too)."""
"""Where `make install` puts the bundled Caffe's binary build: a Caffe root (build/tools/caffe) without python/ (its
pycaffe is this Python's own), so that naming it trains jobs through the binary."""
PROBE_SECONDS = 30.0
"""Each look at a build (its version, its pycaffe, its devices, its libraries) may take this long; loading a CUDA
build's libraries takes seconds, a build that hangs is refused."""
BINARIES = (Path("build") / "tools" / "caffe", Path("build") / "tools" / "caffe.bin")
CUDA_LIBRARIES = ("libcudart", "libcublas", "libcurand", "libcuda.")
CUDNN_LIBRARY = "libcudnn"
NO_CUDA = "CPU-only Caffe"
"""What a CPU_ONLY build says when asked for a GPU (common.hpp's NO_GPU)."""
_VERSION = re.compile(r"version\s+(\S+)")
_LIBCAFFE = re.compile(r"libcaffe[^\s/]*?\.so\.(\d+(?:\.\d+)*\S*)")
_LDD_LINE = re.compile(r"^\s*(\S+)(?:\s+=>\s+(\S+|not found))?")


class CaffeBuildError(MemPluginError):
    """The Caffe the settings name cannot train: not there, not runnable, or silent past the time allowed."""


@dataclasses.dataclass(frozen=True)
class CaffeBuild:
    """The Caffe that trains, as read at start-up."""

    version: str
    flavour: str
    """"bvlc" or "nvcaffe", decided from the version as DIGITS decides."""
    runner: str
    """"pycaffe" or "binary": how its jobs train."""
    cuda: bool
    cudnn: bool
    root: str | None = None
    """The Caffe root; None for the bundled pycaffe."""
    source: str = BUNDLED
    """What named it: "MEMPLUGIN_CAFFE_ROOT", "CAFFE_ROOT", "CAFFE_HOME", or "bundled"."""
    binary: str | None = None
    """Its `caffe` tool (build/tools/caffe)."""
    pycaffe: str | None = None
    """The folder holding its `caffe` package when jobs train through it (None: this Python's own pycaffe)."""
    libraries: tuple[str, ...] = ()
    """The CUDA and cuDNN libraries it links (as the dynamic loader names them)."""
    notes: tuple[str, ...] = ()
    """What people should know: a pycaffe that does not import here, libraries that could not be listed."""

    @property
    def flavour_name(self) -> str:
        return "NVcaffe" if self.flavour == NVCAFFE else "BVLC Caffe"

    @property
    def label(self) -> str:
        """"BVLC Caffe 1.0.0 (the bundled pycaffe)", "NVcaffe 0.17.4 at /opt/nvcaffe (CAFFE_ROOT)"."""
        where = "the bundled pycaffe" if self.root is None else f"at {self.root}, {self.source}"
        return f"{self.flavour_name} {self.version} ({where})"

    @property
    def abilities(self) -> str:
        """"CPU only", "CUDA and cuDNN", "CUDA without cuDNN"."""
        if not self.cuda:
            return "CPU only"
        return "CUDA and cuDNN" if self.cudnn else "CUDA without cuDNN"

    def to_json(self) -> dict[str, Any]:
        document = dataclasses.asdict(self)
        document.update(libraries=list(self.libraries), notes=list(self.notes), label=self.label)
        return document


def devices_document(devices: Any, caffe: CaffeBuild) -> dict[str, Any]:
    """The devices document (devices.DeviceList.to_json) with the Caffe that trains on them: what GET
    <prefix>/api/devices returns, `digits-memplugin devices --json` prints and the `devices` event carries."""
    return {**devices.to_json(), "caffe": caffe.to_json()}


def caffe_root(setting: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None) -> tuple[Path | None, str]:
    """(the Caffe root, what named it): the setting, else CAFFE_ROOT, else CAFFE_HOME (quotes and spaces around a
    value dropped, as DIGITS drops them); (None, "bundled") when none is given."""
    if setting is not None and str(setting).strip():
        return Path(str(setting).strip()).expanduser().absolute(), SETTING
    environ = os.environ if environ is None else environ
    for name in ENVIRONMENT:
        value = environ.get(name, "").strip().strip("\"' ")
        if value:
            return Path(value).expanduser().absolute(), name
    return None, BUNDLED


def find_caffe(
    setting: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None,
    timeout: float = PROBE_SECONDS, driver: Path = NVIDIA_DRIVER,
) -> CaffeBuild:
    """The Caffe that trains: the one named by the setting or the environment; else, where an NVIDIA driver is loaded
    and `make install` built it, the bundled CUDA build (the CPU-only pycaffe cannot train on the GPUs a DIGITS user
    has); else the bundled pycaffe. CaffeBuildError when the named one cannot train."""
    root, source = caffe_root(setting, environ)
    if root is None and driver.exists() and (BUNDLED_CUDA_ROOT / BINARIES[0]).is_file():
        root, source = BUNDLED_CUDA_ROOT, BUNDLED_CUDA
    if root is None:
        return bundled()
    return probe_root(root, source, timeout)


def flavour_of_version(version: str) -> str:
    """DIGITS' rule: a version between 0.9 and 0.99 is NVcaffe's (0.17.4), anything else BVLC's (1.0.0)."""
    numbers = tuple(int(part) for part in re.findall(r"\d+", version)[:3])
    numbers += (0,) * (3 - len(numbers))
    return NVCAFFE if (0, 9, 0) < numbers < (0, 99, 0) else BVLC


@functools.cache
def bundled() -> CaffeBuild:
    """This Python's own pycaffe (scripts/build-pycaffe.sh's wheel): its version from the wheel's metadata and what
    its extension links, without importing it (which would load Caffe's C++ library into the server)."""
    try:
        version = importlib.metadata.version("pycaffe").split("+")[0]
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    spec = importlib.util.find_spec("caffe")
    extension = None
    if spec is not None and spec.submodule_search_locations:
        package = Path(next(iter(spec.submodule_search_locations)))
        extension = next(iter(sorted(package.glob("_caffe*.so"))), None)
    if extension is None:
        return CaffeBuild(version, flavour_of_version(version), PYCAFFE, False, False,
                          notes=("pycaffe is not installed: run `make install`",))
    linked, note = linked_libraries(extension, PROBE_SECONDS)
    cuda = any(name.startswith(CUDA_LIBRARIES) for name in linked)
    return CaffeBuild(
        version, flavour_of_version(version), PYCAFFE, cuda, cuda and _links_cudnn(linked),
        libraries=_gpu_libraries(linked), notes=(note,) if note else (),
    )


def probe_root(root: Path, source: str, timeout: float = PROBE_SECONDS) -> CaffeBuild:
    """Read a Caffe root's build: its binary runs and says its version and whether it has CUDA; its pycaffe, when
    it imports here, is what jobs train with."""
    named = f"{source} names {root}"
    if not root.is_dir():
        raise CaffeBuildError(f"{named}, which is not a folder; give the root of a Caffe build (it holds build/tools/caffe)")
    binary = next((root / relative for relative in BINARIES if _executable(root / relative)), None)
    if binary is None:
        raise CaffeBuildError(f"{named}, but {root / BINARIES[0]} is missing or not executable: build Caffe's tools there")
    version = _binary_version(binary, timeout)
    notes: list[str] = []
    pycaffe_dir, pycaffe_version = _pycaffe(root / "python", timeout, notes)
    version = pycaffe_version or version
    if version is None:
        raise CaffeBuildError(
            f"{binary} does not say its version (`caffe -version`, its pycaffe's __version__, its libcaffe's name): "
            "upgrade that Caffe build"
        )
    linked, note = linked_libraries(binary, timeout)
    if note:
        notes.append(note)
    missing = [name for name, path in linked.items() if path == "not found"]
    if missing:
        raise CaffeBuildError(f"{binary} cannot run: the libraries {', '.join(missing)} are not found (ldd)")
    cuda = _has_cuda(binary, timeout)
    return CaffeBuild(
        version=version, flavour=flavour_of_version(version), runner=PYCAFFE if pycaffe_dir else BINARY,
        cuda=cuda, cudnn=cuda and _links_cudnn(linked), root=str(root), source=source, binary=str(binary),
        pycaffe=pycaffe_dir, libraries=_gpu_libraries(linked), notes=tuple(notes),
    )


def linked_libraries(path: Path, timeout: float = PROBE_SECONDS) -> tuple[dict[str, str], str | None]:
    """{library name: resolved path or "not found"} of an ELF file as the dynamic loader resolves them (`ldd`,
    which lists the whole tree), and a note when they cannot be listed."""
    try:
        result = subprocess.run(
            ["ldd", str(path)], capture_output=True, text=True, errors="replace", timeout=timeout, check=False,
            stdin=subprocess.DEVNULL, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"},
        )
    except FileNotFoundError:
        return {}, "its libraries could not be listed (no ldd on this machine): cuDNN is taken to be missing"
    except subprocess.TimeoutExpired:
        raise CaffeBuildError(f"listing the libraries {path} links (ldd) took more than {timeout:g} s") from None
    linked: dict[str, str] = {}
    for line in result.stdout.splitlines():
        match = _LDD_LINE.match(line)
        if match and ".so" in match.group(1):
            linked[Path(match.group(1)).name] = match.group(2) or match.group(1)
    if result.returncode != 0 and not linked:
        return {}, f"its libraries could not be listed (ldd: {result.stderr.strip()[:200]}): cuDNN is taken to be missing"
    return linked, None


def _gpu_libraries(linked: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(sorted(name for name in linked if name.startswith((*CUDA_LIBRARIES, CUDNN_LIBRARY))))


def _links_cudnn(linked: Mapping[str, str]) -> bool:
    return any(name.startswith(CUDNN_LIBRARY) for name in linked)


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _no_core() -> None:  # pragma: no cover - runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _run(command: list[str], timeout: float, what: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """One look at the build: no GPU visible, glog to stderr, no core file, in a folder of its own."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "GLOG_logtostderr": "1", **extra}
    with tempfile.TemporaryDirectory(prefix="memplugin-caffe-probe-") as folder:
        try:
            return subprocess.run(
                command, cwd=folder, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                errors="replace", timeout=timeout, check=False, preexec_fn=_no_core,
            )
        except subprocess.TimeoutExpired:
            raise CaffeBuildError(f"{what} did not answer within {timeout:g} s: {' '.join(command)}") from None
        except OSError as error:
            raise CaffeBuildError(f"{what} cannot be run: {command[0]}: {error.strerror or error}") from None


def _binary_version(binary: Path, timeout: float) -> str | None:
    """`caffe -version` (gflags prints "caffe version 1.0.0"), else the version in the name of the libcaffe it links
    (libcaffe.so.1.0.0); None when neither says. CaffeBuildError when the binary cannot run at all."""
    result = _run([str(binary), "-version"], timeout, str(binary))
    output = f"{result.stdout}\n{result.stderr}"
    if "error while loading shared libraries" in output or result.returncode < 0 or result.returncode > 1:
        raise CaffeBuildError(f"{binary} cannot run ({_status(result.returncode)}): {_last_line(output) or 'no output'}")
    match = _VERSION.search(output)
    if match and result.returncode == 0:
        return match.group(1)
    linked, _ = linked_libraries(binary, timeout)
    for name, path in linked.items():
        found = _LIBCAFFE.search(Path(path).name) or _LIBCAFFE.search(name)
        if found:
            return found.group(1)
    return None


def _pycaffe(folder: Path, timeout: float, notes: list[str]) -> tuple[str | None, str | None]:
    """(the folder, the version) of a root's pycaffe when it imports in this Python; (None, None) otherwise, with a
    note when it is there but does not import."""
    package = folder / "caffe"
    if not (package / "__init__.py").is_file():
        return None, None
    if not any(package.glob("_caffe*.so")):
        notes.append(f"{package} has no built extension (_caffe.so; `make pycaffe` builds it): jobs train with its caffe binary")
        return None, None
    probe = "import sys; sys.path.insert(0, sys.argv[1]); import caffe; print('version', caffe.__version__)"
    result = _run([sys.executable, "-c", probe, str(folder)], timeout, f"importing the pycaffe in {folder}",
                  GLOG_minloglevel="2", PYTHONPATH="")
    match = _VERSION.search(result.stdout)
    if result.returncode != 0 or match is None:
        notes.append(
            f"its pycaffe ({package}) does not import in this Python ({sys.version.split()[0]}): "
            f"{_last_line(result.stderr) or _status(result.returncode)}; jobs train with its caffe binary"
        )
        return None, None
    return str(folder), match.group(1)


def _has_cuda(binary: Path, timeout: float) -> bool:
    """What the binary says when asked for GPU 0 with none visible: a CPU_ONLY build says it has no GPU support."""
    result = _run([str(binary), "device_query", "--gpu=0"], timeout, str(binary))
    return NO_CUDA not in result.stdout + result.stderr


def _status(returncode: int) -> str:
    return f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("    @ ")]
    return lines[-1][:300] if lines else ""


__all__ = [
    "BINARY", "BUNDLED", "BUNDLED_BINARY_ROOT", "BUNDLED_CUDA", "BUNDLED_CUDA_ROOT", "BVLC", "NVCAFFE", "PYCAFFE", "SETTING", "CaffeBuild", "CaffeBuildError", "bundled",
    "caffe_root", "devices_document", "find_caffe", "flavour_of_version", "linked_libraries", "probe_root",
]
