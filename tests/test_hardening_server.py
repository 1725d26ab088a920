"""The standalone server under load: each connection has Nagle's algorithm off. With it on, a response written in
two parts (headers, then body) waited for the client's delayed acknowledgement, about 40 ms per request on a
kept-alive connection (bench/load.py measured 48 ms for GET /api/health, 3 ms without): a speed figure, so it
lives in docs/benchmarks.md; this test holds the cause."""

from __future__ import annotations

import socket
from typing import Any

from digits_memplugin.host.server import NoDelayWSGIServer


def test_each_accepted_connection_gets_tcp_nodelay() -> None:
    seen: list[int] = []

    class Recorder:
        """Stands in for gevent's request handler: records the socket option the server set before handing over."""

        def __init__(self, sock: socket.socket, address: Any, server: Any) -> None:
            seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

        def handle(self) -> None:
            return None

    server = NoDelayWSGIServer(("127.0.0.1", 0), lambda environ, start: [], handler_class=Recorder)
    with socket.create_server(("127.0.0.1", 0)) as listener, socket.create_connection(listener.getsockname()):
        accepted, address = listener.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0  # the kernel's default
            server.handle(accepted, address)
    assert seen and seen[0] != 0


def test_a_unix_socket_is_handed_over_unchanged() -> None:
    """Not TCP: there is no Nagle to turn off, and the connection is still served."""
    handled: list[bool] = []

    class Recorder:
        def __init__(self, sock: socket.socket, address: Any, server: Any) -> None:
            handled.append(True)

        def handle(self) -> None:
            return None

    server = NoDelayWSGIServer(("127.0.0.1", 0), lambda environ, start: [], handler_class=Recorder)
    left, right = socket.socketpair()
    with left, right:
        server.handle(left, "")
    assert handled == [True]
