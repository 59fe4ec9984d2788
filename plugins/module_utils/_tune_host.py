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
"""

from __future__ import annotations

import os
import time

from ansible_collections.inferops.sglang.plugins.module_utils import _state_files
from ansible_collections.inferops.sglang.plugins.module_utils import _switch
from ansible_collections.inferops.sglang.plugins.module_utils import _variants

UNIT_DIR = "/etc/systemd/system"
DROPIN = "50-inferops-tune.conf"


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
                 clock=None, progress=None) -> None:
        self.host, self.gate, self.unit_dir = host, dict(gate), unit_dir or UNIT_DIR
        self.clock = clock or time.monotonic
        self.trials = {t["role"]: t for t in trials}
        if sorted(self.trials) != ["candidate", "reference"]:
            raise TrialError(f"a tune needs a reference and a candidate trial, got {sorted(self.trials)}")
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
        os.makedirs(self._path(role) + ".d", mode=0o755, exist_ok=True)
        _state_files.write_atomic(self._dropin(role), f"[Service]\nRestart=no\nExecStart=\n{line}\n", 0o644)
        self.host.systemctl("daemon-reload")
        self.host.run_command(["systemctl", "reset-failed", "--", unit])
        started = self.clock()
        self.host.systemctl("start", "--", unit)
        verdict = self.host.gate(trial["url"], None, float(self.gate.get("timeout", 900)),
                                 float(self.gate.get("settle", 5)), unit=unit)
        seconds = round(self.clock() - started, 2)
        if verdict.get("ready"):
            return {"ready": True, "seconds": seconds, "signals": {"server": verdict.get("server")}}
        self.stop(role)
        return {"ready": False, "seconds": seconds, "verdict": verdict.get("failure"),
                "cause": f"{verdict.get('cause') or verdict.get('failure')}: {verdict.get('cause_summary') or verdict.get('msg')}"}

    def stop(self, role: str) -> None:
        self.host.run_command(["systemctl", "stop", "--", self.trials[role]["unit"]])

    def compare(self, load: dict) -> dict:
        ref, cand = self.trials["reference"], self.trials["candidate"]
        return self.host.bench_pair({"url": ref["url"], "unit": ref["unit"]}, {"url": cand["url"], "unit": cand["unit"]},
                                    load, {})

    def time(self) -> float:
        return self.clock()

    def progress(self, event: dict) -> None:
        self._progress(event)

    def remove(self) -> None:
        """Both trial units stopped, their files removed, systemd reloaded (errors are the caller's to report)."""
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
