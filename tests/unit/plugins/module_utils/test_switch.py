"""_switch: the switch's state machine driven in-process through a fake host, every path."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sim_helpers import FakeClocks

from ansible_collections.inferops.sglang.plugins.module_utils import _bench
from ansible_collections.inferops.sglang.plugins.module_utils import _deploy
from ansible_collections.inferops.sglang.plugins.module_utils import _gpu_health
from ansible_collections.inferops.sglang.plugins.module_utils import _switch
from ansible_collections.inferops.sglang.plugins.module_utils._switch import HostError, State

SERVICE = "sglang-qwen.service"
SDIR = "/var/lib/inferops-sglang/sglang-qwen"
UNIT = f"/etc/systemd/system/{SERVICE}"
CONFIG = "/etc/sglang/sglang-qwen.yaml"
LOGGING = "/etc/sglang/sglang-qwen.logging.json"
CURRENT = f"{SDIR}/current.json"
MARKER = f"{SDIR}/switch.json"
HISTORY = f"{SDIR}/history.jsonl"
KG = f"{SDIR}/known-good"
FILES = [
    {"name": SERVICE, "src": UNIT, "mode": "0644", "template": "sglang.service.j2"},
    {"name": "sglang-qwen.yaml", "src": CONFIG, "mode": "0600", "template": "sglang.config.yaml.j2"},
    {"name": "sglang-qwen.logging.json", "src": LOGGING, "mode": "0644", "template": "sglang.logging.json.j2"},
    {"name": "current.json", "src": CURRENT, "mode": "0600", "template": None},
]
STAGED = FILES[:3]
BUSY_MIB, FREE_MIB = 40000, 300
WALL0 = 1750000000.0  # 2025-06-15T15:06:40Z


def variant(name: str, port: int = 30000, gate_timeout: float = 600, **params) -> dict:
    argv = ["--model-path", "/srv/models/Qwen3.6-27B", "--host", "127.0.0.1", "--port", str(port), "--tp-size", "2"]
    return {"variant": name, "argv": argv, "sglang_version": "0.5.11",
            "params": {"gate_timeout": gate_timeout, "max_running_requests": 8, "context_length": 4096, **params}}


NEXTN = variant("nextn")
DDTREE = variant("ddtree", port=30001, gate_timeout=1200)
PLAIN = variant("plain", gate_timeout=300)
URL = "http://127.0.0.1:30000"
DDTREE_URL = "http://127.0.0.1:30001"
FAST = {"output_tokens_per_s": 100.0, "ttft_p50": 0.2, "ttft_p95": 0.4, "tpot_p50": 0.02, "itl_p50": 0.02,
        "accept_length": None}
SLOW = dict(FAST, output_tokens_per_s=50.0)


def rendered(v: dict) -> dict[str, bytes]:
    """The files the role renders for a variant (the fake reads the variant back from the unit)."""
    return {SERVICE: f"[Service]\n# variant={v['variant']}\nExecStart=/opt/sglang/bin/python -m sglang.launch_server "
                     f"{' '.join(v['argv'])}\n".encode(),
            "sglang-qwen.yaml": f'api-key: "secret"\nport: {v["argv"][5]}\n'.encode(),
            "sglang-qwen.logging.json": json.dumps({"version": 1, "variant": v["variant"]}).encode()}


def current_json(v: dict) -> bytes:
    doc = {k: v[k] for k in ("variant", "params", "argv", "sglang_version")}
    doc["gpu_devices"] = [0, 1]
    return json.dumps(doc, indent=4, sort_keys=True).encode()


class FakeHost(FakeClocks):
    """The host in memory: files with modes, one unit, GPUs whose memory empties some polls after
    a stop, a gate that passes the variants in ``healthy`` on their own URL, a scripted drain and
    benchmark, clocks that move only when slept on or gated. Every call is logged."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[bytes, int]] = {}
        self.dirs: set[str] = {"/"}
        for d in ("/etc/systemd/system", "/etc/sglang", SDIR, f"{SDIR}/staging", KG, f"{SDIR}/attempts"):
            self.makedirs(d, 0o700, log=False)
        self.unit = {"active": False, "loaded": False}
        self.serving: str | None = None      # the variant of the unit file the last start found
        self.healthy: set[str] = {"nextn", "ddtree", "plain"}
        self.urls = {v["variant"]: _deploy.url_of(v["argv"]) for v in (NEXTN, DDTREE, PLAIN)}
        self.gate_script: dict[int, bool] = {}  # gate call number (from 1) -> forced readiness
        self.gate_answers: dict[int, dict] = {}  # gate call number -> its whole result (a gate that failed itself)
        self.gate_hook = None                 # called with the host before each gate
        self.figures: dict[str, dict | None] = {"nextn": FAST, "ddtree": FAST, "plain": FAST}
        self.drain_error: str | None = None
        self.fail: dict[tuple[str, int], str] = {}   # (operation, its call number) -> HostError text
        self.release_after: list[int | None] = []    # per stop: busy polls before the memory is free; None: never
        self.gpu_busy: int | None = 0                # polls left busy; None: held until the next stop
        self.gpu_error: str | None = None
        self.mono, self.wall = 1000.0, WALL0
        # the host's gateway: worker URL -> id, as it lists them; it routes to a worker whose URL the
        # serving unit answers on, healthy, once added
        self.gateway_workers: dict[str, str] = {}
        self.gateway_reaches: dict[str, str] = {}  # a fleet gateway's worker URL -> the server URL it reaches
        self.calls: list[tuple] = []
        self.events: list[dict] = []
        self.counts: dict[str, int] = {}
        self.kernel: list[dict] = []                  # the kernel log's Xid events (_gpu_health.parse_kernel_log's)
        self.start_xids: dict[str, list[int]] = {}    # variant -> the Xids its start logs on GPU 0

    # -- bookkeeping --
    def _call(self, *call) -> None:
        self.calls.append(call)
        self.counts[call[0]] = self.counts.get(call[0], 0) + 1
        text = self.fail.get((call[0], self.counts[call[0]]))
        if text:
            raise HostError(text)

    def kinds(self, *names: str) -> list[str]:
        return [c[0] for c in self.calls if c[0] in names]

    def _parent(self, path: str) -> None:
        parent = path.rsplit("/", 1)[0] or "/"
        if parent not in self.dirs:
            raise HostError(f"{parent}: no such directory")

    def put(self, path: str, data: bytes, mode: int = 0o600) -> None:
        self._parent(path)
        self.files[path] = (data, mode)

    def data(self, path: str) -> bytes | None:
        return self.files.get(path, (None, None))[0]

    def mode(self, path: str) -> int | None:
        return self.files.get(path, (None, None))[1]

    def under(self, directory: str) -> list[str]:
        return sorted(p for p in self.files if p.startswith(directory + "/"))

    # -- Host --
    def unit_state(self, unit: str) -> dict:
        self.calls.append(("unit_state", unit))
        return dict(self.unit)

    def stop(self, unit: str) -> None:
        self._call("stop", unit)
        if self.unit["active"]:
            self.gpu_busy = self.release_after.pop(0) if self.release_after else 1
        self.unit["active"] = False
        self.serving = None

    def start(self, unit: str) -> None:
        self._call("start", unit)
        unit_file = self.data(UNIT)
        if unit_file is None:
            raise HostError(f"Unit {unit} not found.")
        self.unit.update(active=True, loaded=True)
        found = re.search(rb"# variant=(\S+)", unit_file)
        self.serving = found.group(1).decode() if found else "unmanaged"
        self.gpu_busy = None
        for xid in self.start_xids.get(self.serving, []):
            self.xid(xid)

    def xid(self, xid: int, bus: str = "00000000:01:00.0") -> None:
        name, action = _gpu_health.classify(xid)
        self.kernel.append({"time": 100.0 + len(self.kernel), "bus_id": bus, "xid": xid, "name": name, "action": action,
                            "pid": "4242", "process": "python3", "detail": "test"})

    def gpu_xids(self, gpus: list[int]) -> dict:
        self._call("xids", tuple(gpus))
        return {"boot_id": "boot-1", "time": max((e["time"] for e in self.kernel), default=0.0), "source": "journal",
                "events": list(self.kernel)}

    def gpu_memory_used(self, gpus: list[int]) -> list[int]:
        self._call("gpu", tuple(gpus))
        if self.gpu_error:
            raise HostError(self.gpu_error)
        busy = self.gpu_busy is None or self.gpu_busy > 0
        if self.gpu_busy:
            self.gpu_busy -= 1
        return [BUSY_MIB if busy else FREE_MIB for dummy in gpus]

    def read_bytes(self, path: str) -> bytes | None:
        return self.data(path)

    def write_atomic(self, path: str, data: bytes, mode: int) -> None:
        self._call("write", path)
        self.put(path, bytes(data), mode)

    def append_line(self, path: str, line: str) -> None:
        self._call("append", path)
        self.put(path, (self.data(path) or b"") + line.encode() + b"\n", 0o600)

    def copy(self, src: str, dest: str, mode: int) -> None:
        self._call("copy", src, dest, mode)
        if src not in self.files:
            raise HostError(f"copy {src} to {dest}: {src} does not exist")
        self.put(dest, self.files[src][0], mode)

    def exists(self, path: str) -> bool:
        return path in self.files or path in self.dirs

    def listdir(self, path: str) -> list[str]:
        names = {p[len(path) + 1:].split("/")[0] for p in (*self.files, *self.dirs) if p.startswith(path + "/")}
        return sorted(names)

    def remove(self, path: str) -> None:
        self._call("remove", path)
        for p in [p for p in self.files if p == path or p.startswith(path + "/")]:
            del self.files[p]
        self.dirs = {d for d in self.dirs if not (d == path or d.startswith(path + "/"))}

    def makedirs(self, path: str, mode: int, log: bool = True) -> None:
        if log:
            self._call("makedirs", path)
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            self.dirs.add("/" + "/".join(parts[:i]))

    def gate(self, url: str, api_key_file: str | None, timeout: float, settle: float, unit: str | None = None) -> dict:
        self._call("gate", url, api_key_file, timeout, settle)
        if self.gate_hook:
            self.gate_hook(self)
        self.sleep(12)
        if self.counts["gate"] in self.gate_answers:
            return dict(self.gate_answers[self.counts["gate"]])
        forced = self.gate_script.get(self.counts["gate"])
        who = self.serving
        if forced is None:
            ready = bool(self.unit["active"] and who in self.healthy and url == self.urls.get(who))
        else:
            ready = forced
        if ready:
            return {"ready": True, "phase": "settled", "failure": None, "cause": None, "elapsed": 12.0,
                    "server": {"version": "0.5.11"}, "msg": f"{who} is ready on {url}"}
        return {"ready": False, "phase": "generation", "failure": "unit_failed", "cause": "cuda_oom", "elapsed": 12.0,
                "server": None, "msg": f"{who or 'nothing'} does not serve on {url}: CUDA out of memory"}

    def drain(self, url: str, api_key_file: str | None, timeout: float, interval: float, unit: str | None = None) -> dict:
        self._call("drain", url, api_key_file, timeout, interval)
        if self.drain_error:
            raise HostError(self.drain_error)
        return {"drained": True, "timed_out": False, "seconds": 0.5, "timeout": timeout, "polls": 2,
                "in_flight_at_start": 2, "in_flight_at_stop": 0, "running_at_stop": 0, "waiting_at_stop": 0,
                "endpoint": "/v1/loads", "error": None, "msg": "drained in 0.5 s (2 request(s) in flight at the start)"}

    def bench(self, url: str, api_key_file: str | None, load: dict, baseline: dict | None, thresholds: dict,
              unit: str | None = None) -> dict:
        self._call("bench", url, baseline)
        figures = self.figures.get(self.serving) if url == self.urls.get(self.serving) else None
        if not figures:
            return {"ok": False, "passed": False, "figures": None, "seconds": 3.0,
                    "msg": "round 1 failed: 16 of 16 requests (connection reset)"}
        comparison = _bench.compare(figures, baseline, thresholds)
        return {"ok": True, "passed": comparison["passed"], "figures": figures, "seconds": 20.0,
                "load": dict(load, rounds_measured=3), "comparison": comparison,
                "msg": f"{figures['output_tokens_per_s']} output tokens/s; {comparison['msg']}"}

    def gateway_out(self, gateway: dict, worker: str) -> dict:
        self._call("gateway_out", worker)
        if worker not in self.gateway_workers:
            return {"removed": False, "seconds": 0.0}
        del self.gateway_workers[worker]
        return {"removed": True, "seconds": 0.01}

    def gateway_in(self, gateway: dict, worker: str, api_key_file: str | None) -> dict:
        self._call("gateway_in", worker, api_key_file)
        added = worker not in self.gateway_workers
        self.gateway_workers.setdefault(worker, f"w{self.counts['gateway_in']}")
        reached = self.gateway_reaches.get(worker, worker)
        if not (self.unit["active"] and self.serving in self.healthy and self.urls.get(self.serving) == reached):
            self.sleep(gateway.get("timeout", 60))
            raise HostError(f"the gateway did not route to {worker} within 60 s: listed as pending, not healthy")
        self.sleep(0.5)
        return {"added": added, "seconds": 0.5}

    def progress(self, event: dict) -> None:
        self.events.append(event)


