"""_switch with two slots: the blue/green path driven in-process through a fake host with two units and a
gateway, every outcome, the gateway's order (never without a ready server) and a kill in every state."""

from __future__ import annotations

import json

import pytest
from sim_helpers import FakeClocks

from ansible_collections.inferops.sglang.plugins.module_utils import _deploy
from ansible_collections.inferops.sglang.plugins.module_utils import _slots
from ansible_collections.inferops.sglang.plugins.module_utils import _switch
from ansible_collections.inferops.sglang.plugins.module_utils._switch import HostError, State

SERVICE = "sglang-qwen.service"
GREEN = "sglang-qwen-green.service"
SDIR = "/var/lib/inferops-sglang/sglang-qwen"
CONFIG = "/etc/sglang/sglang-qwen.yaml"
CURRENT = f"{SDIR}/current.json"
MARKER = f"{SDIR}/switch.json"
WORKERS = f"{SDIR}/gateway-workers.json"
PORTS = {"blue": 30010, "green": 30011}
GATEWAY = {"url": "http://127.0.0.1:30000", "control_key_file": "/etc/sglang/sglang-qwen.gateway-key",
           "workers_file": WORKERS, "timeout": 60, "metrics_url": "http://127.0.0.1:29000/metrics"}
WALL0 = 1750000000.0


def files(unit: str) -> list[dict]:
    return [{"name": unit, "src": f"/etc/systemd/system/{unit}", "mode": "0644", "template": "sglang.service.j2"},
            {"name": "sglang-qwen.yaml", "src": CONFIG, "mode": "0600", "template": "sglang.config.yaml.j2"},
            {"name": "current.json", "src": CURRENT, "mode": "0600", "template": None}]


def variant(name: str, slot: str, **params) -> dict:
    argv = ["--model-path", "/srv/models/q", "--host", "127.0.0.1", "--port", str(PORTS[slot]), "--tp-size", "2"]
    return {"variant": name, "argv": argv, "sglang_version": "0.5.11",
            "params": {"gate_timeout": 600, "max_running_requests": 8, "variant_name": name, **params}}


def url(slot: str) -> str:
    return f"http://127.0.0.1:{PORTS[slot]}"


