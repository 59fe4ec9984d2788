# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A model mirror for the lab and the tests: serves a directory over HTTP with Range
requests (206 and Content-Range, as a real mirror or object store answers), and, to
reproduce an interrupted download, can cut one file's body after N bytes (--cut NAME:N:
the response announces the whole length, sends N bytes, and drops the connection).

    serve.py DIRECTORY [--port 0] [--bind 127.0.0.1] [--cut NAME:N] [--port-file PATH]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"^bytes=(\d+)-$")


def handler(root: str, cuts: dict[str, int]):
    class Mirror(BaseHTTPRequestHandler):
        def log_message(self, format, *args):  # noqa: A002 - http.server API
            sys.stderr.write("mirror: " + (format % args) + "\n")

        def do_GET(self):  # noqa: N802 - http.server API
            name = unquote(urlsplit(self.path).path).lstrip("/")
            path = os.path.realpath(os.path.join(root, name))
            if not path.startswith(os.path.realpath(root) + os.sep) or not os.path.isfile(path):
                self.send_error(404)
                return
            size = os.path.getsize(path)
            start = 0
            match = _RANGE.match(self.headers.get("Range", ""))
            if match:
                start = int(match.group(1))
                if start >= size:
                    self.send_error(416)
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(size - start))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            limit = cuts.get(name)
            with open(path, "rb") as handle:
                handle.seek(start)
                sent = start
                while True:
                    block = handle.read(1 << 16)
                    if not block:
                        break
                    if limit is not None and sent + len(block) > limit:
                        self.wfile.write(block[:max(0, limit - sent)])
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    self.wfile.write(block)
                    sent += len(block)

    return Mirror


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--cut", action="append", default=[], help="NAME:BYTES")
    parser.add_argument("--port-file")
    args = parser.parse_args(argv)
    cuts = {}
    for item in args.cut:
        name, _sep, count = item.rpartition(":")
        cuts[name] = int(count)
    server = ThreadingHTTPServer((args.bind, args.port), handler(os.path.abspath(args.directory), cuts))
    if args.port_file:
        with open(args.port_file + ".tmp", "w", encoding="utf-8") as handle:
            handle.write(str(server.server_address[1]))
        os.replace(args.port_file + ".tmp", args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    main()
