"""The capped-start library (capped_start.c) the binary runner preloads into `caffe train`, built from its source
with the machine's C compiler and cached.

It ships as source (one C file, package data) rather than as a binary: it must match the machine's C library, and a
compiler is on every machine that builds Caffe. The build takes a fraction of a second; the file is cached under
the cache folder build-pycaffe.sh uses (DIGITS_MEMPLUGIN_CACHE, else ~/.cache/digits-memplugin), in a folder named
after the source's hash, so an edited source is built afresh and two servers never half-write one file (the
library is written beside its place and renamed into it).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ...core.errors import MemPluginError

SOURCE = Path(__file__).with_name("capped_start.c")
LIBRARY_NAME = "libmemplugin_capped_start.so"
BUILD_SECONDS = 120.0
"""A compile of one small file; a compiler that hangs (or a machine under heavy load) is given this long."""
COMPILERS = ("cc", "gcc", "clang")


class PreloadError(MemPluginError):
    """The capped-start library cannot be built: no compiler, or the compiler refused the source."""


def cache_folder() -> Path:
    """Where built things are kept (as scripts/build-pycaffe.sh keeps pycaffe)."""
    explicit = os.environ.get("DIGITS_MEMPLUGIN_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "digits-memplugin"


def library_path(cache: Path | None = None) -> Path:
    """Where the library built from this source lives (whether built yet or not)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return (cache or cache_folder()) / "preload" / digest / LIBRARY_NAME


def ensure_library(cache: Path | None = None, timeout: float = BUILD_SECONDS) -> Path:
    """The built library, building it first when this source has not been built yet; PreloadError with the
    compiler's own message when it cannot be. A cache folder that cannot be written falls back to one under the
    system's temporary folder."""
    target = library_path(cache)
    try:
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError:
        if cache is not None:
            raise
        fallback = Path(tempfile.gettempdir()) / f"digits-memplugin-{os.getuid()}"
        return ensure_library(fallback, timeout)
    _check_own(target.parent)
    if target.is_file():
        _check_own(target)
        return target
    compiler = next((found for name in COMPILERS if (found := shutil.which(name))), None)
    if compiler is None:
        raise PreloadError(
            "no C compiler (cc, gcc or clang) on this machine: it builds the small library that caps the memory of a "
            "`caffe train` attempt (install gcc)"
        )
    handle, partial = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=target.parent)
    os.close(handle)
    command = [compiler, "-shared", "-fPIC", "-O2", "-o", partial, str(SOURCE), "-ldl", "-lpthread"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=timeout,
                                check=False, stdin=subprocess.DEVNULL)
        if result.returncode != 0:
            raise PreloadError(f"building {LIBRARY_NAME} failed ({' '.join(command)}): {result.stderr.strip()[-2000:]}")
        os.chmod(partial, 0o755)
        os.replace(partial, target)
    except subprocess.TimeoutExpired:
        raise PreloadError(f"building {LIBRARY_NAME} took more than {timeout:g} s ({' '.join(command)})") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)
    return target


def _check_own(path: Path) -> None:
    """The library runs inside every capped caffe: a file or folder someone else owns or may write (a planted one in
    a shared temporary folder) is refused, never loaded."""
    info = path.lstat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022 or path.is_symlink():
        raise PreloadError(
            f"{path} is not this user's own (owned by uid {info.st_uid}, mode {oct(info.st_mode & 0o777)}): the "
            "capped-start library is not loaded from there; set DIGITS_MEMPLUGIN_CACHE to a folder of your own"
        )


__all__ = ["LIBRARY_NAME", "SOURCE", "PreloadError", "cache_folder", "ensure_library", "library_path"]