class SlotsHost(FakeClocks):
    """Two units (blue, green) with their GPUs, files, a gateway that routes to a listed worker whose
    unit serves healthy on that URL, and clocks that move when slept on. ``routed_log`` keeps the
    ready workers after every gateway call: clients lose nothing while it is never empty."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.units: dict[str, dict] = {}
        self.healthy = {"nextn", "ddtree"}
        self.workers: list[str] = []
        self.routed_log: list[list[str]] = []
        self.calls: list[tuple] = []
        self.fail: dict[str, str] = {}
        self.die_at_gate: int | None = None   # the candidate's unit dies at this gate call
        self.gates = 0
        self.mono, self.wall = 1000.0, WALL0
        # clients: one request per second of the clock through the gateway, failed while nothing is routed
        self.answered = self.failed = 0
        self.counted_until = self.mono

    # state
    def serving_at(self, worker: str) -> str | None:
        for name, unit in self.units.items():
            if unit["active"] and unit["url"] == worker and unit["variant"] in self.healthy:
                return name
        return None

    def routed(self) -> list[str]:
        return [w for w in self.workers if self.serving_at(w)]

    def _op(self, *call) -> None:
        self.calls.append(call)
        if call[0] in self.fail:
            raise HostError(self.fail.pop(call[0]))

    # Host
    def unit_state(self, unit: str) -> dict:
        u = self.units.get(unit) or {}
        return {"active": bool(u.get("active")), "loaded": bool(u)}

    def stop(self, unit: str) -> None:
        self._op("stop", unit)
        if unit in self.units:
            self.units[unit]["active"] = False

    def start(self, unit: str) -> None:
        self._op("start", unit)
        doc = json.loads(self.files[f"/etc/systemd/system/{unit}"])
        self.units[unit] = dict(doc, active=True, enabled=True)

    def disable(self, unit: str) -> None:
        self._op("disable", unit)
        if unit in self.units:
            self.units[unit]["enabled"] = False

    def gpu_xids(self, gpus: list[int]) -> dict:
        return {"boot_id": "boot-1", "time": 0.0, "source": "journal", "events": []}

    def gpu_memory_used(self, gpus: list[int]) -> list[int]:
        held = {g for u in self.units.values() if u["active"] for g in u["gpus"]}
        return [40000 if g in held else 0 for g in gpus]

    def read_bytes(self, path: str) -> bytes | None:
        return self.files.get(path)

    def write_atomic(self, path: str, data: bytes, mode: int) -> None:
        self._op("write", path)
        self.files[path] = bytes(data)

    def append_line(self, path: str, line: str) -> None:
        self.files[path] = self.files.get(path, b"") + line.encode() + b"\n"

    def copy(self, src: str, dest: str, mode: int) -> None:
        self._op("copy", src, dest)
        if src not in self.files:
            raise HostError(f"{src} does not exist")
        self.files[dest] = self.files[src]

    def exists(self, path: str) -> bool:
        return path in self.files or any(p.startswith(path + "/") for p in self.files)

    def listdir(self, path: str) -> list[str]:
        return sorted({p[len(path) + 1:].split("/")[0] for p in self.files if p.startswith(path + "/")})

    def remove(self, path: str) -> None:
        for p in [p for p in self.files if p == path or p.startswith(path + "/")]:
            del self.files[p]

    def makedirs(self, path: str, mode: int) -> None:
        pass

    def gate(self, url_: str, api_key_file, timeout, settle, unit=None) -> dict:
        self.gates += 1
        self.calls.append(("gate", unit, url_))
        if self.die_at_gate == self.gates and unit in self.units:
            self.units[unit]["active"] = False
        u = self.units.get(unit) or {}
        if u.get("active") and u.get("url") == url_ and u.get("variant") in self.healthy:
            return {"ready": True, "failure": None, "cause": None, "elapsed": 2.0, "msg": f"ready on {url_}"}
        self.sleep(3)
        return {"ready": False, "failure": "unit_failed", "cause": "cuda_oom", "elapsed": 3.0,
                "msg": f"{unit} does not serve on {url_}: CUDA out of memory"}

    def drain(self, url_, api_key_file, timeout, interval, unit=None) -> dict:
        self.calls.append(("drain", unit))
        return {"drained": True, "seconds": 0.5, "msg": "no request in flight"}

    def bench(self, url_, api_key_file, load, baseline, thresholds, unit=None) -> dict:
        self.calls.append(("bench", unit))
        return {"passed": True, "figures": {"output_tokens_per_s": 100.0}, "msg": "measured"}

    def bench_pair(self, reference: dict, candidate: dict, load, thresholds) -> dict:
        self.calls.append(("bench_pair", reference["unit"], candidate["unit"]))
        speed = {"output_tokens_per_s": 100.0}
        return {"passed": True, "figures": speed, "reference": {"figures": dict(speed)}, "seconds": 8.0,
                "load": {"interleaved": True}, "comparison": {"passed": True, "checks": [], "method": "interleaved"},
                "msg": "measured"}

    def gateway_out(self, gateway: dict, worker: str) -> dict:
        self._op("gateway_out", worker)
        removed = worker in self.workers
        self.workers = [w for w in self.workers if w != worker]
        self.routed_log.append(self.routed())
        return {"removed": removed, "seconds": 0.01}

    def gateway_in(self, gateway: dict, worker: str, api_key_file) -> dict:
        self._op("gateway_in", worker)
        added = worker not in self.workers
        if added:
            self.workers.append(worker)
        self.routed_log.append(self.routed())
        if not self.serving_at(worker):
            raise HostError(f"the gateway did not route to {worker} within 60 s")
        return {"added": added, "seconds": 0.5}

    def sleep(self, seconds: float) -> None:
        self._clients()
        super().sleep(seconds)
        self._clients(routed=bool(self.routed()))

    def _clients(self, routed: bool | None = None) -> None:
        seconds = int(self.mono - self.counted_until)
        if seconds > 0:
            self.answered += seconds
            self.failed += 0 if (routed if routed is not None else bool(self.routed())) else seconds
            self.counted_until += seconds

    def gateway_responses(self, gateway: dict) -> dict:
        self._clients()
        return {"answered": self.answered, "failed": self.failed}

    def progress(self, event: dict) -> None:
        pass


def unit_file(v: dict, slot: str, gpus: list[int]) -> bytes:
    return json.dumps({"variant": v["variant"], "url": url(slot), "gpus": gpus}).encode()


def live_host(v: dict, slot: str = "blue", gpus: tuple = (0, 2)) -> SlotsHost:
    """``v`` serving in ``slot``, routed by the gateway, as an earlier deploy left it."""
    host = SlotsHost()
    unit = _slots.unit_of(SERVICE, slot)
    host.files[f"/etc/systemd/system/{unit}"] = unit_file(v, slot, list(gpus))
    host.files[CONFIG] = b'api-key: "k"\n'
    doc = {k: v[k] for k in ("variant", "params", "argv", "sglang_version")}
    host.files[CURRENT] = json.dumps(dict(doc, gpu_devices=list(gpus), slot=slot, unit=unit)).encode()
    host.start(unit)
    host.workers = [url(slot)]
    host.calls.clear()
    return host


def preflight(host: SlotsHost, v_name: str, params: dict | None = None, free=(3, 4, 5)) -> dict:
    """The preflight's decision from the host as it is (what sglang_preflight reads)."""
    current = json.loads(host.files[CURRENT]) if CURRENT in host.files else None
    unit = (current or {}).get("unit") or SERVICE
    live = _slots.live_of(current, SERVICE, host.unit_state(unit)["active"])
    marker = json.loads(host.files[MARKER]) if MARKER in host.files else None
    pool = sorted({0, 2, *free})
    busy = dict(zip(pool, host.gpu_memory_used(pool)))
    return _slots.decide(live, params, 2, pool, None, busy, 1024, True, SERVICE, PORTS, marker)


