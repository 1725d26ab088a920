"""The `digits-memplugin` console script: help, and `serve` answering on a free port and stopping cleanly."""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from test_jobs_fixtures import wait_for

SCRIPT = Path(sys.executable).parent / "digits-memplugin"


def test_help_lists_the_subcommands() -> None:
    result = subprocess.run([SCRIPT, "--help"], capture_output=True, text=True, timeout=60, check=True)
    assert "usage: digits-memplugin" in result.stdout
    assert "serve" in result.stdout
    assert "devices" in result.stdout


def test_serve_help_documents_its_flags() -> None:
    result = subprocess.run([SCRIPT, "serve", "--help"], capture_output=True, text=True, timeout=60, check=True)
    for flag in ("--host", "--port", "--data-dir", "--simulate-gpus"):
        assert flag in result.stdout


def test_unknown_subcommand_is_a_usage_error() -> None:
    result = subprocess.run([SCRIPT, "frobnicate"], check=False, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "invalid choice: 'frobnicate'" in result.stderr


def test_a_reader_that_goes_away_ends_the_command_without_a_traceback() -> None:
    # `digits-memplugin devices --json | head -1`: head closes the pipe after its line. The pipe holds one page,
    # far less than the document, so the command is still writing when its reader goes.
    read_end, write_end = os.pipe()
    fcntl.fcntl(read_end, fcntl.F_SETPIPE_SZ, 4096)
    process = subprocess.Popen(
        [SCRIPT, "devices", "--json", "--simulate-gpus", "64x24GiB"], stdout=write_end, stderr=subprocess.PIPE
    )
    os.close(write_end)
    assert os.read(read_end, 1) == b"{"
    os.close(read_end)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 141, err
    assert b"Traceback" not in err and b"BrokenPipeError" not in err


def test_module_entry_point_matches_the_script() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "digits_memplugin", "--version"], check=False, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert result.stdout.startswith("digits-memplugin ")


class Server:
    def __init__(self, process: subprocess.Popen[str], base_url: str) -> None:
        self.process = process
        self.base_url = base_url


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    yield from start_server(tmp_path)


def start_server(tmp_path: Path, *flags: str) -> Iterator[Server]:
    """`digits-memplugin serve --port 0` in its own process group; the bound address is read from its output."""
    process = subprocess.Popen(
        [SCRIPT, "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(tmp_path / "data"), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        start_new_session=True,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    base_url = None
    lines = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        match = re.search(r"serving on (http://127\.0\.0\.1:\d+/)", line)
        if match:
            base_url = match.group(1)
            break
    if base_url is None:
        process.kill()
        pytest.fail("serve did not report its address:\n" + "".join(lines))
    try:
        yield Server(process, base_url)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        process.stdout.close()


def test_serve_answers_http_and_socketio_then_stops_on_sigterm(server: Server, tmp_path: Path) -> None:
    page = requests.get(server.base_url, timeout=10)
    assert page.status_code == 200
    assert "GPU memory for Caffe training" in page.text
    health = requests.get(server.base_url + "memplugin/api/health", timeout=10).json()
    assert health["status"] == "ok"
    # The engine.io handshake of the socketio server, served by gevent.
    handshake = requests.get(server.base_url + "socket.io/?EIO=4&transport=polling", timeout=10)
    assert handshake.status_code == 200
    assert '"sid"' in handshake.text
    assert (tmp_path / "data" / "secret_key").exists()

    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=20) == 0
    output = server.process.stdout.read() if server.process.stdout else ""
    assert "Traceback" not in output
    with pytest.raises(requests.ConnectionError):
        requests.get(server.base_url, timeout=5)


def test_serve_stops_on_ctrl_c(server: Server) -> None:
    assert requests.get(server.base_url, timeout=10).status_code == 200
    server.process.send_signal(signal.SIGINT)
    assert server.process.wait(timeout=20) == 0


@pytest.fixture
def simulated_server(tmp_path: Path) -> Iterator[Server]:
    yield from start_server(tmp_path, "--simulate-gpus", "2x24GiB")


def test_serve_simulated_gpus_on_gevent_page_api_and_pushed_event(simulated_server: Server) -> None:
    """The demo mode end to end on the real gevent server: NVML reads go through gevent's threadpool there."""
    import socketio

    page = requests.get(simulated_server.base_url + "memplugin/devices", timeout=10)
    assert page.status_code == 200
    assert 'id="simulated-gpu-banner"' in page.text
    from_api = requests.get(simulated_server.base_url + "memplugin/api/devices", timeout=10).json()
    assert from_api["simulated"] is True
    assert [row["memory_total"] for row in from_api["devices"]][:2] == [24 * 1024**3] * 2

    received: queue.Queue[dict[str, object]] = queue.Queue()
    client = socketio.Client()
    client.on("devices", received.put, namespace="/memplugin")
    client.connect(simulated_server.base_url, namespaces=["/memplugin"], transports=["polling"], wait_timeout=10)
    try:
        client.emit("subscribe_devices", namespace="/memplugin")
        first = received.get(timeout=10)  # sent at once on subscription
        pushed = received.get(timeout=10)  # then every 2 seconds (the default interval)
    finally:
        client.disconnect()
    for payload in (first, pushed):
        assert payload["simulated"] is True
        assert payload["devices"][:2] == from_api["devices"][:2]  # type: ignore[index]

    simulated_server.process.send_signal(signal.SIGTERM)
    assert simulated_server.process.wait(timeout=20) == 0
    output = simulated_server.process.stdout.read() if simulated_server.process.stdout else ""
    assert "Traceback" not in output


OPEN_TCP_STATES = {"01", "08"}
"""ESTABLISHED and CLOSE_WAIT in /proc/net/tcp: a connection whose server side is not closed yet."""


def open_connections(port: int) -> list[str]:
    """The TCP connections on this machine whose local end is `port` (the server's) and that its server has not
    closed yet (listening sockets left out): /proc/net/tcp's own lines."""
    open_ = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table, encoding="ascii") as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] in OPEN_TCP_STATES:
                    open_.append(line.strip())
    return open_


