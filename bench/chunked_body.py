"""What reading a chunked body strictly costs (digits_memplugin/host/server.py StrictChunkedInput, whose chunk-size
lines and trailers http_framing.read_chunk_size checks as RFC 9112 says), beside gevent's own Input.

Three bodies read from memory through each reader, in interleaved rounds in one process; medians of the rounds
(microseconds a body) and their ratio, printed as the rows of docs/benchmarks.md's table.

    .venv/bin/python bench/chunked_body.py [--rounds 15] [--number 500]
"""

from __future__ import annotations

import argparse
import io
import statistics
import timeit
from collections.abc import Callable

from gevent.pywsgi import Input

from digits_memplugin.host.server import StrictChunkedInput


def body(chunks: int, size: int, extension: bytes = b"") -> bytes:
    data = b"x" * size
    return b"".join(b"%x%s\r\n%s\r\n" % (size, extension, data) for _ in range(chunks)) + b"0\r\nX-Sum: abc\r\n\r\n"


CASES = {
    "1 chunk of 4 KiB": body(1, 4096),
    "64 chunks of 64 B": body(64, 64),
    "16 chunks of 256 B, ;name=value": body(16, 256, b";name=value"),
}


def reading(reader: type[Input], raw: bytes) -> Callable[[], None]:
    def once() -> None:
        stream = reader(io.BufferedReader(io.BytesIO(raw)), None, chunked_input=True)
        while stream.read(16384):
            pass
    return once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=500)
    args = parser.parse_args()
    print("| body | gevent µs | strict µs | ratio |")
    print("|---|---|---|---|")
    for name, raw in CASES.items():
        old, new = [], []
        for _ in range(args.rounds):
            old.append(timeit.timeit(reading(Input, raw), number=args.number) / args.number * 1e6)
            new.append(timeit.timeit(reading(StrictChunkedInput, raw), number=args.number) / args.number * 1e6)
        before, after = statistics.median(old), statistics.median(new)
        print(f"| {name} | {before:.1f} | {after:.1f} | {after / before:.2f} |")


if __name__ == "__main__":
    main()