MUTATING = ("stop", "start", "write", "append", "copy", "remove", "makedirs")


def install(host: FakeHost, v: dict, active: bool = True) -> None:
    """A service the role installed and started earlier."""
    for item, data in zip(STAGED, rendered(v).values()):
        host.put(item["src"], data, int(item["mode"], 8))
    host.put(CURRENT, current_json(v))
    host.unit.update(active=active, loaded=True)
    host.serving = v["variant"] if active else None
    host.gpu_busy = None if active else 0


def save_known_good(host: FakeHost, v: dict) -> None:
    for name, data in rendered(v).items():
        host.put(f"{KG}/{name}", data)
    host.put(f"{KG}/current.json", current_json(v))


def stage(host: FakeHost, v: dict, directory: str) -> None:
    host.makedirs(directory, 0o700, log=False)
    for name, data in rendered(v).items():
        host.put(f"{directory}/{name}", data)


def settings(run_id: str = "run1", v: dict | None = None, **kw) -> _switch.Settings:
    v = NEXTN if v is None else v
    base = dict(service=SERVICE, service_dir=SDIR, files=FILES, staging=f"{SDIR}/staging/{run_id}",
                baseline_staging=f"{SDIR}/staging/{run_id}/baseline", variant=v, baseline=PLAIN,
                url=_deploy.url_of(v["argv"]), run_id=run_id, host="gpu1", gpus=[0, 1], release_timeout=10,
                gate_settle=5, lock={"run_id": run_id, "holder": "ops@ctl", "taken_over": False},
                controller_user="ops")
    base.update(kw)
    return _switch.Settings(**base)


def prepare(host: FakeHost, run_id: str = "run1", v: dict | None = None) -> None:
    """What Ansible does before the module: the variant and the baseline rendered into staging."""
    v = NEXTN if v is None else v
    stage(host, v, f"{SDIR}/staging/{run_id}")
    stage(host, PLAIN, f"{SDIR}/staging/{run_id}/baseline")


def run(host: FakeHost, run_id: str = "run1", v: dict | None = None, stop_at: State | None = None, **kw) -> dict:
    v = NEXTN if v is None else v
    prepare(host, run_id, v)
    return _switch.Switch(settings(run_id, v, **kw), host, stop_at=stop_at).run()


def history(host: FakeHost) -> list[dict]:
    return [json.loads(line) for line in (host.data(HISTORY) or b"").decode().splitlines()]


def serving_truth(host: FakeHost, rec: dict) -> None:
    """The record tells what runs: the unit serves that variant, healthy, and current.json says so."""
    assert rec["running"] is not None
    assert host.unit["active"] and host.serving == rec["running"] and host.serving in host.healthy
    assert json.loads(host.data(CURRENT))["variant"] == rec["running"]
    assert host.data(UNIT) == rendered({"nextn": NEXTN, "ddtree": DDTREE, "plain": PLAIN}[rec["running"]])[SERVICE]


@pytest.fixture
def ddtree_host() -> FakeHost:
    """ddtree serving on its own port, installed by an earlier deploy (no known-good copy yet)."""
    host = FakeHost()
    install(host, DDTREE)
    return host


# -- the table ------------------------------------------------------------------------------------------------------

def test_the_table_is_complete_and_every_state_is_reachable():
    sources = {s for s, _e in _switch.TRANSITIONS}
    assert sources == set(State) - _switch.TERMINAL
    for state in sources:
        assert callable(getattr(_switch.Switch, f"step_{state.value}"))
    reached, frontier = {State.INSPECT}, [State.INSPECT]
    while frontier:
        state = frontier.pop()
        for (source, _event), target in _switch.TRANSITIONS.items():
            if source == state and target not in reached:
                reached.add(target)
                frontier.append(target)
    assert reached == set(State)
    # a host failure in the switch proper always leads to the rollback; beside the live slot, to the candidate's
    # abandon (before the cut-over) or to the traffic given back (after it)
    for state in _switch.RESCUED:
        beside = State.SLOT_ABANDON if state.value.startswith("slot_") else State.ROLLBACK_STOP
        expected = {State.SLOT_COMMIT: State.SLOT_BACK}.get(state, beside)
        assert _switch.TRANSITIONS[(state, "failed")] == expected


def test_refuses_bad_settings_and_stop_at_a_terminal_state():
    with pytest.raises(_switch.SwitchError, match="run_id must be a plain name"):
        _switch.Switch(settings(run_id="../x"), FakeHost())
    with pytest.raises(_switch.SwitchError, match="perf_gate must be one of"):
        _switch.Switch(settings(perf_gate="strict"), FakeHost())
    with pytest.raises(_switch.SwitchError, match="perf_load: unknown setting rps"):
        _switch.Switch(settings(perf_gate="report", perf_load={"rps": 3}), FakeHost())
    with pytest.raises(_switch.SwitchError, match="perf_thresholds: unknown figure speed"):
        _switch.Switch(settings(perf_gate="enforce", v=variant("x", perf_thresholds={"speed": 1})), FakeHost())
    with pytest.raises(_switch.SwitchError, match="stop_at"):
        _switch.Switch(settings(), FakeHost(), stop_at=State.SWITCHED)


# -- unchanged ------------------------------------------------------------------------------------------------------

def test_same_files_serving_is_unchanged_and_only_gated():
    host = FakeHost()
    install(host, NEXTN)
    result = run(host)
    assert result["outcome"] == "unchanged" and not result["changed"] and not result["failed"]
    assert [c for c in host.calls if c[0] == "gate"] == [("gate", URL, CONFIG, 600.0, 0)]
    # only this run's scratch space goes; no history, no marker, nothing stopped
    assert {c[0] for c in host.calls if c[0] in MUTATING} == {"remove"}
    assert [c[1] for c in host.calls if c[0] == "remove"] == [f"{SDIR}/staging/run1"]
    assert host.data(HISTORY) is None and host.data(MARKER) is None
    rec = result["record"]
    assert rec["outcome"] == "unchanged" and rec["running"] == "nextn" and rec["attempt"] is None
    assert result["summary"].startswith("gpu1: nextn already serving, unchanged.")
    assert [t[2] for t in result["trail"]] == ["decide", "steady", "record", "unchanged"]


def test_same_files_but_not_serving_switches_again_without_a_drain():
    host = FakeHost()
    install(host, NEXTN)
    host.gate_script = {1: False}  # the steady gate fails once; the pre-gate and the variant's pass
    result = run(host)
    assert result["outcome"] == "switched"
    assert ("steady", "not_ready", "pregate") in result["trail"]
    assert host.kinds("drain", "gate", "stop", "start") == ["gate", "gate", "stop", "start", "gate"]
    serving_truth(host, result["record"])


def test_decide_compares_this_runs_staging_with_the_installed_files():
    host = FakeHost()
    install(host, NEXTN)
    prepare(host, "run1")
    assert _switch.Switch(settings("run1"), host).plan()["switch"] is False
    # another run's staging is not this run's: run2 staged nothing
    plan = _switch.Switch(settings("run2"), host).plan()
    assert plan["switch"] and plan["reasons"] == ["differs from what is installed: sglang-qwen.service, "
                                                  "sglang-qwen.yaml, sglang-qwen.logging.json"]
    host.put(f"{SDIR}/staging/run1/sglang-qwen.yaml", b'api-key: "rotated"\nport: 30000\n')
    assert _switch.Switch(settings("run1"), host).plan()["reasons"] == ["differs from what is installed: sglang-qwen.yaml"]


@pytest.mark.parametrize("installed", [NEXTN, DDTREE], ids=["unchanged", "switched"])
def test_the_record_empties_staging_of_killed_runs_and_of_the_older_layout(installed):
    host = FakeHost()
    install(host, installed)
    stage(host, DDTREE, f"{SDIR}/staging/killed-run")
    host.put(f"{SDIR}/staging/{SERVICE}", b"the older shared layout")
    result = run(host)
    assert result["outcome"] == ("unchanged" if installed is NEXTN else "switched")
    assert host.listdir(f"{SDIR}/staging") == [] and host.under(f"{SDIR}/staging") == []
    assert (host.data(HISTORY) is None) == (installed is NEXTN)


# -- switched -------------------------------------------------------------------------------------------------------

