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

A chunked body's own lines are read as strictly (`read_chunk_size`): gevent skipped a chunk extension up to the
first CR, so a bare LF in it (where a proxy may end the line, RFC 9112 section 2.2) or in a trailer line let a request
hidden in the body run here.
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
MAX_CHUNK_LINE = 8192
"""Bytes in one chunk-size line (extensions included) or trailer line at most (what gevent took for either)."""

_TOKEN_TEXT = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_TOKEN = re.compile(_TOKEN_TEXT)
"""A field name (RFC 9110 section 5.1: a token, so no space before the colon)."""
_GOOD_LINE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\r\n\0]*\r?\n")
"""A field line with nothing to refuse: checked at once, the reasons looked for only when it does not match."""
_DIGITS = re.compile(r"[0-9]+")
_QUOTED_TEXT = rb'"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
_EXTENSION_TEXT = rb"[ \t]*;[ \t]*%s(?:[ \t]*=[ \t]*(?:%s|%s))?" % (_TOKEN_TEXT, _TOKEN_TEXT, _QUOTED_TEXT)
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:%s)*\r\n" % _EXTENSION_TEXT)
"""A chunk-size line as RFC 9112 section 7.1 has it: at most 16 hex digits (gevent's bound), then extensions
`;name`, `;name=token` or `;name="quoted"` (spaces or tabs around `;` and `=`), then CRLF: no bare LF, no NUL or
other control byte anywhere."""
_TRAILER_LINE = re.compile(rb"%s:[\t\x20-\x7e\x80-\xff]*\r\n" % _TOKEN_TEXT)
"""A trailer field line: `name: value` with no control byte but HTAB in the value, ended by CRLF."""
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


class BadChunk(ValueError):
    """A chunk-size line or trailer section of a chunked body this server refuses, and why."""


def _chunk_line(rfile: BinaryIO, what: str) -> bytes:
    """The next line of the body, CRLF-ended and at most MAX_CHUNK_LINE bytes; BadChunk otherwise."""
    line = rfile.readline(MAX_CHUNK_LINE + 1)
    if len(line) > MAX_CHUNK_LINE:
        raise BadChunk(f"a {what} is over {MAX_CHUNK_LINE} bytes")
    if not line.endswith(b"\r\n"):
        why = "ends with a bare LF" if line.endswith(b"\n") else "is cut short"
        raise BadChunk(f"the {what} {_shown(line)} {why}: lines of a chunked body end with CRLF")
    return line


def read_chunk_size(rfile: BinaryIO) -> int:
    """The size on the chunk-size line `rfile` is at, read as RFC 9112 section 7.1 has it; for the last chunk (size
    0) its trailer section is read too, up to the empty line that ends the body. BadChunk for a line that is not one
    (`_CHUNK_LINE`), a trailer line that is not a field line (`_TRAILER_LINE`) or more than MAX_FIELD_LINES of
    them: the caller then closes the connection, so nothing after the bad line is read as a request."""
    line = _chunk_line(rfile, "chunk-size line")
    match = _CHUNK_LINE.fullmatch(line)
    if match is None:
        raise BadChunk(f"the chunk-size line {_shown(line)} is not a size in hex with well-formed extensions")
    size = int(match.group(1), 16)
    if size == 0:
        for _ in range(MAX_FIELD_LINES + 1):
            trailer = _chunk_line(rfile, "trailer line")
            if trailer == b"\r\n":
                return 0
            if not _TRAILER_LINE.fullmatch(trailer):
                raise BadChunk(f"the trailer line {_shown(trailer)} is not 'Name: value' without control bytes")
        raise BadChunk(f"the chunked body has more than {MAX_FIELD_LINES} trailer lines")
    return size