def run(host: SlotsHost, v_name: str, run_id: str = "run1", stop_at: State | None = None, soak: float = 30,
        perf_gate: str = "off", **params) -> dict:
    decision = preflight(host, v_name, variant(v_name, "blue", **params)["params"])
    slot = decision["slot"]
    v = variant(v_name, slot, **params)
    gpus = decision["gpus"] or [0, 2]
    staging = f"{SDIR}/staging/{run_id}"
    host.files[f"{staging}/{decision['unit']}"] = unit_file(v, slot, gpus)
    host.files[f"{staging}/sglang-qwen.yaml"] = b'api-key: "k"\n'
    settings = _switch.Settings(
        service=decision["unit"], service_dir=SDIR, files=files(decision["unit"]), staging=staging,
        baseline_staging=f"{staging}/baseline", variant=v, baseline=variant("nextn", slot), url=url(slot),
        run_id=run_id, host="ct129", gpus=gpus, release_timeout=10, gate_settle=0, perf_gate=perf_gate,
        perf_load={"requests": 4}, gateway=GATEWAY, slot=dict(decision, soak=soak))
    return _switch.Switch(settings, host, stop_at=stop_at).run()


def test_blue_green_routes_the_candidate_before_the_live_slot_leaves_and_retires_it_after_the_soak():
    host = live_host(variant("nextn", "blue"))
    result = run(host, "ddtree", perf_gate="report")
    rec = result["record"]
    assert result["outcome"] == "switched" and rec["running"] == "ddtree"
    assert rec["slot"]["mode"] == "blue_green" and rec["slot"]["slot"] == "green"
    assert rec["slot"]["gpus"] == [3, 4] and rec["slot"]["retired"] == SERVICE
    assert rec["gateway"]["unavailable_s"] == 0.0
    assert rec["gateway"]["requests"]["answered"] >= 30 and rec["gateway"]["requests"]["failed"] == 0
    # the gateway had a ready server after every call, the candidate in before the live slot out
    assert all(host.routed_log)
    ops = [c for c in host.calls if c[0] in ("gateway_in", "gateway_out", "stop", "start")]
    assert ops.index(("gateway_in", url("green"))) < ops.index(("gateway_out", url("blue"))) < ops.index(("stop", SERVICE))
    # both measured in one interleaved comparison, each by its own unit; the live slot's figures are the reference
    assert [c for c in host.calls if c[0].startswith("bench")] == [("bench_pair", SERVICE, GREEN)]
    assert rec["performance"]["known_good"]["source"] == "measured beside"
    assert rec["performance"]["known_good"]["figures"] == {"output_tokens_per_s": 100.0}
    # the soak probed the candidate, the live slot stayed loaded meanwhile
    assert rec["slot"]["soak"]["ok"] and rec["slot"]["soak"]["elapsed"] >= 30
    current = json.loads(host.files[CURRENT])
    assert (current["slot"], current["unit"], current["variant"], current["gpu_devices"]) == ("green", GREEN, "ddtree", [3, 4])
    assert not host.units[SERVICE]["active"] and not host.units[SERVICE]["enabled"]
    assert host.units[GREEN]["active"] and host.units[GREEN]["enabled"]
    assert json.loads(host.files[WORKERS]) == {"workers": [url("green")]}
    assert MARKER not in host.files
    assert f"{SDIR}/known-good/{GREEN}" in host.files and f"{SDIR}/known-good/{SERVICE}" not in host.files
    assert "Blue/green: slot green took the traffic from slot blue (nextn)" in result["summary"]
    assert _deploy.summary_row(rec)[:2] == ("switched", "ddtree (slot green)")