def test_switch_from_a_serving_service(ddtree_host):
    host = ddtree_host
    result = run(host)
    rec = result["record"]
    assert result["outcome"] == "switched" and result["changed"] and not result["failed"]
    assert host.kinds("drain", "gate", "stop", "start", "bench") == ["drain", "gate", "stop", "start", "gate"]
    gates = [c for c in host.calls if c[0] == "gate"]
    assert gates[0] == ("gate", DDTREE_URL, CONFIG, 60.0, 0)      # the running service on its own URL
    assert gates[1] == ("gate", URL, CONFIG, 600.0, 5)            # the variant with its own timeout and the settle
    assert [c for c in host.calls if c[0] == "drain"] == [("drain", DDTREE_URL, CONFIG, 60.0, 1.0)]
    # the running service saved as known-good before the stop, byte for byte
    stop = host.calls.index(("stop", SERVICE))
    assert host.calls.index(("copy", UNIT, f"{KG}/{SERVICE}", 0o600)) < stop
    assert host.calls.index(("copy", CURRENT, f"{KG}/current.json", 0o600)) < stop
    # GPUs polled until empty (one busy poll, one free), before the install
    first_install = next(i for i, c in enumerate(host.calls) if c[0] == "copy" and c[2] == UNIT)
    assert host.kinds("gpu") == ["gpu", "gpu"] and stop < first_install
    # installed with the installed modes, recorded, saved as the new known-good
    for item, data in zip(STAGED, rendered(NEXTN).values()):
        assert host.files[item["src"]] == (data, int(item["mode"], 8))
        assert host.files[f"{KG}/{item['name']}"] == (data, 0o600)
    assert json.loads(host.data(CURRENT))["variant"] == "nextn" and host.mode(CURRENT) == 0o600
    assert host.data(f"{KG}/current.json") == host.data(CURRENT)
    # the attempt's files kept, staging emptied, marker gone, one history line: the record
    assert re.fullmatch(r"\d{8}T\d{6}Z-nextn", rec["attempt"]) and rec["attempt"] == result["attempt"]
    assert host.under(f"{SDIR}/attempts") == sorted(f"{SDIR}/attempts/{rec['attempt']}/{f['name']}" for f in STAGED)
    assert host.under(f"{SDIR}/staging") == [] and host.data(MARKER) is None
    assert history(host) == [rec]
    serving_truth(host, rec)


def test_the_record_is_deploys_record_of_the_switchs_own_fields(ddtree_host):
    switch = _switch.Switch(settings(ddtree_manifest="/etc/inferops/ddtree.json"), ddtree_host)
    ddtree_host.makedirs("/etc/inferops", 0o755, log=False)
    ddtree_host.put("/etc/inferops/ddtree.json", b'{"state": "applied", "build_id": "b7", "junk": 1}')
    prepare(ddtree_host)
    result = switch.run()
    rec = result["record"]
    assert rec == _deploy.record(switch.fields)
    assert list(rec) == list(_deploy.RECORD_KEYS)
    assert rec["time"] == "2025-06-15T15:07:06Z"          # the host's clock: two gates of 12 s and a poll of 2 s
    assert rec["host"] == "gpu1" and rec["service"] == SERVICE and rec["run_id"] == "run1"
    assert (rec["variant"], rec["from"], rec["running"]) == ("nextn", "ddtree", "nextn")
    assert rec["argv"] == NEXTN["argv"] and rec["gpu_devices"] == [0, 1] and rec["params"] == NEXTN["params"]
    assert rec["ddtree_build"] == {"state": "applied", "build_id": "b7"}
    assert rec["lock"]["holder"] == "ops@ctl" and rec["controller_user"] == "ops"
    assert rec["verdict"]["ready"] and rec["verdict"]["msg"] == f"nextn is ready on {URL}"
    assert rec["drain"]["drained"] and rec["drain"]["in_flight_at_start"] == 2
    assert rec["restore"] is None and rec["rollback"] is None and rec["performance"] is None
    assert not rec["repaired_interrupted_run"]
    assert result["summary"] == _deploy.summary_text(rec, SDIR)


def test_progress_reports_every_transition(ddtree_host):
    result = run(ddtree_host)
    states = [e["state"] for e in ddtree_host.events]
    assert states == ["inspect"] + [t[2] for t in result["trail"]]
    assert [(e["from"], e["event"]) for e in ddtree_host.events[1:]] == [(t[0], t[1]) for t in result["trail"]]


def test_the_marker_follows_the_state_from_the_pre_gate_on(ddtree_host):
    seen = []
    ddtree_host.gate_hook = lambda host: seen.append(json.loads(host.data(MARKER)))
    result = run(ddtree_host)
    assert [m["state"] for m in seen] == ["pregate", "gate"]
    assert seen[1]["variant"] == "nextn" and seen[1]["from"] == "ddtree" and seen[1]["run_id"] == "run1"
    assert seen[1]["attempt"] == result["attempt"] and seen[1]["lock"] == "ops@ctl"
    assert ddtree_host.mode(MARKER) is None  # cleared by the record


def test_old_attempts_are_pruned_after_a_switch(ddtree_host):
    for name in ("20240101T000000Z-a", "20240102T000000Z-b", "20240103T000000Z-c", "manual-copy"):
        ddtree_host.makedirs(f"{SDIR}/attempts/{name}", 0o700, log=False)
        ddtree_host.put(f"{SDIR}/attempts/{name}/x", b"x")
    result = run(ddtree_host, keep_attempts=2)
    assert ddtree_host.listdir(f"{SDIR}/attempts") == ["20240103T000000Z-c", result["attempt"], "manual-copy"]


# -- rolled back ----------------------------------------------------------------------------------------------------

def test_gate_fails_rolls_back_to_the_known_good_service_as_itself(ddtree_host):
    host = ddtree_host
    before = dict(host.files)
    host.healthy = {"ddtree"}
    result = run(host)
    rec = result["record"]
    assert result["outcome"] == "rolled_back" and result["failed"] and result["changed"]
    assert host.kinds("drain", "gate", "stop", "start") == \
        ["drain", "gate", "stop", "start", "gate", "stop", "start", "gate"]
    # the restored service gated on its own URL, with its own key file and gate timeout
    assert [c for c in host.calls if c[0] == "gate"][-1] == ("gate", DDTREE_URL, CONFIG, 1200.0, 5)
    assert rec["verdict"]["failure"] == "unit_failed" and rec["verdict"]["cause"] == "cuda_oom"
    assert rec["restore"]["source"] == "known_good" and rec["restore"]["saved_this_run"]
    assert rec["rollback"] == {"variant": "ddtree", "source": "known_good", "ready": True, "failure": None,
                               "cause": None, "elapsed": 12.0, "msg": f"ddtree is ready on {DDTREE_URL}",
                               "release_warning": None}
    # every file back as it was, with its installed mode
    for path in (UNIT, CONFIG, LOGGING, CURRENT):
        assert host.files[path] == before[path]
    assert host.data(MARKER) is None and history(host) == [rec]
    assert host.under(f"{SDIR}/attempts/{rec['attempt']}") and rec["running"] == "ddtree"
    assert "FAILED and was rolled back" in result["summary"] and "Now running: ddtree, healthy" in result["summary"]
    serving_truth(host, rec)


def test_first_deploy_gate_fails_restores_the_baseline():
    host = FakeHost()
    host.healthy = {"plain"}
    result = run(host)
    rec = result["record"]
    assert result["outcome"] == "rolled_back"
    # nothing ran: no drain, no pre-gate, no stop of the variant path (the unit was not loaded)
    assert host.kinds("drain", "gate", "stop", "start") == ["start", "gate", "stop", "start", "gate"]
    assert [c for c in host.calls if c[0] == "gate"][-1] == ("gate", URL, None, 300.0, 5)
    assert rec["restore"]["source"] == "baseline" and rec["rollback"]["variant"] == "plain"
    assert rec["from"] is None and host.under(KG) == []
    for item, data in zip(STAGED, rendered(PLAIN).values()):
        assert host.files[item["src"]] == (data, int(item["mode"], 8))
    assert host.data(CURRENT) == current_json(PLAIN)
    serving_truth(host, rec)


def test_restored_service_fails_too_rollback_failed_keeps_marker_and_every_file(ddtree_host):
    host = ddtree_host
    for name in ("20240101T000000Z-a", "20240102T000000Z-b"):
        host.makedirs(f"{SDIR}/attempts/{name}", 0o700, log=False)
        host.put(f"{SDIR}/attempts/{name}/x", b"x")
    host.healthy = {"ddtree"}
    host.gate_script = {3: False}  # the restored ddtree does not come back
    result = run(host, keep_attempts=1)
    rec = result["record"]
    assert result["outcome"] == "rollback_failed" and result["failed"]
    assert rec["running"] is None and rec["rollback"]["ready"] is False
    assert rec["rollback"]["msg"] == f"ddtree does not serve on {DDTREE_URL}: CUDA out of memory"
    assert json.loads(host.data(MARKER))["state"] == "record"
    assert host.listdir(f"{SDIR}/attempts") == ["20240101T000000Z-a", "20240102T000000Z-b", rec["attempt"]]
    assert host.data(f"{KG}/{SERVICE}") == rendered(DDTREE)[SERVICE]
    assert history(host) == [rec] and "ROLLBACK FAILED" in result["summary"]
    # with the fault gone, the next deploy repairs it and then prunes
    host.gate_script = {}
    again = run(host, "run2", DDTREE, keep_attempts=1)
    assert again["outcome"] == "switched" and again["record"]["repaired_interrupted_run"]
    assert host.data(MARKER) is None and host.listdir(f"{SDIR}/attempts") == [again["attempt"]]
    serving_truth(host, again["record"])


def test_restore_start_fails_is_rollback_failed(ddtree_host):
    ddtree_host.healthy = {"ddtree"}
    ddtree_host.fail = {("start", 2): "Job for sglang-qwen.service failed."}
    result = run(ddtree_host)
    assert result["outcome"] == "rollback_failed"
    assert ("restore_start", "failed", "restore_gate") in result["trail"]
    assert result["record"]["rollback"]["ready"] is False


def test_baseline_files_missing_is_rollback_failed_without_a_start():
    host = FakeHost()
    host.healthy = {"plain"}
    stage(host, NEXTN, f"{SDIR}/staging/run1")  # the baseline was not rendered
    result = _switch.Switch(settings(), host).run()
    assert result["outcome"] == "rollback_failed"
    assert ("restore", "failed", "record") in result["trail"] and host.kinds("start") == ["start"]
    assert "the baseline files could not be restored" in result["record"]["rollback"]["msg"]
    assert host.data(MARKER) is not None


def test_a_host_failure_in_the_switch_rolls_back_naming_the_state(ddtree_host):
    ddtree_host.fail = {("stop", 1): "systemctl stop: exit 1: Access denied"}
    result = run(ddtree_host)
    rec = result["record"]
    assert result["outcome"] == "rolled_back"
    assert rec["verdict"]["failure"] == "task_failed"
    assert rec["verdict"]["msg"] == 'task "stop" failed: systemctl stop: exit 1: Access denied'
    serving_truth(ddtree_host, rec)


