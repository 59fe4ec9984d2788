"""_http: the readiness gate's HTTP client against real local servers (raw
sockets in threads, so each test decides byte by byte what the server says and
when): the ordinary answers, one deadline that a slow drip cannot stretch, the
body cap, timeout validation, the headers sent, no redirect, dropped
connections, IPv6 and TLS, and the API key kept out of every message."""

from __future__ import annotations

import json
import math
import resource
import shutil
import socket
import ssl
import subprocess
import threading
import time

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _http as h

KEY = "sk-test-KEY-0123456789"
MIB = 1024 * 1024


class Server:
    """A TCP listener in a thread: each connection's request is read (head,
    then a Content-Length body) and recorded, then ``handler(conn, stop)``
    writes whatever the test wants. ``stop`` is set at teardown so handlers
    that stall end with the test."""

    def __init__(self, handler, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None) -> None:
        self.handler, self.tls = handler, tls
        self.stop = threading.Event()
        self.requests: list[bytes] = []
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.sock.bind((host, 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn = self.sock.accept()[0]
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            self.requests.append(_read_request(conn))
            self.handler(conn, self.stop)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, value = (line.split(b":", 1) + [b""])[:2]
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        rest += conn.recv(65536)
    return head + b"\r\n\r\n" + rest


def headers_of(request: bytes) -> dict[str, str]:
    head = request.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    pairs = (line.split(":", 1) for line in head)
    return {name.strip().lower(): value.strip() for name, value in pairs}


def answer(status: str, body: bytes = b"", extra: str = "") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def send(data: bytes):
    return lambda conn, stop: conn.sendall(data)


def stall(conn, stop) -> None:
    stop.wait(10)


@pytest.fixture
def serve():
    servers: list[Server] = []

    def start(handler, **kw) -> Server:
        servers.append(Server(handler, **kw))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def client(server: Server, api_key: str | None = None, request_timeout: float = 5.0, **kw) -> h.Client:
    return h.Client(f"http://127.0.0.1:{server.port}", api_key, True, request_timeout, **kw)


def timed(c: h.Client, *args, **kw) -> tuple[h.Response, float]:
    started = time.monotonic()
    resp = c.call(*args, **kw)
    return resp, time.monotonic() - started


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# -- ordinary answers -------------------------------------------------------------

def test_ok_json_and_the_headers_sent(serve):
    server = serve(send(answer("200 OK", b'{"data": [{"id": "qwen"}]}', "Content-Type: application/json\r\n")))
    resp = h.Client(f"http://127.0.0.1:{server.port}/prefix/", None, True, 5).call("GET", "/v1/models")
    assert (resp.kind, resp.status, resp.error) == ("ok", 200, None)
    assert resp.body == {"data": [{"id": "qwen"}]}
    assert resp.latency > 0
    request = server.requests[0]
    assert request.startswith(b"GET /prefix/v1/models HTTP/1.1\r\n")
    sent = headers_of(request)
    assert sent["accept"] == "application/json"
    assert sent["user-agent"] == "inferops.sglang-wait_for_sglang"
    assert sent["host"] == f"127.0.0.1:{server.port}"
    assert "authorization" not in sent and "content-type" not in sent


def test_post_sends_json_with_its_content_type(serve):
    server = serve(send(answer("200 OK", b'{"text": "Paris"}')))
    resp = client(server).call("POST", "/generate", {"text": "The capital", "sampling_params": {"max_new_tokens": 4}})
    assert resp.body == {"text": "Paris"}
    head, body = server.requests[0].split(b"\r\n\r\n", 1)
    assert head.startswith(b"POST /generate ")
    assert headers_of(server.requests[0])["content-type"] == "application/json"
    assert json.loads(body) == {"text": "The capital", "sampling_params": {"max_new_tokens": 4}}


def test_401_keeps_status_and_parsed_body(serve):
    server = serve(send(answer("401 Unauthorized", b'{"error": "Invalid API Key"}')))
    resp = client(server, KEY).call("GET", "/v1/models")
    assert (resp.kind, resp.status, resp.body) == ("http", 401, {"error": "Invalid API Key"})
    assert resp.error == "HTTP 401 Unauthorized"
    assert resp.describe() == "HTTP 401"


def test_503_with_empty_body(serve):
    server = serve(send(answer("503 Service Unavailable")))
    resp = client(server).call("GET", "/health")
    assert (resp.kind, resp.status, resp.body, resp.describe()) == ("http", 503, None, "HTTP 503")


def test_text_body_is_clipped_to_500_characters(serve):
    server = serve(send(answer("500 Internal Server Error", b"<html>" + b"x" * 2000)))
    resp = client(server).call("GET", "/health")
    assert resp.status == 500 and isinstance(resp.body, str) and len(resp.body) == 500 and resp.body.startswith("<html>")


def test_a_text_body_reaches_messages_without_terminal_control(serve):
    server = serve(send(answer("500 Internal Server Error", b"\x1b]0;pwned\x07boom\x1b[2J\r\n")))
    resp = client(server).call("GET", "/health")
    assert resp.body == "boom??", repr(resp.body)


def test_refused_port():
    resp = h.Client(f"http://127.0.0.1:{closed_port()}", KEY, True, 5).call("GET", "/health")
    assert (resp.kind, resp.status, resp.error, resp.describe()) == ("refused", None, "connection refused", "connection refused")


def test_malformed_status_line_is_an_error_not_a_drop(serve):
    server = serve(send(b"SSH-2.0-OpenSSH_9.2\r\n\r\n"))
    resp = client(server).call("GET", "/health")
    assert resp.kind == "error" and "malformed answer" in resp.error


def test_no_redirect_is_followed(serve):
    elsewhere = serve(send(answer("200 OK", b"{}")))
    server = serve(send(answer("302 Found", b"", f"Location: http://127.0.0.1:{elsewhere.port}/v1/models\r\n")))
    resp = client(server, KEY).call("GET", "/v1/models")
    assert (resp.kind, resp.status, resp.describe()) == ("http", 302, "HTTP 302")
    time.sleep(0.1)
    assert elsewhere.requests == []


# -- the API key ----------------------------------------------------------------------

@pytest.mark.parametrize("api_key, auth, expected", [
    (KEY, True, f"Bearer {KEY}"),
    (KEY, False, None),
    (None, True, None),
    ("", True, None),
])
def test_authorization_only_with_auth_and_a_key(serve, api_key, auth, expected):
    server = serve(send(answer("200 OK", b"{}")))
    assert client(server, api_key).call("GET", "/v1/models", auth=auth).kind == "ok"
    assert headers_of(server.requests[0]).get("authorization") == expected


@pytest.mark.parametrize("bad_key", [KEY + "\r\nX-Injected: 1", KEY + "\u20ac"])
def test_a_key_no_header_can_carry_is_refused_without_quoting_it(bad_key):
    with pytest.raises(ValueError) as exc:
        h.Client("http://127.0.0.1:30000", bad_key, True, 5)
    assert KEY not in str(exc.value) and "API key" in str(exc.value)


def test_the_key_is_in_no_message(serve):
    handlers = [send(answer("401 Unauthorized", KEY.encode())), send(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{"),
                send(b"garbage\r\n\r\n"), stall, send(answer("200 OK", b"x" * 100))]
    seen = []
    for handler in handlers:
        resp = client(serve(handler), KEY, request_timeout=0.3, max_body=60).call("GET", "/v1/models")
        seen.append(resp.kind)
        assert KEY not in (resp.error or "") and KEY not in resp.describe()
    resp = h.Client(f"http://127.0.0.1:{closed_port()}", KEY, True, 5).call("GET", "/")
    assert seen == ["http", "dropped", "error", "timeout", "too_large"]
    assert KEY not in resp.error


# -- one deadline ---------------------------------------------------------------------

def drip_body(conn, stop) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
    for sent in range(100):
        if stop.wait(0.3):
            return
        conn.sendall(b"x")


def test_a_slow_drip_cannot_stretch_the_deadline(serve):
    resp, elapsed = timed(client(serve(drip_body), request_timeout=1.0), "GET", "/v1/models")
    assert resp.kind == "timeout"
    assert 0.95 <= elapsed < 1.5, elapsed
    assert resp.error.startswith("no complete answer within 1 s (slow or stalled response: ")
    assert resp.error.endswith(" s)") and "bytes in 1.0 s" in resp.error


def test_a_slow_drip_of_the_status_line_is_bounded_too(serve):
    def drip_head(conn, stop):
        for byte in b"HTTP/1.1 200 OK\r\n":
            if stop.wait(0.2):
                return
            conn.sendall(bytes([byte]))

    resp, elapsed = timed(client(serve(drip_head), request_timeout=0.8), "GET", "/health")
    assert resp.kind == "timeout" and 0.75 <= elapsed < 1.3, elapsed


def test_a_server_that_never_answers_times_out_at_the_call_timeout(serve):
    server = serve(stall)
    resp, elapsed = timed(client(server, request_timeout=10), "GET", "/health", timeout=0.5)
    assert resp.kind == "timeout" and 0.45 <= elapsed < 1.0, elapsed
    assert resp.error == f"no complete answer within 0.5 s (no byte of an answer in {resp.latency:.1f} s)"
    assert server.requests[0].startswith(b"GET /health ")


@pytest.mark.parametrize("late", [0, -3.0])
def test_a_call_after_the_deadline_still_gets_the_floor(serve, late):
    resp, elapsed = timed(client(serve(stall)), "GET", "/health", timeout=late)
    assert resp.kind == "timeout" and h.TIMEOUT_FLOOR - 0.02 <= elapsed < 0.5, elapsed
    assert "within 0.1 s" in resp.error


# -- timeouts must be finite and positive ------------------------------------------

@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 0, 0.0, -1, "soon", None, True])
def test_request_timeout_must_be_finite_and_positive(value):
    with pytest.raises(ValueError, match="request_timeout"):
        h.Client("http://127.0.0.1:30000", None, True, value)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "soon"])
