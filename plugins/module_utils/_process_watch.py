# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The readiness gate's watchers: one look at the watched server at a time.

``UnitWatcher`` reads a systemd unit (its state, main PID, restart count and
journal), ``PidWatcher`` a plain process and its log file, ``NoWatcher`` nothing
(HTTP only, no fail-fast). Each says whether the process is still the one the
gate began with, hands the gate the log lines it has not read yet, and names the
processes whose sockets count as the server's (``own_pids``, ``belongs``: used by
``_listener.find_listener``). ``GateFailure`` is the gate's failure, raised here
too when there is nothing to watch.
"""

from __future__ import annotations

import json
import os
import signal
import time

from ansible_collections.inferops.sglang.plugins.module_utils._listener import descendants
from ansible_collections.inferops.sglang.plugins.module_utils._mask import printable

_LOG_WINDOW = 1 << 20
_EXIT_CODES = {"1": "exited", "2": "killed", "3": "dumped"}


class GateFailure(Exception):
    def __init__(self, failure: str, detail: str = "") -> None:
        super().__init__(detail or failure)
        self.failure = failure
        self.detail = detail


def _signal_name(number: str) -> str:
    try:
        return signal.Signals(int(number)).name.replace("SIG", "")
    except (ValueError, TypeError):
        return str(number)


# -- watching the process ---------------------------------------------------

class Observation:
    """One look at the watched process. ``failure`` is set when it is gone."""

    def __init__(self, alive: bool, failure: str | None = None, detail: str = "", pid: int | None = None) -> None:
        self.alive, self.failure, self.detail, self.pid = alive, failure, detail, pid


class NoWatcher:
    """No process given: the gate can only watch HTTP (no fail-fast). Also the
    base of the other watchers: the hooks a watcher without a journal lacks."""

    kind = "none"
    pid = None
    has_log = False
    # How long a dead server's last lines may take to reach the log after its death
    # was seen, when no cause shows yet.
    cause_wait = 0.0

    def begin(self) -> Observation:
        return Observation(True)

    def poll(self) -> Observation:
        return Observation(True)

    def new_lines(self) -> list[str]:
        return []

    def all_lines(self) -> list[str]:
        return []

    def sync(self) -> None:
        return None

    def since_start(self) -> float | None:
        return None

    def detection_delay(self) -> float | None:
        return None

    def own_pids(self) -> list[int] | None:
        """The processes whose sockets count as the server's; None: unknown."""
        return None

    def belongs(self, pid: int) -> bool:
        """Whether a process outside own_pids() is still the server's."""
        return False

    def describe(self) -> dict:
        return {"kind": "none"}


# The most journal entries a first read takes (the newest of the unit's run); later reads follow
# the cursor. As many as the readiness gate keeps (_readiness._KEEP_LINES).
FIRST_READ = 4000


def unit_state(run_command, unit: str) -> dict:
    """Whether a systemd unit is active and loaded (``systemctl show``; both false when it cannot say)."""
    rc, out, _err = run_command(["systemctl", "show", "-p", "ActiveState,LoadState", "--", unit])
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line) if rc == 0 else {}
    return {"active": props.get("ActiveState") == "active", "loaded": props.get("LoadState") == "loaded"}