def test_a_candidate_that_fails_its_gate_is_refused_and_the_live_slot_is_never_touched():
    host = live_host(variant("nextn", "blue"))
    host.healthy = {"nextn"}
    result = run(host, "ddtree")
    rec = result["record"]
    assert result["outcome"] == "refused" and result["failed"] and rec["running"] == "nextn"
    assert rec["verdict"]["failure"] == "unit_failed" and rec["verdict"]["cause"] == "cuda_oom"
    assert not any(c[1] == SERVICE for c in host.calls if c[0] in ("stop", "start", "disable"))
    assert ("gateway_out", url("blue")) not in host.calls and host.workers == [url("blue")]
    assert not host.units[GREEN]["active"] and not host.units[GREEN]["enabled"]
    assert json.loads(host.files[CURRENT])["unit"] == SERVICE and MARKER not in host.files
    assert "REFUSED beside the live service; nextn serves, untouched" in result["summary"]
    assert _deploy.summary_row(rec)[:2] == ("refused, live untouched", "nextn (slot blue)")


def test_a_candidate_the_gateway_does_not_route_is_taken_out_again_and_refused():
    host = live_host(variant("nextn", "blue"))
    host.fail["gateway_in"] = "the gateway did not route to it within 60 s"
    result = run(host, "ddtree")
    assert result["outcome"] == "refused" and result["record"]["verdict"]["failure"] == "not_routed"
    assert host.workers == [url("blue")] and all(host.routed_log)
    assert json.loads(host.files[WORKERS]) == {"workers": [url("blue")]}


def test_a_candidate_that_dies_in_the_soak_gives_the_traffic_back_to_the_loaded_old_slot():
    host = live_host(variant("nextn", "blue"))
    host.die_at_gate = 3  # the gate, then two soak probes: it dies under its first real traffic
    result = run(host, "ddtree", soak=60)
    rec = result["record"]
    assert result["outcome"] == "rolled_back" and rec["running"] == "nextn"
    assert rec["rollback"]["source"] == "live_slot" and rec["rollback"]["ready"]
    assert rec["slot"]["soak"]["ok"] is False and rec["verdict"]["failure"] == "unit_failed"
    # the old slot was never stopped: back in the gateway, then the candidate out and stopped
    assert ("stop", SERVICE) not in host.calls and host.units[SERVICE]["active"]
    ops = [c for c in host.calls if c[0] in ("gateway_in", "gateway_out")]
    assert ops[-2:] == [("gateway_in", url("blue")), ("gateway_out", url("green"))]
    assert host.workers == [url("blue")] and json.loads(host.files[WORKERS]) == {"workers": [url("blue")]}
    assert json.loads(host.files[CURRENT])["slot"] == "blue" and not host.units[GREEN]["enabled"]


def test_a_live_slot_that_moved_since_the_preflight_changes_nothing():
    host = live_host(variant("nextn", "blue"))
    decision = preflight(host, "ddtree", {"other": 1})
    host.files[CURRENT] = json.dumps(dict(json.loads(host.files[CURRENT]), slot="green", unit=GREEN)).encode()
    v = variant("ddtree", "green")
    settings = _switch.Settings(service=GREEN, service_dir=SDIR, files=files(GREEN), staging=f"{SDIR}/staging/r",
                                baseline_staging=f"{SDIR}/staging/r/baseline", variant=v, baseline=v, url=url("green"),
                                run_id="r", gpus=[3, 4], gateway=GATEWAY, slot=dict(decision, soak=0))
    result = _switch.Switch(settings, host).run()
    assert result["outcome"] == "failed_before_switching" and "deploy again" in result["msg"]
    assert not [c for c in host.calls if c[0] not in ("gate",)]


