"""Serving an app that carries the plugin on gevent's WSGI server, with a clean stop on SIGTERM or SIGINT."""

from __future__ import annotations

import logging
import signal
import sys

import gevent
from flask import Flask
from gevent.pywsgi import WSGIServer

log = logging.getLogger(__name__)


def serve(app: Flask, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT, then stop accepting, let requests finish (5 s at most) and return.

    Needs gevent's monkey-patching done before the app was imported (the `serve` command does it). Websockets are
    served through simple-websocket, which engineio drives on gevent without gevent-websocket.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = WSGIServer((host, port), app, log=None, error_log=log)
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