class UnitWatcher(NoWatcher):
    """A systemd unit: ActiveState/SubState, MainPID, NRestarts, and its journal
    from the start of the current activation, or from ``log_since`` (seconds since
    the epoch) when that is later or the start is unknown: the watchdog reads only
    what a server up for weeks wrote since its probe began. ``clock`` reads the
    monotonic clock systemd's ``*TimestampMonotonic`` properties count on,
    ``wall_clock`` the epoch the journal's timestamps count from."""

    kind = "unit"
    has_log = True
    # journald reads service output from a stream: a crash's last lines can be stored
    # a moment after systemd saw the process die.
    cause_wait = 6.0
    PROPS = (
        "LoadState", "ActiveState", "SubState", "Result", "MainPID", "NRestarts", "InvocationID",
        "ExecMainCode", "ExecMainStatus", "InactiveExitTimestampMonotonic", "ExecMainStartTimestampMonotonic",
        "ExecMainExitTimestampMonotonic", "SyslogIdentifier", "ControlGroup",
    )
    CGROUP_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified")
    PROC = "/proc"

    def __init__(self, unit: str, run_command, log_since: float | None = None, clock=time.monotonic,
                 wall_clock=time.time) -> None:
        self.unit = unit
        self.run_command = run_command
        self.log_since = log_since
        self.clock = clock
        self.wall_clock = wall_clock
        self.props: dict[str, str] = {}
        self.base_pid = 0
        self.base_restarts = 0
        self.start_mono: float | None = None
        self.exit_mono: float | None = None
        self.cursor: str | None = None
        self.journal_error: str | None = None
        self.pid: int | None = None
        self.seen_pids: set[int] = set()

    def _show(self) -> dict[str, str]:
        rc, out, err = self.run_command(["systemctl", "show", "--no-pager", "-p", ",".join(self.PROPS), self.unit])
        if rc != 0:
            raise GateFailure("unit_missing", f"systemctl show {self.unit} failed: {(err or out).strip()}")
        props = {}
        for line in out.splitlines():
            key, sep, value = line.partition("=")
            if sep:
                props[key] = value
        return props

    @staticmethod
    def _mono(value: str | None) -> float | None:
        try:
            number = int(value or 0)
        except ValueError:
            return None
        return number / 1e6 if number > 0 else None

    def begin(self) -> Observation:
        self.props = self._show()
        if self.props.get("LoadState") != "loaded":
            raise GateFailure("unit_missing", f"unit {self.unit} is {self.props.get('LoadState', 'unknown')} (not installed?)")
        self.base_pid = int(self.props.get("MainPID") or 0)
        self.base_restarts = int(self.props.get("NRestarts") or 0)
        self.start_mono = self._run_start()
        return self._judge()

    def _run_start(self) -> float | None:
        """When the current run began: the unit's last exit from inactive, except
        when its main process already died and systemd holds it for an automatic
        restart. Entering auto-restart passes through inactive, so that timestamp
        is the crash itself; the run began when its main process started."""
        left_inactive = self._mono(self.props.get("InactiveExitTimestampMonotonic"))
        main_start = self._mono(self.props.get("ExecMainStartTimestampMonotonic"))
        main_exit = self._mono(self.props.get("ExecMainExitTimestampMonotonic"))
        held = self.props.get("SubState") == "auto-restart"
        if held and left_inactive and main_start and main_exit and main_start <= main_exit <= left_inactive:
            return main_start
        return left_inactive

    def poll(self) -> Observation:
        self.props = self._show()
        return self._judge()

    def _exit_text(self) -> str:
        code = _EXIT_CODES.get(self.props.get("ExecMainCode", ""), "")
        status = self.props.get("ExecMainStatus", "")
        if code in ("killed", "dumped"):
            return f"code={code}, signal={_signal_name(status)}"
        if code:
            return f"code={code}, status={status}"
        return ""

    def _judge(self) -> Observation:
        p = self.props
        active, sub, result = p.get("ActiveState", ""), p.get("SubState", ""), p.get("Result", "")
        pid = int(p.get("MainPID") or 0)
        restarts = int(p.get("NRestarts") or 0)
        self.exit_mono = self._mono(p.get("ExecMainExitTimestampMonotonic"))
        state = f"{active}/{sub}, Result: {result}" + (f", {self._exit_text()}" if self._exit_text() else "")
        if pid and not self.base_pid:
            self.base_pid = pid
        if pid:
            self.pid = pid
            self.seen_pids.add(pid)
        if active == "failed":
            return Observation(False, "unit_failed", state, pid)
        if active == "activating" and sub == "auto-restart":
            return Observation(False, "unit_restarted", f"{state}; systemd is about to restart it", pid)
        if restarts > self.base_restarts or (pid and self.base_pid and pid != self.base_pid):
            return Observation(False, "unit_restarted", f"NRestarts {self.base_restarts} -> {restarts}, MainPID {self.base_pid} -> {pid}", pid)
        if active in ("inactive", "deactivating"):
            failure = "unit_failed" if result not in ("", "success") else "unit_inactive"
            return Observation(False, failure, state, pid)
        return Observation(True, None, state, pid)

    def detection_delay(self) -> float | None:
        """Seconds from the main process's exit (as systemd recorded it) to now."""
        if self.exit_mono is None or (self.start_mono and self.exit_mono < self.start_mono):
            return None
        return max(0.0, self.clock() - self.exit_mono)

    def since_start(self) -> float | None:
        if self.start_mono is None:
            return None
        end = self.exit_mono if self.exit_mono and self.exit_mono >= self.start_mono else self.clock()
        return max(0.0, end - self.start_mono)

    def sync(self) -> None:
        """Have journald store everything written before now (a dead server's
        last lines may still be in its stream buffer). Needs root; best effort."""
        self.run_command(["journalctl", "--sync"])

    def new_lines(self) -> list[str]:
        lines, self.cursor = self._journal(["-u", self.unit], self.cursor)
        return lines

    def all_lines(self) -> list[str]:
        """This start's whole log, read again from the start rather than from
        the last cursor (a crashed server's last stream lines can be stored
        after systemd's own messages about its death), plus the lines carrying
        the unit's SyslogIdentifier that the unit's own processes wrote (a
        message sent to the syslog socket by a process that died at once can
        lose its unit field; its PID is one the gate saw in the unit). Anything
        else logged under that identifier (``logger -t sglang-qwen ...`` by any
        local user) is not the server's and is never read."""
        lines, _cursor = self._journal(["-u", self.unit], None)
        ident = self.props.get("SyslogIdentifier")
        if ident:
            lines += self._journal([f"SYSLOG_IDENTIFIER={ident}"], None, trusted=self._own_entry)[0]
        return lines

    def _own_entry(self, entry: dict) -> bool:
        """Whether a journal entry was written by this unit: journald's own
        trusted fields (those starting with ``_``, which a client cannot set)
        name the unit or one of its processes."""
        if entry.get("_SYSTEMD_UNIT") == self.unit:
            return True
        try:
            return int(entry.get("_PID") or 0) in self.seen_pids
        except ValueError:
            return False

    def _journal(self, match: list[str], cursor: str | None, trusted=None) -> tuple[list[str], str | None]:
        argv = ["journalctl", *match, "-o", "json", "--no-pager", "-q"]
        start_us = None
        if cursor:
            argv.append(f"--after-cursor={cursor}")
        elif self.start_mono is not None or self.log_since is not None:
            # from the run's start, or from log_since when that is later or the start unknown
            starts = [] if self.log_since is None else [self.log_since - 1.0]
            if self.start_mono is not None:
                starts.append(self.wall_clock() - (self.clock() - self.start_mono))
            start_epoch = max(starts)
            start_us = int(start_epoch * 1e6)
            # the newest FIRST_READ entries of that span, newest first (journalctl's -n with --since
            # counts from the span's start: systemd 252), put back in order below. A server up for
            # weeks under load has logged every request since its start (one tune's client load:
            # 81k entries, 105 MB of JSON, a read that outlasted the gate's timeout; 5 MB this way)
            argv.extend([f"--since=@{int(start_epoch) - 1}", "--reverse", "-n", str(FIRST_READ)])
        else:
            argv.extend(["-n", "200"])
        rc, out, err = self.run_command(argv)
        if rc != 0:
            self.journal_error = (err or out).strip()[:300]
            return [], cursor
        lines = []
        raws = out.splitlines()
        for raw in reversed(raws) if "--reverse" in argv else raws:
            try:
                entry = json.loads(raw)
            except ValueError:
                continue
            cursor = entry.get("__CURSOR", cursor)
            if start_us is not None and int(entry.get("__REALTIME_TIMESTAMP", 0)) < start_us - 2000:
                continue
            if trusted is not None and not trusted(entry):
                continue
            message = entry.get("MESSAGE")
            if isinstance(message, list):  # journald stores non-UTF-8 messages as byte arrays
                message = bytes(message).decode("utf-8", "replace")
            if message is None:
                continue
            lines.extend(printable(line) for line in (str(message).splitlines() or [""]))
        return lines, cursor

    def own_pids(self) -> list[int] | None:
        """The processes of the unit's control group (cgroup v2, or v1's
        name=systemd hierarchy), else its main process and descendants."""
        group = self.props.get("ControlGroup") or ""
        if group.startswith("/"):
            for root in self.CGROUP_ROOTS:
                pids = _cgroup_procs(root + group)
                if pids is not None:
                    self.seen_pids.update(pids)
                    return pids
        return descendants(self.pid) if self.pid else []

    def belongs(self, pid: int) -> bool:
        """Whether /proc/PID/cgroup puts the process in the unit's group."""
        group = (self.props.get("ControlGroup") or "").rstrip("/")
        if not group:
            return False
        try:
            with open(f"{self.PROC}/{pid}/cgroup", "r", encoding="utf-8", errors="replace") as handle:
                rows = handle.read().splitlines()
        except OSError:
            return False
        for row in rows:
            path = row.split(":", 2)[-1]
            if path == group or path.startswith(group + "/"):
                return True
        return False

    def describe(self) -> dict:
        p = self.props
        return {
            "kind": "unit",
            "unit": self.unit,
            "active_state": p.get("ActiveState"),
            "sub_state": p.get("SubState"),
            "result": p.get("Result"),
            "main_pid": self.pid,
            "restarts": int(p.get("NRestarts") or 0),
            "invocation_id": p.get("InvocationID"),
            "exit": self._exit_text() or None,
            "journal_error": self.journal_error,
        }


