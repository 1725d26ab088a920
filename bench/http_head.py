"""What reading a request head strictly costs (digits_memplugin/host/http_framing.py), beside gevent's own parse.

A browser-like head of 13 header lines, parsed the way gevent does (Python's email parser, through gevent's
`headers_factory`) and the way `serve` does now (each line checked, the same parse, the framing decided), in
interleaved rounds in one process; medians of the rounds and their ratio. A request costs the server about a
millisecond or more in Flask, so what matters is the difference in microseconds.

    .venv/bin/python bench/http_head.py [--rounds 21] [--number 2000]
"""

from __future__ import annotations

import argparse
import io
import statistics
import timeit

from gevent.pywsgi import headers_factory

from digits_memplugin.host.http_framing import framing, read_field_lines

HEAD = (
    b"Host: 127.0.0.1:5000\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64) Chrome/130.0 Safari/537.36\r\n"
    b"Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\nAccept-Language: en-US,en;q=0.9\r\n"
    b"Accept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\nCookie: session=eyJjc3JmX3Rva2VuIjoiYWJjIn0.Z.abc\r\n"
    b"Upgrade-Insecure-Requests: 1\r\nSec-Fetch-Dest: document\r\nSec-Fetch-Mode: navigate\r\nSec-Fetch-Site: none\r\n"
    b"Content-Type: application/json\r\nContent-Length: 1234\r\n\r\n"
)


def gevents_parse() -> None:
    headers_factory(io.BytesIO(HEAD))


def checked_parse() -> None:
    fields = headers_factory(io.BytesIO(read_field_lines(io.BytesIO(HEAD))))
    framing(fields, "HTTP/1.1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    old: list[float] = []
    new: list[float] = []
    for _ in range(args.rounds):
        old.append(timeit.timeit(gevents_parse, number=args.number) / args.number * 1e6)
        new.append(timeit.timeit(checked_parse, number=args.number) / args.number * 1e6)
    before, after = statistics.median(old), statistics.median(new)
    print("| head of 13 lines | median µs |")
    print("|---|---|")
    print(f"| gevent's parse | {before:.1f} |")
    print(f"| checked (serve) | {after:.1f} |")
    print(f"| difference | {after - before:.1f} (ratio {after / before:.2f}) |")


if __name__ == "__main__":
    main()
