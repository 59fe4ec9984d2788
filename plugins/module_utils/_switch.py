# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The switch of one host's SGLang service as one state machine, run on the host by the
sglang_switch module (a job that finishes by itself when its controller dies).

``Switch`` walks explicit states, one method per state; each method does its step and
returns an event, and ``TRANSITIONS`` (state, event) -> next state is the one place
where the next step is chosen. From the pre-gate on (the first step of the switch
proper) every transition rewrites the switch marker, ``switch.json`` in the service
directory, with the state entered, so a switch cut short (a killed job, a reboot of the
host) is visible, and the next run, finding the marker at inspect, switches again and
records that it repaired one. The states before the pre-gate change nothing on the host
and write nothing.

Everything the switch does to the host goes through ``Host``, a narrow seam: the unit
(systemctl), the GPUs' memory (nvidia-smi), files, the readiness gate, the drain, the
benchmark, the clocks. ``SystemHost`` is the real one, over the collection's own gate
(_readiness), drain (_drain), benchmark (_bench) and nvidia-smi reader (_gpu); tests
replace it with an in-memory fake and drive every path in-process.

The decisions are _deploy's as they are (switch_reasons, differing, restore_plan,
outcome, record, summary_text), and so is the record: the one _deploy.record() makes
from this object's own fields. Rendering stays in Ansible: the variant's files and the
baseline's are in the run's staging directories before the switch starts; nothing here
templates. The rotation hooks stay on the controller, around the module
(docs/switch-state-machine.md tells the states, the table and what surrounds the job).

Standard library and the collection's module_utils only: no Ansible import.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import posixpath
import shutil
import subprocess
import time

from dataclasses import dataclass, field
from typing import Callable, Protocol

from ansible_collections.inferops.sglang.plugins.module_utils import _bench
from ansible_collections.inferops.sglang.plugins.module_utils import _credentials
from ansible_collections.inferops.sglang.plugins.module_utils import _deploy
from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_metrics
from ansible_collections.inferops.sglang.plugins.module_utils import _drain
from ansible_collections.inferops.sglang.plugins.module_utils import _gateway
from ansible_collections.inferops.sglang.plugins.module_utils import _gpu
from ansible_collections.inferops.sglang.plugins.module_utils import _gpu_health
from ansible_collections.inferops.sglang.plugins.module_utils import _http
from ansible_collections.inferops.sglang.plugins.module_utils import _listener
from ansible_collections.inferops.sglang.plugins.module_utils import _mask
from ansible_collections.inferops.sglang.plugins.module_utils import _process_watch
from ansible_collections.inferops.sglang.plugins.module_utils import _readiness
from ansible_collections.inferops.sglang.plugins.module_utils import _slots
from ansible_collections.inferops.sglang.plugins.module_utils import _state_files


class State(str, enum.Enum):
    """The switch's steps, in the order a successful switch takes them, then the rollback's,
    then the outcomes (terminal)."""

    INSPECT = "inspect"                    # the unit, current.json, the marker, the known-good copy
    SLOT_RECOVER = "slot_recover"          # a blue/green switch cut short: the slot current.json names routed, the other stopped
    DECIDE = "decide"                      # the staged files against the installed ones
    STEADY = "steady"                      # nothing to switch: gate the running service
    GATEWAY_OUT = "gateway_out"            # the running server out of the host's gateway (when it has one)
    GATEWAY_RETURN = "gateway_return"      # a drain that failed: the server back into the gateway, nothing changed
    DRAIN = "drain"                        # wait for the requests in flight (out of rotation already)
    MEASURE = "measure"                    # the known-good's figures under the performance gate's load
    PREGATE = "pregate"                    # prove the running service healthy before saving it
    SAVE = "save"                          # known-good/ (when proven) and attempts/<attempt>/
    STOP = "stop"
    RELEASE = "release"                    # wait for the GPUs' memory
    INSTALL = "install"                    # the staged files into place
    START = "start"
    GATE = "gate"                          # the readiness gate on the variant
    PERF = "perf"                          # the performance gate
    GATEWAY_IN = "gateway_in"              # the variant into the gateway, routed to before the commit
    COMMIT = "commit"                      # current.json, the new service saved as known-good
    ROLLBACK_STOP = "rollback_stop"        # stop the failed variant
    ROLLBACK_RELEASE = "rollback_release"  # wait for the GPUs; a timeout is only a warning here
    RESTORE = "restore"                    # the known-good files back, else the baseline's staged ones
    RESTORE_START = "restore_start"
    RESTORE_GATE = "restore_gate"          # the restored service gated as itself
    RESTORE_GATEWAY = "restore_gateway"    # the restored service back into the gateway
    RECORD = "record"                      # history.jsonl, the marker cleared, attempts pruned
    # blue/green (Settings.slot mode blue_green): the candidate in the free slot, beside the live one
    SLOT_TIDY = "slot_tidy"                # the free slot stopped, disabled, out of the gateway (a cut-short run's)
    SLOT_INSTALL = "slot_install"          # the candidate's files into its slot
    SLOT_START = "slot_start"
    SLOT_GATE = "slot_gate"                # the readiness gate on the candidate, the live slot serving meanwhile
    SLOT_PERF = "slot_perf"                # the live slot, then the candidate, under the same load
    SLOT_ROUTE = "slot_route"              # the candidate into the gateway beside the live slot, until it routes to it
    CUTOVER = "cutover"                    # the live slot out of the gateway: the candidate takes the traffic
    SLOT_DRAIN = "slot_drain"              # the old slot's requests in flight finish
    SOAK = "soak"                          # the old slot kept loaded while the candidate takes real traffic
    SLOT_COMMIT = "slot_commit"            # current.json names the candidate's slot; its files saved as known-good
    RETIRE = "retire"                      # the old slot stopped and disabled, its GPUs waited for
    SLOT_BACK = "slot_back"                # a candidate that failed after the cut-over: the old slot routed again
    SLOT_ABANDON = "slot_abandon"          # the candidate out of the gateway, stopped and disabled
    # terminal
    UNCHANGED = "unchanged"
    SWITCHED = "switched"
    ROLLED_BACK = "rolled_back"
    ROLLBACK_FAILED = "rollback_failed"
    FAILED_BEFORE_SWITCHING = "failed_before_switching"
    REFUSED = "refused"                    # blue/green: the candidate failed before the cut-over; the live slot untouched


TERMINAL = frozenset({State.UNCHANGED, State.SWITCHED, State.ROLLED_BACK, State.ROLLBACK_FAILED,
                      State.FAILED_BEFORE_SWITCHING, State.REFUSED})

# The one transition table.
TRANSITIONS: dict[tuple[State, str], State] = {
    (State.INSPECT, "inspected"): State.DECIDE,
    (State.INSPECT, "cut_short"): State.SLOT_RECOVER,         # the marker of a blue/green switch
    (State.SLOT_RECOVER, "recovered"): State.DECIDE,
    (State.DECIDE, "keep"): State.STEADY,
    (State.DECIDE, "switch"): State.GATEWAY_OUT,
    (State.GATEWAY_OUT, "removed"): State.DRAIN,
    (State.GATEWAY_OUT, "skipped"): State.DRAIN,        # no gateway, or it did not list the server
    (State.GATEWAY_OUT, "failed"): State.FAILED_BEFORE_SWITCHING,  # the gateway down: nothing changed
    (State.GATEWAY_RETURN, "returned"): State.FAILED_BEFORE_SWITCHING,
    (State.GATEWAY_RETURN, "skipped"): State.FAILED_BEFORE_SWITCHING,
    (State.GATEWAY_RETURN, "failed"): State.FAILED_BEFORE_SWITCHING,
    (State.STEADY, "ready"): State.RECORD,
    (State.STEADY, "not_ready"): State.PREGATE,         # installed as asked but not serving: switch again, no drain
    (State.DRAIN, "drained"): State.MEASURE,            # a drain that timed out is drained too: the stop goes ahead
    (State.DRAIN, "skipped"): State.PREGATE,            # nothing serving (inactive, or an interrupted switch)
    (State.DRAIN, "failed"): State.GATEWAY_RETURN,
    (State.MEASURE, "measured"): State.PREGATE,         # figures or not: a failed measurement is recorded, never fatal
    (State.MEASURE, "skipped"): State.PREGATE,
    (State.PREGATE, "ready"): State.SAVE,
    (State.PREGATE, "not_ready"): State.SAVE,           # saved nowhere: the restore falls back
    (State.PREGATE, "skipped"): State.SAVE,
    (State.SAVE, "saved"): State.STOP,
    (State.SAVE, "failed"): State.ROLLBACK_STOP,
    (State.STOP, "stopped"): State.RELEASE,
    (State.STOP, "skipped"): State.RELEASE,             # the unit is not loaded
    (State.STOP, "failed"): State.ROLLBACK_STOP,
    (State.RELEASE, "released"): State.INSTALL,
    (State.RELEASE, "skipped"): State.INSTALL,
    (State.RELEASE, "timed_out"): State.ROLLBACK_STOP,
    (State.RELEASE, "failed"): State.ROLLBACK_STOP,
    (State.INSTALL, "installed"): State.START,
    (State.INSTALL, "failed"): State.ROLLBACK_STOP,
    (State.START, "started"): State.GATE,
    (State.START, "failed"): State.ROLLBACK_STOP,
    (State.GATE, "ready"): State.PERF,
    (State.GATE, "not_ready"): State.ROLLBACK_STOP,
    (State.GATE, "failed"): State.ROLLBACK_STOP,
    (State.PERF, "passed"): State.GATEWAY_IN,
    (State.PERF, "reported"): State.GATEWAY_IN,         # slower, but the mode is report
    (State.PERF, "skipped"): State.GATEWAY_IN,
    (State.PERF, "failed"): State.ROLLBACK_STOP,
    (State.GATEWAY_IN, "routed"): State.COMMIT,
    (State.GATEWAY_IN, "skipped"): State.COMMIT,
    (State.GATEWAY_IN, "failed"): State.ROLLBACK_STOP,  # serves, but the gateway does not route to it
    (State.COMMIT, "committed"): State.RECORD,
    (State.COMMIT, "failed"): State.ROLLBACK_STOP,
    (State.ROLLBACK_STOP, "stopped"): State.ROLLBACK_RELEASE,
    (State.ROLLBACK_RELEASE, "released"): State.RESTORE,
    (State.ROLLBACK_RELEASE, "skipped"): State.RESTORE,
    (State.ROLLBACK_RELEASE, "timed_out"): State.RESTORE,
    (State.RESTORE, "restored"): State.RESTORE_START,
    (State.RESTORE, "failed"): State.RECORD,            # nothing to start: rollback_failed
    (State.RESTORE_START, "started"): State.RESTORE_GATE,
    (State.RESTORE_START, "failed"): State.RESTORE_GATE,  # the gate says what runs
    (State.RESTORE_GATE, "ready"): State.RESTORE_GATEWAY,
    (State.RESTORE_GATEWAY, "routed"): State.RECORD,
    (State.RESTORE_GATEWAY, "skipped"): State.RECORD,
    (State.RESTORE_GATEWAY, "failed"): State.RECORD,    # serves on its port; the record says the gateway does not route
    (State.RESTORE_GATE, "not_ready"): State.RECORD,
    (State.RECORD, "unchanged"): State.UNCHANGED,
    (State.RECORD, "switched"): State.SWITCHED,
    (State.RECORD, "rolled_back"): State.ROLLED_BACK,
    (State.RECORD, "rollback_failed"): State.ROLLBACK_FAILED,
    (State.RECORD, "refused"): State.REFUSED,
    # blue/green
    (State.DECIDE, "beside"): State.SLOT_TIDY,
    (State.DECIDE, "moved"): State.FAILED_BEFORE_SWITCHING,   # the live slot is not the one the preflight decided for
    (State.SLOT_TIDY, "tidy"): State.SLOT_INSTALL,
    (State.SLOT_TIDY, "failed"): State.SLOT_ABANDON,
    (State.SLOT_INSTALL, "installed"): State.SLOT_START,
    (State.SLOT_INSTALL, "failed"): State.SLOT_ABANDON,
    (State.SLOT_START, "started"): State.SLOT_GATE,
    (State.SLOT_START, "failed"): State.SLOT_ABANDON,
    (State.SLOT_GATE, "ready"): State.SLOT_PERF,
    (State.SLOT_GATE, "not_ready"): State.SLOT_ABANDON,
    (State.SLOT_GATE, "failed"): State.SLOT_ABANDON,
    (State.SLOT_PERF, "passed"): State.SLOT_ROUTE,
    (State.SLOT_PERF, "reported"): State.SLOT_ROUTE,
    (State.SLOT_PERF, "skipped"): State.SLOT_ROUTE,
    (State.SLOT_PERF, "failed"): State.SLOT_ABANDON,
    (State.SLOT_ROUTE, "routed"): State.CUTOVER,
    (State.SLOT_ROUTE, "failed"): State.SLOT_ABANDON,
    (State.CUTOVER, "cut"): State.SLOT_DRAIN,
    (State.CUTOVER, "failed"): State.SLOT_ABANDON,            # both still routed: the candidate is taken out again
    (State.SLOT_DRAIN, "drained"): State.SOAK,
    (State.SLOT_DRAIN, "failed"): State.SOAK,                 # recorded; the old slot stays loaded for the soak anyway
    (State.SOAK, "passed"): State.SLOT_COMMIT,
    (State.SOAK, "failed"): State.SLOT_BACK,
    (State.SLOT_COMMIT, "committed"): State.RETIRE,
    (State.SLOT_COMMIT, "failed"): State.SLOT_BACK,
    (State.RETIRE, "retired"): State.RECORD,
    (State.RETIRE, "failed"): State.RECORD,                   # the new slot serves; the record says what was left running
    (State.SLOT_BACK, "back"): State.SLOT_ABANDON,
    (State.SLOT_BACK, "failed"): State.SLOT_ABANDON,          # rollback_failed: nothing routable
    (State.SLOT_ABANDON, "stopped"): State.RECORD,
}