class PidWatcher(NoWatcher):
    """A process by PID (servers not under systemd), with an optional log file."""

    kind = "pid"
    # The server writes its log file itself: once it is gone, its lines are there (a
    # moment more for output that passes through a pipe, e.g. `| tee`). A dead server
    # whose log names no cause (a SIGTERM) gets its verdict within about a poll.
    cause_wait = 0.5

    def __init__(self, pid: int, log_file: str | None = None) -> None:
        self.pid = pid
        self.log_file = log_file
        self.has_log = bool(log_file)
        self.start_ticks: str | None = None
        self.started_mono: float | None = None
        self.offset: int | None = None
        self.state = "unknown"

    def _stat(self) -> list[str] | None:
        try:
            with open(f"/proc/{self.pid}/stat", "r", encoding="utf-8", errors="replace") as handle:
                data = handle.read()
        except OSError:
            return None
        # the command name may hold spaces and parentheses: split after the last ')'
        return data[data.rfind(")") + 2:].split()

    def begin(self) -> Observation:
        fields = self._stat()
        if fields is None:
            raise GateFailure("process_exited", f"process {self.pid} does not exist")
        self.start_ticks = fields[19]
        try:
            hertz = os.sysconf("SC_CLK_TCK")
            self.started_mono = int(self.start_ticks) / hertz
        except (ValueError, OSError):
            self.started_mono = None
        return self.poll()

    def poll(self) -> Observation:
        fields = self._stat()
        if fields is None:
            self.state = "gone"
            return Observation(False, "process_exited", "gone", self.pid)
        if fields[19] != self.start_ticks:
            self.state = "replaced"
            return Observation(False, "process_exited", "its PID now belongs to another process", self.pid)
        if fields[0] in ("Z", "X", "x"):
            self.state = "exited"
            return Observation(False, "process_exited", "zombie, not yet reaped", self.pid)
        self.state = "running"
        return Observation(True, None, f"process {self.pid} state {fields[0]}", self.pid)

    def since_start(self) -> float | None:
        if self.started_mono is None:
            return None
        # /proc/<pid>/stat starttime counts from boot, as CLOCK_BOOTTIME does
        try:
            now = time.clock_gettime(time.CLOCK_BOOTTIME)
        except (AttributeError, OSError):
            return None
        return max(0.0, now - self.started_mono)

    def new_lines(self) -> list[str]:
        if not self.log_file:
            return []
        try:
            with open(self.log_file, "rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if self.offset is None or size < self.offset:
                    self.offset = max(0, size - _LOG_WINDOW)
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        cut = data.rfind(b"\n") + 1  # keep a partial last line for the next read
        self.offset += cut
        return [printable(line) for line in data[:cut].decode("utf-8", "replace").splitlines()]

    def own_pids(self) -> list[int] | None:
        return descendants(self.pid)

    def describe(self) -> dict:
        return {"kind": "pid", "pid": self.pid, "state": self.state, "log_file": self.log_file}


def _cgroup_procs(directory: str) -> list[int] | None:
    """Every PID in a cgroup directory and the groups below it; None when the
    directory is not there."""
    if not os.path.isfile(os.path.join(directory, "cgroup.procs")):
        return None
    pids: list[int] = []
    for path, _dirs, files in os.walk(directory):
        if "cgroup.procs" not in files:
            continue
        try:
            with open(os.path.join(path, "cgroup.procs"), "r", encoding="ascii") as handle:
                pids.extend(int(x) for x in handle.read().split() if x.isdigit())
        except OSError:
            continue
    return pids