def test_a_gate_that_could_not_run_rolls_back_with_its_reason_and_never_the_key(ddtree_host):
    """The gate refuses to start (the run's key has a newline no HTTP header can carry): no failure,
    no cause, only its reason. The rollback runs and the record keeps the reason as the gate's."""
    secret = "s3cr3t\nLD_PRELOAD=/tmp/x.so"
    with pytest.raises(HostError) as refused:
        _switch.SystemHost(SERVICE, Commands(), api_key=secret).gate(URL, None, 5, 0)
    reason = str(refused.value)
    assert "the API key has control characters" in reason and "s3cr3t" not in reason
    ddtree_host.fail = {("gate", 2): reason}  # the pre-gate ran; the variant's gate cannot
    result = run(ddtree_host)
    rec = result["record"]
    assert result["outcome"] == "rolled_back" and rec["rollback"]["ready"]
    assert ("gate", "not_ready", "rollback_stop") in result["trail"]
    assert (rec["verdict"]["ready"], rec["verdict"]["failure"], rec["verdict"]["cause"]) == (False, "task_failed", None)
    assert rec["verdict"]["msg"] == f'task "gate" failed: nextn is not ready: the gate did not run: {reason}'
    assert f"Why: {rec['verdict']['msg']}." in result["summary"].splitlines()
    assert history(ddtree_host) == [rec] and "s3cr3t" not in json.dumps(result)
    serving_truth(ddtree_host, rec)


def test_a_gate_that_failed_itself_without_a_verdict_rolls_back_with_its_msg(ddtree_host):
    crash = "Unsupported parameters for (inferops.sglang.wait_for_sglang) module: stall"
    ddtree_host.gate_answers = {2: {"failed": True, "msg": crash}}  # no ready, failure nor cause
    result = run(ddtree_host)
    rec = result["record"]
    assert result["outcome"] == "rolled_back" and rec["running"] == "ddtree"
    assert rec["verdict"]["failure"] == "task_failed" and rec["verdict"]["ready"] is False
    assert rec["verdict"]["msg"] == f'task "gate" failed: nextn is not ready: {crash}'
    serving_truth(ddtree_host, rec)


def test_a_restore_gate_that_failed_itself_is_a_recorded_rollback_failure(ddtree_host):
    ddtree_host.healthy = {"ddtree"}
    ddtree_host.gate_answers = {3: {"failed": True, "msg": "the gate crashed: KeyError 'server_info'"}}
    result = run(ddtree_host)
    rec = result["record"]
    assert result["outcome"] == "rollback_failed" and history(ddtree_host) == [rec]
    assert rec["verdict"]["failure"] == "unit_failed"  # the variant's own verdict, kept
    assert rec["rollback"] == {"variant": "ddtree", "source": "known_good", "ready": False, "failure": None,
                               "cause": None, "elapsed": None, "msg": "the gate crashed: KeyError 'server_info'",
                               "release_warning": None}
    assert "did not come back: the gate crashed: KeyError 'server_info'" in result["summary"]


# -- the drain and the rotation hooks' results ---------------------------------------------------------------------

OUT_OK = {"ok": True, "msg": "HTTP 204"}
IN_OK = {"ok": True, "msg": "HTTP 204"}
IN_FAILED = {"ok": False, "msg": "HTTP 503 (expected 200): Service Unavailable"}


def test_the_drain_and_the_out_hooks_result_are_recorded_and_the_in_hooks_amends_them(ddtree_host):
    host = ddtree_host
    drained = []
    real_drain = host.drain
    host.drain = lambda *args, **kw: drained.append(real_drain(*args, **kw)) or drained[-1]
    result = run(host, rotation={"out": dict(OUT_OK), "noise": {"ok": 1}})
    rec = result["record"]
    assert [c for c in host.calls if c[0] == "drain"] == [("drain", DDTREE_URL, CONFIG, 60.0, 1.0)]
    assert host.calls.index(("drain", DDTREE_URL, CONFIG, 60.0, 1.0)) < host.calls.index(("stop", SERVICE))
    assert rec["drain"] == {k: drained[0][k] for k in _deploy.DRAIN_KEYS} and "polls" not in rec["drain"]
    assert rec["rotation"] == {"out": OUT_OK}  # Settings.rotation, as the out hook left it
    assert history(host) == [rec]
    assert result["summary"].splitlines()[-1] == (f"Before the stop: {drained[0]['msg']}. "
                                                  "The host is OUT of rotation (the in hook did not run).")
    # the in hook ran on the controller after the job: the record's line amended, the summary made again
    amended, summary, written = _switch.amend_rotation(host, SDIR, rec, {"out": OUT_OK, "in": IN_OK})
    assert written and amended == dict(rec, rotation={"out": OUT_OK, "in": IN_OK})
    assert history(host) == [amended] and host.mode(HISTORY) == 0o600
    assert summary == _deploy.summary_text(amended, SDIR) and "OUT of rotation" not in summary


def test_amend_rewrites_only_this_runs_line_and_an_unchanged_record_writes_nothing(ddtree_host):
    host = ddtree_host
    # an older run's line, and one of this run's id before its record (the last line of the id is the record's)
    older = [json.dumps({"run_id": "run0", "outcome": "switched", "variant": "ddtree", "rotation": None}),
             json.dumps({"run_id": "run1", "outcome": "rolled_back", "variant": "ddtree", "rotation": None})]
    host.put(HISTORY, "".join(line + "\n" for line in older).encode())
    rec = run(host, rotation={"out": OUT_OK})["record"]
    amended, summary, written = _switch.amend_rotation(host, SDIR, rec, {"out": OUT_OK, "in": IN_FAILED})
    assert written
    lines = host.data(HISTORY).decode().splitlines()
    assert lines[:2] == older and [json.loads(line) for line in lines[2:]] == [amended]
    assert amended["rotation"]["in"] == IN_FAILED
    assert summary.endswith(f"The host is OUT of rotation ({IN_FAILED['msg']}).")
    # an unchanged host has no line of its own: its record is only returned, even with a line of its run id
    data, writes = host.data(HISTORY), host.kinds("write")
    again, text, written = _switch.amend_rotation(host, SDIR, dict(rec, outcome="unchanged"), {"out": OUT_OK, "in": IN_OK})
    assert not written
    assert host.data(HISTORY) == data and host.kinds("write") == writes
    assert again["rotation"] == {"out": OUT_OK, "in": IN_OK} and "OUT of rotation" not in text


def test_amend_keeps_a_damaged_older_line_as_it_is(ddtree_host):
    host = ddtree_host
    damaged = b'{"run_id": "run0", "note": "\xff\xfe"}\n'  # a torn write of an older run
    host.put(HISTORY, damaged)
    rec = run(host, rotation={"out": OUT_OK})["record"]
    assert _switch.amend_rotation(host, SDIR, rec, {"out": OUT_OK, "in": IN_OK})[2]
    data = host.data(HISTORY)
    assert data.startswith(damaged)
    assert json.loads(data[len(damaged):]) == dict(rec, rotation={"out": OUT_OK, "in": IN_OK})


@pytest.mark.parametrize("rotation", [None, {}], ids=["none", "empty"])
def test_without_rotation_hooks_the_drain_still_runs(ddtree_host, rotation):
    result = run(ddtree_host, rotation=rotation, drain_timeout=30, drain_interval=0.2)
    rec = result["record"]
    assert [c for c in ddtree_host.calls if c[0] == "drain"] == [("drain", DDTREE_URL, CONFIG, 30, 0.2)]
    assert rec["drain"]["drained"] is True and rec["drain"]["timeout"] == 30
    assert rec["rotation"] is None and "rotation" not in result["summary"]
    # the performance gate is off: nothing measured
    assert ddtree_host.kinds("bench") == [] and rec["performance"] is None


def test_the_running_service_is_measured_after_its_drain_on_its_own_url_and_key(ddtree_host):
    host = ddtree_host
    asked = []
    real_bench = host.bench

    def bench(url, api_key_file, load, baseline, thresholds, unit=None):
        asked.append((url, api_key_file, load, baseline))
        return real_bench(url, api_key_file, load, baseline, thresholds)

    host.bench = bench
    rec = run(host, perf_gate="enforce", perf_load={"max_tokens": 64})["record"]
    load = _bench.plan_load(8, 4096, {"max_tokens": 64})  # the variant's load, the operator's override laid over it
    assert load["max_tokens"] == 64
    assert asked == [(DDTREE_URL, CONFIG, load, None), (URL, CONFIG, load, FAST)]
    # drained first, then measured, then pre-gated and stopped
    assert [c[0] for c in host.calls if c[0] in ("drain", "bench", "gate", "stop")][:4] == \
        ["drain", "bench", "gate", "stop"]
    assert rec["performance"]["known_good"] == {
        "variant": "ddtree", "source": "measured", "time": "2025-06-15T15:06:40Z", "figures": FAST,
        "load": dict(load, rounds_measured=3), "seconds": 20.0, "error": None, "argv": DDTREE["argv"],
        "sglang_version": "0.5.11", "gpu_devices": [0, 1]}
    assert rec["outcome"] == "switched" and rec["performance"]["passed"]


@pytest.mark.parametrize("how,error", [
    ("requests fail", "round 1 failed: 16 of 16 requests (connection reset)"),
    ("the benchmark cannot run", "api_key_file /etc/sglang/sglang-qwen.yaml: Permission denied"),
])
def test_a_known_good_that_cannot_be_measured_is_recorded_and_the_switch_goes_on(ddtree_host, how, error):
    if how == "requests fail":
        ddtree_host.figures["ddtree"] = None
    else:
        ddtree_host.fail = {("bench", 1): error}
    result = run(ddtree_host, perf_gate="enforce")
    rec = result["record"]
    known = rec["performance"]["known_good"]
    assert result["outcome"] == "switched" and ("measure", "measured", "pregate") in result["trail"]
    assert known["source"] == "measured" and known["figures"] is None and known["error"] == error
    assert [c for c in ddtree_host.calls if c[0] == "bench"][1] == ("bench", URL, None)  # nothing to compare with
    assert f"not compared ({known['error']})" in rec["performance"]["msg"]


# -- the GPUs' health over the start -------------------------------------------------------------------------------

def test_a_variant_whose_start_faulted_its_gpu_is_rolled_back_with_the_xid_though_it_served(ddtree_host):
    """The gate passes (nextn serves), but the driver logged Xid 13 on GPU 0 during its start: failed with
    that cause, rolled back, the known-good (whose start logs nothing) proven healthy again."""
    ddtree_host.start_xids["nextn"] = [13]
    result = run(ddtree_host)
    rec = result["record"]
    assert result["outcome"] == "rolled_back"
    assert (rec["verdict"]["failure"], rec["verdict"]["cause"]) == ("gpu_xid", "xid_13")
    assert len(rec["verdict"]["evidence"]) == 1
    assert rec["verdict"]["msg"] == (
        "nextn served, but its start faulted GPUs 0,1: 00000000:01:00.0: Xid 13 (Graphics Engine Exception) at 100.0 s "
        "since boot, process python3 (pid 4242): restart the application that used the GPU")
    assert ddtree_host.serving == "ddtree"
    serving_truth(ddtree_host, rec)