def test_websocket_sessions_end_without_an_error_in_the_log(server: Server) -> None:
    """gevent used to read a closed websocket's last frame as the next HTTP request and log its bytes as an
    invalid request at every disconnect; the handler now closes the connection after a websocket instead."""
    import socketio

    for transports in (["websocket"], ["polling", "websocket"]):
        client = socketio.Client()
        client.connect(server.base_url, namespaces=["/memplugin"], transports=transports, wait_timeout=10)
        client.emit("subscribe_devices", namespace="/memplugin")
        client.disconnect()
    # The server has ended each session (closed its side of every connection): what it would log about their last
    # frames, it has logged by now.
    port = int(server.base_url.rstrip("/").rsplit(":", 1)[1])
    wait_for(lambda: not open_connections(port), timeout=30, what="the server to close the sessions' connections")
    # The server goes on answering, on a new connection and on the same server.
    assert requests.get(server.base_url + "memplugin/api/health", timeout=10).status_code == 200
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=20) == 0
    output = server.process.stdout.read() if server.process.stdout else ""
    assert "ERROR" not in output and "Invalid" not in output, output


def test_serve_refuses_a_bad_gpu_spec(tmp_path: Path) -> None:
    command = [SCRIPT, "serve", "--simulate-gpus", "24", "--data-dir", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert "argument --simulate-gpus" in result.stderr and "not a memory size" in result.stderr


def test_serve_with_a_token_file_guards_writes(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("a-long-enough-api-token\n")
    running = start_server(tmp_path, "--api-token-file", str(token_file))
    server = next(running)
    try:
        url = server.base_url + "memplugin/api/jobs"
        assert requests.get(url, timeout=10).status_code == 200
        assert requests.post(url, json={}, timeout=10).status_code == 401
        authorized = requests.post(url, json={}, timeout=10,
                                   headers={"Authorization": "Bearer a-long-enough-api-token"})
        assert authorized.status_code == 400  # past the token: the empty request is refused on its merits
    finally:
        running.close()


def test_serve_refuses_bad_access_flags(tmp_path: Path) -> None:
    no_token = subprocess.run([SCRIPT, "serve", "--auth-reads", "--data-dir", str(tmp_path)], check=False,
                              capture_output=True, text=True, timeout=60)
    assert no_token.returncode == 2 and "--auth-reads needs a token" in no_token.stderr
    (tmp_path / "weak").write_text("short")
    weak = subprocess.run([SCRIPT, "serve", "--api-token-file", str(tmp_path / "weak"), "--data-dir", str(tmp_path)],
                          check=False, capture_output=True, text=True, timeout=60)
    assert weak.returncode == 2 and "MEMPLUGIN_API_TOKEN must be a string of at least 16" in weak.stderr
