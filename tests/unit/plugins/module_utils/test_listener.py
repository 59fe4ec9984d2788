"""Who answers on the gate's port: the ownership check before the API key is sent.

Real processes, real sockets, the kernel's own /proc/net/tcp{,6} and /proc/PID/fd: a
listener that is the watched process's child (the server's own), an unrelated listener
(an impostor, or an old server still holding the port), one that starts listening while
the gate waits, IPv6 wildcard sockets, and the cases where ownership cannot be checked.
The listeners are test doubles: plain Python sockets and tests/unit/fake_sglang_http.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sim_helpers import free_port

from ansible_collections.inferops.sglang.plugins.module_utils import _listener
from ansible_collections.inferops.sglang.plugins.module_utils import _readiness as r
from ansible_collections.inferops.sglang.plugins.module_utils._process_watch import NoWatcher, PidWatcher, UnitWatcher

FAKE = Path(__file__).resolve().parents[2] / "fake_sglang_http.py"

# A listener that records every request's line and Authorization header, one JSON per line,
# and answers 200 with an SGLang-like /v1/models body (so an unchecked gate would go on).
RECORDER = r'''
import json, sys, time, socket
from http.server import BaseHTTPRequestHandler, HTTPServer
port, record, bind_after, family = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
time.sleep(bind_after)

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def _answer(self):
        with open(record, "a") as out:
            out.write(json.dumps({"line": self.requestline, "authorization": self.headers.get("Authorization")}) + "\n")
        body = json.dumps({"object": "list", "data": [{"id": "impostor"}]}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = _answer

class Server(HTTPServer):
    address_family = socket.AF_INET6 if family == "v6" else socket.AF_INET
    def server_bind(self):
        if family == "v6":
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

Server(("::" if family == "v6" else "127.0.0.1", port), Handler).serve_forever()
'''

# The watched "server": a parent that runs the real listener as its child and waits.
PARENT = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))"


@pytest.fixture
def procs(tmp_path):
    started: list[subprocess.Popen] = []
    script = tmp_path / "recorder.py"
    script.write_text(RECORDER)

    def recorder_argv(port: int, bind_after: float = 0.0, family: str = "v4") -> list[str]:
        return [sys.executable, str(script), str(port), str(tmp_path / f"requests-{port}.jsonl"), str(bind_after), family]

    def start(argv: list[str], **kw) -> subprocess.Popen:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        started.append(proc)
        return proc

    start.recorder_argv = recorder_argv
    start.requests = lambda port: [json.loads(x) for x in (tmp_path / f"requests-{port}.jsonl").read_text().splitlines()] \
        if (tmp_path / f"requests-{port}.jsonl").exists() else []
    yield start
    for proc in started:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.wait()


def wait_listening(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(entry[1] == port for entry in _listener.read_listeners()):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


def gate(port: int, watcher, api_key: str | None = "s3cret-key", **kw) -> dict:
    kw.setdefault("timeout", 30)
    kw.setdefault("interval", 0.2)
    kw.setdefault("settle", 0.2)
    return r.Gate(r.Client(f"http://127.0.0.1:{port}", api_key, True, 5), watcher, **kw).run()


def child_of(parent: subprocess.Popen, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        below = [p for p in _listener.descendants(parent.pid) if p != parent.pid]
        if below:
            return below[0]
        time.sleep(0.02)
    raise AssertionError("no child")


# -- the kernel's tables --------------------------------------------------------------

def test_listen_sockets_are_read_with_their_inode():
    v4 = socket.socket(socket.AF_INET)
    v6 = socket.socket(socket.AF_INET6)
    try:
        v4.bind(("127.0.0.1", 0))
        v4.listen()
        v6.bind(("::1", 0))
        v6.listen()
        found = _listener.read_listeners()
        port4, port6 = v4.getsockname()[1], v6.getsockname()[1]
        # a socket's inode is what /proc/net/tcp prints and what /proc/PID/fd links to
        assert ("127.0.0.1", port4, os.fstat(v4.fileno()).st_ino, os.getuid()) in found
        assert ("::1", port6, os.fstat(v6.fileno()).st_ino, os.getuid()) in found
    finally:
        v4.close()
        v6.close()


def test_a_proc_net_tcp_table_is_parsed(tmp_path):
    """Rows as the kernel prints them (net/ipv4/tcp_ipv4.c get_tcp4_sock: address words in
    host byte order): 127.0.0.1:8080 LISTEN, an established connection, the IPv6 wildcard
    and ::ffff:127.0.0.1."""
    (tmp_path / "net").mkdir()
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (tmp_path / "net/tcp").write_text(head + (
        "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000   998        0 4242 1 0 100 0 0 10 0\n"
        "   1: 0100007F:1F90 0100007F:D1C2 01 00000000:00000000 00:00000000 00000000   998        0 4343 1 0 20 4 30 10 -1\n"))
    (tmp_path / "net/tcp6").write_text(head + (
        "   0: 00000000000000000000000000000000:7530 00000000000000000000000000000000:0000 0A "
        "00000000:00000000 00:00000000 00000000     0        0 5151 1 0 100 0 0 10 0\n"
        "   1: 0000000000000000FFFF00000100007F:7531 00000000000000000000000000000000:0000 0A "
        "00000000:00000000 00:00000000 00000000     0        0 5252 1 0 100 0 0 10 0\n"))
    if sys.byteorder != "little":
        pytest.skip("the rows above are a little-endian host's")
    found = _listener.read_listeners(str(tmp_path))
    assert found == [("127.0.0.1", 8080, 4242, 998), ("::", 30000, 5151, 0), ("::ffff:127.0.0.1", 30001, 5252, 0)]


def test_unreadable_tables_are_an_error(tmp_path):
    with pytest.raises(OSError):
        _listener.read_listeners(str(tmp_path))


def test_the_address_a_connection_reaches():
    listeners = [("0.0.0.0", 30000, 1, 0), ("127.0.0.1", 30000, 2, 0), ("::", 30001, 3, 0), ("10.1.2.3", 30002, 4, 0)]
    assert [e[2] for e in _listener._accepting(listeners, "127.0.0.1", 30000)] == [2]  # the exact bind wins
    assert [e[2] for e in _listener._accepting(listeners, "10.9.9.9", 30000)] == [1]  # else the wildcard
    assert [e[2] for e in _listener._accepting(listeners, "127.0.0.1", 30001)] == [3]  # a dual-stack :: takes IPv4
    assert _listener._accepting(listeners, "127.0.0.1", 30002) == []
    assert _listener._accepting([("0.0.0.0", 30000, 1, 0)], "::1", 30000) == []  # an IPv4 socket never takes IPv6


# -- the gate with real listeners -----------------------------------------------------

def test_a_child_that_listens_is_the_servers_own(procs):
    """The watched PID is a wrapper; the HTTP server is its child: the gate passes it."""
    port = free_port()
    parent = procs([sys.executable, "-c", PARENT, sys.executable, str(FAKE), str(port), json.dumps({"api_key": "s3cret-key"})])
    child = child_of(parent)
    result = gate(port, PidWatcher(parent.pid))
    assert result["ready"], result["msg"]
    assert result["listener"]["state"] == "owned" and result["listener"]["verified"] is True
    assert result["listener"]["pid"] == child and "fake_sglang_http.py" in result["listener"]["cmdline"]
    assert result["listener"]["address"] == f"127.0.0.1:{port}"


def test_an_unrelated_listener_is_port_taken_and_gets_nothing(procs):
    """The issue's impostor: something else listens on the port while the server (here a
    process that never listens) loads. No request reaches it, so no key either."""
    port = free_port()
    other = procs(procs.recorder_argv(port))
    wait_listening(port)
    server = procs(["sleep", "60"])
    result = gate(port, PidWatcher(server.pid))
    assert (result["phase"], result["failure"]) == ("http", "port_taken"), result["msg"]
    assert result["listener"]["pid"] == other.pid and "recorder.py" in result["listener"]["cmdline"]
    assert result["elapsed"] < 2
    assert procs.requests(port) == []
    assert f"pid {other.pid}" in result["msg"] and f"not by process {server.pid}" in result["msg"]
    assert "s3cret-key" not in json.dumps(result)


def test_a_listener_appearing_while_the_gate_waits_never_gets_the_key(procs):
    """Nothing listens at first (the gate's requests go without the key and are refused);
    then another process binds the port: port_taken, and no request carried the key."""
    port = free_port()
    server = procs(["sleep", "60"])
    other = procs(procs.recorder_argv(port, bind_after=1.0))
    result = gate(port, PidWatcher(server.pid), interval=0.05)
    assert result["failure"] == "port_taken", result["msg"]
    assert result["listener"]["pid"] == other.pid
    assert result["elapsed"] >= 0.9
    assert all(req["authorization"] is None for req in procs.requests(port)), procs.requests(port)


def test_without_the_check_the_impostor_gets_the_key(procs):
    """The control: check_listener=False is the old behaviour, and shows what the check
    prevents (the key in the impostor's hands, verdict not port_taken)."""
    port = free_port()
    procs(procs.recorder_argv(port))
    wait_listening(port)
    server = procs(["sleep", "60"])
    result = gate(port, PidWatcher(server.pid), check_listener=False, timeout=1.5)
    assert result["failure"] != "port_taken"
    assert result["listener"]["state"] == "unverified" and "check_listener is off" in result["listener"]["detail"]
    assert "Bearer s3cret-key" in [req["authorization"] for req in procs.requests(port)]


def test_an_ipv6_wildcard_listener_of_the_server_counts_for_127_0_0_1(procs):
    port = free_port()
    parent = procs([sys.executable, "-c", PARENT, *procs.recorder_argv(port, family="v6")])
    wait_listening(port)
    seen = _listener.find_listener(f"http://127.0.0.1:{port}", PidWatcher(parent.pid))
    assert (seen.state, seen.pid) == ("owned", child_of(parent))
    assert seen.address == f"127.0.0.1:{port}"
    # and localhost, which resolves to ::1 and/or 127.0.0.1, reaches the same socket
    assert _listener.find_listener(f"http://localhost:{port}", PidWatcher(parent.pid)).state == "owned"


def test_nothing_listening_is_absent_and_requests_go_without_the_key(procs):
    port = free_port()
    server = procs(["sleep", "60"])
    seen = _listener.find_listener(f"http://127.0.0.1:{port}", PidWatcher(server.pid))
    assert seen.state == "absent"
    result = gate(port, PidWatcher(server.pid), timeout=1)
    assert (result["failure"], result["last_response"]) == ("not_listening", "connection refused")
    assert result["listener"]["state"] == "absent"


# -- where ownership cannot be established ---------------------------------------------

def test_a_url_on_another_host_is_not_checked():
    seen = _listener.find_listener("http://192.0.2.10:30000", PidWatcher(os.getpid()))  # TEST-NET-1: not this host's
    assert seen.state == "unverified" and "not an address of this host" in seen.detail
    assert seen.describe()["verified"] is False


def test_no_watched_process_keeps_todays_behaviour(procs):
    port = free_port()
    procs([sys.executable, str(FAKE), str(port), json.dumps({"api_key": "s3cret-key"})])
    wait_listening(port)
    result = gate(port, NoWatcher())
    assert result["ready"], result["msg"]
    assert result["listener"]["state"] == "unverified" and "no unit or pid is watched" in result["listener"]["detail"]
    assert any("who listens is not checked" in e["event"] for e in result["timeline"])


def test_unreadable_fd_tables_are_unverified(procs, monkeypatch):
    """A gate that is not root cannot read another user's /proc/PID/fd: it says so and
    goes on as before, rather than calling the server an impostor."""
    port = free_port()
    parent = procs([sys.executable, "-c", PARENT, *procs.recorder_argv(port)])
    wait_listening(port)

    def denied(pid, proc="/proc"):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(_listener, "_socket_inodes", denied)
    seen = _listener.find_listener(f"http://127.0.0.1:{port}", PidWatcher(parent.pid))
    assert seen.state == "unverified" and "needs root" in seen.detail


def test_fd_links_that_do_not_resolve_are_unverified_not_port_taken(procs, monkeypatch):
    """Root without CAP_SYS_PTRACE (a podman container) lists another user's
    /proc/PID/fd but readlink answers EACCES: the server's own socket must not
    then read as someone else's."""
    port = free_port()
    parent = procs([sys.executable, "-c", PARENT, *procs.recorder_argv(port)])
    wait_listening(port)
    real_readlink = os.readlink

    def readlink(path, *args, **kwargs):
        if "/fd/" in str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_readlink(path, *args, **kwargs)

    monkeypatch.setattr(_listener.os, "readlink", readlink)
    seen = _listener.find_listener(f"http://127.0.0.1:{port}", PidWatcher(parent.pid))
    assert seen.state == "unverified" and "needs root" in seen.detail


# -- unit mode: the unit's control group ----------------------------------------------------

def unit_watcher(tmp_path, group: str, members: list[int], main_pid: int) -> UnitWatcher:
    """A UnitWatcher whose cgroup tree and /proc/PID/cgroup files are laid out in tmp_path
    (systemd's own cgroupfs is not on this machine: systemd runs only in lab containers)."""
    root = tmp_path / "cgroup"
    (root / group.lstrip("/")).mkdir(parents=True)
    (root / group.lstrip("/") / "cgroup.procs").write_text("".join(f"{p}\n" for p in members))
    props = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "MainPID": str(main_pid),
             "NRestarts": "0", "ControlGroup": group}

    def run(argv):
        return 0, "".join(f"{k}={v}\n" for k, v in props.items()), ""

    watcher = UnitWatcher("sglang-qwen.service", run)
    watcher.CGROUP_ROOTS = (str(root),)
    watcher.begin()
    return watcher


def test_unit_mode_owns_the_sockets_of_its_cgroup_only(tmp_path, procs):
    port, other_port = free_port(), free_port()
    mine = procs(procs.recorder_argv(port))  # not a child of the main PID, but in the unit's cgroup
    theirs = procs(procs.recorder_argv(other_port))
    wait_listening(port)
    wait_listening(other_port)
    main = procs(["sleep", "60"])
    watcher = unit_watcher(tmp_path, "/system.slice/sglang-qwen.service", [main.pid, mine.pid], main.pid)
    assert sorted(watcher.own_pids()) == sorted([main.pid, mine.pid])
    assert _listener.find_listener(f"http://127.0.0.1:{port}", watcher).state == "owned"
    seen = _listener.find_listener(f"http://127.0.0.1:{other_port}", watcher)
    assert (seen.state, seen.pid) == ("foreign", theirs.pid)


def test_unit_membership_from_proc_pid_cgroup(tmp_path):
    watcher = unit_watcher(tmp_path, "/system.slice/sglang-qwen.service", [], 0)
    proc = tmp_path / "proc"
    for pid, text in {
        101: "0::/system.slice/sglang-qwen.service\n",  # cgroup v2
        102: "12:memory:/system.slice/sglang-qwen.service\n1:name=systemd:/system.slice/sglang-qwen.service/sub\n",  # v1
        103: "0::/system.slice/sglang-qwen-old.service\n",  # a prefix is not membership
        104: "0::/user.slice/user-1000.slice/session-3.scope\n",
    }.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(text)
    watcher.PROC = str(proc)
    assert [pid for pid in (101, 102, 103, 104, 105) if watcher.belongs(pid)] == [101, 102]


def test_secret_flags_are_masked_in_the_listeners_command_line(procs):
    """The verdict names the listening process by its command line, and SGLang takes its
    key as --api-key VALUE: the values of secret flags never reach the result."""
    port = free_port()
    # the fake reads only PORT and SCENARIO; the flags after them are there to be seen in /proc
    parent = procs([sys.executable, "-c", PARENT, sys.executable, str(FAKE), str(port), "{}",
                    "--api-key", "s3cret-key", "--admin-api-key=adm1n", "--tokenizer-path", "/srv/tok"])
    result = gate(port, PidWatcher(parent.pid), api_key=None)
    assert result["ready"], result["msg"]
    line = result["listener"]["cmdline"]
    assert line.endswith("--api-key ******** --admin-api-key=******** --tokenizer-path /srv/tok"), line
    assert "s3cret-key" not in json.dumps(result) and "adm1n" not in json.dumps(result)
