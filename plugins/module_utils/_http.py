# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The readiness gate's HTTP client, bounded in time and in memory.

A gate that waits on a server must not itself be held by it: every call ends
by one deadline (a server that drips a byte a second cannot stretch it, as it
could a per-read socket timeout), and a body is read in chunks up to a cap (a
server answering 300 MiB cannot push the module's memory with it).

Built on ``http.client`` directly, which reads no proxy from the environment,
follows no redirect and reads no netrc: the request goes to the URL's host
and nowhere else. Name resolution (``getaddrinfo``) is the one step the
deadline cannot interrupt; the gate's URLs are addresses or local names.
"""

from __future__ import annotations

import http.client
import io
import json
import math
import socket
import ssl
import time
from urllib.parse import urlsplit

from ansible_collections.inferops.sglang.plugins.module_utils._mask import printable

USER_AGENT = "inferops.sglang-wait_for_sglang"
MAX_BODY = 8 * 1024 * 1024
TIMEOUT_FLOOR = 0.1  # a call made after the gate's deadline still gets this long
_CHUNK = 64 * 1024
_TEXT_CLIP = 500


class Response:
    """What one call came to. ``kind`` is ``ok`` (2xx), ``http`` (any other
    status, 3xx included: no redirect is followed), ``too_large`` (over the
    body cap; status kept), or the network outcome ``refused``, ``timeout``,
    ``dropped`` or ``error``. ``body`` is parsed JSON, text clipped to 500
    characters, or None."""

    def __init__(self, status: int | None = None, body: object = None, error: str | None = None,
                 kind: str = "ok", latency: float = 0.0) -> None:
        self.status, self.body, self.error, self.kind, self.latency = status, body, error, kind, latency

    def describe(self) -> str:
        """One phrase for the gate's timeline: the status for an HTTP error, else the error or the kind."""
        if self.status is not None and self.kind == "http":
            return f"HTTP {self.status}"
        return self.error or self.kind


class _Deadline(Exception):
    """The call's deadline passed; raised in place of a socket timeout so the
    message can say how far the answer got."""


def finite_seconds(name: str, value: object, minimum_exclusive: float = 0.0) -> float:
    """``value`` as float seconds, refusing what would never expire (NaN, inf)
    or expire at once (at or below ``minimum_exclusive``): NaN compares false
    with everything, so a plain ``<= 0`` check would let it through."""
    seconds = _finite(name, value)
    if seconds <= minimum_exclusive:
        raise ValueError(f"{name} must be a finite number of seconds greater than {minimum_exclusive:g}, got {value!r}")
    return seconds


def _finite(name: str, value: object) -> float:
    """``value`` as a finite float, or a ValueError that names the option."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}") from None
    if not math.isfinite(seconds):
        raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
    return seconds


class Client:
    """HTTP to the server, every call bounded by one deadline and the body by ``max_body`` bytes."""

    def __init__(self, url: str, api_key: str | None, validate_certs: bool, request_timeout: float,
                 max_body: int = MAX_BODY) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.validate_certs = validate_certs
        self.request_timeout = finite_seconds("request_timeout", request_timeout)
        if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 1:
            raise ValueError(f"max_body must be a positive number of bytes, got {max_body!r}")
        self.max_body = max_body
        self._https, self._host, self._port, self._prefix = _split_url(self.url)
        _check_key(api_key)
        self._tls = _tls_context(validate_certs) if self._https else None

    def call(self, method: str, path: str, body: dict | None = None, timeout: float | None = None,
             auth: bool = True, text: bool = False) -> Response:
        """One request, ended by ``min(request_timeout, timeout)`` seconds after
        it started; ``auth=False`` leaves the API key out (a server not yet
        proven to be the watched one); ``text=True`` keeps a 2xx body whole as text
        (Prometheus's format), up to the body cap. A ``timeout`` at or below 0 (the gate's
        deadline passed) still gets ``TIMEOUT_FLOOR``; NaN or inf raise."""
        limit = self.request_timeout if timeout is None else min(self.request_timeout, _finite("timeout", timeout))
        limit = max(TIMEOUT_FLOOR, limit)
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self.api_key and auth:
            headers["Authorization"] = f"Bearer {self.api_key}"
        conn = _Connection(self._host, self._port, limit, self._tls)
        try:
            return self._exchange(conn, method, self._prefix + path, data, headers, text)
        except _Deadline as exc:
            return Response(None, None, f"no complete answer within {limit:g} s ({exc})", "timeout", conn.elapsed())
        except (OSError, http.client.HTTPException, ValueError) as exc:
            return Response(None, None, *_classify_network(exc), latency=conn.elapsed())
        finally:
            conn.shut()

    def stream(self, path: str, body: dict, timeout: float | None = None) -> tuple[Response, list[tuple[float, bytes]]]:
        """POST ``body`` and read the answer as server-sent events (SGLang's ``stream: true``): each
        ``data:`` line's payload with the ``time.monotonic()`` it arrived, up to ``data: [DONE]`` or
        the end. The whole exchange ends by the call's deadline, the lines together by ``max_body``."""
        limit = max(TIMEOUT_FLOOR, self.request_timeout if timeout is None else min(self.request_timeout, _finite("timeout", timeout)))
        headers = {"Accept": "text/event-stream", "User-Agent": USER_AGENT, "Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        conn = _Connection(self._host, self._port, limit, self._tls)
        events: list[tuple[float, bytes]] = []
        try:
            conn.request("POST", self._prefix + path, body=json.dumps(body).encode("utf-8"), headers=headers)
            resp = conn.getresponse()
            if not 200 <= resp.status < 300:
                raw = _read_capped(resp, self.max_body)
                return Response(resp.status, None if raw is None else _json(raw), f"HTTP {resp.status} {resp.reason}".rstrip(),
                                "http", conn.elapsed()), events
            size = 0
            while True:
                line = resp.readline(_CHUNK)
                if not line:
                    break
                size += len(line)
                if size > self.max_body:
                    return Response(resp.status, None, f"answer too large: over the {_size(self.max_body)} cap (cut off there)",
                                    "too_large", conn.elapsed()), events
                if line.startswith(b"data:"):
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        break
                    events.append((time.monotonic(), payload))
            return Response(resp.status, None, None, "ok", conn.elapsed()), events
        except _Deadline as exc:
            return Response(None, None, f"no complete answer within {limit:g} s ({exc})", "timeout", conn.elapsed()), events
        except (OSError, http.client.HTTPException, ValueError) as exc:
            return Response(None, None, *_classify_network(exc), latency=conn.elapsed()), events
        finally:
            conn.shut()

    def _exchange(self, conn: _Connection, method: str, target: str, data: bytes | None, headers: dict,
                  text: bool = False) -> Response:
        conn.request(method, target, body=data, headers=headers)
        resp = conn.getresponse()
        status, reason = resp.status, resp.reason
        kind = "ok" if 200 <= status < 300 else "http"
        error = None if kind == "ok" else f"HTTP {status} {reason}".rstrip()
        if resp.length is not None and resp.length > self.max_body:
            return Response(status, None, f"answer too large: Content-Length {resp.length} bytes, over the {_size(self.max_body)} cap"
                            " (not read)", "too_large", conn.elapsed())
        raw = _read_capped(resp, self.max_body)
        if raw is None:
            return Response(status, None, f"answer too large: over the {_size(self.max_body)} cap (cut off there)", "too_large",
                            conn.elapsed())
        body = raw.decode("utf-8", "replace") if text and kind == "ok" else _json(raw)
        return Response(status, body, error, kind, conn.elapsed())


def _read_capped(resp: http.client.HTTPResponse, cap: int) -> bytes | None:
    """The decoded body (chunked or not), or None once it grows past ``cap``.
    A body shorter than its Content-Length (the server closed early) raises
    IncompleteRead, as http.client does only for a read without a size."""
    expected = resp.length
    buf = bytearray()
    while True:
        chunk = resp.read(min(_CHUNK, cap + 1 - len(buf)))
        if not chunk:
            break
        buf += chunk
        if len(buf) > cap:
            return None
    if expected is not None and len(buf) < expected:
        raise http.client.IncompleteRead(bytes(buf[-16:]), expected - len(buf))
    return bytes(buf)


class _DeadlineReader(io.RawIOBase):
    """The socket's read side for http.client: before each receive the
    timeout is set to the time left, so the status line, headers and body
    all share one deadline. Closing it leaves the socket to its owner."""

    def __init__(self, conn: _Connection) -> None:
        super().__init__()
        self._conn = conn

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        sock = self._conn.raw
        sock.settimeout(self._conn.left())
        try:
            n = sock.recv_into(b)
        except (socket.timeout, TimeoutError):
            raise _Deadline(self._conn.progress()) from None
        self._conn.received += n
        return n


class _DeadlineSocket:
    """What http.client sees as its socket: sends and reads bounded by the
    deadline; ``close`` is left to ``_Connection.shut`` so the response can
    still be read after http.client closes its side of a ``Connection: close``."""

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn

    def sendall(self, data) -> None:
        sock = self._conn.raw
        sock.settimeout(self._conn.left())
        try:
            sock.sendall(data)
        except (socket.timeout, TimeoutError):
            raise _Deadline(self._conn.progress()) from None

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._conn))

    def close(self) -> None:
        """http.client's close: a no-op, the real socket closes in ``_Connection.shut``."""


class _Connection(http.client.HTTPConnection):
    """http.client's connection with its own connect: the addresses tried and
    the TLS handshake share the call's deadline instead of a fresh timeout each."""

    def __init__(self, host: str, port: int, limit: float, tls: ssl.SSLContext | None) -> None:
        super().__init__(host, port)
        if tls is not None:
            self.default_port = 443  # the Host header leaves the default port out, as a browser would
        self.tls, self.started = tls, time.monotonic()
        self.deadline = self.started + limit
        self.raw: socket.socket | None = None
        self.received = 0
        self.stage = "connect"

    def left(self) -> float:
        """Seconds to the deadline; raises _Deadline when there are none."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Deadline(self.progress())
        return left

    def elapsed(self) -> float:
        """Seconds since the call started: the Response's latency."""
        return time.monotonic() - self.started

    def progress(self) -> str:
        """How far the exchange got, for the timeout message."""
        elapsed = self.elapsed()
        if self.stage != "exchange":
            return f"{self.stage} not done in {elapsed:.1f} s"
        if self.received:
            return f"slow or stalled response: {self.received} bytes in {elapsed:.1f} s"
        return f"no byte of an answer in {elapsed:.1f} s"

    def connect(self) -> None:
        raw = self._open()
        if self.tls is not None:
            self.stage = "TLS handshake"
            raw = self.tls.wrap_socket(raw, server_hostname=self.host, do_handshake_on_connect=False)
            self.raw = raw
            raw.settimeout(self.left())
            try:
                raw.do_handshake()  # CPython bounds the whole handshake by the timeout, not each step
            except (socket.timeout, TimeoutError):
                raise _Deadline(self.progress()) from None
        self.stage = "exchange"
        self.sock = _DeadlineSocket(self)

    def _open(self) -> socket.socket:
        """A connected socket to one of the host's addresses; the last error when none takes it."""
        error: OSError | None = None
        for family, kind, proto, _name, address in socket.getaddrinfo(self.host, self.port, 0, socket.SOCK_STREAM):
            sock = socket.socket(family, kind, proto)
            self.raw = sock
            try:
                sock.settimeout(self.left())
                sock.connect(address)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            except (socket.timeout, TimeoutError):
                raise _Deadline(self.progress()) from None
            except OSError as exc:
                sock.close()
                error = exc
        raise error or OSError(f"no address for {self.host}")

    def shut(self) -> None:
        """Close the real socket, whatever http.client did with its stand-in."""
        self.close()
        if self.raw is not None:
            self.raw.close()
            self.raw = None


def port_of(url: str | None) -> int | None:
    """A URL's port, None when it names none or is not one."""
    try:
        return urlsplit(url or "").port
    except ValueError:
        return None


def url_of(argv: list[str] | None, default: str | None = None) -> str | None:
    """The URL a server started with these flags answers on (--host/--port);
    ``default`` when the flags do not say (a service the role did not render)."""
    argv = list(argv or [])

    def flag(name: str) -> str | None:
        for i, arg in enumerate(argv):
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
        return None

    host, port = flag("--host"), flag("--port")
    if host is None and port is None:
        return default
    host = host or "127.0.0.1"
    # A wildcard is probed on the loopback of its own family: a server on "::" is reached on
    # ::1, where its own socket answers; 127.0.0.1's port may be another user's when the
    # server's socket is IPv6-only (bindv6only), and the probes carry the API key.
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port or 30000}"