@pytest.mark.parametrize("xid", [63, 92])
def test_earlier_xids_and_those_needing_no_action_fail_nothing(ddtree_host, xid):
    ddtree_host.xid(79, bus="00000000:02:00.0")   # before the switch: provisioning and the preflight judge those
    ddtree_host.start_xids["nextn"] = [xid]
    result = run(ddtree_host)
    assert result["outcome"] == "switched", result["record"]["verdict"]


def test_with_the_health_check_off_the_kernel_log_is_not_read(ddtree_host):
    ddtree_host.start_xids["nextn"] = [13]
    assert run(ddtree_host, check_health=False)["outcome"] == "switched"
    assert "xids" not in ddtree_host.kinds("xids")


def test_an_unreadable_kernel_log_leaves_the_gate_alone(ddtree_host):
    ddtree_host.start_xids["nextn"] = [13]
    ddtree_host.fail = {("xids", 1): "the kernel log cannot be read here"}
    assert run(ddtree_host)["outcome"] == "switched"


# -- the performance gate -------------------------------------------------------------------------------------------

def test_perf_enforce_slower_variant_is_rolled_back(ddtree_host):
    host = ddtree_host
    host.figures["nextn"] = SLOW
    result = run(host, perf_gate="enforce")
    rec = result["record"]
    assert result["outcome"] == "rolled_back"
    assert host.kinds("drain", "bench", "gate", "stop", "start") == \
        ["drain", "bench", "gate", "stop", "start", "gate", "bench", "stop", "start", "gate"]
    benches = [c for c in host.calls if c[0] == "bench"]
    assert benches == [("bench", DDTREE_URL, None), ("bench", URL, FAST)]  # the known-good measured first
    assert rec["verdict"]["failure"] == "slower_than_known_good" and rec["verdict"]["cause"] == "output_tokens_per_s"
    assert rec["verdict"]["msg"].startswith("nextn serves but failed the performance gate against the known-good ddtree")
    perf = rec["performance"]
    assert perf["enforced"] and perf["measured_ok"] and not perf["passed"]
    assert perf["known_good"]["source"] == "measured" and perf["known_good"]["variant"] == "ddtree"
    assert perf["known_good"]["figures"] == FAST and perf["known_good"]["argv"] == DDTREE["argv"]
    serving_truth(host, rec)


def test_perf_enforce_variant_failing_under_load_is_rolled_back(ddtree_host):
    ddtree_host.figures["nextn"] = None
    rec = run(ddtree_host, perf_gate="enforce")["record"]
    assert rec["outcome"] == "rolled_back"
    assert (rec["verdict"]["failure"], rec["verdict"]["cause"]) == ("failed_under_load", "requests_failed")


def test_perf_report_mode_switches_and_records_the_regression(ddtree_host):
    ddtree_host.figures["nextn"] = SLOW
    result = run(ddtree_host, perf_gate="report")
    rec = result["record"]
    assert result["outcome"] == "switched"
    assert rec["performance"]["mode"] == "report" and not rec["performance"]["enforced"]
    assert not rec["performance"]["passed"] and "slower than the known-good service" in rec["performance"]["msg"]
    assert "Performance gate (report)" in result["summary"]
    serving_truth(ddtree_host, rec)


def test_perf_enforce_on_the_baseline_variant_is_only_reported(ddtree_host):
    ddtree_host.figures["plain"] = SLOW
    result = run(ddtree_host, v=PLAIN, perf_gate="enforce")
    perf = result["record"]["performance"]
    assert result["outcome"] == "switched" and perf["mode"] == "report" and not perf["passed"]
    assert perf["msg"].endswith("(reported only: the baseline variant plain is the reference)")


def test_perf_known_good_figures_from_the_history_are_not_measured_again(ddtree_host):
    load = _bench.plan_load(8, 4096, {})
    old = {"outcome": "switched", "variant": "ddtree", "time": "2025-06-01T00:00:00Z", "argv": DDTREE["argv"],
           "sglang_version": "0.5.11", "gpu_devices": [0, 1],
           "performance": {"measured_ok": True, "figures": dict(FAST, output_tokens_per_s=105.0), "load": load}}
    ddtree_host.put(HISTORY, (json.dumps(old) + "\n").encode())
    rec = run(ddtree_host, perf_gate="enforce")["record"]
    assert [c for c in ddtree_host.calls if c[0] == "bench"] == [("bench", URL, old["performance"]["figures"])]
    assert rec["performance"]["known_good"]["source"] == "history" and rec["outcome"] == "switched"
    assert len(history(ddtree_host)) == 2


def test_perf_gate_off_measures_nothing(ddtree_host):
    ddtree_host.figures["nextn"] = SLOW
    rec = run(ddtree_host, perf_gate="off")["record"]
    assert ddtree_host.kinds("bench") == [] and rec["outcome"] == "switched" and rec["performance"] is None


def measured_record(v: dict, figures: dict, load: dict) -> dict:
    """A history line of an earlier switch to ``v`` whose figures were measured under ``load``."""
    return {"outcome": "switched", "variant": v["variant"], "time": "2025-06-01T00:00:00Z", "argv": v["argv"],
            "sglang_version": v["sglang_version"], "gpu_devices": [0, 1],
            "performance": {"measured_ok": True, "figures": figures, "load": load}}


def test_perf_enforce_names_every_slower_figure_and_the_comparison(ddtree_host):
    known = dict(FAST, output_tokens_per_s=105.0)
    ddtree_host.put(HISTORY, (json.dumps(measured_record(DDTREE, known, _bench.plan_load(8, 4096, {}))) + "\n").encode())
    slower = dict(FAST, output_tokens_per_s=50.0, ttft_p95=0.8)
    ddtree_host.figures["nextn"] = slower
    result = run(ddtree_host, perf_gate="enforce")
    rec = result["record"]
    comparison = _bench.compare(slower, known, {})
    assert comparison["msg"].startswith("slower than the known-good service: output_tokens_per_s 50.0 vs 105.0")
    assert result["outcome"] == "rolled_back" and ("perf", "failed", "rollback_stop") in result["trail"]
    verdict = rec["verdict"]
    assert (verdict["phase"], verdict["failure"], verdict["cause"]) == \
        ("performance", "slower_than_known_good", "output_tokens_per_s,ttft_p95")
    assert verdict["msg"] == f"nextn serves but failed the performance gate against the known-good ddtree on this host: " \
                             f"{comparison['msg']}"
    assert verdict["server"] == {"version": "0.5.11"}  # the readiness gate's, which passed
    assert rec["performance"]["known_good"]["source"] == "history"
    assert rec["performance"]["comparison"]["checks"] == comparison["checks"]
    assert [c["figure"] for c in comparison["checks"] if not c["ok"]] == ["output_tokens_per_s", "ttft_p95"]
    assert _deploy.summary_row(rec)[3] == "0.476x tok/s, output_tokens_per_s, ttft_p95 regressed"
    serving_truth(ddtree_host, rec)


def test_perf_enforce_a_variants_own_threshold_overrides_the_operators(ddtree_host):
    ddtree_host.figures["nextn"] = SLOW  # half the known-good's tokens/s
    strict = run(ddtree_host, perf_gate="enforce", perf_thresholds={"output_tokens_per_s": 0.6})["record"]
    assert strict["outcome"] == "rolled_back"
    assert strict["performance"]["comparison"]["checks"][0]["limit"] == ">= 0.6x"
    host = FakeHost()
    install(host, DDTREE)
    host.figures["nextn"] = SLOW
    own = variant("nextn", perf_thresholds={"output_tokens_per_s": 0.01})
    result = run(host, v=own, perf_gate="enforce", perf_thresholds={"output_tokens_per_s": 0.6})
    perf = result["record"]["performance"]
    assert result["outcome"] == "switched" and perf["passed"] and perf["enforced"]
    speed = perf["comparison"]["checks"][0]
    assert (speed["figure"], speed["ratio"], speed["limit"], speed["ok"]) == ("output_tokens_per_s", 0.5, ">= 0.01x", True)


def test_perf_enforce_a_first_deploy_failing_under_load_rolls_back_to_the_baseline():
    host = FakeHost()
    host.figures["nextn"] = None
    result = run(host, perf_gate="enforce")
    rec = result["record"]
    assert result["outcome"] == "rolled_back" and rec["rollback"]["variant"] == "plain"
    verdict = rec["verdict"]
    assert (verdict["phase"], verdict["failure"], verdict["cause"]) == ("performance", "failed_under_load", "requests_failed")
    assert verdict["msg"] == ("nextn serves but failed the performance gate against the known-good service on this "
                              "host: round 1 failed: 16 of 16 requests (connection reset)")
    perf = rec["performance"]
    assert perf["known_good"] is None and not perf["measured_ok"] and not perf["passed"]
    assert _deploy.summary_row(rec)[3] == "failed under load"
    serving_truth(host, rec)


def test_perf_report_mode_keeps_a_variant_that_fails_under_load(ddtree_host):
    ddtree_host.figures["nextn"] = None
    result = run(ddtree_host, perf_gate="report")
    rec = result["record"]
    assert result["outcome"] == "switched" and ("perf", "reported", "gateway_in") in result["trail"]
    assert rec["verdict"]["ready"] and rec["verdict"]["failure"] is None
    assert rec["performance"]["mode"] == "report" and not rec["performance"]["measured_ok"]
    assert rec["performance"]["msg"] == "not measured: round 1 failed: 16 of 16 requests (connection reset)"
    serving_truth(ddtree_host, rec)


@pytest.mark.parametrize("mode,outcome", [("report", "switched"), ("enforce", "rolled_back")])
def test_a_benchmark_that_cannot_run_on_the_variant_rolls_back_only_when_enforced(ddtree_host, mode, outcome):
    host = ddtree_host
    real_bench = host.bench

    def bench(url, api_key_file, load, baseline, thresholds, unit=None):
        if url == URL:  # the variant's, not the known-good's measurement
            host.calls.append(("bench", url, baseline))
            raise HostError("benchmark: api_key_file /etc/sglang/sglang-qwen.yaml: Permission denied")
        return real_bench(url, api_key_file, load, baseline, thresholds)

    host.bench = bench
    result = run(host, perf_gate=mode)
    rec = result["record"]
    assert result["outcome"] == outcome
    if mode == "report":
        assert ("perf", "reported", "gateway_in") in result["trail"]
        assert rec["performance"]["msg"].startswith("not measured: the benchmark did not run: benchmark: api_key_file")
        serving_truth(host, rec)
    else:
        assert ("perf", "failed", "rollback_stop") in result["trail"]
        assert re.search(r'task "perf" failed: .*Permission denied', rec["verdict"]["msg"]), rec["verdict"]