def test_the_same_variant_again_is_its_own_slot_in_place_and_unchanged_decisions():
    host = live_host(variant("nextn", "blue"))
    same = preflight(host, "nextn", variant("nextn", "blue")["params"])
    assert same["mode"] == "in_place" and same["slot"] == "blue" and same["gpus"] == [0, 2]
    assert preflight(host, "ddtree", {"x": 1}, free=(3,))["mode"] == "in_place"


@pytest.mark.parametrize("state", [s for s in State if (s.value.startswith("slot_") and s != State.SLOT_RECOVER)
                                   or s in (State.CUTOVER, State.SOAK, State.RETIRE)])
def test_killed_in_any_blue_green_state_the_next_deploy_ends_routed_to_what_current_json_names(state):
    host = live_host(variant("nextn", "blue"))
    if state in (State.SLOT_BACK,):
        host.die_at_gate = 2
    if state == State.SLOT_ABANDON:
        host.healthy = {"nextn"}
    with pytest.raises(_switch.Interrupted):
        run(host, "ddtree", stop_at=state)
    host.healthy = {"nextn", "ddtree"}
    host.die_at_gate = None
    # the next deploy of the same variant, decided from the host as the kill left it
    result = run(host, "ddtree", run_id="run2")
    assert result["outcome"] in ("switched", "unchanged"), result["msg"]
    current = json.loads(host.files[CURRENT])
    live_unit = current["unit"]
    assert current["variant"] == "ddtree" and host.units[live_unit]["active"]
    assert host.workers == [url(current["slot"])]
    other = GREEN if live_unit == SERVICE else SERVICE
    assert not host.units.get(other, {}).get("active")
    assert MARKER not in host.files


def test_decide_free_gpus_busy_gpus_given_gpus_and_hosts_without_gpus():
    live = {"slot": "blue", "unit": SERVICE, "variant": "nextn", "url": url("blue"), "gpus": [0, 2], "active": True,
            "params": {"a": 1}}
    pool = [0, 2, 3, 4, 5, 6, 7]
    bg = _slots.decide(live, {"a": 2}, 2, pool, None, {3: 30000}, 1024, True, SERVICE, PORTS)
    assert (bg["mode"], bg["slot"], bg["unit"], bg["port"], bg["gpus"]) == ("blue_green", "green", GREEN, 30011, [4, 5])
    short = _slots.decide(live, {"a": 2}, 4, [0, 2, 3, 4, 5], None, {3: 30000}, 1024, True, SERVICE, PORTS)
    assert short["mode"] == "in_place" and "GPU 3 holds 30000 MiB" in short["why"] and short["gpus"] is None
    given = _slots.decide(live, {"a": 2}, 2, pool, [2, 3], {}, 1024, True, SERVICE, PORTS)
    assert given["mode"] == "in_place" and "[2]" in given["why"]
    cpu = _slots.decide(live, {"a": 2}, 1, [], [0], {}, 1024, False, SERVICE, PORTS)
    assert cpu["mode"] == "blue_green" and cpu["gpus"] == [0] and "check_gpus is false" in cpu["why"]
    first = _slots.decide(None, {"a": 2}, 2, pool, None, {}, 1024, True, SERVICE, PORTS)
    assert (first["mode"], first["slot"], first["unit"]) == ("in_place", "blue", SERVICE)
    down = _slots.decide(dict(live, active=False), {"a": 2}, 2, pool, None, {}, 1024, True, SERVICE, PORTS)
    assert down["mode"] == "in_place" and "not running" in down["why"]
    migrating = _slots.decide(dict(live, url="http://0.0.0.0:30000"), {"a": 2}, 2, pool, None, {}, 1024, True,
                              SERVICE, PORTS)
    assert migrating["mode"] == "in_place" and "moves there (behind the gateway) in place first" in migrating["why"]
    repair = _slots.decide(live, {"a": 2}, 2, pool, None, {}, 1024, True, SERVICE, PORTS, {"state": "gate"})
    assert repair["mode"] == "in_place" and "interrupted in-place switch" in repair["why"]
    green_live = _slots.live_of({"variant": "x", "slot": "green", "argv": ["--port", "30011"], "gpu_devices": [3, 4]},
                                SERVICE, True)
    assert (green_live["unit"], green_live["url"]) == (GREEN, "http://127.0.0.1:30011")
    assert _slots.live_of({"variant": "x"}, SERVICE, True)["unit"] == SERVICE  # written before slots: blue's
    with pytest.raises(_slots.SlotError):
        _slots.unit_of(SERVICE, "red")


