"""Serving an app that carries the plugin on gevent's WSGI server, with a clean stop on SIGTERM or SIGINT.

gevent's handler is adjusted for what the plugin promises about connections (docs/security.md, "Hosts and
connections"): a request head whose body's framing a proxy could read otherwise (two Content-Lengths, `+12`,
Content-Length with chunked: http_framing.py) is refused and its connection closed; a connection is closed after a
body it could not read (a malformed chunk would otherwise leave the rest of the body to be read as the next request:
request smuggling), after a websocket, and when a request's head or body does not arrive within the read timeout.
"""

from __future__ import annotations

import contextlib
import http
import io
import json
import logging
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import gevent
from flask import Flask
from gevent.pywsgi import MAX_REQUEST_LINE, Input, WSGIHandler, WSGIServer, _InvalidClientInput, headers_factory

from .http_framing import BadChunk, BadHead, framing, read_chunk_size, read_field_lines

log = logging.getLogger(__name__)


def closing_response(status: int, message: str) -> bytes:
    """A whole JSON error response, status line to body, after which the connection is closed."""
    body = json.dumps({"error": f"{message}; the connection is closed", "status": status}).encode()
    return b"HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        status, http.HTTPStatus(status).phrase.encode(), len(body), body
    )


REQUEST_TIMEOUT_RESPONSE = closing_response(408, "the request's line and headers did not arrive in time")
URI_TOO_LONG_RESPONSE = closing_response(
    414, f"the request line is over {MAX_REQUEST_LINE} bytes (a URL that long is refused before any page or API sees it)"
)


class HeadTimedOut(OSError):
    """A request's line and headers did not arrive within the read timeout."""


class GuardedInput:
    """The request body as the application reads it: each read waits at most `timeout` seconds for data, and a
    read that fails (a malformed chunk, the timeout, the client gone) is noted, so the connection is closed after
    the response instead of being read on as if it were at the start of a next request."""

    def __init__(self, stream: Any, sock: Any, timeout: float | None) -> None:
        self._stream = stream
        self._socket = sock
        self._timeout = timeout
        self.failed = False

    def guard(self, read: Callable[..., Any], *args: Any) -> Any:
        previous = self._socket.gettimeout()
        self._socket.settimeout(self._timeout)
        try:
            return read(*args)
        except Exception:
            self.failed = True
            raise
        finally:
            with contextlib.suppress(OSError):
                self._socket.settimeout(previous)

    def read(self, length: int | None = None) -> bytes:
        return self.guard(self._stream.read, length)  # type: ignore[no-any-return]

    def readline(self, size: int | None = None) -> bytes:
        return self.guard(self._stream.readline, size)  # type: ignore[no-any-return]

    def readlines(self, hint: int | None = None) -> list[bytes]:
        return list(self)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.readline, b"")


class StrictChunkedInput(Input):  # type: ignore[misc]
    """gevent's request body, its chunk-size lines and trailers read as RFC 9112 asks (`read_chunk_size`).

    gevent skipped a chunk extension up to the first CR and took a bare LF, a NUL or any control byte in it, and a
    bare LF in a trailer line: a proxy that ends a line at the LF forwarded one request whose body held a second one,
    which ran here. A line refused raises what gevent raises for a malformed chunk (so the application's read
    fails, GuardedInput notes it and the connection is closed after the 400). The method replaced is gevent's
    private `__read_chunk_length`, under its mangled name; the chunk data and the CRLF after it are still gevent's.
    """

    def _Input__read_chunk_length(self, rfile: Any) -> int:
        try:
            return read_chunk_size(rfile)
        except BadChunk as bad:
            self._chunked_input_error = True
            log.info("refused a chunked body: %s", bad)
            raise _InvalidClientInput(str(bad)) from None


class _Drained:
    """Stands in for gevent's input once the connection is to be closed: nothing more of the body is read."""

    def _discard(self) -> None:
        return None