def test_perf_enforce_on_the_baseline_variant_failing_under_load_is_only_reported(ddtree_host):
    ddtree_host.figures["plain"] = None
    result = run(ddtree_host, v=PLAIN, perf_gate="enforce")
    perf = result["record"]["performance"]
    assert result["outcome"] == "switched" and result["record"]["verdict"]["failure"] is None
    assert perf["mode"] == "report" and not perf["enforced"] and not perf["measured_ok"]
    assert perf["msg"].endswith("(reported only: the baseline variant plain is the reference)")


def test_perf_figures_recorded_by_one_switch_are_the_known_good_of_the_next_under_the_same_load(ddtree_host):
    host = ddtree_host
    host.figures["nextn"] = dict(FAST, output_tokens_per_s=95.0)  # ddtree's 100 is not slower than that
    first = run(host, perf_gate="enforce")["record"]
    assert first["outcome"] == "switched" and first["performance"]["measured_ok"]
    host.put(HISTORY, host.data(HISTORY) + b'{"cut short\n')  # a line cut short is skipped
    seen = len(host.calls)
    second = run(host, "run2", DDTREE, perf_gate="enforce")["record"]
    # nextn, now running, is not measured again: its figures from run1's record are the known-good's
    assert [c for c in host.calls[seen:] if c[0] == "bench"] == [("bench", DDTREE_URL, first["performance"]["figures"])]
    known = second["performance"]["known_good"]
    assert second["outcome"] == "switched"
    assert (known["source"], known["variant"], known["figures"]) == ("history", "nextn", first["performance"]["figures"])
    # a variant with 4 running requests is measured at concurrency 4: the figures at 8 do not count
    seen = len(host.calls)
    third = run(host, "run3", variant("nextn", max_running_requests=4), perf_gate="enforce")["record"]
    assert [c for c in host.calls[seen:] if c[0] == "bench"] == [("bench", DDTREE_URL, None), ("bench", URL, FAST)]
    assert third["performance"]["known_good"]["source"] == "measured"
    assert third["performance"]["load"]["concurrency"] == 4


# -- the GPUs' memory -----------------------------------------------------------------------------------------------

def test_gpu_memory_never_released_on_the_variant_path_restores(ddtree_host):
    host = ddtree_host
    host.release_after = [None, None]
    result = run(host)
    rec = result["record"]
    assert result["outcome"] == "rolled_back"
    assert ("release", "timed_out", "rollback_stop") in result["trail"]
    assert rec["verdict"]["failure"] == "task_failed"
    assert rec["verdict"]["msg"] == ('task "release" failed: GPUs 0,1 still held 40000 MiB 10 s after the service '
                                     'stopped (threshold 1024 MiB)')
    # the variant was never installed nor started
    assert not [c for c in host.calls if c[0] == "copy" and c[1].startswith(f"{SDIR}/staging/") and c[2] == UNIT]
    assert host.kinds("start") == ["start"]
    assert rec["rollback"]["release_warning"] == "GPUs 0,1 still held memory 10 s after the failed variant stopped"
    assert result["warnings"] == [rec["rollback"]["release_warning"]]
    assert host.kinds("gpu") == ["gpu"] * 12  # every 2 s for 10 s, twice
    serving_truth(host, rec)


def test_gpu_memory_not_released_on_the_rollback_path_is_only_a_warning(ddtree_host):
    ddtree_host.release_after = [1, None]
    ddtree_host.healthy = {"ddtree"}
    result = run(ddtree_host)
    rec = result["record"]
    assert result["outcome"] == "rolled_back" and rec["verdict"]["failure"] == "unit_failed"
    assert ("rollback_release", "timed_out", "restore") in result["trail"]
    assert rec["rollback"]["release_warning"].startswith("GPUs 0,1 still held memory")
    serving_truth(ddtree_host, rec)


def test_nvidia_smi_failing_counts_as_not_released(ddtree_host):
    ddtree_host.gpu_error = "nvidia-smi failed (exit 15): GPU is lost"
    rec = run(ddtree_host)["record"]
    assert rec["outcome"] == "rolled_back"
    assert "could not be read (nvidia-smi failed (exit 15): GPU is lost)" in rec["verdict"]["msg"]


def test_no_gpu_check_skips_the_waits(ddtree_host):
    result = run(ddtree_host, check_gpus=False)
    assert ddtree_host.kinds("gpu") == [] and ("release", "skipped", "install") in result["trail"]


# -- before anything changes ----------------------------------------------------------------------------------------

def test_drain_fails_before_switching_and_nothing_changes(ddtree_host):
    host = ddtree_host
    prepare(host)
    files = dict(host.files)
    host.drain_error = "cannot reach http://127.0.0.1:30001: connection refused"
    result = _switch.Switch(settings(), host).run()
    assert result["outcome"] == "failed_before_switching" and result["failed"] and not result["changed"]
    assert result["record"] is None
    assert result["msg"] == ("gpu1: cannot reach http://127.0.0.1:30001: connection refused; nothing was changed, "
                             "ddtree still runs")
    assert host.files == files and host.data(MARKER) is None
    assert [c[0] for c in host.calls] == ["unit_state", "drain"]
    assert host.unit["active"] and host.serving == "ddtree"


def test_pre_gate_fails_the_running_service_is_not_saved(ddtree_host):
    host = ddtree_host
    host.healthy = {"plain"}
    host.gate_script = {1: False}
    result = run(host)
    rec = result["record"]
    assert ("pregate", "not_ready", "save") in result["trail"]
    assert not [c for c in host.calls if c[0] == "copy" and c[2].startswith(KG + "/")]
    assert rec["restore"]["source"] == "baseline" and not rec["restore"]["saved_this_run"]
    serving_truth(host, rec)


def test_pre_gate_fails_an_earlier_known_good_is_kept_and_restored(ddtree_host):
    host = ddtree_host
    save_known_good(host, PLAIN)
    host.healthy = {"plain"}
    host.gate_script = {1: False}
    rec = run(host)["record"]
    assert host.data(f"{KG}/{SERVICE}") == rendered(PLAIN)[SERVICE]
    assert (rec["restore"]["source"], rec["rollback"]["variant"]) == ("known_good", "plain")
    assert not rec["restore"]["saved_this_run"]
    serving_truth(host, rec)


# -- interrupted switches -------------------------------------------------------------------------------------------

def test_a_marker_found_at_inspect_forces_a_switch_and_is_repaired():
    host = FakeHost()
    install(host, NEXTN)  # installed exactly as this run stages it, and serving
    host.put(MARKER, json.dumps({"variant": "nextn", "state": "gate", "run_id": "dead"}).encode())
    result = run(host)
    rec = result["record"]
    assert result["outcome"] == "switched" and rec["repaired_interrupted_run"]
    assert result["reasons"] == ["an earlier switch was interrupted (switch.json is there)"]
    assert result["before"]["marker"]["state"] == "gate"
    # nothing is proven about a half-switched service: no drain, no pre-gate, nothing saved from it
    assert host.kinds("drain", "gate", "stop", "start") == ["stop", "start", "gate"]
    assert host.data(MARKER) is None
    serving_truth(host, rec)


SWITCHED_PATH = [State.INSPECT, State.DECIDE, State.GATEWAY_OUT, State.DRAIN, State.MEASURE, State.PREGATE, State.SAVE,
                 State.STOP, State.RELEASE, State.INSTALL, State.START, State.GATE, State.PERF, State.GATEWAY_IN,
                 State.COMMIT, State.RECORD]
ROLLBACK_PATH = [State.INSPECT, State.DECIDE, State.GATEWAY_OUT, State.DRAIN, State.MEASURE, State.PREGATE, State.SAVE,
                 State.STOP, State.RELEASE, State.INSTALL, State.START, State.GATE, State.ROLLBACK_STOP,
                 State.ROLLBACK_RELEASE, State.RESTORE, State.RESTORE_START, State.RESTORE_GATE, State.RESTORE_GATEWAY,
                 State.RECORD]
STEADY_PATH = [State.INSPECT, State.DECIDE, State.STEADY, State.RECORD]
SCENARIOS = {
    # (installed before, healthy variants, perf gate, deployed, path)
    "switch": (DDTREE, {"nextn", "ddtree", "plain"}, "enforce", NEXTN, SWITCHED_PATH),
    "rollback": (DDTREE, {"ddtree", "plain"}, "off", NEXTN, ROLLBACK_PATH),
    "steady": (NEXTN, {"nextn", "plain"}, "off", NEXTN, STEADY_PATH),
}


def scenario_host(name: str) -> FakeHost:
    installed, healthy, _perf, _deployed, _path = SCENARIOS[name]
    host = FakeHost()
    install(host, installed)
    host.healthy = set(healthy)
    return host


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_each_scenario_takes_the_path_its_interruptions_are_tested_on(name):
    _installed, _healthy, perf, deployed, path = SCENARIOS[name]
    result = run(scenario_host(name), v=deployed, perf_gate=perf)
    assert [State.INSPECT.value] + [t[2] for t in result["trail"][:-1]] == [s.value for s in path]


CASES = [(name, state, repair) for name in sorted(SCENARIOS) for state in SCENARIOS[name][4]
         for repair in ("same", "previous")]


@pytest.mark.parametrize("name,state,repair", CASES, ids=[f"{n}-{s.value}-{r}" for n, s, r in CASES])
def test_killed_on_entering_a_state_the_next_run_repairs(name, state, repair):
    installed, _healthy, perf, deployed, path = SCENARIOS[name]
    host = scenario_host(name)
    with pytest.raises(_switch.Interrupted) as killed:
        run(host, v=deployed, perf_gate=perf, stop_at=state)
    assert killed.value.state == state
    marked = name != "steady" and path.index(state) >= path.index(State.PREGATE)
    if marked:
        assert json.loads(host.data(MARKER))["state"] == state.value
    else:
        assert host.data(MARKER) is None and not [c for c in host.calls if c[0] in MUTATING]
    # the next deploy: the same variant again, or the one that ran before (as molecule's fault matrix does)
    again_variant = deployed if repair == "same" else installed
    result = run(host, "run2", again_variant, perf_gate=perf)
    rec = result["record"]
    assert result["outcome"] in ("switched", "rolled_back", "unchanged")
    assert rec["repaired_interrupted_run"] == marked
    assert host.data(MARKER) is None and host.under(f"{SDIR}/staging") == []
    if result["outcome"] != "unchanged":
        assert history(host)[-1] == rec
    serving_truth(host, rec)