def _split_url(url: str) -> tuple[bool, str, int, str]:
    """(https, host, port, path prefix) of the server URL, refusing what this
    client would silently ignore (credentials, a query) rather than dropping it."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("url must be http:// or https:// with a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("url must not carry user:password@ (the API key goes in api_key)")
    if parts.query or parts.fragment:
        raise ValueError("url must not have a query or fragment: request paths are appended to it")
    https = parts.scheme == "https"
    return https, parts.hostname, parts.port or (443 if https else 80), parts.path.rstrip("/")


def _check_key(api_key: str | None) -> None:
    """Refuse a key that cannot go in a header here, where the message can leave
    it out: http.client's own refusal would quote the header value, key and all."""
    if not api_key:
        return
    try:
        api_key.encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError("the API key has characters an HTTP header cannot carry (outside Latin-1)") from None
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in api_key):
        raise ValueError("the API key has control characters (a newline?) an HTTP header cannot carry")


def _tls_context(validate_certs: bool) -> ssl.SSLContext:
    """The system's trust store and hostname check, or neither when certificates are not validated."""
    context = ssl.create_default_context()
    if not validate_certs:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _size(n: int) -> str:
    """The cap as the option would be written: whole MiB, else bytes."""
    mib = 1024 * 1024
    return f"{n // mib} MiB" if n % mib == 0 else f"{n} bytes"


def _json(raw: bytes) -> object:
    """Parsed JSON, else the text clipped (an HTML error page must not flood the gate's messages), else None."""
    if not raw:
        return None
    try:
        return json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return printable(raw.decode("utf-8", "replace")[:_TEXT_CLIP])


def _classify_network(reason: BaseException) -> tuple[str, str]:
    """(message, kind) for a failed exchange: ``dropped`` is a connection the
    server ended (reset, broken pipe, closed before or during the answer),
    ``error`` a malformed answer or anything else."""
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused", "refused"
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return f"timed out ({reason})", "timeout"
    if isinstance(reason, http.client.IncompleteRead):
        short = f"{reason.expected} bytes short of" if reason.expected else "in the middle of"
        return f"connection dropped (the server closed {short} the answer)", "dropped"
    if isinstance(reason, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError, http.client.RemoteDisconnected)):
        return f"connection dropped ({type(reason).__name__}: {reason})", "dropped"
    if isinstance(reason, (http.client.HTTPException, ValueError)):
        return f"malformed answer ({type(reason).__name__}: {reason})", "error"
    return f"{type(reason).__name__}: {reason}", "error"
