# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Who listens on the gate's port: the LISTEN socket behind a URL and its owner.

``find_listener`` reads the kernel's tables (``/proc/net/tcp{,6}``, each
process's ``/proc/PID/fd``) and judges the socket a connection to the URL reaches
against a watcher's processes (``_process_watch``): ``owned``, ``foreign``,
``absent`` or ``unverified``. Also the process tree (``descendants``) and a
process's masked command line (``cmdline``).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct

from urllib.parse import urlsplit

from ansible_collections.inferops.sglang.plugins.module_utils import _mask

# A server that cannot bind its port does not always die at once: real SGLang
# starts its warmup thread before uvicorn binds (0.5.11
# srt/entrypoints/http_server.py:390-400, the lifespan joins that thread), so
# when another SGLang already holds the port, uvicorn's "[Errno 98] ... address
# already in use" is followed by a warmup that succeeds against the other
# server, "The server is fired up and ready to roll!" (http_server.py:2032) and
# exit status 3 (or -9, when its subprocess watchdog kills the tree first:
# srt/utils/watchdog.py:203-221). HTTP alone cannot tell the two servers apart: before the gate
# sends the API key or passes the http phase, the LISTEN socket that the URL's
# host:port reaches must be held by the watched process (or a descendant) or,
# for a unit, by a process of the unit's cgroup.

_TCP_LISTEN = "0A"


class Listener:
    """One look at who holds the LISTEN socket behind the gate's URL.

    ``state``: ``owned`` (the watched server's), ``foreign`` (another
    process's), ``absent`` (nothing listens there), ``unverified`` (ownership
    cannot be established: ``detail`` says why)."""

    def __init__(self, state: str, detail: str = "", address: str | None = None, pid: int | None = None,
                 cmdline: str | None = None, uid: int | None = None) -> None:
        self.state, self.detail, self.address = state, detail, address
        self.pid, self.cmdline, self.uid = pid, cmdline, uid

    def describe(self) -> dict:
        return {"verified": self.state in ("owned", "foreign", "absent"), "state": self.state,
                "address": self.address, "pid": self.pid, "cmdline": self.cmdline, "uid": self.uid,
                "detail": self.detail or None}