@pytest.mark.parametrize("name,state,repair", CASES, ids=[f"{n}-{s.value}-{r}" for n, s, r in CASES])
def test_killed_on_entering_a_state_behind_the_gateway_the_next_run_routes_what_serves(name, state, repair):
    """The same kills behind the host's gateway: whatever state the kill left the gateway in (the server
    taken out, the variant put in before its commit), the next deploy ends with the gateway routing to
    the server that serves, and the live workers file naming it."""
    installed, _healthy, perf, deployed, _path = SCENARIOS[name]
    host = scenario_host(name)
    host.gateway_workers = {host.urls[installed["variant"]]: "w0"}
    with pytest.raises(_switch.Interrupted):
        run(host, v=deployed, perf_gate=perf, stop_at=state, gateway=GW)
    again_variant = deployed if repair == "same" else installed
    result = run(host, "run2", again_variant, perf_gate=perf, gateway=GW)
    rec = result["record"]
    serving_truth(host, rec)
    live = host.urls[rec["running"]]
    assert live in routed(host) and json.loads(host.data(GW["workers_file"])) == {"workers": [live]}


# -- check mode -----------------------------------------------------------------------------------------------------

def test_check_mode_says_what_a_switch_would_do_and_changes_nothing(ddtree_host):
    host = ddtree_host
    prepare(host)
    files, unit = dict(host.files), dict(host.unit)
    plan = _switch.Switch(settings(perf_gate="enforce"), host).plan()
    assert plan["switch"] and plan["changed"]
    assert plan["reasons"] == ["differs from what is installed: sglang-qwen.service, sglang-qwen.yaml, "
                               "sglang-qwen.logging.json"]
    assert plan["would"] == ["decide", "drain", "measure", "pregate", "save", "stop", "release", "install", "start",
                             "gate", "perf", "commit", "record", "switched"]
    assert plan["msg"].startswith(f"would switch {SERVICE} from ddtree to nextn (--model-path ")
    assert [c[0] for c in host.calls] == ["unit_state"]
    assert host.files == files and host.unit == unit and host.events == []


def test_check_mode_on_an_unchanged_host_would_keep_it():
    host = FakeHost()
    install(host, NEXTN)
    prepare(host)
    plan = _switch.Switch(settings(), host).plan()
    assert not plan["switch"] and plan["would"] == ["decide", "steady", "record", "unchanged"]
    assert plan["msg"].startswith(f"would keep {SERVICE} on nextn (")
    assert [c[0] for c in host.calls] == ["unit_state"]


def test_check_mode_without_staged_files_uses_what_the_templates_would_change():
    host = FakeHost()
    install(host, NEXTN)
    plan = _switch.Switch(settings(changed_files=["sglang-qwen.yaml"]), host).plan()
    assert plan["reasons"] == ["differs from what is installed: sglang-qwen.yaml"]
    assert _switch.Switch(settings(changed_files=[]), host).plan()["switch"] is False


def test_check_mode_on_an_interrupted_first_deploy_skips_what_would_be_skipped():
    host = FakeHost()
    host.put(MARKER, b"{}")
    prepare(host)
    plan = _switch.Switch(settings(), host).plan()
    assert plan["msg"].startswith(f"would switch {SERVICE} from an unmanaged or absent service to nextn")
    assert plan["would"] == ["decide", "save", "release", "install", "start", "gate", "commit", "record", "switched"]
    assert [c[0] for c in host.calls] == ["unit_state"]


# -- the real host, thin: its commands and files ---------------------------------------------------------------------

class Commands:
    def __init__(self, answers: dict[str, tuple[int, str, str]] | None = None) -> None:
        self.argvs: list[list[str]] = []
        self.answers = answers or {}

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        self.argvs.append(list(argv))
        return self.answers.get(" ".join(argv[:2]), (0, "", ""))


def test_system_host_unit_state_and_start_stop():
    commands = Commands({"systemctl show": (0, "ActiveState=active\nLoadState=loaded\n", "")})
    host = _switch.SystemHost(SERVICE, commands)
    assert host.unit_state(SERVICE) == {"active": True, "loaded": True}
    host.start(SERVICE)
    host.stop(SERVICE)
    assert commands.argvs[1:] == [["systemctl", "daemon-reload"], ["systemctl", "enable", "--", SERVICE],
                                  ["systemctl", "restart", "--", SERVICE], ["systemctl", "stop", "--", SERVICE]]
    failing = _switch.SystemHost(SERVICE, Commands({"systemctl restart": (1, "", "Job failed.\n")}))
    with pytest.raises(HostError, match="systemctl restart -- sglang-qwen.service: exit 1: Job failed."):
        failing.start(SERVICE)
    assert _switch.SystemHost(SERVICE, Commands({"systemctl show": (1, "", "")})).unit_state(SERVICE) == \
        {"active": False, "loaded": False}


def test_system_host_makes_the_state_trees_directories_and_never_follows_a_link(tmp_path):
    """An attempt's directory, its parents made too, root-only; a symbolic link planted where one
    goes (attempts/ pointing elsewhere) is refused and nothing is made through it."""
    host = _switch.SystemHost(SERVICE, Commands())
    service_dir = tmp_path / "sglang-qwen"
    service_dir.mkdir(mode=0o700)
    host.makedirs(str(service_dir / "attempts" / "balanced-1"), 0o700)
    for made in (service_dir / "attempts", service_dir / "attempts" / "balanced-1"):
        assert made.is_dir() and not made.is_symlink() and made.stat().st_mode & 0o777 == 0o700
    host.makedirs(str(service_dir / "attempts" / "balanced-1"), 0o700)  # already there: nothing to do
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (service_dir / "known-good").symlink_to(elsewhere)
    with pytest.raises(HostError, match="known-good exists and is not a directory"):
        host.makedirs(str(service_dir / "known-good"), 0o700)
    with pytest.raises(HostError, match="known-good is a symbolic link"):
        host.makedirs(str(service_dir / "known-good" / "x"), 0o700)
    assert list(elsewhere.iterdir()) == []


def test_system_host_reads_gpu_memory_with_nvidia_smi():
    commands = Commands({"nvidia-smi -i": (0, "0, 300\n2, 41000\n", "")})
    assert _switch.SystemHost(SERVICE, commands).gpu_memory_used([0, 2]) == [300, 41000]
    assert commands.argvs == [["nvidia-smi", "-i", "0,2", "--query-gpu=index,memory.used",
                               "--format=csv,noheader,nounits"]]
    with pytest.raises(HostError, match="did not report memory.used of GPUs"):
        _switch.SystemHost(SERVICE, Commands({"nvidia-smi -i": (0, "0, 300\n", "")})).gpu_memory_used([0, 2])
    with pytest.raises(HostError, match="nvidia-smi failed"):
        _switch.SystemHost(SERVICE, Commands({"nvidia-smi -i": (9, "", "NVML not found")})).gpu_memory_used([0])


def test_system_host_files(tmp_path):
    host = _switch.SystemHost(SERVICE, Commands())
    base = str(tmp_path)
    host.makedirs(f"{base}/kg/sub", 0o700)
    assert (tmp_path / "kg" / "sub").stat().st_mode & 0o777 == 0o700
    host.write_atomic(f"{base}/a", b"one", 0o644)
    host.copy(f"{base}/a", f"{base}/kg/a", 0o600)
    assert host.read_bytes(f"{base}/kg/a") == b"one" and (tmp_path / "kg" / "a").stat().st_mode & 0o777 == 0o600
    host.append_line(f"{base}/h", "x")
    host.append_line(f"{base}/h", "y")
    assert host.read_bytes(f"{base}/h") == b"x\ny\n" and (tmp_path / "h").stat().st_mode & 0o777 == 0o600  # history
    assert host.listdir(f"{base}/kg") == ["a", "sub"] and host.listdir(f"{base}/none") == []
    host.remove(f"{base}/kg")
    host.remove(f"{base}/none")
    assert not host.exists(f"{base}/kg") and host.read_bytes(f"{base}/none") is None
    with pytest.raises(HostError, match="does not exist"):
        host.copy(f"{base}/none", f"{base}/b", 0o600)


def test_system_host_gate_drain_and_bench_call_the_collections_own_with_the_key_masked(tmp_path, monkeypatch):
    config = tmp_path / "sglang-qwen.yaml"
    config.write_text('api-key: "s3cret-key"\n')
    made = {}

    class Gate:
        def __init__(self, client, watcher, **kw):
            made.update(client=client, watcher=watcher, **kw)

        def run(self):
            made["progress"]("[1.0s http] sent s3cret-key")
            return {"ready": False, "failure": "auth", "msg": "the server refused s3cret-key"}

    monkeypatch.setattr(_switch._readiness, "Gate", Gate)
    events = []
    host = _switch.SystemHost(SERVICE, Commands(), api_key="run-key",
                              gate_options={"interval": 2, "generations": 3, "stall_budgets": {"weights": 5}},
                              progress=events.append)
    result = host.gate(URL, str(config), 900, 5)
    assert made["client"].api_key == "s3cret-key" and made["client"].url == URL
    assert made["watcher"].unit == SERVICE
    assert (made["timeout"], made["interval"], made["generations"], made["settle"], made["budgets"]) == \
        (900, 2.0, 3, 5, {"weights": 5})
    assert "s3cret-key" not in json.dumps(result) and "s3cret-key" not in json.dumps(events)
    assert result["failure"] == "auth" and events and "gate" in events[0]

    drained = {}
    monkeypatch.setattr(_switch._drain, "drain",
                        lambda client, timeout, interval: drained.update(key=client.api_key, t=timeout) or {"drained": True})
    assert host.drain(URL, None, 30, 1) == {"drained": True} and drained == {"key": "run-key", "t": 30}

    figures = dict(FAST)
    monkeypatch.setattr(_switch._bench, "benchmark",
                        lambda client, *args: {"ok": True, "figures": figures, "msg": "100 output tokens/s"})
    load = _bench.plan_load(8, 4096, {})
    measured = host.bench(URL, str(config), load, SLOW, {})
    assert measured["passed"] and measured["comparison"]["passed"] and "as fast as" in measured["msg"]
    monkeypatch.setattr(_switch._bench, "benchmark", lambda client, *args: {"ok": False, "figures": None, "msg": "x"})
    assert host.bench(URL, str(config), load, FAST, {})["passed"] is False
    with pytest.raises(HostError, match="api_key_file"):
        host.gate(URL, str(tmp_path / "missing.yaml"), 10, 0)


