"""A request's header section read strictly, and its body's framing decided as RFC 9112 asks of a server.

Behind a reverse proxy (the docs recommend one for TLS) the proxy and this server must agree on where each request's
body ends, or bytes the proxy forwarded as one request's body run here as a next request (request smuggling). The
header parser gevent uses (Python's email parser) is lenient where RFC 9112 is not: it keeps the first of two
different Content-Length headers, takes `int()`'s spellings (`+12`, `1_2`, `12\\x0b`), reads a body by
Transfer-Encoding when Content-Length is there too and keeps the connection, ignores a Transfer-Encoding that is not
exactly "chunked" (`gzip, chunked`, `chunked\\0`), splits lines at a bare CR, and drops every line after one it
cannot read (`Content-Length : 12`). Each of those is a way for a proxy to count a body this server does not. So
every field line is checked before it is parsed, and a request whose framing is not one of the two the RFC allows (a
single Content-Length of digits, or Transfer-Encoding: chunked alone) is refused: the server answers 400 (501 for a
transfer coding it does not implement) and closes the connection, as RFC 9112 section 6.3 requires, so nothing
after the head is read as a request.
"""

from __future__ import annotations

import dataclasses
import re
from email.message import Message
from typing import BinaryIO

MAX_FIELD_LINE = 65536
"""Bytes in one header line at most (what Python's http.client takes)."""
MAX_FIELD_LINES = 100
"""Header lines in one request at most (what Python's http.client takes)."""
MAX_LENGTH_DIGITS = 18
"""A Content-Length of more significant digits than this is refused (no body that long is taken anyway)."""

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""A field name (RFC 9110 section 5.1: a token, so no space before the colon)."""
_GOOD_LINE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\r\n\0]*\r?\n")
"""A field line with nothing to refuse: checked at once, the reasons looked for only when it does not match."""
_DIGITS = re.compile(r"[0-9]+")
_SHOWN = 80


class BadHead(ValueError):
    """A request head this server refuses: `status` to answer (then the connection is closed) and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclasses.dataclass(frozen=True)
class Framing:
    """How the request's body is delimited: chunked, or `length` bytes (None: no body)."""

    chunked: bool
    length: int | None


def _shown(line: bytes) -> str:
    text = line.rstrip(b"\r\n").decode("latin-1")
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


def read_field_lines(rfile: BinaryIO) -> bytes:
    """The header section up to and including its closing blank line, each line checked; BadHead otherwise.

    Refused: a line over MAX_FIELD_LINE bytes or more than MAX_FIELD_LINES lines (431); a line that is not
    `name: value` with a token for its name (a space before the colon, no colon, a byte a name cannot hold); a line
    starting with a space or tab (obsolete line folding, which a proxy may read as part of the line before); a bare
    CR or a NUL in a line (Python splits lines at a bare CR, where a proxy reads on); a head cut short before its
    blank line. A bare LF ending a line is taken, as RFC 9112 section 2.2 allows.
    """
    lines: list[bytes] = []
    while True:
        line = rfile.readline(MAX_FIELD_LINE + 1)
        if len(line) > MAX_FIELD_LINE:
            raise BadHead(431, f"header line {len(lines) + 1} is over {MAX_FIELD_LINE} bytes")
        if line in (b"\r\n", b"\n"):
            return b"".join(lines) + b"\r\n"
        if not line.endswith(b"\n"):
            raise BadHead(400, "the request's head ends before the blank line that closes its headers")
        number = len(lines) + 1
        if number > MAX_FIELD_LINES:
            raise BadHead(431, f"the request has more than {MAX_FIELD_LINES} header lines")
        if _GOOD_LINE.fullmatch(line):
            lines.append(line)
            continue
        content = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        if content[:1] in (b" ", b"\t"):
            raise BadHead(400, f"header line {number} ({_shown(line)}) starts with a space or tab: obsolete line "
                               "folding is not taken; send each header on one line")
        if b"\r" in content:
            raise BadHead(400, f"header line {number} ({_shown(line)}) holds a carriage return that does not end it")
        if b"\0" in content:
            raise BadHead(400, f"header line {number} ({_shown(line)}) holds a NUL byte")
        name, colon, _ = content.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            why = "has a space before its colon" if colon and name[-1:] in (b" ", b"\t") else "is not 'Name: value'"
            raise BadHead(400, f"header line {number} ({_shown(line)}) {why}")
        raise BadHead(400, f"header line {number} ({_shown(line)}) cannot be read")  # not reached: each case above


def framing(fields: Message, version: str) -> Framing:
    """How the body of a request with these header fields is delimited, as RFC 9112 section 6 has it; BadHead for a
    request whose body a proxy and this server could delimit differently.

    Refused: Content-Length and Transfer-Encoding together (the RFC lets a server read such a request by its
    Transfer-Encoding, but then requires the connection closed; refusing it is simpler and what proxies do);
    Transfer-Encoding in an HTTP/1.0 request; a transfer coding other than chunked alone (501 when it is one this
    server does not implement, such as gzip); more than one Content-Length header, even equal ones; a
    Content-Length that is not digits 0-9 (`+12`, `1_2`, `0x1f`, `12, 12`).
    """
    lengths = fields.get_all("Content-Length") or []
    codings_fields = fields.get_all("Transfer-Encoding") or []
    if codings_fields:
        if lengths:
            raise BadHead(400, "the request has both Content-Length and Transfer-Encoding: a proxy may delimit its "
                               "body by one and this server by the other; send one of them")
        if version != "HTTP/1.1":
            raise BadHead(400, f"Transfer-Encoding is not taken in an {version} request (RFC 9112 section 6.1)")
        if len(codings_fields) > 1:
            raise BadHead(400, f"the request has {len(codings_fields)} Transfer-Encoding headers; send one")
        codings = [coding for coding in (part.strip(" \t").lower() for part in codings_fields[0].split(",")) if coding]
        if codings[-1:] != ["chunked"]:
            raise BadHead(400, f"Transfer-Encoding {codings_fields[0]!r} does not end with chunked, so the body's "
                               "end cannot be found")
        unknown = [coding for coding in codings[:-1] if coding != "chunked"]
        if unknown:
            raise BadHead(501, f"the transfer coding {unknown[0]!r} is not implemented: only chunked is")
        if len(codings) > 1:
            raise BadHead(400, f"Transfer-Encoding {codings_fields[0]!r} applies chunked more than once")
        return Framing(chunked=True, length=None)
    if not lengths:
        return Framing(chunked=False, length=None)
    if len(lengths) > 1:
        given = ", ".join(repr(value) for value in lengths[:4])
        raise BadHead(400, f"the request has {len(lengths)} Content-Length headers ({given}); send one")
    value = lengths[0].strip(" \t")
    if not _DIGITS.fullmatch(value):
        shown = value if len(value) <= _SHOWN else value[:_SHOWN] + "..."
        raise BadHead(400, f"Content-Length {shown!r} is not a number written with the digits 0-9 alone")
    if len(value.lstrip("0")) > MAX_LENGTH_DIGITS:
        raise BadHead(400, f"Content-Length has {len(value.lstrip('0'))} digits; no body that long is taken")
    return Framing(chunked=False, length=int(value))