def test_a_blue_green_switch_without_the_hosts_gateway_is_refused_before_anything_runs():
    host = live_host(variant("nextn", "blue"))
    decision = preflight(host, "ddtree", {"x": 1})
    v = variant("ddtree", "green")
    with pytest.raises(_switch.SwitchError, match="needs the host's own gateway"):
        _switch.Switch(_switch.Settings(service=GREEN, service_dir=SDIR, files=files(GREEN), staging="/s",
                                        baseline_staging="/s/b", variant=v, baseline=v, url=url("green"), run_id="r",
                                        slot=dict(decision, soak=0)), host)


def test_a_recovery_cut_short_itself_is_recovered_by_the_next_run():
    host = live_host(variant("nextn", "blue"))
    with pytest.raises(_switch.Interrupted):
        run(host, "ddtree", stop_at=State.SOAK)        # both slots run, the candidate alone routed
    assert host.workers == [url("green")] and host.units[SERVICE]["active"]
    with pytest.raises(_switch.Interrupted):
        run(host, "ddtree", run_id="run2", stop_at=State.SLOT_RECOVER)
    result = run(host, "ddtree", run_id="run3")
    assert result["outcome"] == "switched" and result["record"]["repaired_interrupted_run"]
    assert result["record"]["slot"]["recovered"]["state"] == "soak"
    assert json.loads(host.files[CURRENT])["slot"] == "green" and host.workers == [url("green")]
    assert not host.units[SERVICE]["active"] and all(host.routed_log)


def test_the_gateway_down_refuses_the_candidate_before_it_starts_and_leaves_the_live_slot_alone():
    host = live_host(variant("nextn", "blue"))
    host.fail["gateway_out"] = "cannot reach the gateway at http://127.0.0.1:30000: connection refused"
    result = run(host, "ddtree")
    assert result["outcome"] == "refused" and "connection refused" in result["record"]["verdict"]["msg"]
    assert not [c for c in host.calls if c[0] in ("start", "copy") or (c[0] == "stop" and c[1] == SERVICE)]
    assert host.units[SERVICE]["active"] and host.workers == [url("blue")]


def test_check_mode_says_a_blue_green_switch_would_run_and_changes_nothing():
    host = live_host(variant("nextn", "blue"))
    decision = preflight(host, "ddtree", {"x": 1})
    v = variant("ddtree", "green")
    settings = _switch.Settings(service=GREEN, service_dir=SDIR, files=files(GREEN), staging=f"{SDIR}/staging/r",
                                baseline_staging=f"{SDIR}/staging/r/baseline", variant=v, baseline=v, url=url("green"),
                                run_id="r", gpus=[3, 4], gateway=GATEWAY, slot=dict(decision, soak=0),
                                changed_files=[GREEN])
    plan = _switch.Switch(settings, host).plan()
    assert plan["switch"] and plan["would"][:3] == ["decide", "slot_tidy", "slot_install"]
    assert plan["would"][-1] == "switched" and "cutover" in plan["would"] and "retire" in plan["would"]
    assert not [c for c in host.calls if c[0] != "gate"]


def test_a_live_service_deployed_before_slots_is_blue_and_a_candidate_runs_beside_it():
    host = live_host(variant("nextn", "blue"))
    doc = json.loads(host.files[CURRENT])
    del doc["slot"], doc["unit"]
    host.files[CURRENT] = json.dumps(doc).encode()   # as a switch without slots wrote it
    host.files[f"{SDIR}/known-good/{SERVICE}"] = b"the known-good unit"
    result = run(host, "ddtree")
    assert result["outcome"] == "switched" and result["record"]["slot"]["live"]["unit"] == SERVICE
    assert result["before"]["unit"] == SERVICE and result["before"]["known_good"]
    assert json.loads(host.files[CURRENT])["unit"] == GREEN and not host.units[SERVICE]["active"]


def test_a_refused_candidate_says_what_the_gateways_clients_got_meanwhile():
    host = live_host(variant("nextn", "blue"))
    host.healthy = {"nextn"}
    rec = run(host, "ddtree")["record"]
    assert rec["outcome"] == "refused" and rec["gateway"]["requests"]["failed"] == 0
    assert rec["gateway"]["requests"]["answered"] >= 3  # the candidate's failed gate took 3 s of the clock
