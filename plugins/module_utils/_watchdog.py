# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The watchdog: the readiness gate's own checks, on a timer, against a server that is up.

systemd's ``Restart=on-failure`` sees a server that exits. It does not see one that stays
alive and stops serving: a scheduler stuck in a collective or stopped, after which real
SGLang still answers ``/v1/models`` while ``/health`` waits 20 s for a token and answers
503 and a generation never returns (0.5.11 and 0.5.23 srt/entrypoints/http_server.py,
the /health handler: HEALTH_CHECK_TIMEOUT). The role installs ``<service>-watchdog.timer``,
which runs ``run_once`` every ``interval`` seconds as root:

1. A deploy holds the host's deploy lock (its lease has not run out): quiet; nothing is
   probed or counted (the deploy stops and starts the server, and gates it itself).
2. The unit is not active (stopped, failed, restarting): nothing to judge; that is systemd's
   and the deploy's business. A new run of the unit (another InvocationID: a deploy's switch,
   systemd's own restart, a restart of ours) starts the count again.
3. The probe is ``_readiness.Gate`` over the unit, as a deploy's gate runs it: the unit's
   state, who listens on the port, /v1/models, /health, /ready, one real generation,
   within ``timeout`` seconds, no settle.
4. A run that has not served yet (since its start) and is younger than ``start_grace`` is
   still starting: a failed probe is not counted.
5. ``failures`` failed probes in a row: ``action`` restart takes the deploy lock (a deploy that
   holds it wins: nothing is restarted), restarts the unit, and records it; a restart within
   the backoff of the previous one (``backoff`` seconds, doubled after each restart that did
   not bring the server back, at most ``backoff_max``) is held back and recorded once;
   ``action`` report only records. A switch left interrupted (switch.json, a killed deploy)
   is never restarted by the watchdog: the next deploy repairs it.

