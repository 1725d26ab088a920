"""digits_memplugin.confine.landlock: the kernel's Landlock through ctypes. Each restriction is made in a child process
(it is for good), which reports what the kernel then allowed."""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from digits_memplugin.confine import landlock

needs_landlock = pytest.mark.skipif(landlock.abi() < 1, reason=f"no Landlock here: {landlock.unavailable()}")


def test_the_abi_is_what_the_kernel_says() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(ctypes.c_long(444), None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    assert landlock.abi() == max(int(version), 0)
    assert (landlock.unavailable() == "") == (version >= 1)


def test_each_abi_handles_the_rights_it_knows() -> None:
    assert landlock.fs_rights(0) == 0
    assert landlock.fs_rights(1) == (1 << 13) - 1  # up to MAKE_SYM
    assert landlock.fs_rights(2) & landlock.REFER and not landlock.fs_rights(2) & landlock.TRUNCATE
    assert landlock.fs_rights(3) & landlock.TRUNCATE and not landlock.fs_rights(3) & landlock.IOCTL_DEV
    assert landlock.fs_rights(5) == landlock.fs_rights(7) == (1 << 16) - 1
    assert not landlock.WRITE & (landlock.MAKE_SYM | landlock.REFER)  # a confined writer never makes links


CHILD = r"""
import errno, json, os, signal, socket, sys
from digits_memplugin.confine import landlock
folder, port = sys.argv[1], int(sys.argv[2])
rules = landlock.Ruleset()
rules.allow(os.path.join(folder, "readable"), landlock.READ)
rules.allow(os.path.join(folder, "writable"), landlock.READ | landlock.WRITE)
rules.allow(os.path.join(folder, "file.txt"), landlock.READ | landlock.WRITE)  # a file: only its file rights
missing = rules.allow(os.path.join(folder, "missing"), landlock.READ)
rules.allow(os.path.dirname(sys.executable), landlock.READ | landlock.EXECUTE)
for path in sys.path + ["/usr", "/lib", "/lib64", "/etc/ld.so.cache"]:
    if path and os.path.exists(path):
        rules.allow(path, landlock.READ | landlock.EXECUTE)
rules.restrict()
result = {"missing": missing, "abi": rules.abi}
def attempt(name, action):
    try:
        action()
        result[name] = "ok"
    except OSError as error:
        result[name] = errno.errorcode.get(error.errno, str(error.errno))
attempt("read", lambda: open(os.path.join(folder, "readable", "a.txt")).read())
attempt("write in readable", lambda: open(os.path.join(folder, "readable", "b.txt"), "w").close())
attempt("create in writable", lambda: open(os.path.join(folder, "writable", "c.txt"), "w").close())
attempt("link in writable", lambda: os.symlink("/etc", os.path.join(folder, "writable", "l")))
attempt("remove in writable", lambda: os.unlink(os.path.join(folder, "writable", "old.txt")))
attempt("write the file", lambda: open(os.path.join(folder, "file.txt"), "a").write("x"))
attempt("read outside", lambda: open(os.path.join(folder, "secret.txt")).read())
attempt("tcp connect", lambda: socket.create_connection(("127.0.0.1", port), timeout=5).close())
attempt("signal outside", lambda: os.kill(os.getppid(), 0))
print(json.dumps(result))
"""


@needs_landlock
def test_a_ruleset_confines_a_process_to_what_it_allows(tmp_path: Path) -> None:
    for name in ("readable", "writable"):
        (tmp_path / name).mkdir()
    (tmp_path / "readable" / "a.txt").write_text("a")
    (tmp_path / "writable" / "old.txt").write_text("old")
    (tmp_path / "file.txt").write_text("file")
    (tmp_path / "secret.txt").write_text("secret")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        done = subprocess.run(
            [sys.executable, "-c", CHILD, str(tmp_path), str(server.getsockname()[1])],
            capture_output=True, text=True, timeout=60, check=False,
        )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["missing"] is False and result["abi"] == landlock.abi()
    assert result["read"] == result["create in writable"] == result["write the file"] == "ok", result
    for denied in ("write in readable", "link in writable", "remove in writable", "read outside"):
        assert result[denied] == "EACCES", (denied, result)
    if landlock.abi() >= 4:
        assert result["tcp connect"] == "EACCES", result
    if landlock.abi() >= 6:
        assert result["signal outside"] == "EPERM", result
    assert (tmp_path / "writable" / "old.txt").exists() and not os.path.lexists(tmp_path / "writable" / "l")