class ConnectionHandler(WSGIHandler):  # type: ignore[misc]
    """gevent's request handler, closing the connection where reading on could go wrong.

    - After a websocket: simple-websocket takes the socket over during the upgrade request; when the websocket
      ends, gevent would go on reading the connection for a next HTTP request and find the client's last websocket
      frame there, logging it as an invalid HTTP request (its bytes in the log) at every disconnect.
    - After a body that could not be read to its end (malformed chunked framing, a client that stopped sending):
      gevent answered the application's 400 and then read what followed the bad chunk as a new request, so a
      request hidden in a body ran (request smuggling). The 400 now says `Connection: close` and nothing more is
      read. A body the application left unread is still read out (so keep-alive goes on), but under the timeout.
    - A head whose body's framing is not one RFC 9112 allows, or whose header lines are not well formed
      (http_framing.py): gevent kept the first of two Content-Lengths, took `+12` and `1_2`, and read a body by
      Transfer-Encoding and ran the rest (Content-Length's count of bytes, to a proxy) as the next request. Such
      a head gets a JSON 400 (501 for a coding not implemented, 431 for too many or too long lines) and the
      connection is closed before any body is read; so do the heads gevent itself refuses (a bad request line).
    - A chunked body's chunk-size lines and trailers are read strictly too (StrictChunkedInput): gevent took a bare
      LF or a control byte in a chunk extension or trailer, where a proxy may end the line and read on.
    - Read timeout (the server's `read_timeout`): the request line and headers must arrive within it from the
      moment the handler waits for them (a connection without a whole request line by then, idle kept-alive ones
      included, is closed; one with headers still missing gets 408 first), and a body may pause at most that long
      between two reads. A websocket, once open, is not timed.
    """

    wsgi_input: Any
    _guarded: GuardedInput | None = None
    _head_deadline: float | None = None

    @contextlib.contextmanager
    def _head_timer(self) -> Iterator[None]:
        if self._head_deadline is None:
            yield
            return
        left = max(self._head_deadline - time.monotonic(), 0.001)
        with gevent.Timeout(left, HeadTimedOut("the request's line and headers did not arrive in time")):
            yield

    def read_requestline(self) -> str:
        timeout = self.server.read_timeout
        self._head_deadline = None if timeout is None else time.monotonic() + timeout
        with self._head_timer():  # a timeout here is an OSError: gevent closes the connection without a word
            return super().read_requestline()  # type: ignore[no-any-return]

    def read_request(self, raw_requestline: str) -> bool:
        with self._head_timer():
            return super().read_request(raw_requestline)  # type: ignore[no-any-return]

    def MessageClass(self, rfile: Any, *args: Any) -> Any:  # gevent's name for its header parser
        """The request's header fields, each line checked before gevent's parser reads them, and the body's framing
        decided once (BadHead, a ValueError, reaches `_handle_client_error`). gevent compares Transfer-Encoding
        with "chunked" in two places, once as sent and once stripped, so the field is rewritten to exactly that once
        it is found to mean it ("Chunked", "chunked " with a space after it): every reader then sees one framing."""
        fields = headers_factory(io.BytesIO(read_field_lines(rfile)))
        if framing(fields, self.request_version).chunked:
            fields.replace_header("Transfer-Encoding", "chunked")
        return fields

    def get_environ(self) -> dict[str, Any]:
        """gevent's environment, with a chunked body read through StrictChunkedInput."""
        environ: dict[str, Any] = super().get_environ()
        plain = self.wsgi_input
        if isinstance(plain, Input) and plain.chunked_input:
            self.wsgi_input = StrictChunkedInput(self.rfile, self.content_length, plain.socket, chunked_input=True)
            if environ.get("wsgi.input") is plain:
                environ["wsgi.input"] = self.wsgi_input
        return environ

    def handle_one_request(self) -> Any:
        result = super().handle_one_request()
        if isinstance(result, tuple) and result[0] == "414":  # gevent's own 414 has no body: say why, in JSON
            return "414", URI_TOO_LONG_RESPONSE
        return result

    def _handle_client_error(self, ex: BaseException) -> tuple[str, bytes]:
        if isinstance(ex, HeadTimedOut):
            log.info("closing a connection from %s: %s", self.client_address, ex)
            return "408", REQUEST_TIMEOUT_RESPONSE
        if isinstance(ex, BadHead):
            log.info("refused a request head from %s: %s", self.client_address, ex.message)
            return str(ex.status), closing_response(ex.status, ex.message)
        super()._handle_client_error(ex)  # logs it; its answer is a 400 with an empty body
        reason = str(ex) or type(ex).__name__
        reason = reason if len(reason) <= 200 else reason[:200] + "..."
        return "400", closing_response(400, f"the request line or headers could not be read ({reason})")

    def start_response(self, status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        if self._guarded is not None and self._guarded.failed:
            headers = [(name, value) for name, value in headers if name.lower() != "connection"]
            headers.append(("Connection", "close"))  # gevent closes the connection after this response
        return super().start_response(status, headers, exc_info)

    def run_application(self) -> None:
        self._guarded = None
        if self.environ.get("wsgi.input") is self.wsgi_input:  # a body gevent reads for the application
            self._guarded = GuardedInput(self.wsgi_input, self.socket, self.server.read_timeout)
            self.environ["wsgi.input"] = self._guarded
        try:
            super().run_application()
        finally:
            self._finish_body()
            if self.environ.get("HTTP_UPGRADE", "").lower() == "websocket":
                self.close_connection = True

    def _finish_body(self) -> None:
        """Read out what the application left of the body, under the timeout; or, where a read failed, close."""
        guarded = self._guarded
        if guarded is None:
            return
        if not guarded.failed:
            with contextlib.suppress(Exception):
                guarded.guard(self.wsgi_input._discard)
        if guarded.failed:
            self.close_connection = True
            self.wsgi_input = _Drained()


class NoDelayWSGIServer(WSGIServer):  # type: ignore[misc]
    """gevent's WSGI server with Nagle's algorithm off on each connection.

    A response goes out in more than one write (headers, then body; a websocket frame's header, then its payload).
    With Nagle on, the second small write waits for the client to acknowledge the first, and a client delays that
    acknowledgement by up to 40 ms: every request on a kept-alive connection took about 45 ms instead of 2.
    """

    handler_class = ConnectionHandler
    read_timeout: float | None = None
    """Seconds a request's head may take, and a body may pause (ConnectionHandler); None: no timeout."""

    def __init__(self, *args: Any, read_timeout: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_timeout = read_timeout

    def handle(self, sock: socket.socket, address: Any) -> None:
        with contextlib.suppress(OSError):  # not TCP (a Unix socket): nothing to turn off
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().handle(sock, address)


def serve(app: Flask, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT, then stop accepting, let requests finish (5 s at most) and return.

    Needs gevent's monkey-patching done before the app was imported (the `serve` command does it). Websockets are
    served through simple-websocket, which engineio drives on gevent without gevent-websocket.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .extension import get_plugin

    read_timeout = get_plugin(app).settings.read_timeout_seconds
    server = NoDelayWSGIServer((host, port), app, log=None, error_log=log, read_timeout=read_timeout)
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