def test_call_timeout_must_be_finite(value):
    with pytest.raises(ValueError, match="timeout must be"):
        h.Client(f"http://127.0.0.1:{closed_port()}", None, True, 5).call("GET", "/health", timeout=value)


def test_finite_seconds():
    assert h.finite_seconds("interval", 2) == 2.0 and isinstance(h.finite_seconds("interval", 2), float)
    assert h.finite_seconds("settle", "0.5") == 0.5
    assert h.finite_seconds("settle", 0.0, minimum_exclusive=-1) == 0.0
    for value in (math.nan, math.inf, 0, -0.5):
        with pytest.raises(ValueError, match=r"^interval must be a finite number of seconds"):
            h.finite_seconds("interval", value)
    with pytest.raises(ValueError, match="greater than 1, got 1"):
        h.finite_seconds("timeout", 1, minimum_exclusive=1)


# -- the body cap ---------------------------------------------------------------------

def test_a_huge_content_length_is_refused_before_reading(serve):
    def huge(conn, stop):
        conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {300 * MIB}\r\n\r\n".encode() + b"[" * 65536)
        stop.wait(10)

    resp, elapsed = timed(client(serve(huge)), "GET", "/v1/models")
    assert (resp.kind, resp.status, resp.body) == ("too_large", 200, None)
    assert resp.error == f"answer too large: Content-Length {300 * MIB} bytes, over the 8 MiB cap (not read)"
    assert resp.describe() == resp.error
    assert elapsed < 0.5, elapsed


def chunked(parts: list[bytes]) -> bytes:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
    return head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def test_a_chunked_body_is_decoded(serve):
    resp = client(serve(send(chunked([b'{"status":', b' "ok"}'])))).call("GET", "/health")
    assert (resp.kind, resp.body) == ("ok", {"status": "ok"})


def test_a_chunked_body_growing_past_the_cap_is_cut_off(serve):
    resp = client(serve(send(chunked([b"a" * 300] * 4))), max_body=1000).call("GET", "/v1/models")
    assert (resp.kind, resp.status) == ("too_large", 200)
    assert resp.error == "answer too large: over the 1000 bytes cap (cut off there)"


def test_a_body_exactly_at_the_cap_is_kept(serve):
    resp = client(serve(send(chunked([b"a" * 600, b"b" * 400]))), max_body=1000).call("GET", "/")
    assert (resp.kind, resp.body) == ("ok", "a" * 500)


def test_an_error_status_over_the_cap_keeps_its_status(serve):
    resp = client(serve(send(answer("500 Internal Server Error", b"x" * 2000))), max_body=1000).call("GET", "/")
    assert (resp.kind, resp.status) == ("too_large", 500)


def _vm_hwm_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


@pytest.mark.parametrize("framing", ["close", "chunked"])
def test_300_mib_pushed_keeps_memory_near_the_cap(serve, framing, capsys):
    block = b" " * MIB

    def push(conn, stop):
        if framing == "chunked":
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            frame = b"%x\r\n%s\r\n" % (len(block), block)
        else:
            conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
            frame = block
        for pushed in range(300):
            conn.sendall(frame)

    server = serve(push)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS, so the peak measured is this call's
    before, maxrss_before = _vm_hwm_kib(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    resp, elapsed = timed(client(server), "GET", "/v1/models")
    grew = _vm_hwm_kib() - before
    with capsys.disabled():
        print(f"\n[{framing}] 300 MiB pushed, cap 8 MiB: VmHWM {before} -> {before + grew} KiB (+{grew / 1024:.1f} MiB), "
              f"ru_maxrss {maxrss_before} -> {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} KiB, {elapsed:.2f} s")
    assert (resp.kind, resp.status) == ("too_large", 200)
    assert grew < 3 * 8 * 1024, grew
    assert elapsed < 3


# -- dropped connections --------------------------------------------------------------

def test_a_connection_closed_mid_body_is_dropped(serve):
    resp = client(serve(send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10))).call("GET", "/v1/models")
    assert resp.kind == "dropped" and resp.error == "connection dropped (the server closed 90 bytes short of the answer)"


def test_a_chunked_body_cut_mid_chunk_is_dropped(serve):
    resp = client(serve(send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n64\r\nxxxx"))).call("GET", "/")
    assert resp.kind == "dropped", resp.error


def test_a_reset_mid_body_is_dropped(serve):
    def reset(conn, stop):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nxx")
        time.sleep(0.05)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # close sends RST

    resp = client(serve(reset)).call("GET", "/")
    assert resp.kind == "dropped" and "ConnectionResetError" in resp.error


def test_closed_before_any_answer_is_dropped(serve):
    resp = client(serve(lambda conn, stop: None)).call("GET", "/health")
    assert resp.kind == "dropped" and "RemoteDisconnected" in resp.error


# -- URLs, IPv6, TLS ------------------------------------------------------------------

@pytest.mark.parametrize("url", ["ftp://127.0.0.1:30000", "http://", "http://user:pw@127.0.0.1:30000", "http://127.0.0.1:30000/?a=1",
                                 "http://127.0.0.1:notaport"])
def test_urls_this_client_cannot_honour_are_refused(url):
    with pytest.raises(ValueError) as exc:
        h.Client(url, None, True, 5)
    assert "pw" not in str(exc.value)


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback here")
def test_an_ipv6_literal_url(serve):
    server = serve(send(answer("200 OK", b'{"ok": true}')), host="::1")
    resp = h.Client(f"http://[::1]:{server.port}", None, True, 5).call("GET", "/health")
    assert (resp.kind, resp.body) == ("ok", {"ok": True})
    assert headers_of(server.requests[0])["host"] == f"[::1]:{server.port}"


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.skip("no openssl to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")], check=True, capture_output=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(d / "cert.pem", d / "key.pem")
    return context


def test_https_without_certificate_validation(serve, cert):
    server = serve(send(answer("200 OK", b'{"data": []}')), tls=cert)
    resp = h.Client(f"https://127.0.0.1:{server.port}/", KEY, False, 5).call("GET", "/v1/models")
    assert (resp.kind, resp.body) == ("ok", {"data": []})
    assert headers_of(server.requests[0])["authorization"] == f"Bearer {KEY}"


def test_https_refuses_an_unknown_certificate_when_validating(serve, cert):
    server = serve(send(answer("200 OK", b"{}")), tls=cert)
    resp = h.Client(f"https://127.0.0.1:{server.port}", KEY, True, 5).call("GET", "/v1/models")
    assert resp.kind == "error" and "CERTIFICATE_VERIFY_FAILED" in resp.error
    assert server.requests == []


def test_a_stalled_tls_handshake_ends_at_the_deadline(serve):
    resp, elapsed = timed(h.Client(f"https://127.0.0.1:{serve(stall).port}", None, False, 0.5), "GET", "/health")
    assert resp.kind == "timeout" and 0.45 <= elapsed < 1.0, elapsed
    assert "(TLS handshake not done in 0.5 s)" in resp.error


@pytest.mark.parametrize("url,port", [("http://127.0.0.1:30001", 30001), ("http://h/x", None), ("http://h:99999", None),
                                      ("", None), (None, None)])
def test_port_of_a_url_or_none(url, port):
    assert h.port_of(url) == port