def test_the_drain_and_the_benchmark_send_the_key_only_to_the_units_own_listener():
    """Issue 29: a local user who holds the service's port (bound while the service was down,
    or beside an IPv6 listener) got the API key from the drain, the first contact of a switch,
    and from the known-good benchmark. Both now look up who listens, as the gate does, and
    refuse another process without sending anything; the unit's own listener gets the key."""
    seen: list[str | None] = []

    class Squatter(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(self.headers.get("Authorization"))
            self.send_response(404)
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Squatter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    unit_process = subprocess.Popen(["sleep", "60"])  # the unit's main process: not the one that listens

    def show(pid: int) -> Commands:
        return Commands({"systemctl show": (0, f"LoadState=loaded\nActiveState=active\nSubState=running\nMainPID={pid}\n", "")})

    try:
        host = _switch.SystemHost(SERVICE, show(unit_process.pid), api_key="run-key")
        with pytest.raises(HostError, match=rf"^drain: another process answers on 127.0.0.1:{server.server_port}, "
                                            rf"not {SERVICE}: pid {os.getpid()} .*the API key was not sent to it$"):
            host.drain(url, None, 5, 0.1)
        with pytest.raises(HostError, match="^benchmark: another process answers on .*the API key was not sent to it$"):
            host.bench(url, None, _bench.plan_load(8, 4096, {}), None, {})
        # no unit at all: any listener is another's
        gone = _switch.SystemHost(SERVICE, Commands({"systemctl show": (1, "", "no such unit")}), api_key="run-key")
        with pytest.raises(HostError, match="the API key was not sent"):
            gone.drain(url, None, 5, 0.1)
        assert seen == []
        # the unit's own listener (this process stands for its main process): the drain goes ahead, with the key
        _switch.SystemHost(SERVICE, show(os.getpid()), api_key="run-key").drain(url, None, 0, 0.1)
        assert seen and set(seen) == {"Bearer run-key"}
    finally:
        unit_process.kill()
        unit_process.wait()
        server.shutdown()
        server.server_close()


def test_staged_files_each_need_name_src_and_mode_and_a_plain_name():
    """One check of the staged files for the switch's settings, the lock's inspect and the stage step."""
    good = {"name": "sglang-qwen.service", "src": "/etc/systemd/system/sglang-qwen.service", "mode": "0644"}
    assert _switch.file_problems([good], "files") == []
    problems = _switch.file_problems([good, {"name": "x.yaml", "src": "/etc/x.yaml"}, dict(good, name="../unit"),
                                      "text"], "inspect.files")
    assert problems == [
        "each of inspect.files needs name, src and mode; {'name': 'x.yaml', 'src': '/etc/x.yaml'} lacks mode",
        "each of inspect.files needs a plain file name; '../unit' is not one",
        "each of inspect.files needs name, src and mode; 'text' lacks name, src, mode",
    ]
    assert settings(files=[dict(good, name="a/b")]).problems()[0] == "each of files needs a plain file name; 'a/b' is not one"


# -- behind the host's gateway (in place: the server's one slot) -----------------------------------------------------

GW = {"url": "http://0.0.0.0:29999", "control_key_file": "/etc/sglang/sglang-qwen.gateway-key",
      "workers_file": f"{SDIR}/gateway-workers.json"}


def routed(host: FakeHost) -> list[str]:
    return sorted(host.gateway_workers)


def test_in_place_behind_the_gateway_takes_the_server_out_first_and_commits_only_once_routed(ddtree_host):
    host = ddtree_host
    host.gateway_workers = {DDTREE_URL: "w0"}
    result = run(host, gateway=GW)
    assert result["outcome"] == "switched"
    states = [t[2] for t in result["trail"]]
    assert states[states.index("gateway_out"):states.index("drain") + 1] == ["gateway_out", "drain"]
    assert states[states.index("perf") + 1:states.index("commit") + 1] == ["gateway_in", "commit"]
    # out before the drain (no new requests reach it), in before current.json says nextn
    assert host.kinds("gateway_out", "drain", "stop", "start", "gateway_in") == [
        "gateway_out", "drain", "stop", "start", "gateway_in"]
    assert host.calls.index(("gateway_in", URL, CONFIG)) < host.calls.index(("write", CURRENT))
    assert routed(host) == [URL]
    assert json.loads(host.data(GW["workers_file"])) == {"workers": [URL]} and host.mode(GW["workers_file"]) == 0o600
    gw = result["record"]["gateway"]
    # clients had no server from the removal to the route, on the fake's clock: the pre-gate (12 s), the GPUs'
    # release poll (2), the variant's gate (12) and the route (0.5)
    assert gw["unavailable_s"] == 12 + 2 + 12 + 0.5 and gw["out"] == {"removed": True, "seconds": 0.01}
    assert gw["worker"] == DDTREE_URL and gw["in"] == {"added": True, "seconds": 0.5}
    assert "had no server for 26.5 s" in result["summary"]
    assert history(host)[-1]["gateway"] == gw


def test_the_gateway_down_refuses_the_switch_before_anything_changes(ddtree_host):
    host = ddtree_host
    host.fail[("gateway_out", 1)] = "GET /workers failed: connection refused"
    result = run(host, gateway=GW)
    assert result["outcome"] == "failed_before_switching" and not result["changed"]
    assert "could not take http://127.0.0.1:30001 out: GET /workers failed: connection refused" in result["msg"]
    assert host.kinds(*MUTATING) == [] and host.serving == "ddtree" and host.data(MARKER) is None


def test_a_failed_drain_puts_the_server_back_into_the_gateway(ddtree_host):
    host = ddtree_host
    host.gateway_workers = {DDTREE_URL: "w0"}
    host.drain_error = "/v1/loads: HTTP 500"
    result = run(host, gateway=GW)
    assert result["outcome"] == "failed_before_switching"
    assert [t[2] for t in result["trail"]][-3:] == ["drain", "gateway_return", "failed_before_switching"]
    assert routed(host) == [DDTREE_URL] and host.serving == "ddtree" and "stop" not in host.kinds("stop")


def test_a_variant_the_gateway_does_not_route_to_is_rolled_back_and_the_known_good_routed_again(ddtree_host):
    host = ddtree_host
    host.gateway_workers = {DDTREE_URL: "w0"}
    host.fail[("gateway_in", 1)] = "the gateway did not route to http://127.0.0.1:30000 within 60 s: listed as pending"
    result = run(host, gateway=GW)
    rec = result["record"]
    assert result["outcome"] == "rolled_back" and ("gateway_in", "failed", "rollback_stop") in result["trail"]
    assert rec["verdict"]["phase"] == "gateway" and "does not route to it" in rec["verdict"]["msg"]
    assert [t[2] for t in result["trail"]][-3:] == ["restore_gateway", "record", "rolled_back"]
    # the failed variant's worker stays listed (it is stopped, the gateway marks it unhealthy), the restored one routes
    assert DDTREE_URL in routed(host) and host.serving == "ddtree"
    assert json.loads(host.data(GW["workers_file"])) == {"workers": [DDTREE_URL]}
    assert rec["gateway"]["unavailable_s"] > 24


def test_a_rolled_back_variant_leaves_the_known_good_routed_with_the_outage_recorded(ddtree_host):
    host = ddtree_host
    host.gateway_workers = {DDTREE_URL: "w0"}
    host.healthy.discard("nextn")
    result = run(host, gateway=GW)
    assert result["outcome"] == "rolled_back"
    assert "gateway_in" not in [t[2] for t in result["trail"]]  # never routed to a variant that failed its gate
    assert routed(host) == [DDTREE_URL] and result["record"]["gateway"]["unavailable_s"] > 0
    assert "had no server for" in result["summary"]


def test_steady_puts_a_serving_server_the_gateway_lost_back_and_says_it_changed():
    host = FakeHost()
    install(host, NEXTN)
    result = run(host, gateway=GW)
    assert result["outcome"] == "unchanged" and result["changed"] and routed(host) == [URL]
    assert json.loads(host.data(GW["workers_file"])) == {"workers": [URL]}
    again = run(host, run_id="run2", gateway=GW)
    assert again["outcome"] == "unchanged" and not again["changed"]


def test_a_first_deploy_behind_the_gateway_routes_the_variant_with_no_outage_to_count():
    host = FakeHost()
    result = run(host, gateway=GW)
    assert result["outcome"] == "switched" and routed(host) == [URL]
    assert result["record"]["gateway"].get("unavailable_s") is None
    prepare(host, "run9", DDTREE)
    would = _switch.Switch(settings("run9", v=DDTREE, gateway=GW), host).plan()["would"]
    assert would[:2] == ["decide", "gateway_out"] and "gateway_in" in would
    assert "gateway_in" not in _switch.Switch(settings("run9", v=DDTREE), host).plan()["would"]


@pytest.mark.parametrize("gateway, error", [
    ({"url": "0.0.0.0:29999"}, "gateway needs the gateway's url"),
    ({"url": "http://0.0.0.0:29999"}, "gateway needs control_key_file and workers_file"),
    (dict(GW, url=URL), "the gateway and the server cannot both answer"),
])
def test_bad_gateway_settings_are_refused(gateway, error):
    with pytest.raises(_switch.SwitchError, match=error):
        _switch.Switch(settings(gateway=gateway), FakeHost())


def test_the_first_switch_behind_a_gateway_stops_the_server_that_holds_its_port_and_routes_the_variant():
    """A host that ran its server on the service's port before the gateway: the gateway's unit binds the
    port once the switch stops that server; the outage is counted from the gateway's part of the switch."""
    host = FakeHost()
    install(host, PLAIN)
    result = run(host, gateway=dict(GW, url="http://0.0.0.0:30000"), v=DDTREE)
    assert result["outcome"] == "switched" and routed(host) == [DDTREE_URL]
    gw = result["record"]["gateway"]
    assert gw["out"] == {"removed": False, "migrating": True} and gw["unavailable_s"] > 0
    assert host.kinds("gateway_out") == []


FLEET_GW = {"url": "http://10.0.0.1:31000", "control_key": "fleet-control-key", "worker_url": "http://10.0.0.7:30000/",
            "timeout": 60}


def test_a_fleet_gateway_takes_the_host_out_by_its_own_address_and_puts_it_back_once_it_serves():
    """A gateway on another host: the host's server is known to it by the host's address; the same port on
    both sides is not the first switch onto a host's own gateway; no workers file is written."""
    host = FakeHost()
    install(host, PLAIN)  # 127.0.0.1:30000, the gateway's worker http://10.0.0.7:30000
    host.gateway_workers = {"http://10.0.0.7:30000": "w0"}
    host.gateway_reaches = {"http://10.0.0.7:30000": URL}
    result = run(host, v=NEXTN, gateway=dict(FLEET_GW, url="http://10.0.0.1:30000"))
    assert result["outcome"] == "switched"
    gw = result["record"]["gateway"]
    assert gw["worker"] == "http://10.0.0.7:30000" and gw["out"]["removed"] is True and gw["unavailable_s"] > 0
    assert ("gateway_out", "http://10.0.0.7:30000") in host.calls and routed(host) == ["http://10.0.0.7:30000"]
    assert not [c for c in host.calls if c[0] == "write" and "workers" in c[1]]
    assert "fleet-control-key" not in json.dumps(result)


def test_a_fleet_gateway_needs_its_key_and_a_worker_url_that_is_one():
    with pytest.raises(_switch.SwitchError, match="a gateway on another host needs its control_key"):
        _switch.Switch(settings(gateway=dict(FLEET_GW, control_key=None)), FakeHost())
    with pytest.raises(_switch.SwitchError, match="gateway.worker_url must be an http"):
        _switch.Switch(settings(gateway=dict(FLEET_GW, worker_url="10.0.0.7:30000")), FakeHost())
