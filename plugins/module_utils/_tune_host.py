# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A tune's trials on the host (_tune.Trials): two systemd units beside the live service.

The role renders each trial unit from the service's own template (the reference's variant on the
trial's port and GPUs: the same account, credential, logging configuration and sandbox as the
service); this file installs them, and each candidate's command line goes into a drop-in
(``<unit>.d/50-inferops-tune.conf``) that resets ExecStart to the rendered line with the
candidate's arguments in place of the reference's, and Restart=no (a trial that dies is a verdict,
not something to restart). A trial is started without being enabled (a reboot starts none),
gated by the readiness gate on its own unit (its verdict when it dies), measured against the
reference in interleaved pairs (SystemHost.bench_pair: the API key only to the unit's own
listener), and stopped. ``remove`` stops both and removes their files; a run that was killed
leaves them, and the next tune removes them before it starts.

With one trial slot (``mode`` one: both trials on the same GPUs) the two never run at once and
each is measured alone (``measure``). A tune in place (``mode`` in_place: no free GPU group, the
operator allowed it) is one slot on the live service's own GPUs: before the first trial starts,
a transient systemd timer is armed to start the live unit again after ``restore_after`` seconds
(the job's time limit and a minute: a job that was killed cannot leave the service down), then
the live unit is stopped (not disabled: a reboot starts it); each trial's drop-in conflicts with
it (whichever starts stops the other). ``remove`` starts the live unit again, proves it with the
readiness gate, and disarms the timer; a live unit that does not come back is an error.
"""

from __future__ import annotations

import os
import shutil
import time

from ansible_collections.inferops.sglang.plugins.module_utils import _process_watch
from ansible_collections.inferops.sglang.plugins.module_utils import _sglang_log
from ansible_collections.inferops.sglang.plugins.module_utils import _state_files
from ansible_collections.inferops.sglang.plugins.module_utils import _switch
from ansible_collections.inferops.sglang.plugins.module_utils import _variants

UNIT_DIR = "/etc/systemd/system"
DROPIN = "50-inferops-tune.conf"
MODES = ("two", "one", "in_place")


def restore_timer(live_unit: str) -> str:
    """The transient timer that starts the live unit again after a tune in place: ``<live>-tune-restore``."""
    return f"{live_unit.removesuffix('.service')}-tune-restore"


def _cause(verdict: dict) -> str:
    """A gate's failed verdict in a phrase: ``cuda_oom: CUDA out of memory ...``."""
    return f"{verdict.get('cause') or verdict.get('failure')}: {verdict.get('cause_summary') or verdict.get('msg')}"


class TrialError(Exception):
    """The trial units cannot be made as asked (nothing of the live service is touched)."""


def exec_start(unit_text: str, rendered_args: str, args: str) -> str:
    """The unit's ExecStart line with ``args`` in place of the ``rendered_args`` it was rendered with."""
    lines = [line for line in unit_text.splitlines() if line.startswith("ExecStart=")]
    if len(lines) != 1 or lines[0].count(rendered_args) != 1:
        raise TrialError("the rendered trial unit has no single ExecStart line holding the reference's arguments "
                         f"({len(lines)} ExecStart line(s)); the unit template and the preflight disagree")
    return lines[0].replace(rendered_args, args)


class SystemTrials:
    """_tune.Trials on systemd. ``trials``: the preflight's two (role, unit, url, port, render: exec_args,
    server, sglang_version) each with ``unit_text`` (the role's rendering); ``host``: the switch's
    SystemHost (systemctl, the gate, the benchmark); ``gate``: timeout and settle."""

    def __init__(self, host: _switch.SystemHost, trials: list[dict], gate: dict, unit_dir: str | None = None,
                 clock=None, progress=None, restore_after: float | None = None) -> None:
        self.host, self.gate, self.unit_dir = host, dict(gate), unit_dir or UNIT_DIR
        self.clock = clock or time.monotonic
        self.trials = {t["role"]: t for t in trials}
        if sorted(self.trials) != ["candidate", "reference"]:
            raise TrialError(f"a tune needs a reference and a candidate trial, got {sorted(self.trials)}")
        self.mode = str(trials[0].get("mode") or "two")
        if self.mode not in MODES or any(str(t.get("mode") or "two") != self.mode for t in trials):
            raise TrialError(f"the trials' mode must be one of {', '.join(MODES)} and the same for both, "
                             f"got {[t.get('mode') for t in trials]}")
        self.together = self.mode == "two"
        self.live = trials[0].get("live") if self.mode == "in_place" else None
        if self.mode == "in_place" and not (isinstance(self.live, dict) and self.live.get("unit") and self.live.get("url")):
            raise TrialError("a tune in place needs the live service's unit and URL (the preflight's trials[].live)")
        if self.mode == "in_place" and not restore_after:
            raise TrialError("a tune in place needs restore_after: when the live service is started again whatever happens")
        self.restore_after = restore_after
        self.live_stopped = False
        self.restored: dict | None = None
        self.started_signals: dict[str, dict] = {}
        self._progress = progress or (lambda event: None)
        try:
            self.version = _variants.parse_version(str(trials[0]["render"]["sglang_version"]))
        except _variants.VariantError as exc:
            raise TrialError(str(exc)) from None

    def _path(self, role: str) -> str:
        return os.path.join(self.unit_dir, self.trials[role]["unit"])

    def _dropin(self, role: str) -> str:
        return os.path.join(self._path(role) + ".d", DROPIN)

    def install(self) -> None:
        """Both units written (0644, replacing a killed run's), no drop-in, systemd reloaded."""
        for role in self.trials:
            self._remove_dropin(role)
            _state_files.write_atomic(self._path(role), self.trials[role]["unit_text"], 0o644)
        self.host.systemctl("daemon-reload")

    def _remove_dropin(self, role: str) -> None:
        try:
            os.unlink(self._dropin(role))
        except FileNotFoundError:
            pass
        try:
            os.rmdir(self._path(role) + ".d")
        except OSError:
            pass

    def argv(self, role: str, params: dict) -> list[str]:
        return _variants.argv(params, self.trials[role]["render"]["server"], self.version)

    def start(self, role: str, params: dict) -> dict:
        trial = self.trials[role]
        unit = trial["unit"]
        line = exec_start(trial["unit_text"], trial["render"]["exec_args"], _variants.quote(self.argv(role, params)))
        if self.live is not None and not self.live_stopped:
            self._stop_live()
        # in place, a trial and the live unit never run at once, whichever is started
        conflict = f"[Unit]\nConflicts={self.live['unit']}\n" if self.live is not None else ""
        os.makedirs(self._path(role) + ".d", mode=0o755, exist_ok=True)
        _state_files.write_atomic(self._dropin(role), f"{conflict}[Service]\nRestart=no\nExecStart=\n{line}\n", 0o644)
        self.host.systemctl("daemon-reload")
        verdict, seconds = self._start_gated(unit, trial["url"])
        if verdict.get("ready"):
            # its start-up summary (available_gpu_mem) now, while its log is short
            self.started_signals[role] = self._log_signals(role)
            return {"ready": True, "seconds": seconds, "signals": {"server": verdict.get("server")}}
        self.stop(role)
        return {"ready": False, "seconds": seconds, "verdict": verdict.get("failure"), "cause": _cause(verdict)}

    def stop(self, role: str) -> None:
        self.host.run_command(["systemctl", "stop", "--", self.trials[role]["unit"]])

    def _start_gated(self, unit: str, url: str) -> tuple[dict, float]:
        """``unit`` (a failed run's state cleared) started and gated on its own listener: (verdict, seconds)."""
        self.host.run_command(["systemctl", "reset-failed", "--", unit])
        started = self.clock()
        self.host.systemctl("start", "--", unit)
        verdict = self.host.gate(url, None, float(self.gate.get("timeout", 900)), float(self.gate.get("settle", 5)), unit=unit)
        return verdict, round(self.clock() - started, 2)

    def _stop_live(self) -> None:
        """In place: the restore timer armed (a killed run's first disarmed), then the live unit stopped."""
        unit, timer = self.live["unit"], restore_timer(self.live["unit"])
        self.host.run_command(["systemctl", "stop", "--", f"{timer}.timer"])
        self.host.run_command(["systemctl", "reset-failed", "--", f"{timer}.timer", f"{timer}.service"])
        systemctl = shutil.which("systemctl") or "/usr/bin/systemctl"
        rc, _out, err = self.host.run_command([
            "systemd-run", "--quiet", f"--unit={timer}", f"--on-active={int(self.restore_after)}s",
            "--timer-property=AccuracySec=1s", f"--description=Start {unit} again after a tune in place",
            systemctl, "start", "--", unit])
        if rc != 0:
            raise TrialError(f"the timer that would start {unit} again could not be armed ({err.strip()}); "
                             f"{unit} was not stopped")
        self.progress({"event": "live_stopped", "unit": unit, "restore_after": int(self.restore_after)})
        self.host.systemctl("stop", "--", unit)
        self.live_stopped = True

    def restore(self) -> dict:
        """In place, after the trials: the live unit started again and proven by the readiness gate, the
        timer disarmed. TrialError when it does not come back (the timer stays armed: it tries again)."""
        unit, timer = self.live["unit"], restore_timer(self.live["unit"])
        verdict, seconds = self._start_gated(unit, self.live["url"])
        if not verdict.get("ready"):
            raise TrialError(f"the live service {unit} did not come back after the tune in place: {_cause(verdict)}")
        self.host.run_command(["systemctl", "stop", "--", f"{timer}.timer"])
        self.live_stopped = False
        self.restored = {"unit": unit, "ready": True, "seconds": seconds, "msg": verdict.get("msg")}
        self.progress({"event": "live_restored", "unit": unit, "seconds": seconds})
        return self.restored

    def _log_signals(self, role: str) -> dict:
        """SGLang's tuning signals in the trial's log since its start (_sglang_log.signals); {} unreadable."""
        watcher = _process_watch.UnitWatcher(self.trials[role]["unit"], self.host.run_command)
        try:
            watcher.begin()
        except _process_watch.GateFailure:
            return {}
        return _sglang_log.signals(watcher.all_lines())

    def signals(self, role: str) -> dict:
        """The trial's signals after its measurement: the load's (decode lines, retractions) from its log now,
        its start-up summary from the log read when it became ready (a long log's first lines may be past
        the journal read's window)."""
        found = self._log_signals(role)
        started = self.started_signals.get(role) or {}
        for key in _sglang_log.SUMMARY_KEYS:
            if found.get(key) is None and started.get(key) is not None:
                found[key] = started[key]
        if found:
            found["reading"] = _sglang_log.reading(found)
        return found

    def measure(self, role: str, load: dict) -> dict:
        """One trial alone (one slot): _bench.benchmark's rounds on its own listener."""
        trial = self.trials[role]
        return self.host.bench(trial["url"], None, dict({"budget": None}, **load), None, {}, unit=trial["unit"])

    def compare(self, load: dict) -> dict:
        ref, cand = self.trials["reference"], self.trials["candidate"]
        return self.host.bench_pair({"url": ref["url"], "unit": ref["unit"]}, {"url": cand["url"], "unit": cand["unit"]},
                                    load, {})

    def time(self) -> float:
        return self.clock()

    def progress(self, event: dict) -> None:
        self._progress(event)

    def remove(self) -> None:
        """Both trial units stopped, their files removed, systemd reloaded; in place, the live unit restored
        and proven (``restore``). Errors are the caller's to report."""
        for role in self.trials:
            self.stop(role)
            self._remove_dropin(role)
            try:
                os.unlink(self._path(role))
            except FileNotFoundError:
                pass
        self.host.systemctl("daemon-reload")
        for role in self.trials:
            self.host.run_command(["systemctl", "reset-failed", "--", self.trials[role]["unit"]])
        if self.live_stopped:
            self.restore()