def _url_endpoint(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "", port


def _is_local(ip: str) -> bool:
    """Whether ``ip`` is an address of this host (loopback, wildcard, or one
    the kernel lets this process bind)."""
    addr = ipaddress.ip_address(ip)
    if addr.is_loopback or addr.is_unspecified:
        return True
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((ip, 0))
        return True
    except OSError:
        return False


def _hex_ip(text: str) -> str:
    """An address as /proc/net/tcp{,6} prints it: 32-bit words in host order."""
    raw = b"".join(struct.pack("=I", int(text[i:i + 8], 16)) for i in range(0, len(text), 8))
    return socket.inet_ntop(socket.AF_INET6 if len(raw) == 16 else socket.AF_INET, raw)


def read_listeners(proc: str = "/proc") -> list[tuple[str, int, int, int]]:
    """(ip, port, inode, uid) of every TCP LISTEN socket in this network
    namespace. OSError when neither table can be read."""
    found, readable = [], False
    for name in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/net/{name}", "r", encoding="ascii", errors="replace") as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for row in rows:
            cols = row.split()
            if len(cols) < 10 or cols[3] != _TCP_LISTEN:
                continue
            local, _sep, port = cols[1].partition(":")
            try:
                found.append((_hex_ip(local), int(port, 16), int(cols[9]), int(cols[7])))
            except (ValueError, OSError, struct.error):
                continue
    if not readable:
        raise OSError(f"cannot read {proc}/net/tcp or {proc}/net/tcp6")
    return found


def _accepting(listeners: list[tuple[str, int, int, int]], ip: str, port: int) -> list[tuple[str, int, int, int]]:
    """The listeners a connection to ip:port reaches: the ones bound to that
    address if any (the kernel prefers them), else the wildcard ones. An IPv6
    wildcard socket takes IPv4 connections too unless it is IPv6-only, which
    /proc does not show: it is counted (a possible impostor is still one)."""
    addr = ipaddress.ip_address(ip)
    exact, wild = [], []
    for entry in listeners:
        if entry[1] != port:
            continue
        bound = ipaddress.ip_address(entry[0])
        mapped = bound.ipv4_mapped if bound.version == 6 else None
        if bound == addr or (mapped is not None and mapped == addr):
            exact.append(entry)
        elif bound.is_unspecified and (bound.version == 6 or addr.version == 4):
            wild.append(entry)
    return exact or wild


def _pid_dirs(proc: str = "/proc") -> list[int]:
    try:
        return [int(name) for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return []


def descendants(pid: int, proc: str = "/proc") -> list[int]:
    """``pid`` and every process below it, from each process's parent PID."""
    parents: dict[int, list[int]] = {}
    for child in _pid_dirs(proc):
        try:
            with open(f"{proc}/{child}/stat", "r", encoding="utf-8", errors="replace") as handle:
                data = handle.read()
            ppid = int(data[data.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents.setdefault(ppid, []).append(child)
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        if current in tree:
            continue
        tree.append(current)
        todo.extend(parents.get(current, []))
    return tree


def _socket_inodes(pid: int, proc: str = "/proc") -> set[int]:
    """The socket inodes among a process's open files. PermissionError when
    its fd table cannot be read (another user's process, the gate not root);
    FileNotFoundError when the process is gone."""
    inodes = set()
    base = f"{proc}/{pid}/fd"
    for fd in os.listdir(base):
        try:
            target = os.readlink(f"{base}/{fd}")
        except FileNotFoundError:
            continue  # closed meanwhile
        except PermissionError:
            # The fd table lists but its links do not resolve: root without
            # CAP_SYS_PTRACE (an unprivileged container) reading another user's process
            raise
        except OSError:
            continue
        if target.startswith("socket:["):
            try:
                inodes.add(int(target[8:-1]))
            except ValueError:
                continue
    return inodes


def cmdline(pid: int, proc: str = "/proc") -> str | None:
    """A process's command line (secrets masked: ``_mask.redact_argv``; it goes into the
    verdict, which Ansible prints and records), or None."""
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    argv = raw.decode("utf-8", "replace").split("\0")  # argv, NUL-separated
    text = " ".join(_mask.redact_argv([a for a in argv if a])).strip()
    if not text:
        try:
            with open(f"{proc}/{pid}/comm", "r", encoding="utf-8", errors="replace") as handle:
                text = f"[{handle.read().strip()}]"
        except OSError:
            return None
    return text if len(text) <= 1000 else text[:1000] + " ..."


def _clip(text: str, limit: int = 180) -> str:
    return text if len(text) <= limit else text[:limit].rstrip() + " ..."


def find_listener(url: str, watcher, proc: str = "/proc") -> Listener:
    """Who holds the LISTEN socket that a connection to ``url`` reaches,
    judged against the watcher's processes (``own_pids`` / ``belongs``)."""
    host, port = _url_endpoint(url)
    try:
        infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        return Listener("unverified", f"cannot resolve {host}: {exc}")
    ips = []
    for info in infos:
        ip = info[4][0].split("%", 1)[0]
        if ip not in ips:
            ips.append(ip)
    if not ips or not all(_is_local(ip) for ip in ips):
        return Listener("unverified", f"{host} is not an address of this host: who listens there cannot be checked")
    own = watcher.own_pids()
    if own is None:
        return Listener("unverified", "no unit or pid is watched: who listens cannot be checked")
    try:
        listeners = read_listeners(proc)
    except OSError as exc:
        return Listener("unverified", str(exc))
    for ip in ips:  # in the order a client tries them (socket.create_connection)
        reached = _accepting(listeners, ip, port)
        if not reached:
            continue
        shown = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
        wanted = {entry[2] for entry in reached}
        held: dict[int, int] = {}
        for pid in own:
            try:
                for inode in _socket_inodes(pid, proc) & wanted:
                    held[inode] = pid
            except FileNotFoundError:
                continue
            except OSError as exc:
                return Listener("unverified", f"cannot read the open files of the server's process {pid} ({exc.strerror}): "
                                "the gate needs root to check who listens", shown)
        missing = [entry for entry in reached if entry[2] not in held]
        if not missing:
            pid = held[reached[0][2]]
            return Listener("owned", f"pid {pid} listens on {shown}", shown, pid, cmdline(pid, proc), reached[0][3])
        # someone else's: name it (its fd table may be unreadable for a non-root gate)
        inode, uid = missing[0][2], missing[0][3]
        for pid in _pid_dirs(proc):
            if pid in own:
                continue
            try:
                if inode not in _socket_inodes(pid, proc):
                    continue
            except OSError:
                continue
            if watcher.belongs(pid):
                held[inode] = pid
                break
            line = cmdline(pid, proc)
            return Listener("foreign", f"pid {pid} ({_clip(line or '?', 200)}) listens on {shown}", shown, pid, line, uid)
        else:
            return Listener("foreign", f"a process of uid {uid} that is not the server listens on {shown} "
                            "(its PID is not visible here)", shown, None, None, uid)
        pid = held[reached[0][2]]
        return Listener("owned", f"pid {pid} listens on {shown}", shown, pid, cmdline(pid, proc), reached[0][3])
    return Listener("absent", f"nothing listens on {host}:{port}", f"{host}:{port}")