6. The GPUs the server runs on (current.json's ``gpu_devices``): each new Xid event the kernel
   log shows on them since the last run is one ``gpu_xid`` record (GPU, bus id, Xid, NVIDIA's
   action: _gpu_health) and a journal line, an error when the GPU needs a reset or a reboot; each
   change of a GPU's memory counters (uncorrectable ECC errors, a row remap pending or failed) one
   ``gpu_memory`` record (the first reading is the baseline: recorded only when the GPU is
   sick). The textfile counts the Xids by GPU, Xid and action and gives the newest
   counters. A server that stops serving after such an event (and has not served since) is not
   restarted: restarting cannot help a GPU that needs a reset or a reboot; ``gpu_needs_reset``
   says so, once.

Each action is one line of ``watchdog/history.jsonl`` in the service's state directory
(beside the deploy history, which keeps one schema: deploy records) and a journal line under
the watchdog unit; the count survives between runs in ``watchdog/state.json``, written only
when it changes. No API key is written anywhere: it is read from the server's
root-only ``--config`` file at each run and masked (``_mask.mask``, with every other
secret-looking value) in every line printed and every record written.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from ansible_collections.inferops.sglang.plugins.module_utils import _credentials
from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_lock as lock
from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_metrics
from ansible_collections.inferops.sglang.plugins.module_utils import _gateway
from ansible_collections.inferops.sglang.plugins.module_utils import _gpu_health
from ansible_collections.inferops.sglang.plugins.module_utils import _mask
from ansible_collections.inferops.sglang.plugins.module_utils import _process_watch as watch
from ansible_collections.inferops.sglang.plugins.module_utils import _state_files as files
from ansible_collections.inferops.sglang.plugins.module_utils import _readiness as readiness
from ansible_collections.inferops.sglang.plugins.module_utils._http import Client, url_of

ACTIONS = ("restart", "report")
# The settings file's keys and their defaults (the role writes every one).
DEFAULTS = {
    "unit": None,
    "url": None,
    "service_dir": None,
    "api_key_file": None,
    "action": "restart",
    "interval": 30,
    "failures": 3,
    "timeout": 30,
    "start_grace": 900,
    "backoff": 300,
    "backoff_max": 3600,
    "lease": 600,
    "endpoint": "generate",
    "prompt": "The capital city of France is",
    "max_tokens": 8,
    "textfile_dir": None,
    # read the kernel log's Xid events on the server's GPUs at each run
    "gpu_health": True,
    # the host's gateway in front of the server (url, control_key_file, timeout): a serving server it
    # does not list is put back (a switch cut short after it took the server out, a hand that removed it)
    "gateway": None,
}
REQUIRED = ("unit", "url", "service_dir")
# Probe failures that are the watchdog's, not the server's: never counted, never a restart.
NOT_THE_SERVER = ("config_unreadable", "unauthorized")
RECORD_KEYS = ("time", "host", "unit", "event", "action", "failures", "invocation", "main_pid", "probe",
               "restarts_in_a_row", "backoff_s", "msg", "xid", "memory")
# journald reads a "<N>" prefix on a service's output as the line's priority (sd-daemon(3)).
PRIORITY = {"debug": "<7>", "info": "<6>", "notice": "<5>", "warning": "<4>", "err": "<3>"}


class WatchdogError(ValueError):
    """Settings the watchdog cannot run with."""


def load_settings(raw: object) -> dict:
    """The settings file's content, checked; WatchdogError names every problem."""
    if not isinstance(raw, dict):
        raise WatchdogError("the settings are not a JSON object")
    unknown = sorted(set(raw) - set(DEFAULTS))
    settings = dict(DEFAULTS, **{k: v for k, v in raw.items() if k in DEFAULTS})
    errors = [f"unknown setting {name}" for name in unknown]
    errors += [f"{name} is required" for name in REQUIRED if not settings.get(name)]
    if settings["action"] not in ACTIONS:
        errors.append(f"action must be one of {', '.join(ACTIONS)}, not {settings['action']!r}")
    if settings["endpoint"] not in readiness.ENDPOINTS:
        errors.append(f"endpoint must be one of {', '.join(readiness.ENDPOINTS)}")
    for name, low in (("interval", 1), ("failures", 1), ("timeout", 1), ("start_grace", 0), ("backoff", 0),
                      ("backoff_max", 0), ("lease", 60), ("max_tokens", 1)):
        value = settings[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
            errors.append(f"{name} must be a number >= {low}, not {value!r}")
    gateway = settings["gateway"]
    if gateway is not None and (not isinstance(gateway, dict) or not gateway.get("url")
                                or not gateway.get("control_key_file")):
        errors.append("gateway must name its url and control_key_file")
    if not errors and settings["backoff_max"] < settings["backoff"]:
        errors.append("backoff_max must be >= backoff")
    if errors:
        raise WatchdogError("; ".join(errors))
    return settings


def fresh_state(invocation: str | None) -> dict:
    return {"invocation": invocation, "failures": 0, "served": False, "reported": False,
            "restarts_in_a_row": 0, "last_restart": None, "held_back": False}


def backoff_for(settings: dict, restarts_in_a_row: int) -> float:
    """Seconds a restart waits after the previous one: none before the first; ``backoff``
    after one, doubled after each further restart that did not bring the server back."""
    if restarts_in_a_row <= 0:
        return 0.0
    return float(min(settings["backoff_max"], settings["backoff"] * 2 ** (restarts_in_a_row - 1)))


def decide(settings: dict, state: dict, probe: dict, age: float | None, now: float) -> tuple[dict, str]:
    """After one probe of the same run of the unit: the new state and what to do
    (ok, starting, failed, restart, held_back, report, reported)."""
    state = dict(state)
    if probe.get("ready"):
        recovered = state["failures"] > 0 or state["restarts_in_a_row"] > 0
        state.update(failures=0, served=True, reported=False, restarts_in_a_row=0, held_back=False)
        return state, "recovered" if recovered else "ok"
    if not state["served"] and age is not None and age < settings["start_grace"]:
        return state, "starting"
    state["failures"] += 1
    if state["failures"] < settings["failures"]:
        return state, "failed"
    if settings["action"] == "report":
        if state["reported"]:
            return state, "failed"
        state["reported"] = True
        return state, "report"
    if state["reported"]:
        return state, "failed"  # not restarted for a reason a probe cannot change (said once)
    wait = backoff_for(settings, state["restarts_in_a_row"])
    if state["last_restart"] is not None and now - state["last_restart"] < wait:
        if state["held_back"]:
            return state, "failed"
        state["held_back"] = True
        return state, "held_back"
    return state, "restart"


def probe(settings: dict, client: Client, watcher, gate_class=readiness.Gate) -> dict:
    """One probe: the deploy gate's checks (the process, who listens, /v1/models, /health,
    /ready, one real generation) within ``timeout`` seconds, no settle; the gate's verdict."""
    gate = gate_class(client, watcher, timeout=float(settings["timeout"]), interval=1.0,
                      endpoint=settings["endpoint"], prompt=settings["prompt"],
                      max_tokens=int(settings["max_tokens"]), generations=1, settle=0.0)
    return gate.run()


# -- the host ----------------------------------------------------------------------

def run_command(argv: list[str]) -> tuple[int, str, str]:
    """The gate's run_command on the host (module.run_command's shape)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", check=False, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, "", str(exc)
    return done.returncode, done.stdout, done.stderr


class Watchdog:
    """One run against the host: ``run()`` returns the event and prints the journal line."""

    def __init__(self, settings: dict, run=run_command, out=None, now=time.time, gate_class=readiness.Gate,
                 gateway_class=_gateway.Gateway) -> None:
        self.s = settings
        self.gateway_class = gateway_class
        self.run_command = run
        self.out = out or sys.stdout
        self.now = now
        self.gate_class = gate_class
        self.key: str | None = None
        self.directory = os.path.join(settings["service_dir"], "watchdog")
        self.state_file = os.path.join(self.directory, "state.json")
        self.records = os.path.join(self.directory, "history.jsonl")
        self.lock_file = os.path.join(settings["service_dir"], "deploy.lock")
        self.gpu_file = os.path.join(self.directory, "gpu.json")

    def _masked(self, text: str) -> str:
        return _mask.mask(text, (self.key,))

    def _masked_value(self, value):
        """A record with every string in it masked, before it is serialized: masking the
        JSON text instead could take a closing quote with a value and lose the line."""
        if isinstance(value, str):
            return self._masked(value)
        if isinstance(value, dict):
            return {key: self._masked_value(item) for key, item in value.items()}
        if isinstance(value, list):
            return [self._masked_value(item) for item in value]
        return value

    def say(self, level: str, text: str) -> None:
        self.out.write(f"{PRIORITY[level]}{self._masked(text)}\n")
        self.out.flush()

    def _deploying(self) -> str | None:
        """Who deploys the service now, or None (no lock, or a stale one)."""
        try:
            held = lock.read(self.lock_file)
        except lock.LockError as exc:
            return f"the deploy lock cannot be read ({exc})"
        if held is None or lock.stale_reason(held, self.now()) is not None:
            return None
        return f"run {held['run_id']} by {lock.describe(held)}"

    def _unit(self) -> dict:
        rc, out, err = self.run_command(["systemctl", "show", "--no-pager", "-p",
                                         "LoadState,ActiveState,SubState,InvocationID,MainPID", self.s["unit"]])
        if rc != 0:
            return {"LoadState": "error", "error": (err or out).strip()}
        return dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)

    def _probe(self) -> tuple[dict, float | None]:
        if self.s.get("api_key_file"):
            try:
                self.key = _credentials.api_key_from_config(self.s["api_key_file"])
            except (OSError, ValueError) as exc:
                return {"ready": False, "failure": "config_unreadable", "msg": f"{self.s['api_key_file']}: {exc}"}, None
        # the journal from the probe's start only: the probe's cause is in a long-running server's newest lines
        watcher = watch.UnitWatcher(self.s["unit"], self.run_command, log_since=self.now())
        verdict = probe(self.s, Client(self.s["url"], self.key, True, float(self.s["timeout"])), watcher, self.gate_class)
        return verdict, watcher.since_start()

    def _gpu_events(self, state: dict, unit: dict) -> list[dict]:
        """The server's GPUs since the last run: each new Xid event in the kernel log (``gpu_xid``) and each
        change of a GPU's memory counters (``gpu_memory``: uncorrectable ECC errors, a row remap pending or
        failed, the recovery action; the first reading is the baseline, recorded only when it is sick)
        recorded and said, an error when the GPU needs a reset or a reboot. Returns what, since the server last served, makes a
        restart useless (a reset- or reboot-class Xid, a GPU the counters make sick)."""
        current = files.read_json(os.path.join(self.s["service_dir"], "current.json")) or {}
        gpus = [g for g in current.get("gpu_devices") or [] if isinstance(g, int)]
        saved = files.read_json(self.gpu_file) or {}
        if not gpus or not self.s.get("gpu_health", True):
            return []
        buses = _gpu_health.buses(self.run_command, gpus)
        kernel = _gpu_health.read_kernel_log(self.run_command)
        fatal = list(saved.get("fatal") or [])
        updated = dict(saved)
        if kernel["source"] is None:
            if saved.get("unread") != kernel["boot_id"]:  # said once a boot
                self.say("warning", f"{self.s['unit']}: {kernel['problem']}")
                updated["unread"] = kernel["boot_id"]
        else:
            mark = saved.get("cursor")
            fatal = fatal if (mark or {}).get("boot_id") == kernel["boot_id"] else []
            for event in _gpu_health.unseen(kernel["events"], mark, kernel["boot_id"]):
                if event["bus_id"] not in buses:
                    continue
                xid = dict(event, gpu=buses[event["bus_id"]])
                text = f"GPU {xid['gpu']} ({event['bus_id']}): {_gpu_health.event_text(event)}"
                bad = event["action"] in _gpu_health.UNUSABLE
                self.say("err" if bad else "warning", f"{self.s['unit']}: {text}")
                self._record("gpu_xid", state, unit, None, text, xid={k: xid.get(k) for k in (
                    "gpu", "bus_id", "xid", "name", "action", "time", "pid", "process")})
                if bad:
                    fatal.append({"gpu": xid["gpu"], "text": text})
            cursor = _gpu_health.cursor(kernel)
            updated["cursor"] = {"boot_id": cursor["boot_id"], "time": cursor["time"]}
        memory, _problem = _gpu_health.read_memory_health(self.run_command)
        counted = dict(saved.get("counters") or {})
        for bus, index in sorted(buses.items(), key=lambda item: item[1]):
            if bus not in memory:
                continue
            before = counted.get(str(index))
            verdict = _gpu_health.assess(bus, memory[bus], [], baseline=before)
            if verdict["counters"] == before:
                continue
            counted[str(index)] = verdict["counters"]
            if before is None and not verdict["sick"]:
                continue  # the first reading of a healthy GPU: kept as the baseline, nothing to report
            c = verdict["counters"]
            standing = (f"memory health: ECC {c['ecc_mode'] or 'N/A'}, uncorrectable errors {c['aggregate_uncorrected']} "
                        f"(aggregate), {c['volatile_uncorrected']} (since the driver loaded), row remap pending "
                        f"{c['remap_pending']}, remapping failed {c['remap_failure']}")
            text = f"GPU {index} ({bus}): " + ("; ".join(verdict["sick"]) if verdict["sick"] else standing)
            self.say("err" if verdict["sick"] else "info", f"{self.s['unit']}: {text}")
            self._record("gpu_memory", state, unit, None, text,
                         memory={"gpu": index, "bus_id": bus, "counters": c, "sick": verdict["sick"]})
            if verdict["sick"]:
                fatal.append({"gpu": index, "text": text})
        updated.update(counters=counted, fatal=fatal)
        if updated != saved:
            files.replace(self.gpu_file, json.dumps(updated))
        return fatal

    def _served(self) -> None:
        """The server serves: whatever its GPUs logged before, they work now."""
        saved = files.read_json(self.gpu_file) or {}
        if saved.get("fatal"):
            files.replace(self.gpu_file, json.dumps(dict(saved, fatal=[])))

    def _record(self, event: str, state: dict, unit: dict, probe: dict | None, msg: str, xid: dict | None = None,
                memory: dict | None = None) -> None:
        record = dict.fromkeys(RECORD_KEYS)
        record.update(
            time=lock.utc_iso(self.now()), host=socket.gethostname(), unit=self.s["unit"], event=event,
            action=self.s["action"], failures=state["failures"], invocation=unit.get("InvocationID"),
            main_pid=int(unit.get("MainPID") or 0) or None, restarts_in_a_row=state["restarts_in_a_row"],
            backoff_s=backoff_for(self.s, state["restarts_in_a_row"]), msg=msg,
            probe={k: (probe or {}).get(k) for k in ("failure", "phase", "cause", "detail", "elapsed")} if probe else None,
            xid=xid, memory=memory)
        files.append_line(self.records, json.dumps(self._masked_value(record)))
        if self.s.get("textfile_dir"):
            try:
                _deploy_metrics.refresh(self.s["service_dir"], self.s.get("service") or self.s["unit"],
                                        self.s["textfile_dir"])
            except OSError as exc:
                self.say("warning", f"{self.s['unit']}: the deploy state for node_exporter was not written: {exc}")

    def _restart(self, state: dict, unit: dict, probe: dict) -> tuple[str, str]:
        holder = {"service": self.s["unit"], "variant": None, "controller_user": "root (watchdog)",
                  "controller_host": socket.gethostname(), "controller_pid": os.getpid(), "awx_job_id": None}
        run_id = f"watchdog-{os.getpid()}-{int(self.now())}"
        taken = lock.acquire(self.lock_file, run_id, holder, lease=int(self.s["lease"]), now=self.now)
        if not taken["acquired"]:
            return "deploying", f"not restarted: a deploy took the lock first ({lock.describe(taken['holder'])})"
        try:
            if self._unit().get("InvocationID") != unit.get("InvocationID"):
                return "superseded", "not restarted: the unit was restarted meanwhile"
            rc, out, err = self.run_command(["systemctl", "restart", self.s["unit"]])
        finally:
            lock.release(self.lock_file, run_id)
        if rc != 0:
            return "restart_failed", f"systemctl restart {self.s['unit']} failed: {(err or out).strip()[:300]}"
        return "restarted", f"restarted {self.s['unit']}"

    def _follow_the_live_slot(self) -> None:
        """With two slots the live one moves with each blue/green switch: current.json names its unit and
        command line, and the watchdog watches that one (its settings name the service's own unit)."""
        current = files.read_json(os.path.join(self.s["service_dir"], "current.json")) or {}
        unit, url = current.get("unit"), url_of(current.get("argv"))
        if isinstance(unit, str) and unit and url:
            self.s = dict(self.s, unit=unit, url=url, service=self.s.get("service") or self.s["unit"])

    def _route(self, state: dict, unit: dict) -> str | None:
        """The serving server as the host's gateway lists it: put back when it is not listed (or listed as
        removed), with its key; ``gateway_routed`` then, ``gateway_unrouted`` (said once an episode) when the
        gateway cannot be made to; None when it routes to it already."""
        g, worker = self.s["gateway"], _gateway.worker_url(self.s["url"])
        timeout = float(g.get("timeout") or 60)
        try:
            with open(g["control_key_file"], encoding="utf-8") as handle:
                control = handle.read().strip()
            gw = self.gateway_class(Client(g["url"], control, True, 10.0))
            found = gw.find(worker)
            if found is not None and found["status"] != "draining":
                state.pop("gateway_reported", None)
                return None  # listed: the gateway's own health checks route to it
            if found is not None:
                gw.wait_gone(found["id"], timeout)
            gw.add(worker, self.key)
            ready = gw.wait_ready(worker, timeout)
        except (OSError, _gateway.GatewayError, ValueError) as exc:
            msg = f"the gateway at {g['url']} does not route to {worker}, which serves: {exc}"
            if not state.get("gateway_reported"):
                state["gateway_reported"] = True
                self.say("err", f"{self.s['unit']}: {msg}")
                self._record("gateway_unrouted", state, unit, None, msg)
            return "gateway_unrouted"
        state.pop("gateway_reported", None)
        msg = f"{worker} serves but the gateway at {g['url']} did not list it: put back, routed in {ready['seconds']} s"
        self.say("warning", f"{self.s['unit']}: {msg}")
        self._record("gateway_routed", state, unit, None, msg)
        return "gateway_routed"

    def run(self) -> str:
        if os.path.isdir(self.s["service_dir"]):
            self._follow_the_live_slot()
        unit_name = self.s["unit"]
        if not os.path.isdir(self.s["service_dir"]):
            self.say("info", f"{unit_name}: {self.s['service_dir']} is missing: nothing deployed here to watch")
            return "not_deployed"
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        deploying = self._deploying()
        if deploying:
            self.say("info", f"{unit_name}: a deploy holds the host's lock ({deploying}); not probing")
            return "deploying"
        unit = self._unit()
        saved = files.read_json(self.state_file) or {}
        invocation = unit.get("InvocationID") or None
        state = dict(fresh_state(invocation), **saved) if saved.get("invocation") == invocation else fresh_state(invocation)
        if unit.get("ActiveState") != "active":
            if saved != fresh_state(invocation):
                files.replace(self.state_file, json.dumps(fresh_state(invocation)))
            self.say("info", f"{unit_name} is {unit.get('ActiveState', '?')}/{unit.get('SubState', '?')}: "
                             "nothing to probe (systemd and the deploy own a unit that is not running)")
            return "inactive"
        before = dict(state)
        fatal = self._gpu_events(state, unit)
        probe, age = self._probe()
        if probe.get("failure") in NOT_THE_SERVER:
            # the watchdog cannot ask (its key is unreadable or refused): a restart would not help
            self.say("err", f"{unit_name}: the watchdog cannot probe: {probe.get('msg') or probe.get('failure')}; "
                            "not counted")
            return "cannot_probe"
        state, event = decide(self.s, state, probe, age, self.now())
        limit = self.s["failures"]
        what = probe.get("msg") or probe.get("failure") or ""
        msg = f"probe {state['failures']}/{limit} failed: {what}"
        if event in ("ok", "recovered"):
            self._served()
            generation = probe.get("generation") or {}
            msg = (f"{unit_name} serves: {generation.get('completion_tokens')} tokens in "
                   f"{generation.get('latency')} s")
            self.say("info" if event == "recovered" else "debug", msg + (" (recovered)" if event == "recovered" else ""))
            if event == "recovered":
                self._record(event, state, unit, None, msg)
            if self.s.get("gateway"):
                routed = self._route(state, unit)
                event = routed or event
        elif event == "starting":
            self.say("info", f"{unit_name} started {age:.0f} s ago and has not served yet "
                             f"(start_grace {self.s['start_grace']} s): not counted; {what}")
        elif event == "failed":
            self.say("warning", f"{unit_name}: {msg}")
        elif event == "report":
            msg = f"{limit} probes in a row failed (action report: not restarted); last: {what}"
            self.say("err", f"{unit_name}: {msg}")
            self._record(event, state, unit, probe, msg)
        elif event == "held_back":
            wait = backoff_for(self.s, state["restarts_in_a_row"])
            msg = (f"{limit} probes in a row failed; not restarted: {state['restarts_in_a_row']} restart(s) in a row "
                   f"did not bring it back, the next waits {wait:.0f} s after the last; last: {what}")
            self.say("err", f"{unit_name}: {msg}")
            self._record(event, state, unit, probe, msg)
        elif event == "restart":
            if os.path.exists(os.path.join(self.s["service_dir"], "switch.json")):
                event, why = "interrupted_switch", ("not restarted: a switch was interrupted (switch.json); "
                                                    "the next deploy repairs it")
            elif fatal:
                event, why = "gpu_needs_reset", ("not restarted: restarting cannot help, its GPU needs a reset or a "
                                                 "reboot: " + "; ".join(f["text"] for f in fatal))
            else:
                event, why = self._restart(state, unit, probe)
            msg = f"{limit} probes in a row failed ({what}); {why}"
            self.say("err" if event != "restarted" else "warning", f"{unit_name}: {msg}")
            self._record(event, state, unit, probe, msg)
            if event == "restarted":
                state = dict(fresh_state(None), restarts_in_a_row=state["restarts_in_a_row"] + 1,
                             last_restart=self.now())
                state["invocation"] = self._unit().get("InvocationID") or None
            elif event == "restart_failed":  # tried: the backoff applies to the next try
                state.update(restarts_in_a_row=state["restarts_in_a_row"] + 1, last_restart=self.now())
            elif event in ("interrupted_switch", "gpu_needs_reset"):  # said once, until the next deploy or a recovery
                state["reported"] = True
        if state != before or saved != state:
            files.replace(self.state_file, json.dumps(state))
        return event


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python3 -m ansible_collections.inferops.sglang.plugins.module_utils._watchdog SETTINGS.json\n")
        return 2
    try:
        with open(args[0], encoding="utf-8") as handle:
            settings = load_settings(json.load(handle))
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"<3>watchdog settings {args[0]}: {exc}\n")
        return 2
    Watchdog(settings).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
