"""Serving an app that carries the plugin on gevent's WSGI server, with a clean stop on SIGTERM or SIGINT."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import sys
from typing import Any

import gevent
from flask import Flask
from gevent.pywsgi import WSGIHandler, WSGIServer

log = logging.getLogger(__name__)


class WebsocketClosingHandler(WSGIHandler):  # type: ignore[misc]
    """gevent's request handler, which closes the connection once a websocket on it has ended.

    simple-websocket takes the socket over during the upgrade request; when the websocket ends, gevent would go
    on reading the connection for a next HTTP request and find the client's last websocket frame there, logging
    it as an invalid HTTP request (its bytes in the log) at every disconnect.
    """

    def run_application(self) -> None:
        try:
            super().run_application()
        finally:
            if self.environ.get("HTTP_UPGRADE", "").lower() == "websocket":
                self.close_connection = True


class NoDelayWSGIServer(WSGIServer):  # type: ignore[misc]
    """gevent's WSGI server with Nagle's algorithm off on each connection.

    A response goes out in more than one write (headers, then body; a websocket frame's header, then its payload).
    With Nagle on, the second small write waits for the client to acknowledge the first, and a client delays that
    acknowledgement by up to 40 ms: every request on a kept-alive connection took about 45 ms instead of 2.
    """

    def handle(self, sock: socket.socket, address: Any) -> None:
        with contextlib.suppress(OSError):  # not TCP (a Unix socket): nothing to turn off
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().handle(sock, address)

    handler_class = WebsocketClosingHandler


def serve(app: Flask, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT, then stop accepting, let requests finish (5 s at most) and return.

    Needs gevent's monkey-patching done before the app was imported (the `serve` command does it). Websockets are
    served through simple-websocket, which engineio drives on gevent without gevent-websocket.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = NoDelayWSGIServer((host, port), app, log=None, error_log=log)
    server.start()
    bound_host, bound_port = server.address[:2]
    # The address line is machine-readable on purpose: tests and scripts started with --port 0 read it.
    print(f"digits-memplugin serving on http://{bound_host}:{bound_port}/", flush=True)
    sys.stdout.flush()

    def stop(signum: int) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        server.stop(timeout=5)

    gevent.signal_handler(signal.SIGTERM, stop, signal.SIGTERM)
    gevent.signal_handler(signal.SIGINT, stop, signal.SIGINT)
    server.serve_forever()
    log.info("stopped")