# The first state of the switch proper: from here on every transition rewrites the marker
# (SLOT_TIDY: the blue/green switch's first).
MARKED_FROM = State.PREGATE
MARK_STARTS = frozenset({MARKED_FROM, State.SLOT_TIDY})
# States whose HostError is the switch failing (the YAML block's rescue): the rollback follows.
RESCUED = frozenset({State.SAVE, State.STOP, State.RELEASE, State.INSTALL, State.START, State.GATE, State.PERF,
                     State.GATEWAY_IN, State.COMMIT,
                     State.SLOT_TIDY, State.SLOT_INSTALL, State.SLOT_START, State.SLOT_GATE, State.SLOT_PERF,
                     State.SLOT_COMMIT})
MARKER = "switch.json"
CURRENT = "current.json"
# What current.json holds of the variant (and of the baseline a first deploy's rollback installs)
CURRENT_KEYS = ("variant", "params", "argv", "sglang_version")
HISTORY = "history.jsonl"
DEFAULT_GATE_TIMEOUT = 900.0
# How long the gateway may take to route to a server the gate found ready, or to forget one it was
# asked to remove (smg 1.13.0: about 0.5 s to route, a fixed 5 s settle to forget: _gateway)
DEFAULT_GATEWAY_TIMEOUT = 60.0


class SwitchError(Exception):
    """Settings the switch cannot run with, or a transition the table lacks (a bug)."""


class HostError(Exception):
    """The host failed one operation (systemctl, nvidia-smi, a file); the message says which."""


class Interrupted(Exception):
    """Raised by a Switch made with ``stop_at`` right after it entered that state (and wrote the
    marker): the job killed at that point, for the tests and the fault matrix."""

    def __init__(self, state: State) -> None:
        super().__init__(f"interrupted on entering {state.value}")
        self.state = state


class Host(Protocol):
    """What the switch does to the host, and nothing else."""

    def unit_state(self, unit: str) -> dict: ...            # {"active": bool, "loaded": bool}
    def stop(self, unit: str) -> None: ...
    def start(self, unit: str) -> None: ...                 # daemon-reload, enable, restart
    def disable(self, unit: str) -> None: ...               # not started at boot (a slot that is not live)
    def gpu_memory_used(self, gpus: list[int]) -> list[int]: ...  # MiB per GPU; HostError when unreadable
    # this boot's Xid events on those GPUs (_gpu_health.parse_kernel_log) and where the kernel log stands
    # ({"boot_id", "time": the last event's, "events"}); HostError when the kernel log is unreadable
    def gpu_xids(self, gpus: list[int]) -> dict: ...
    def read_bytes(self, path: str) -> bytes | None: ...    # None: no such file
    def write_atomic(self, path: str, data: bytes, mode: int) -> None: ...
    def append_line(self, path: str, line: str) -> None: ...
    def copy(self, src: str, dest: str, mode: int) -> None: ...  # byte for byte, dest replaced in one step
    def exists(self, path: str) -> bool: ...
    def listdir(self, path: str) -> list[str]: ...          # [] for a missing directory
    def remove(self, path: str) -> None: ...                # a file or a tree; missing is fine
    def makedirs(self, path: str, mode: int) -> None: ...
    # the gate, the drain and the benchmark of the server at ``url`` run by ``unit`` (None: the switch's own unit)
    def gate(self, url: str, api_key_file: str | None, timeout: float, settle: float, unit: str | None = None) -> dict: ...
    def drain(self, url: str, api_key_file: str | None, timeout: float, interval: float, unit: str | None = None) -> dict: ...
    def bench(self, url: str, api_key_file: str | None, load: dict, baseline: dict | None, thresholds: dict,
              unit: str | None = None) -> dict: ...
    # two servers serving now ({url, api_key_file, unit} each), measured in interleaved rounds (_bench.interleaved)
    def bench_pair(self, reference: dict, candidate: dict, load: dict, thresholds: dict) -> dict: ...
    # the host's gateway (Settings.gateway): the server at ``worker`` taken out ({"removed": bool, "seconds"}),
    # or put in and routed to ({"seconds"}); HostError with the gateway's answer
    def gateway_out(self, gateway: dict, worker: str) -> dict: ...
    def gateway_in(self, gateway: dict, worker: str, api_key_file: str | None) -> dict: ...
    # the clients' responses the gateway has counted (its metrics_url): {"answered", "failed"}; HostError when unreadable
    def gateway_responses(self, gateway: dict) -> dict: ...
    def clock(self) -> float: ...                           # monotonic seconds: waits
    def time(self) -> float: ...                            # epoch seconds: stamps
    def sleep(self, seconds: float) -> None: ...
    def progress(self, event: dict) -> None: ...


@dataclass
class Settings:
    """What a switch runs with: the role's settings as the preflight resolved them.

    ``files``: the installed files, the unit first (name, src, mode; ``template`` false for
    the ones not staged, current.json), as vars/main.yml _sglang_service_installed_files.
    ``variant`` and ``baseline``: sglang_variant's results (variant, params, argv,
    sglang_version, memory_plan). ``staging``: this run's staged files of the variant;
    ``baseline_staging``: the baseline's, rendered up front for a first deploy's rollback."""

    service: str
    service_dir: str
    files: list[dict]
    staging: str
    baseline_staging: str
    variant: dict
    baseline: dict
    url: str
    run_id: str
    host: str = "localhost"
    gpus: list[int] = field(default_factory=list)
    check_gpus: bool = True
    check_health: bool = True  # the Xid events the variant's start logs on its GPUs (_gpu_health)
    release_threshold_mib: int = 1024
    release_timeout: float = 120.0
    release_interval: float = 2.0
    gate_settle: float = 5.0
    pregate_timeout: float = 60.0
    drain_timeout: float = 60.0
    drain_interval: float = 1.0
    perf_gate: str = "off"
    perf_load: dict = field(default_factory=dict)
    perf_thresholds: dict = field(default_factory=dict)
    # the running service's figures under this load, when the caller found them; else the
    # history in the service directory is searched (the newest of the same command line)
    perf_known_good: dict | None = None
    keep_attempts: int = 20
    # check mode without staged files: the names whose templates would change the installed ones
    changed_files: list[str] | None = None
    ddtree_manifest: str | None = None
    lock: dict | None = None
    rotation: dict | None = None
    plan_tolerance: float | None = None
    controller_user: str | None = None
    # the host's gateway in front of the server (sglang_service_gateway): url (its client port),
    # control_key_file (root only), workers_file (the live workers, handed to its unit), timeout;
    # or a gateway on another host in front of several (sglang_service_gateway_url): url, control_key
    # (the value), worker_url (where that gateway reaches this server), timeout
    gateway: dict | None = None
    # two slots (sglang_service_slots): the preflight's decision (_slots.decide: mode, slot, unit, port, gpus,
    # live, why) and soak (seconds the old slot stays loaded after the cut-over); ``service``, ``files``,
    # ``url`` and ``gpus`` are then the candidate slot's
    slot: dict | None = None
    soak_interval: float = 5.0

    def problems(self) -> list[str]:
        errors = []
        if not self.files:
            errors.append("files: the unit's files are needed, the unit first")
        errors.extend(file_problems(self.files, "files"))
        if not self.run_id or "/" in self.run_id or self.run_id.startswith("."):
            errors.append(f"run_id must be a plain name, got {self.run_id!r}")
        for name in ("variant", "baseline"):
            value = getattr(self, name)
            if not isinstance(value, dict) or not value.get("variant") or not isinstance(value.get("params"), dict):
                errors.append(f"{name} needs variant and params, got {value!r}")
        if self.perf_gate not in _bench.MODES:
            errors.append(f"perf_gate must be one of {', '.join(_bench.MODES)}, got {self.perf_gate!r}")
        if self.perf_gate != "off":
            # checked before anything changes: a bad load found after the stop would strand the host
            errors += _bench.check_load(self.perf_load, "perf_load") + _bench.check_thresholds(
                dict(self.perf_thresholds, **((self.variant or {}).get("params") or {}).get("perf_thresholds") or {}),
                "perf_thresholds")
        if self.gateway is not None:
            g = self.gateway
            if not isinstance(g, dict) or not str(g.get("url") or "").startswith(("http://", "https://")):
                errors.append(f"gateway needs the gateway's url (http:// or https://), got {g!r}")
            elif g.get("worker_url"):  # a fleet's gateway on another host
                if not str(g["worker_url"]).startswith(("http://", "https://")):
                    errors.append(f"gateway.worker_url must be an http:// or https:// URL, got {g['worker_url']!r}")
                if not g.get("control_key"):
                    errors.append("a gateway on another host needs its control_key")
            else:
                missing = [k for k in ("control_key_file", "workers_file") if not g.get(k)]
                if missing:
                    errors.append(f"gateway needs {' and '.join(missing)}")
                if g.get("url", "").rstrip("/") == (self.url or "").rstrip("/"):
                    errors.append(f"the gateway and the server cannot both answer on {self.url}")
        if self.keep_attempts < 1:
            errors.append(f"keep_attempts must be at least 1, got {self.keep_attempts}")
        errors.extend(self._slot_problems())
        return errors

    def _slot_problems(self) -> list[str]:
        slot = self.slot
        if slot is None:
            return []
        if not isinstance(slot, dict) or slot.get("mode") not in _slots.MODES or slot.get("slot") not in _slots.SLOTS:
            return [f"slot needs mode ({', '.join(_slots.MODES)}) and slot ({', '.join(_slots.SLOTS)}), got {slot!r}"]
        errors = []
        if slot.get("unit") != self.service:
            errors.append(f"the slot's unit {slot.get('unit')!r} is not the service this switch installs, {self.service!r}")
        soak = slot.get("soak", 0)
        if isinstance(soak, bool) or not isinstance(soak, (int, float)) or soak < 0:
            errors.append(f"slot.soak must be seconds (0 or more), got {soak!r}")
        if slot["mode"] == "blue_green":
            live = slot.get("live") or {}
            if not (self.gateway and self.gateway.get("workers_file")):
                errors.append("a blue/green switch needs the host's own gateway")
            if not live.get("unit") or not str(live.get("url") or "").startswith("http"):
                errors.append(f"a blue/green switch needs the live slot's unit and URL, got {live!r}")
            elif live["unit"] == self.service or live.get("url") == self.url:
                errors.append(f"the candidate and the live slot cannot share a unit or a URL ({self.service}, {self.url})")
        return errors


def _sha1(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha1(data).hexdigest()


def file_problems(files: list, option: str) -> list[str]:
    """What is wrong with a list of staged files (name, src, mode each; the name a plain
    file name): one message per file, naming the option it came in."""
    errors = []
    for item in files:
        missing = [k for k in ("name", "src", "mode") if not (isinstance(item, dict) and item.get(k))]
        if missing:
            errors.append(f"each of {option} needs name, src and mode; {item!r} lacks {', '.join(missing)}")
        elif "/" in item["name"] or item["name"].startswith("."):
            errors.append(f"each of {option} needs a plain file name; {item['name']!r} is not one")
    return errors


def file_mode(value: str | int) -> int:
    """A mode given as octal text ("0600") or as a number (YAML's unquoted 0600)."""
    return value if isinstance(value, int) else int(str(value), 8)


def _stamp(epoch: float, fmt: str = "%Y-%m-%dT%H:%M:%SZ") -> str:
    return time.strftime(fmt, time.gmtime(epoch))


class Switch:
    """One switch of one host's service. ``run()`` takes it from inspect to an outcome;
    ``plan()`` (check mode) inspects and decides only and says what a run would do."""

    def __init__(self, settings: Settings, host: Host, stop_at: State | None = None) -> None:
        errors = settings.problems()
        if errors:
            raise SwitchError("; ".join(errors))
        if stop_at is not None and (stop_at in TERMINAL or not isinstance(stop_at, State)):
            raise SwitchError(f"stop_at must be a state the switch passes through, got {stop_at!r}")
        self.s, self.host, self.stop_at = settings, host, stop_at
        self.state: State | None = None
        self.marked = False
        self.trail: list[tuple[str, str, str]] = []
        self.before: dict = {}
        self.reasons: list[str] = []
        self.steady: dict | None = None
        self.drain_result: dict | None = None
        self.drain_error: str | None = None
        self.perf_known: dict | None = None
        self.perf_result: dict | None = None
        self.perf_failure: dict | None = None
        self.pregate: dict | None = None
        self.attempt: str | None = None
        self.started: str | None = None
        self.gate_result: dict | None = None
        self.xid_mark: dict | None = None  # the kernel log's Xid events before the variant started
        self.failure: dict | None = None
        self.failed_task: str | None = None
        self.committed = False
        self.release_warning: str | None = None
        self.rollback_stop_error: str | None = None
        self.restore: dict | None = None
        self.restore_error: str | None = None
        self.restart_error: str | None = None
        self.rollback_gate: dict | None = None
        self.ddtree_build: dict = {}
        self.gateway_log: dict | None = None
        self.unavailable_from: float | None = None
        self.gateway_warning: str | None = None
        # blue/green: what the slots went through (the record's ``slot``)
        self.decision: str | None = None
        self.slot_log: dict | None = None
        self.candidate_routed = False
        self.cut_over = False
        self.back_ok: bool | None = None
        self.recovered: dict | None = None
        self.responses_before: dict | None = None
        self.fields: dict | None = None
        self.record: dict | None = None
        self.summary: str | None = None
        self.outcome: str | None = None

    # -- paths and small facts -------------------------------------------------------------------------------

    def _path(self, *parts: str) -> str:
        return posixpath.join(self.s.service_dir, *parts)

    def _staged(self) -> list[dict]:
        """The files this run renders (all but current.json, unless ``template`` says otherwise)."""
        return [f for f in self.s.files if f.get("template", f["name"] != CURRENT)]

    def _config_file(self) -> str | None:
        """The installed --config file (holds the API key), when there is one."""
        found = [f["src"] for f in self.s.files if f["src"].endswith((".yaml", ".yml")) and self.host.exists(f["src"])]
        return found[0] if found else None

    def _json(self, path: str) -> dict | None:
        return _read_json(self.host, path)

    def _serving(self) -> bool:
        """A service runs that this switch replaces (drained, measured, pre-gated)."""
        return bool(self.before.get("active")) and not self.before.get("interrupted")

    def _gpu_check(self) -> bool:
        return bool(self.s.check_gpus and self.s.gpus)

    def _gate_timeout(self, variant: dict) -> float:
        return float((variant.get("params") or {}).get("gate_timeout") or DEFAULT_GATE_TIMEOUT)

    def _why_report(self) -> str | None:
        if self.s.perf_gate == "enforce" and self.s.variant["variant"] == self.s.baseline["variant"]:
            return f"the baseline variant {self.s.baseline['variant']} is the reference"
        return None

    def perf_mode(self) -> str:
        return "report" if self._why_report() else self.s.perf_gate

    def _perf_load(self) -> dict:
        params = self.s.variant["params"]
        try:
            return _bench.plan_load(params.get("max_running_requests"), params.get("context_length"), self.s.perf_load)
        except _bench.BenchError as exc:
            raise SwitchError(f"perf_load: {exc}") from None

    def _thresholds(self) -> dict:
        return dict(self.s.perf_thresholds, **(self.s.variant["params"].get("perf_thresholds") or {}))

    def _current(self, variant: dict) -> bytes:
        """current.json for a variant, as the role renders it (with two slots, the live slot and its unit)."""
        doc = {k: variant.get(k) for k in CURRENT_KEYS}
        doc["gpu_devices"] = list(self.s.gpus)
        if self.s.slot:
            doc.update(slot=self.s.slot["slot"], unit=self.s.service)
        return json.dumps(doc, indent=4, sort_keys=True).encode("utf-8")

    def _history(self) -> list[dict]:
        return _state_files.parse_jsonl((self.host.read_bytes(self._path(HISTORY)) or b"").decode("utf-8", "replace"))

    def _find_known_figures(self) -> None:
        """The running service's figures under this run's load: the caller's, else the history's."""
        if self.s.perf_gate == "off" or self.perf_known is not None:
            return
        if self.s.perf_known_good is not None:
            self.perf_known = dict(self.s.perf_known_good)
        elif self._serving():
            self.perf_known = _bench.known_good(self._history(), self.before, self._perf_load())

    def _gate(self, url: str, api_key_file: str | None, timeout: float, settle: float, unit: str | None = None) -> dict:
        """The gate's result; a gate that could not run is not ready, its msg says why."""
        try:
            result = dict(self.host.gate(url, api_key_file, timeout, settle, unit=unit))
        except HostError as exc:
            return {"ready": False, "failure": None, "cause": None, "msg": f"the gate did not run: {exc}"}
        result["ready"] = bool(result.get("ready"))
        return result

    def _wait_release(self, devices: list[int] | None = None) -> tuple[bool, str]:
        """Poll the GPUs' memory (the switch's, or ``devices``) until every GPU holds less than the
        threshold, or the timeout."""
        s = self.s
        devices = list(s.gpus if devices is None else devices)
        deadline = self.host.clock() + s.release_timeout
        gpus = ",".join(str(g) for g in devices)
        while True:
            try:
                used, error = self.host.gpu_memory_used(devices), None
            except HostError as exc:
                used, error = None, str(exc)
            if used and max(used) < s.release_threshold_mib:
                return True, f"GPUs {gpus} hold {max(used)} MiB at most"
            now = self.host.clock()
            if now >= deadline:
                held = f"still held {max(used)} MiB" if used else f"could not be read ({error or 'no GPU listed'})"
                return False, (f"GPUs {gpus} {held} {s.release_timeout:g} s after the service stopped "
                               f"(threshold {s.release_threshold_mib} MiB)")
            self.host.sleep(min(s.release_interval, deadline - now))

    def _copy_files(self, names_from: str, files: list[dict]) -> None:
        for item in files:
            self.host.copy(posixpath.join(names_from, item["name"]), item["src"], file_mode(item["mode"]))

    def _marker(self) -> bytes:
        doc = {"variant": self.s.variant["variant"], "from": self.before.get("variant"), "run_id": self.s.run_id,
               "lock": (self.s.lock or {}).get("holder"), "started": self.started, "attempt": self.attempt,
               "state": self.state.value, "updated": _stamp(self.host.time())}
        if self.s.slot:
            doc.update(mode=self.s.slot["mode"], slot=self.s.slot["slot"], unit=self.s.service, url=self.s.url,
                       gpus=list(self.s.gpus))
            if self._beside():
                live = self.s.slot["live"]
                doc.update(live_unit=live["unit"], live_url=live["url"], live_gpus=list(live.get("gpus") or []))
        return json.dumps(doc, indent=4).encode("utf-8")

    # -- the one place where transitions are made ------------------------------------------------------------

    def _enter(self, state: State, event: str | None = None) -> None:
        previous, self.state = self.state, state
        if previous is not None:
            self.trail.append((previous.value, event, state.value))
        if state in MARK_STARTS and not self.marked:
            self.marked = True
            now = self.host.time()
            self.started = _stamp(now)
            self.attempt = f"{_stamp(now, '%Y%m%dT%H%M%SZ')}-{self.s.variant['variant']}"
        if self.marked and state not in TERMINAL:
            # 0600: the marker names the run and its lock holder
            self.host.write_atomic(self._path(MARKER), self._marker(), 0o600)
        self.host.progress({"state": state.value, "from": previous.value if previous else None, "event": event,
                            "time": _stamp(self.host.time())})
        if state == self.stop_at:
            raise Interrupted(state)

    def run(self) -> dict:
        """From inspect to an outcome; returns the result (outcome, record, summary, ...)."""
        if self.state is not None:
            raise SwitchError("a Switch runs once")
        self._enter(State.INSPECT)
        while self.state not in TERMINAL:
            state = self.state
            try:
                event = getattr(self, f"step_{state.value}")()
            except HostError as exc:
                if state not in RESCUED:
                    raise
                self.failure = {"ready": False, "msg": str(exc)}
                self.failed_task = state.value
                event = "failed"
            following = TRANSITIONS.get((state, event))
            if following is None:
                raise SwitchError(f"no transition from {state.value} on {event!r}")
            self._enter(following, event)
        return self.result()

    def result(self) -> dict:
        outcome = self.state.value
        if self.state == State.FAILED_BEFORE_SWITCHING:
            msg = (f"{self.s.host}: {self.drain_error}; nothing was changed, "
                   f"{self.before.get('variant') or 'the service'} still runs")
        else:
            msg = self.summary or ""
        repaired = (bool(((self.gateway_log or {}).get("in") or {}).get("added")) or self.recovered is not None) \
            and self.state == State.UNCHANGED
        return {"outcome": outcome,
                "changed": repaired or self.state not in (State.UNCHANGED, State.FAILED_BEFORE_SWITCHING),
                "failed": self.state not in (State.SWITCHED, State.UNCHANGED), "record": self.record,
                "summary": self.summary, "msg": msg, "before": self.before, "reasons": self.reasons,
                "trail": list(self.trail), "attempt": self.attempt,
                "gateway": self.gateway_log,
                "warnings": [w for w in (self.release_warning, self.rollback_stop_error, self.gateway_warning) if w]}

    # -- check mode ------------------------------------------------------------------------------------------

    def plan(self) -> dict:
        """Inspect and decide, and say what a run would do; changes nothing on the host."""
        self.step_inspect()
        switch = self.step_decide() in ("switch", "beside")
        # the states a run would act in (one that would skip its step is left out), then the outcome
        would, state, steady = [], State.INSPECT, False
        while state not in TERMINAL:
            steady = steady or state == State.STEADY
            event = self._predict(state, steady)
            if event != "skipped" and state != State.INSPECT:
                would.append(state.value)
            state = TRANSITIONS[(state, event)]
        would.append(state.value)
        v, before = self.s.variant, self.before
        if self.decision == "moved":
            msg = f"would change nothing: {self.drain_error}"
        elif switch:
            msg = (f"would switch {self.s.service} from {before.get('variant') or 'an unmanaged or absent service'} "
                   f"to {v['variant']} ({' '.join(v.get('argv') or [])}): {'; '.join(self.reasons)}")
        else:
            msg = f"would keep {self.s.service} on {v['variant']} ({' '.join(v.get('argv') or [])})"
        return {"changed": switch, "switch": switch, "reasons": self.reasons, "before": before, "would": would,
                "msg": msg}

    def _predict(self, state: State, steady: bool) -> str:
        """The event a state would give when every step succeeds (plan())."""
        perf_on = self.s.perf_gate != "off"
        return {
            State.INSPECT: ("cut_short" if self.before.get("interrupted") and self.s.gateway
                            and (self.before.get("marker") or {}).get("mode") == "blue_green" else "inspected"),
            State.SLOT_RECOVER: "recovered",
            State.DECIDE: self.decision if self.decision in ("beside", "moved") else "switch" if self.reasons else "keep",
            State.SLOT_TIDY: "tidy",
            State.SLOT_INSTALL: "installed",
            State.SLOT_START: "started",
            State.SLOT_GATE: "ready",
            State.SLOT_PERF: "passed" if perf_on else "skipped",
            State.SLOT_ROUTE: "routed",
            State.CUTOVER: "cut",
            State.SLOT_DRAIN: "drained",
            State.SOAK: "passed",
            State.SLOT_COMMIT: "committed",
            State.RETIRE: "retired",
            State.STEADY: "ready",
            State.GATEWAY_OUT: "removed" if self.s.gateway and self._serving() else "skipped",
            State.DRAIN: "drained" if self._serving() else "skipped",
            State.MEASURE: "measured" if perf_on and self.perf_known is None else "skipped",
            State.PREGATE: "ready" if self._serving() else "skipped",
            State.SAVE: "saved",
            State.STOP: "stopped" if self.before.get("loaded") else "skipped",
            State.RELEASE: "released" if self._gpu_check() else "skipped",
            State.INSTALL: "installed",
            State.START: "started",
            State.GATE: "ready",
            State.PERF: "passed" if perf_on else "skipped",
            State.GATEWAY_IN: "routed" if self.s.gateway else "skipped",
            State.COMMIT: "committed",
            State.RECORD: "unchanged" if steady else "switched",
        }[state]

    # -- the states: one method each, returning the event ----------------------------------------------------

    def step_inspect(self) -> str:
        """The service as it is (``inspect``)."""
        s = self.s
        # the service's own unit (blue's), which a current.json without one names: not the candidate's slot
        self.before = inspect(self.host, (s.slot or {}).get("service") or s.service, s.service_dir, s.files)
        ddtree = self._json(s.ddtree_manifest) if s.ddtree_manifest else None
        self.ddtree_build = ddtree or {}
        marker = self.before.get("marker") or {}
        if self.before.get("interrupted") and marker.get("mode") == "blue_green" and s.gateway:
            return "cut_short"
        return "inspected"

    def step_slot_recover(self) -> str:
        """A blue/green switch cut short (a killed job, a reboot) left two slots that may both run and be
        routed: the one current.json names (committed or not, it is the live one) is put back into the
        gateway, the other taken out, stopped and not started at boot; then the marker is cleared and
        this run decides as on a host nobody interrupted."""
        marker, before = self.before["marker"], self.before
        live_unit = before.get("unit")
        if marker.get("unit") == live_unit:   # cut short after the commit: the old slot is the one left over
            other_unit, other_url = marker.get("live_unit"), marker.get("live_url")
        else:
            other_unit, other_url = marker.get("unit"), marker.get("url")
        done = []
        if before.get("active") and before.get("url"):
            self._gateway_in(before["url"], before.get("api_key_file"))
            done.append(f"{live_unit} routed")
        if other_url and other_url != before.get("url"):
            if dict(self.host.gateway_out(self.s.gateway, self._worker_of(other_url))).get("removed"):
                done.append(f"{other_unit} taken out of the gateway")
        if other_unit and other_unit != live_unit:
            state = self.host.unit_state(other_unit)
            if state.get("active"):
                self.host.stop(other_unit)
                done.append(f"{other_unit} stopped")
            if state.get("loaded"):
                self.host.disable(other_unit)
        self.host.remove(self._path(MARKER))
        self.recovered = {"state": marker.get("state"), "run_id": marker.get("run_id"), "done": done}
        self.before = dict(before, interrupted=False, marker=None)
        return "recovered"

    def step_decide(self) -> str:
        self.decision = self._decide()
        if self.decision in ("switch", "beside"):
            self.responses_before = self._responses()
        return self.decision

    def _responses(self) -> dict | None:
        """The clients' responses the host's gateway has counted so far (None: no gateway metrics, or unread)."""
        g = self.s.gateway or {}
        if not g.get("metrics_url"):
            return None
        try:
            return dict(self.host.gateway_responses(g))
        except HostError as exc:
            self.gateway_warning = self.gateway_warning or f"the gateway's metrics were not read: {exc}"
            return None

    def _count_responses(self) -> None:
        """What the clients' requests through the gateway came to while this run switched."""
        before, after = self.responses_before, self._responses() if self.responses_before else None
        if before and after:
            # a candidate refused before the gateway heard of it: its clients are counted too
            self.gateway_log = self.gateway_log or {"url": self.s.gateway["url"], "worker": self._worker_of(self.s.url)}
            # a gateway restarted meanwhile starts its counters again: then what it counted since
            restarted = after["answered"] < before["answered"]
            self.gateway_log["requests"] = {k: after[k] - (0 if restarted else before[k]) for k in ("answered", "failed")}

    def _decide(self) -> str:
        if self.s.slot:
            self.slot_log = {k: self.s.slot.get(k) for k in ("mode", "slot", "unit", "gpus", "why")}
            self.slot_log["live"] = {k: (self.s.slot.get("live") or {}).get(k) for k in ("slot", "unit", "variant")}
        if self._beside():
            moved = self._slot_moved()
            if moved:
                self.drain_error = moved
                return "moved"
            live = self.s.slot["live"]
            self.reasons = [f"{self.s.variant['variant']} starts in slot {self.s.slot['slot']} beside "
                            f"{live['variant']} (slot {live['slot']}): {self.s.slot.get('why')}"]
            return "beside"
        staged = self._staged()
        names = [f["name"] for f in staged]
        if self.s.changed_files is not None:
            differ = [n for n in names if n in self.s.changed_files]
        else:
            differ = _deploy.differing(
                names, [_sha1(self.host.read_bytes(posixpath.join(self.s.staging, n))) for n in names],
                [_sha1(self.host.read_bytes(f["src"])) for f in staged])
        self.reasons = _deploy.switch_reasons(differ, self.before["active"], self.before["interrupted"])
        if self.reasons:
            self._find_known_figures()
            return "switch"
        return "keep"

    def step_steady(self) -> str:
        self.steady = self._gate(self.s.url, self._config_file(), self._gate_timeout(self.s.variant), 0,
                                 unit=self.s.service)
        if self.steady["ready"]:
            if self.s.gateway:
                # a gateway restarted without its workers file, or one a hand took the server out of
                try:
                    self._gateway_in(self.s.url, self._config_file())
                except HostError as exc:
                    self.gateway_warning = (f"{self.s.variant['variant']} serves on {self.s.url}, but the gateway at "
                                            f"{self.s.gateway['url']} does not route to it: {exc}")
            return "ready"
        self._find_known_figures()
        return "not_ready"

    # -- the gateway ----------------------------------------------------------------------------------------

    def _worker_of(self, url: str) -> str:
        """The server at ``url`` as the gateway reaches it: itself on this host, else the fleet gateway's worker_url."""
        return _gateway.worker_url(self.s.gateway.get("worker_url") or url)

    def _gateway_in(self, url: str, api_key_file: str | None) -> dict:
        """The server at ``url`` into the gateway and routed to; the live workers file rewritten (the
        host's own gateway). HostError when the gateway does not route to it in time."""
        g, worker = self.s.gateway, self._worker_of(url)
        self.gateway_log = self.gateway_log or {"url": g["url"], "worker": worker}
        answer = dict(self.host.gateway_in(g, worker, api_key_file))
        self.gateway_log["in"] = answer
        if self.unavailable_from is not None:
            self.gateway_log["unavailable_s"] = round(self.host.clock() - self.unavailable_from, 2)
            self.unavailable_from = None
        workers = json.dumps({"workers": [worker]}, indent=4).encode("utf-8")
        if g.get("workers_file") and self.host.read_bytes(g["workers_file"]) != workers:
            self.host.write_atomic(g["workers_file"], workers, 0o600)
        return answer

    def step_gateway_out(self) -> str:
        """The running server out of the gateway before its drain: new requests stop reaching it."""
        g = self.s.gateway
        if not g or not self._serving():
            return "skipped"
        worker = self._worker_of(self.before.get("url") or self.s.url)
        self.gateway_log = {"url": g["url"], "worker": worker}
        if not g.get("worker_url") and _http.port_of(worker) == _http.port_of(g["url"]):
            # the first switch behind a gateway: the running server holds the gateway's port until it stops
            # (the gateway's unit binds it then), so clients lose it from the stop, as without a gateway
            self.gateway_log["out"] = {"removed": False, "migrating": True}
            self.unavailable_from = self.host.clock()
            return "skipped"
        started = self.host.clock()
        try:
            out = dict(self.host.gateway_out(g, worker))
        except HostError as exc:
            self.drain_error = f"the gateway at {g['url']} could not take {worker} out: {exc}"
            return "failed"
        self.gateway_log["out"] = out
        if not out.get("removed"):
            return "skipped"
        # from here the gateway has no server to route to until the variant (or the rollback) is in
        self.unavailable_from = started
        return "removed"

    def step_gateway_return(self) -> str:
        """A drain that failed leaves the host as it was: the server back into the gateway."""
        if not ((self.gateway_log or {}).get("out") or {}).get("removed"):
            return "skipped"
        try:
            self._gateway_in(self.before.get("url") or self.s.url, self.before.get("api_key_file"))
        except HostError as exc:
            self.drain_error = f"{self.drain_error}; AND the gateway does not route to it again: {exc}"
            return "failed"
        return "returned"

    def step_gateway_in(self) -> str:
        """The variant into the gateway; committed only once the gateway itself routes to it."""
        if not self.s.gateway:
            return "skipped"
        try:
            self._gateway_in(self.s.url, self._config_file())
        except HostError as exc:
            v = self.s.variant
            self.failure = {"ready": False, "phase": "gateway", "failure": "not_routed", "cause": "gateway",
                            "server": (self.gate_result or {}).get("server"),
                            "msg": (f"{v['variant']} serves on {self.s.url} but the gateway at {self.s.gateway['url']} "
                                    f"does not route to it: {exc}")}
            self.failed_task = State.GATEWAY_IN.value
            return "failed"
        return "routed"

    def step_restore_gateway(self) -> str:
        if not self.s.gateway:
            return "skipped"
        try:
            self._gateway_in(self.restore["url"], self.restore.get("api_key_file"))
        except HostError as exc:
            self.gateway_warning = (f"{self.restore['variant']} serves again on {self.restore['url']}, but the gateway "
                                    f"at {self.s.gateway['url']} does not route to it: {exc}")
            (self.gateway_log or {}).update(error=self.gateway_warning)
            return "failed"
        return "routed"

    def step_drain(self) -> str:
        if not self._serving():
            return "skipped"
        try:
            self.drain_result = self.host.drain(self.before.get("url") or self.s.url, self.before.get("api_key_file"),
                                                self.s.drain_timeout, self.s.drain_interval, unit=self.before.get("unit"))
        except HostError as exc:
            self.drain_error = str(exc)
            return "failed"
        return "drained"

    def step_measure(self) -> str:
        if self.s.perf_gate == "off" or self.perf_known is not None:
            return "skipped"
        self._measure(self.before.get("url") or self.s.url, self.before.get("api_key_file"), self.before.get("unit"))
        return "measured"

    def _measure(self, url: str, api_key_file: str | None, unit: str | None) -> None:
        """The running service's figures under this run's load (perf_known); a failed measurement is kept."""
        before = self.before
        try:
            result = self.host.bench(url, api_key_file, self._perf_load(), None, {}, unit=unit)
        except HostError as exc:
            result = {"msg": str(exc)}
        figures = result.get("figures")
        self.perf_known = {
            "variant": before.get("variant"), "source": "measured", "time": _stamp(self.host.time()),
            "figures": figures, "load": result.get("load"), "seconds": result.get("seconds"),
            "error": None if figures else (result.get("msg") or "not measured"),
            "argv": before.get("argv"), "sglang_version": before.get("sglang_version"),
            "gpu_devices": before.get("gpu_devices"),
        }

    def step_pregate(self) -> str:
        if not self._serving():
            return "skipped"
        self.pregate = self._gate(self.before.get("url") or self.s.url, self.before.get("api_key_file"),
                                  self.s.pregate_timeout, 0, unit=self.before.get("unit") or self.s.service)
        return "ready" if self.pregate["ready"] else "not_ready"

    def step_save(self) -> str:
        """Only a service proven healthy is saved as known-good; this attempt's files are always kept."""
        if (self.pregate or {}).get("ready"):
            self.host.makedirs(self._path("known-good"), 0o700)
            for item in self.s.files:
                if not self.host.exists(item["src"]):
                    continue  # a service the role did not install lacks some
                if item["name"] == CURRENT and not self.before.get("variant"):
                    continue
                self.host.copy(item["src"], self._path("known-good", item["name"]), 0o600)
        self._keep_attempt()
        return "saved"

    def _keep_attempt(self) -> None:
        """This attempt's staged files in attempts/<attempt>/, whatever comes of it."""
        attempt = self._path("attempts", self.attempt)
        self.host.makedirs(attempt, 0o700)
        for item in self._staged():
            self.host.copy(posixpath.join(self.s.staging, item["name"]), posixpath.join(attempt, item["name"]), 0o600)

    def step_stop(self) -> str:
        if not self.before.get("loaded"):
            return "skipped"
        self.host.stop(self.s.service)
        return "stopped"

    def step_release(self) -> str:
        if not self._gpu_check():
            return "skipped"
        released, detail = self._wait_release()
        if released:
            return "released"
        self.failure, self.failed_task = {"ready": False, "msg": detail}, State.RELEASE.value
        return "timed_out"

    def step_install(self) -> str:
        self._copy_files(self.s.staging, self._staged())
        return "installed"

    def step_start(self) -> str:
        self.xid_mark = self._xids()
        self.host.start(self.s.service)
        return "started"

    def _xids(self) -> dict | None:
        """The kernel log's Xid events on the switch's GPUs (None: no GPU check, or unreadable)."""
        if not self._gpu_check() or not self.s.check_health:
            return None
        try:
            return self.host.gpu_xids(list(self.s.gpus))
        except HostError:
            return None

    def _start_faults(self) -> list[dict]:
        """The Xid events the variant's start logged on its GPUs that fail it (_gpu_health.START_FAULT:
        an application fault, or worse): after the mark taken before the start, in the same boot."""
        mark = self.xid_mark
        now = self._xids() if mark else None
        if not now or now.get("boot_id") != mark.get("boot_id"):
            return []
        return [e for e in _gpu_health.unseen(now["events"], mark, now["boot_id"]) if e["action"] in _gpu_health.START_FAULT]

    def step_gate(self) -> str:
        return self._variant_gate(State.GATE)

    def _variant_gate(self, state: State) -> str:
        """The readiness gate on the variant, as its own unit runs it; ``state`` fails when it is not ready."""
        v = self.s.variant
        self.gate_result = self._gate(self.s.url, self._config_file(), self._gate_timeout(v), self.s.gate_settle,
                                      unit=self.s.service)
        if self.gate_result["ready"]:
            faults = self._start_faults()
            if not faults:
                return "ready"
            # it serves, but its start faulted its GPUs: the driver's word outranks the gate's
            gpus = ",".join(str(g) for g in self.s.gpus)
            evidence = [f"{e['bus_id']}: {_gpu_health.event_text(e)}" for e in faults]
            self.gate_result = dict(self.gate_result, ready=False, failure="gpu_xid")
            self.failure = {"ready": False, "failure": "gpu_xid", "cause": f"xid_{faults[0]['xid']}", "evidence": evidence,
                            "msg": f"{v['variant']} served, but its start faulted GPUs {gpus}: " + "; ".join(evidence)}
            self.failed_task = state.value
            return "not_ready"
        if self.gate_result.get("failure"):
            self.failure = self.gate_result
        else:
            # a gate that could not run has no failure of its own: its msg is the reason
            self.failure = {"ready": False, "msg": f"{v['variant']} is not ready: {self.gate_result.get('msg')}"}
        self.failed_task = state.value
        return "not_ready"

    def step_perf(self) -> str:
        if self.s.perf_gate == "off":
            return "skipped"
        return self._perf(State.PERF)

    def _perf(self, state: State) -> str:
        """The variant under the load, against perf_known: passed, reported or failed (``state`` fails)."""
        known = self.perf_known or {}
        return self._judge(lambda: self.host.bench(self.s.url, self._config_file(), self._perf_load(),
                                                   known.get("figures") or None, self._thresholds(), unit=self.s.service),
                           state)

    def _judge(self, measure: Callable[[], dict], state: State) -> str:
        """The performance gate's verdict on ``measure()``'s result (the benchmark's): passed, reported or
        failed (``state`` fails, in enforce mode)."""
        known = self.perf_known or {}
        try:
            result = measure()
        except HostError as exc:
            if self.perf_mode() == "enforce":
                raise
            # report mode records what happened and never rolls back for it
            result = {"passed": False, "figures": None, "msg": f"the benchmark did not run: {exc}"}
        self.perf_result = result
        if result.get("passed"):
            return "passed"
        if self.perf_mode() != "enforce":
            return "reported"
        measured = bool(result.get("figures"))
        checks = (result.get("comparison") or {}).get("checks") or []
        why = (result.get("comparison") or {}).get("msg") if measured else result.get("msg")
        self.perf_failure = {
            "ready": False, "phase": "performance",
            "failure": "slower_than_known_good" if measured else "failed_under_load",
            "cause": ",".join(c["figure"] for c in checks if not c.get("ok")) if measured else "requests_failed",
            "server": (self.gate_result or {}).get("server"),
            "msg": (f"{self.s.variant['variant']} serves but failed the performance gate against the known-good "
                    f"{known.get('variant') or 'service'} on this host: {why}"),
        }
        self.failure, self.failed_task = self.perf_failure, state.value
        return "failed"

    def step_commit(self) -> str:
        self.host.write_atomic(self._path(CURRENT), self._current(self.s.variant), 0o600)
        self.host.makedirs(self._path("known-good"), 0o700)
        for item in self.s.files:
            self.host.copy(item["src"], self._path("known-good", item["name"]), 0o600)
        self.committed = True
        return "committed"

    def step_rollback_stop(self) -> str:
        try:
            self.host.stop(self.s.service)
        except HostError as exc:
            self.rollback_stop_error = str(exc)  # the restore goes ahead; its gate says what runs
        return "stopped"

    def step_rollback_release(self) -> str:
        if not self._gpu_check():
            return "skipped"
        released, _detail = self._wait_release()
        if released:
            return "released"
        self.release_warning = (f"GPUs {','.join(str(g) for g in self.s.gpus)} still held memory "
                                f"{self.s.release_timeout:g} s after the failed variant stopped")
        return "timed_out"

    def step_restore(self) -> str:
        s = self.s
        known = {f["name"]: self.host.exists(self._path("known-good", f["name"])) for f in s.files}
        self.restore = _deploy.restore_plan(
            known, self._json(self._path("known-good", CURRENT)), bool((self.pregate or {}).get("ready")),
            s.baseline["variant"], [{k: f[k] for k in ("name", "src", "mode")} for f in s.files], s.url,
            self._gate_timeout(s.baseline))
        try:
            if self.restore["source"] == "known_good":
                self._copy_files(self._path("known-good"), self.restore["files"])
            else:
                self._copy_files(s.baseline_staging, self._staged())
                self.host.write_atomic(self._path(CURRENT), self._current(s.baseline), 0o600)
        except HostError as exc:
            self.restore_error = f"the {self.restore['source']} files could not be restored: {exc}"
            return "failed"
        return "restored"

    def step_restore_start(self) -> str:
        try:
            self.host.start(self.s.service)
        except HostError as exc:
            self.restart_error = str(exc)
            return "failed"
        return "started"

    def step_restore_gate(self) -> str:
        plan = self.restore
        self.rollback_gate = self._gate(plan["url"], plan.get("api_key_file"),
                                        float(plan.get("gate_timeout") or DEFAULT_GATE_TIMEOUT), self.s.gate_settle,
                                        unit=self.s.service)
        return "ready" if self.rollback_gate["ready"] else "not_ready"

    def step_record(self) -> str:
        if self.steady is not None and self.steady.get("ready") and not self.marked:
            outcome = "unchanged"
        elif self._beside():
            # the live slot was never stopped: refused before the cut-over, else the traffic given back (or not)
            outcome = ("switched" if self.committed else "refused" if not self.cut_over
                       else "rolled_back" if self.back_ok else "rollback_failed")
        else:
            outcome = _deploy.outcome(self.committed, bool((self.rollback_gate or {}).get("ready")))
        self.outcome = outcome
        self._count_responses()
        self.fields = self._fields(outcome)
        self.record = _deploy.record(self.fields)
        self.summary = _deploy.summary_text(self.record, self.s.service_dir)
        # staging/ holds this run's scratch space and what killed runs left (the run holds the lock)
        staging = self._path("staging")
        for name in self.host.listdir(staging):
            self.host.remove(posixpath.join(staging, name))
        if outcome == "unchanged":
            return outcome
        self.host.append_line(self._path(HISTORY), json.dumps(self.record, sort_keys=False))
        if outcome != "rollback_failed":
            # a failed rollback keeps the marker and every file for the operator
            self.host.remove(self._path(MARKER))
            attempts = self._path("attempts")
            for name in _deploy.attempts_to_prune(self.host.listdir(attempts), self.s.keep_attempts):
                self.host.remove(posixpath.join(attempts, name))
        return outcome

    # -- blue/green: the candidate in the free slot, beside the live one -----------------------------------------

    def _beside(self) -> bool:
        return bool(self.s.slot and self.s.slot["mode"] == "blue_green")

    def _slot_moved(self) -> str | None:
        """Why the live slot is not the one the preflight decided for (a deploy between the preflight and
        the lock, an interrupted in-place switch): nothing is done then."""
        live, before = self.s.slot["live"], self.before
        marker = before.get("marker") or {}
        if before.get("interrupted") and marker.get("mode") != "blue_green":
            return (f"an interrupted in-place switch (marker: state {marker.get('state')}) is repaired in place, not "
                    "beside it; deploy again")
        if before.get("slot") != live["slot"] or before.get("unit") != live["unit"] or not before.get("active"):
            return (f"the preflight found {live['variant']} live in slot {live['slot']} ({live['unit']}), the switch "
                    f"finds {before.get('variant') or 'nothing'} in slot {before.get('slot')} ({before.get('unit')}, "
                    f"{'active' if before.get('active') else 'not active'}): deploy again")
        return None

    def _live_worker(self) -> str:
        return self._worker_of(self.s.slot["live"]["url"])

    def _write_workers(self, urls: list[str]) -> None:
        """The live workers the gateway's unit registers when it restarts (a crash, a reboot)."""
        path = self.s.gateway.get("workers_file")
        workers = json.dumps({"workers": [self._worker_of(u) for u in urls]}, indent=4).encode("utf-8")
        if path and self.host.read_bytes(path) != workers:
            self.host.write_atomic(path, workers, 0o600)

    def _take_out(self, worker: str) -> dict:
        """``worker`` out of the gateway ({"removed": bool}); HostError with the gateway's answer."""
        return dict(self.host.gateway_out(self.s.gateway, worker))

    def step_slot_tidy(self) -> str:
        """The free slot as a run cut short may have left it: out of the gateway, stopped, not started at
        boot, and its GPUs free; then the candidate's slot is clean."""
        unit, tidy = self.s.service, []
        if self._take_out(self._worker_of(self.s.url)).get("removed"):
            tidy.append("taken out of the gateway")
        state = self.host.unit_state(unit)
        if state.get("active"):
            self.host.stop(unit)
            tidy.append("stopped")
            if self._gpu_check():
                released, detail = self._wait_release()
                if not released:
                    self.failure, self.failed_task = {"ready": False, "msg": detail}, State.SLOT_TIDY.value
                    raise HostError(detail)
        if state.get("loaded"):
            self.host.disable(unit)
        self.slot_log["tidy"] = tidy
        return "tidy"

    def step_slot_install(self) -> str:
        """This attempt's files kept in attempts/, and put into the candidate's slot (the live slot's unit is
        another file; the --config and logging files are the same for both)."""
        self._keep_attempt()
        return self.step_install()

    def step_slot_start(self) -> str:
        return self.step_start()

    def step_slot_gate(self) -> str:
        return self._variant_gate(State.SLOT_GATE)

    def step_slot_perf(self) -> str:
        """The live slot and the candidate measured under the same load on the same host in the same run,
        their rounds interleaved (_bench.interleaved): each figure's ratio with its interval, and a limit
        failed only beyond noise."""
        if self.s.perf_gate == "off":
            return "skipped"
        live, before = self.s.slot["live"], self.before
        # what the record keeps of the reference: this run's figures of the live slot
        self.perf_known = {"variant": live["variant"], "source": "measured beside", "time": _stamp(self.host.time()),
                           "figures": None, "load": None, "seconds": None, "error": None, "argv": before.get("argv"),
                           "sglang_version": before.get("sglang_version"), "gpu_devices": before.get("gpu_devices")}

        def measure() -> dict:
            result = self.host.bench_pair({"url": live["url"], "api_key_file": before.get("api_key_file"),
                                           "unit": live["unit"]},
                                          {"url": self.s.url, "api_key_file": self._config_file(),
                                           "unit": self.s.service}, self._perf_load(), self._thresholds())
            reference = (result.get("reference") or {}).get("figures")
            self.perf_known.update(figures=reference, load=result.get("load"), seconds=result.get("seconds"),
                                   error=None if reference else result.get("msg"))
            return result
        return self._judge(measure, State.SLOT_PERF)

    def step_slot_route(self) -> str:
        """The candidate into the gateway beside the live slot; the cut-over waits until the gateway
        itself lists it healthy and answers /readiness (removing the live one first would leave clients
        with nothing routable)."""
        g, worker = self.s.gateway, self._worker_of(self.s.url)
        self.gateway_log = {"url": g["url"], "worker": worker}
        self.candidate_routed = True  # from the add on: an abandon takes it out again
        try:
            self.gateway_log["in"] = dict(self.host.gateway_in(g, worker, self._config_file()))
        except HostError as exc:
            v = self.s.variant
            self.failure = {"ready": False, "phase": "gateway", "failure": "not_routed", "cause": "gateway",
                            "server": (self.gate_result or {}).get("server"),
                            "msg": f"{v['variant']} serves on {self.s.url} but the gateway at {g['url']} does not route "
                                   f"to it: {exc}"}
            self.failed_task = State.SLOT_ROUTE.value
            return "failed"
        self._write_workers([self.s.slot["live"]["url"], self.s.url])
        return "routed"

    def step_cutover(self) -> str:
        """The live slot out of the gateway: from here the candidate takes every new request."""
        try:
            self.gateway_log["out"] = self._take_out(self._live_worker())
        except HostError as exc:
            self.failure = {"ready": False, "phase": "gateway", "failure": "not_cut_over", "cause": "gateway",
                            "msg": f"the gateway at {self.s.gateway['url']} could not take the live slot out: {exc}"}
            self.failed_task = State.CUTOVER.value
            return "failed"
        self.cut_over = True
        self.gateway_log["unavailable_s"] = 0.0  # the gateway routed to a ready server throughout
        self.slot_log["cut_over_at"] = _stamp(self.host.time())
        self._write_workers([self.s.url])
        return "cut"

    def step_slot_drain(self) -> str:
        live = self.s.slot["live"]
        try:
            self.drain_result = self.host.drain(live["url"], self.before.get("api_key_file"), self.s.drain_timeout,
                                                self.s.drain_interval, unit=live["unit"])
        except HostError as exc:
            self.slot_log["drain_error"] = str(exc)
            return "failed"
        return "drained"

    def step_soak(self) -> str:
        """The old slot kept loaded while the candidate takes real traffic: its unit and a real
        generation checked every soak_interval seconds; a failure gives the traffic back at once."""
        soak = float(self.s.slot.get("soak") or 0)
        started = self.host.clock()
        probes = 0
        while True:
            probes += 1
            check = self._gate(self.s.url, self._config_file(), 30.0, 0, unit=self.s.service)
            elapsed = round(self.host.clock() - started, 2)
            if not check["ready"]:
                self.slot_log["soak"] = {"seconds": soak, "elapsed": elapsed, "probes": probes, "ok": False}
                self.failure = check if check.get("failure") else {
                    "ready": False, "msg": f"{self.s.variant['variant']} failed under its first real traffic: "
                                           f"{check.get('msg')}"}
                self.failure = dict(self.failure, phase="soak")
                self.failed_task = State.SOAK.value
                return "failed"
            left = soak - (self.host.clock() - started)
            if left <= 0:
                break
            self.host.sleep(min(self.s.soak_interval, left))
        self.slot_log["soak"] = {"seconds": soak, "elapsed": round(self.host.clock() - started, 2), "probes": probes,
                                 "ok": True}
        return "passed"

    def step_slot_commit(self) -> str:
        """current.json names the candidate's slot and unit; its files are the known-good copy."""
        self.step_commit()
        # the other slot's unit file is not known-good any more
        old = self.s.slot["live"]["unit"]
        if old not in {f["name"] for f in self.s.files}:
            try:
                self.host.remove(self._path("known-good", old))
            except HostError as exc:  # committed already: a stale copy left is only untidy
                self.slot_log["known_good_warning"] = str(exc)
        return "committed"

    def step_retire(self) -> str:
        """The old slot stopped, not started at boot, and its GPUs waited for (a timeout is a warning)."""
        live = self.s.slot["live"]
        try:
            self.host.stop(live["unit"])
            self.host.disable(live["unit"])
        except HostError as exc:
            self.slot_log["retire_error"] = f"{live['unit']} was not stopped: {exc}"
            return "failed"
        if self._gpu_check() and live.get("gpus"):
            released, detail = self._wait_release(live["gpus"])
            if not released:
                self.release_warning = detail
        self.slot_log["retired"] = live["unit"]
        return "retired"

    def step_slot_back(self) -> str:
        """The candidate failed after the cut-over: the old slot, still loaded, routed again, then the
        candidate taken out (in that order: the gateway always has a server to route to)."""
        live, started = self.s.slot["live"], self.host.clock()
        try:
            answer = dict(self.host.gateway_in(self.s.gateway, self._live_worker(), self.before.get("api_key_file")))
        except HostError as exc:
            self.back_ok = False
            self.slot_log["back"] = {"ok": False, "msg": f"{live['variant']} ({live['unit']}) is not routed again: {exc}"}
            return "failed"
        self.back_ok = True
        self._write_workers([live["url"]])
        self.slot_log["back"] = {"ok": True, "seconds": round(self.host.clock() - started, 2), "in": answer,
                                 "msg": f"the traffic is back on {live['variant']} (slot {live['slot']})"}
        return "back"

    def step_slot_abandon(self) -> str:
        """The candidate out of the gateway (when it was put in), stopped and not started at boot; the
        live slot is not touched. Errors are kept: the record says what is left."""
        problems = []
        if self.candidate_routed:
            try:
                self._take_out(self._worker_of(self.s.url))
            except HostError as exc:
                problems.append(f"not taken out of the gateway: {exc}")
            if not self.cut_over:
                self._write_workers([self.s.slot["live"]["url"]])
        for action in (self.host.stop, self.host.disable):
            try:
                action(self.s.service)
            except HostError as exc:
                problems.append(str(exc))
        self.slot_log["abandoned"] = {"unit": self.s.service, "problems": problems}
        return "stopped"

    # -- the record's fields, from this object ---------------------------------------------------------------

    def _rollback(self) -> dict:
        if self._beside():
            back = (self.slot_log or {}).get("back") or {}
            return {"variant": self.s.slot["live"]["variant"], "source": "live_slot", "ready": bool(back.get("ok")),
                    "failure": None, "cause": None, "elapsed": back.get("seconds"), "msg": back.get("msg") or "",
                    "release_warning": None}
        gate = self.rollback_gate or {}
        msg = gate.get("msg") or self.restart_error or self.restore_error or ""
        return {"variant": self.restore["variant"], "source": self.restore["source"], "ready": bool(gate.get("ready")),
                "failure": gate.get("failure"), "cause": gate.get("cause"), "elapsed": gate.get("elapsed"),
                "msg": msg, "release_warning": self.release_warning}

    def _fields(self, outcome: str) -> dict:
        s, v = self.s, self.s.variant
        verdict = {"unchanged": self.steady, "switched": self.gate_result}.get(outcome, self.failure)
        if outcome == "refused" and verdict is None:
            verdict = {"ready": False, "msg": "the candidate was refused"}
        return {
            "time": _stamp(self.host.time()),
            "host": s.host,
            "service": s.service,
            "run_id": s.run_id,
            "variant": v["variant"],
            "from": self.before.get("variant"),
            "params": v["params"],
            "argv": v.get("argv"),
            "sglang_version": v.get("sglang_version"),
            "ddtree_build": self.ddtree_build,
            "memory_plan": v.get("memory_plan"),
            "gpu_devices": list(s.gpus),
            "repaired_interrupted_run": bool(self.before.get("interrupted")) or self.recovered is not None,
            "lock": s.lock,
            "outcome": outcome,
            "verdict": verdict,
            "plan_tolerance": s.plan_tolerance,
            "failed_task": self.failed_task,
            "restore": self.restore,
            "rollback": self._rollback() if outcome in ("rolled_back", "rollback_failed") else None,
            "attempt": self.attempt,
            "drain": self.drain_result if (self.drain_result or {}).get("drained") is not None else None,
            "rotation": s.rotation or None,
            "performance": {"mode": self.perf_mode(), "why_report": self._why_report(),
                            "result": self.perf_result if (self.perf_result or {}).get("msg") is not None else None,
                            "known_good": self.perf_known},
            "controller_user": s.controller_user,
            "gateway": self.gateway_log,
            "slot": dict(self.slot_log, recovered=self.recovered) if self.slot_log else None,
        }


# -- read and amended outside a switch ------------------------------------------------------------------------

def _read_json(host: Host, path: str) -> dict | None:
    return _state_files.parse_json_object(host.read_bytes(path))


def inspect(host: Host, service: str, service_dir: str, files: list[dict]) -> dict:
    """The service before a deploy: its unit (active, loaded), the variant current.json records
    as running (argv, URL, release, GPUs), its --config file, an interrupted switch (the marker)
    and the known-good copy. The role reads it before staging (the rollback target's checks),
    and the switch reads it again as its first state."""
    current = _read_json(host, posixpath.join(service_dir, CURRENT))
    # with two slots, current.json names the live slot's unit (the service's own, blue, without one)
    unit_name = (current or {}).get("unit") if isinstance((current or {}).get("unit"), str) else service
    unit = host.unit_state(unit_name)
    marker_path = posixpath.join(service_dir, MARKER)
    # the known-good copy of the live service: its unit file under the name this run installs, or (two slots)
    # under the live slot's unit name
    names = {files[0]["name"], unit_name} if files else set()
    known_good = any(host.exists(posixpath.join(service_dir, "known-good", n)) for n in names)
    known_record = _read_json(host, posixpath.join(service_dir, "known-good", CURRENT))
    config = [f["src"] for f in files if f["src"].endswith((".yaml", ".yml")) and host.exists(f["src"])]
    return {
        "active": bool(unit.get("active")),
        "loaded": bool(unit.get("loaded")),
        "unit": unit_name,
        "slot": (current or {}).get("slot") or ("blue" if current else None),
        "variant": (current or {}).get("variant"),
        "argv": (current or {}).get("argv"),
        "url": _deploy.url_of((current or {}).get("argv")),
        "api_key_file": config[0] if config else None,
        "interrupted": host.exists(marker_path),
        "marker": _read_json(host, marker_path),
        "known_good": known_good,
        "known_good_variant": (known_record or {}).get("variant") if known_good else None,
        "known_good_argv": (known_record or {}).get("argv") if known_good else None,
        "sglang_version": (current or {}).get("sglang_version"),
        "gpu_devices": (current or {}).get("gpu_devices"),
        # what a restore of either would be gated with (the action plugin's time limit)
        "gate_timeout": _params_of(current).get("gate_timeout"),
        "known_good_gate_timeout": _params_of(known_record).get("gate_timeout") if known_good else None,
    }


def _params_of(current: dict | None) -> dict:
    params = (current or {}).get("params")
    return params if isinstance(params, dict) else {}


def amend_rotation(host: Host, service_dir: str, record: dict, rotation: dict) -> tuple[dict, str, bool]:
    """This run's record with the rotation hooks' results (the in hook runs on the controller
    after the switch's job recorded it), and its summary. The record's line in history.jsonl
    (the last with this run's id) is rewritten in one step; an unchanged host has no line.
    Returns the record, its summary and whether a line was rewritten."""
    amended = dict(record, rotation=_deploy.rotation_of(rotation))
    written = False
    path = posixpath.join(service_dir, HISTORY)
    data = host.read_bytes(path)
    if data is not None and record.get("outcome") != "unchanged":
        # an older line that is not UTF-8 (a torn write) is kept byte for byte
        lines = data.decode("utf-8", "surrogateescape").splitlines()
        for index in range(len(lines) - 1, -1, -1):
            try:
                line = json.loads(lines[index])
            except ValueError:
                continue
            if isinstance(line, dict) and line.get("run_id") == record.get("run_id"):
                lines[index] = json.dumps(dict(line, rotation=amended["rotation"]), sort_keys=False)
                host.write_atomic(path, ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"), 0o600)
                written = True
                break
    return amended, _deploy.summary_text(amended, service_dir), written


# -- the real host --------------------------------------------------------------------------------------------------

def run_command(argv: list[str]) -> tuple[int, str, str]:
    """argv run without a shell, colours off: (rc, stdout, stderr), as AnsibleModule.run_command returns."""
    env = dict(os.environ, SYSTEMD_COLORS="0", LC_ALL="C")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    except OSError as exc:
        return 127, "", str(exc)
    return done.returncode, done.stdout, done.stderr


class SystemHost:
    """The host as it is: systemctl, nvidia-smi (through _gpu), files (through _state_files),
    the collection's gate, drain and benchmark. ``run_command``: AnsibleModule.run_command
    in a module, else ``run_command`` above. ``api_key``: the key of this run, sent where no
    --config file is named (the role's module_defaults). ``gate_options``: the gate's own
    settings (interval, generations, stall_budgets, request_timeout, max_response_bytes,
    validate_certs, check_listener, progress_file)."""

    def __init__(self, unit: str, run_command: Callable = run_command, api_key: str | None = None,
                 gate_options: dict | None = None, progress: Callable[[dict], None] | None = None) -> None:
        self.unit = unit
        self.run_command = run_command
        self.api_key = api_key
        self.gate_options = dict(gate_options or {})
        self._progress = progress or (lambda event: None)

    def _systemctl(self, *args: str) -> str:
        rc, out, err = self.run_command(["systemctl", *args])
        if rc != 0:
            raise HostError(f"systemctl {' '.join(args)}: exit {rc}: {' '.join((err or out).split())[:300]}")
        return out

    def systemctl(self, *args: str) -> str:
        """systemctl with ``args``; HostError when it fails."""
        return self._systemctl(*args)

    def unit_state(self, unit: str) -> dict:
        return _process_watch.unit_state(self.run_command, unit)

    def stop(self, unit: str) -> None:
        self._systemctl("stop", "--", unit)

    def start(self, unit: str) -> None:
        self._systemctl("daemon-reload")
        self._systemctl("enable", "--", unit)
        self._systemctl("restart", "--", unit)

    def disable(self, unit: str) -> None:
        self._systemctl("disable", "--", unit)

    def gpu_xids(self, gpus: list[int]) -> dict:
        buses = _gpu_health.buses(self.run_command, gpus)
        kernel = _gpu_health.read_kernel_log(self.run_command)
        if kernel["source"] is None:
            raise HostError(kernel["problem"])
        return dict(_gpu_health.cursor(kernel), events=[e for e in kernel["events"] if e["bus_id"] in buses])

    def gpu_memory_used(self, gpus: list[int]) -> list[int]:
        fields = ("index", "memory.used")
        rc, out, err = self.run_command(_gpu.query_command(fields=fields, devices=list(gpus)))
        if rc != 0:
            raise HostError(_gpu.explain_failure(rc, f"{out}\n{err}"))
        rows, errors, _other = _gpu.parse_query(out, fields)
        used = {row["index"]: row["memory_used_mib"] for row in rows}
        if errors or any(used.get(g) is None for g in gpus):
            raise HostError(f"nvidia-smi did not report memory.used of GPUs {gpus}: {' '.join(out.split())[:300]}")
        return [used[g] for g in gpus]

    # files: OSError becomes HostError, the switch's one failure type
    def read_bytes(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise HostError(f"read {path}: {exc}") from None

    def write_atomic(self, path: str, data: bytes, mode: int) -> None:
        try:
            _state_files.write_atomic(path, data, mode, sync_dir=True)
        except OSError as exc:
            raise HostError(f"write {path}: {exc}") from None

    def append_line(self, path: str, line: str) -> None:
        try:
            _state_files.append_line(path, line)
        except OSError as exc:
            raise HostError(f"append to {path}: {exc}") from None

    def copy(self, src: str, dest: str, mode: int) -> None:
        data = self.read_bytes(src)
        if data is None:
            raise HostError(f"copy {src} to {dest}: {src} does not exist")
        self.write_atomic(dest, data, mode)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise HostError(f"list {path}: {exc}") from None

    def remove(self, path: str) -> None:
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise HostError(f"remove {path}: {exc}") from None

    def makedirs(self, path: str, mode: int) -> None:
        """``path`` and any missing parent made directories with ``mode``; a symbolic link or a
        file where one of them goes, or as the directory it is made in, is refused, never
        followed (the state tree is root's: a copy of a --config file is not written where a
        planted link points)."""
        parent = posixpath.dirname(path)
        try:
            if parent != path and not os.path.lexists(parent):
                self.makedirs(parent, mode)
            elif os.path.islink(parent):
                raise OSError(f"{parent} is a symbolic link")
            _state_files.ensure_directory(path, mode)
        except OSError as exc:
            raise HostError(f"make {path}: {exc}") from None

    # the gate, the drain and the benchmark: the collection's own, as the modules call them
    def _client(self, url: str, api_key_file: str | None, request_timeout: float):
        key = self.api_key
        if api_key_file:
            try:
                key = _credentials.api_key_from_config(api_key_file)
            except (OSError, ValueError) as exc:
                raise HostError(f"api_key_file {api_key_file}: {exc}") from None
        options = self.gate_options
        try:
            client = _http.Client(url, key, bool(options.get("validate_certs", True)), request_timeout,
                                  max_body=int(options.get("max_response_bytes") or _http.MAX_BODY))
        except ValueError as exc:
            raise HostError(f"cannot reach {url}: {exc}") from None
        return client, key

    def _masked(self, value, key: str | None):
        if not key:
            return value
        if isinstance(value, str):
            return _mask.mask(value, (key,))
        if isinstance(value, dict):
            return {k: self._masked(v, key) for k, v in value.items()}
        if isinstance(value, list):
            return [self._masked(v, key) for v in value]
        return value

    def gate(self, url: str, api_key_file: str | None, timeout: float, settle: float, unit: str | None = None) -> dict:
        o = self.gate_options
        client, key = self._client(url, api_key_file, float(o.get("request_timeout", 30)))
        watcher = _process_watch.UnitWatcher(unit or self.unit, self.run_command)
        try:
            gate = _readiness.Gate(client, watcher, timeout=timeout, interval=float(o.get("interval", 1)),
                                   generations=int(o.get("generations", 1)), settle=settle,
                                   progress=lambda text: self.progress({"gate": self._masked(text, key)}),
                                   check_listener=bool(o.get("check_listener", True)), budgets=o.get("stall_budgets"),
                                   progress_file=o.get("progress_file"))
        except ValueError as exc:
            raise HostError(f"gate settings: {exc}") from None
        return self._masked(gate.run(), key)

    def _listener_is_the_units(self, url: str, what: str, key: str | None, unit: str) -> None:
        """The API key goes only to the unit's own listener: before the drain and the benchmark
        send it (the gate checks for itself), who listens on the URL is looked up as the gate
        looks it up, and another process there (a local user who bound the port while the
        service was down, or beside an IPv6 listener) is refused: HostError, nothing sent."""
        if not key or not self.gate_options.get("check_listener", True):
            return
        watcher = _process_watch.UnitWatcher(unit, self.run_command)
        try:
            watcher.poll()
        except _process_watch.GateFailure:
            pass  # no unit: none of its processes listens, so any listener is another's
        seen = _listener.find_listener(url, watcher)
        if seen.state == "foreign":
            raise HostError(f"{what}: another process answers on {seen.address}, not {unit}: {seen.detail}; "
                            "the API key was not sent to it")

    def drain(self, url: str, api_key_file: str | None, timeout: float, interval: float, unit: str | None = None) -> dict:
        client, key = self._client(url, api_key_file, 5.0)
        self._listener_is_the_units(url, "drain", key, unit or self.unit)
        return self._masked(_drain.drain(client, timeout, interval), key)

    def bench(self, url: str, api_key_file: str | None, load: dict, baseline: dict | None, thresholds: dict,
              unit: str | None = None) -> dict:
        """What the sglang_bench module returns for the deploy's load (_bench.measure)."""
        client, key = self._client(url, api_key_file, float(load["timeout"]))
        self._listener_is_the_units(url, "benchmark", key, unit or self.unit)
        try:
            return self._masked(_bench.measure(client, load, baseline, thresholds), key)
        except _bench.BenchError as exc:
            raise HostError(f"benchmark: {exc}") from None

    def bench_pair(self, reference: dict, candidate: dict, load: dict, thresholds: dict) -> dict:
        """Two servers serving now, in interleaved rounds (_bench.interleaved), each client checked as ``bench``'s."""
        clients = []
        for side in (reference, candidate):
            client, key = self._client(side["url"], side.get("api_key_file"), float(load["timeout"]))
            self._listener_is_the_units(side["url"], "benchmark", key, side.get("unit") or self.unit)
            clients.append((client, key))
        try:
            result = _bench.interleaved(clients[0][0], clients[1][0], load, thresholds)
        except _bench.BenchError as exc:
            raise HostError(f"benchmark: {exc}") from None
        for _client, key in clients:
            result = self._masked(result, key)
        return result

    def _gateway(self, gateway: dict) -> tuple[_gateway.Gateway, float]:
        """The gateway through its control key (the host's own: a root-only file; a fleet's: given), and
        the switch's timeout for it."""
        key = gateway.get("control_key")
        if not key:
            path = gateway["control_key_file"]
            try:
                with open(path, encoding="utf-8") as handle:
                    key = handle.read().strip()
            except OSError as exc:
                raise HostError(f"the gateway's control key {path} cannot be read: {exc}") from None
        try:
            client = _http.Client(gateway["url"], key, bool(self.gate_options.get("validate_certs", True)), 10.0)
        except ValueError as exc:
            raise HostError(f"cannot reach the gateway at {gateway['url']}: {exc}") from None
        return _gateway.Gateway(client, self.clock, self.sleep), float(gateway.get("timeout") or DEFAULT_GATEWAY_TIMEOUT)

    def gateway_out(self, gateway: dict, worker: str) -> dict:
        gw, _timeout = self._gateway(gateway)
        try:
            found = gw.find(worker)
            if found is None:
                return {"removed": False, "seconds": 0.0}
            started = self.clock()
            gw.remove(found["id"])
            # not waited for until gone: a removed worker is listed as draining for smg's fixed settle
            # (5 s), and the gateway routes nothing new to it from the removal on
            return {"removed": True, "seconds": round(self.clock() - started, 2)}
        except _gateway.GatewayError as exc:
            raise HostError(str(exc)) from None

    def gateway_responses(self, gateway: dict) -> dict:
        try:
            client = _http.Client(gateway["metrics_url"], None, True, 10.0)
        except ValueError as exc:
            raise HostError(f"the gateway's metrics at {gateway['metrics_url']}: {exc}") from None
        answer = client.call("GET", "", text=True)
        if answer.kind != "ok" or not isinstance(answer.body, str):
            raise HostError(f"the gateway's metrics at {gateway['metrics_url']}: {answer.describe()}")
        try:
            return _deploy_metrics.gateway_responses(answer.body)
        except ValueError as exc:
            raise HostError(f"the gateway's metrics at {gateway['metrics_url']}: {exc}") from None

    def gateway_in(self, gateway: dict, worker: str, api_key_file: str | None) -> dict:
        gw, timeout = self._gateway(gateway)
        key = self.api_key
        if api_key_file:
            try:
                key = _credentials.api_key_from_config(api_key_file)
            except (OSError, ValueError) as exc:
                raise HostError(f"api_key_file {api_key_file}: {exc}") from None
        try:
            gw.wait_up(timeout)  # a gateway that just took the port over from the server before it
            found = gw.find(worker)
            if found is not None and found["status"] == "draining":
                # the same URL removed moments ago (in place): it must be gone before it is added again
                gw.wait_gone(found["id"], timeout)
                found = None
            added = found is None
            gw.add(worker, key)
            ready = gw.wait_ready(worker, timeout)
        except _gateway.GatewayError as exc:
            raise HostError(str(self._masked(str(exc), key))) from None
        return {"added": added, "seconds": ready["seconds"]}

    def clock(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def progress(self, event: dict) -> None:
        self._progress(event)
