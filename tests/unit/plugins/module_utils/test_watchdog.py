"""The watchdog (plugins/module_utils/_watchdog.py): its settings, its count of failed probes,
the backoff of its restarts, and one run on a host as systemd starts it (systemctl and the
gate replaced by recorders; the deploy lock, the state and the records are real files).
The probe against a real wedged server: tests/conformance/test_real_gate.py (real SGLang)
and tests/unit/lab/test_simulator_readiness.py (the simulator's wedge)."""

from __future__ import annotations

import io
import json
import os
import time

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _gateway
from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_lock as lock
from ansible_collections.inferops.sglang.plugins.module_utils import _watchdog as wd

UNIT = "sglang-qwen.service"
OK = {"ready": True, "generation": {"completion_tokens": 8, "latency": 0.4}, "msg": "ready"}
WEDGED = {"ready": False, "failure": "not_ready", "phase": "health", "cause": None, "detail": "no verdict within 30 s",
          "elapsed": 30.0, "msg": "not ready: /health answered 503"}


def settings(tmp_path, **kw) -> dict:
    return wd.load_settings({"unit": UNIT, "url": "http://127.0.0.1:30000", "service_dir": str(tmp_path), **kw})


# -- settings ------------------------------------------------------------------------

def test_settings_take_the_defaults_and_refuse_what_cannot_run():
    got = wd.load_settings({"unit": UNIT, "url": "http://127.0.0.1:30000", "service_dir": "/x"})
    assert (got["interval"], got["failures"], got["timeout"], got["action"]) == (30, 3, 30, "restart")
    with pytest.raises(wd.WatchdogError) as exc:
        wd.load_settings({"unit": UNIT, "action": "reboot", "failures": 0, "backoff": 600, "backoff_max": 60,
                          "colour": "red", "timeout": True})
    text = str(exc.value)
    for part in ("unknown setting colour", "url is required", "service_dir is required", "action must be one of",
                 "failures must be a number >= 1", "timeout must be a number >= 1"):
        assert part in text, text
    with pytest.raises(wd.WatchdogError, match="backoff_max must be >= backoff"):
        wd.load_settings({"unit": UNIT, "url": "u", "service_dir": "/x", "backoff": 600, "backoff_max": 60})
    with pytest.raises(wd.WatchdogError, match="not a JSON object"):
        wd.load_settings([])


# -- the count -------------------------------------------------------------------------

def test_failures_in_a_row_restart_once_the_count_is_reached(tmp_path):
    s = settings(tmp_path, failures=3)
    state = dict(wd.fresh_state("a"), served=True)
    events = []
    for _probe in range(3):
        state, event = wd.decide(s, state, WEDGED, 5000.0, 1000.0)
        events.append((event, state["failures"]))
    assert events == [("failed", 1), ("failed", 2), ("restart", 3)]
    # one good probe in between starts the count again
    state, event = wd.decide(s, dict(wd.fresh_state("a"), served=True, failures=2), OK, 5000.0, 1000.0)
    assert (event, state["failures"]) == ("recovered", 0)


def test_a_run_that_has_not_served_is_not_judged_inside_its_start_grace(tmp_path):
    s = settings(tmp_path, failures=1, start_grace=900)
    state, event = wd.decide(s, wd.fresh_state("a"), WEDGED, 120.0, 1000.0)
    assert (event, state["failures"]) == ("starting", 0)
    # past the grace it counts; and a run that served once counts at any age
    assert wd.decide(s, wd.fresh_state("a"), WEDGED, 901.0, 1000.0)[1] == "restart"
    assert wd.decide(s, dict(wd.fresh_state("a"), served=True), WEDGED, 10.0, 1000.0)[1] == "restart"


def test_restarts_back_off_and_are_held_back_once_per_episode(tmp_path):
    s = settings(tmp_path, failures=1, backoff=60, backoff_max=200)
    assert [wd.backoff_for(s, n) for n in range(5)] == [0.0, 60.0, 120.0, 200.0, 200.0]
    # one restart 30 s ago did not bring it back: the next waits 60 s after it
    state = dict(wd.fresh_state("b"), served=True, restarts_in_a_row=1, last_restart=970.0)
    state, event = wd.decide(s, state, WEDGED, 5000.0, 1000.0)
    assert event == "held_back" and state["held_back"] is True
    state, event = wd.decide(s, state, WEDGED, 5000.0, 1010.0)
    assert event == "failed"  # said once
    assert wd.decide(s, state, WEDGED, 5000.0, 1031.0)[1] == "restart"


def test_report_only_reports_once_per_episode(tmp_path):
    s = settings(tmp_path, failures=2, action="report")
    state = dict(wd.fresh_state("c"), served=True)
    events = []
    for verdict in (WEDGED, WEDGED, WEDGED, OK, WEDGED, WEDGED):
        state, event = wd.decide(s, state, verdict, 5000.0, 1000.0)
        events.append(event)
    assert events == ["failed", "report", "failed", "recovered", "failed", "report"]


# -- one run on a host -----------------------------------------------------------------

class Host:
    """systemctl as the watchdog calls it: the unit's properties, and restarts recorded."""

    def __init__(self, active: str = "active", invocation: str = "inv-1", pid: int = 4242) -> None:
        self.active, self.invocation, self.pid = active, invocation, pid
        self.calls: list[list[str]] = []
        self.restart_rc = 0
        self.lock_during_restart: dict | None = None
        self.lock_file: str | None = None

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        self.calls.append(argv)
        if argv[:2] == ["systemctl", "show"]:
            return 0, (f"LoadState=loaded\nActiveState={self.active}\nSubState=running\n"
                       f"InvocationID={self.invocation}\nMainPID={self.pid}\n"), ""
        if argv[:2] == ["systemctl", "restart"]:
            self.lock_during_restart = lock.read(self.lock_file) if self.lock_file else None
            if self.restart_rc == 0:
                self.invocation, self.pid = self.invocation + "+", self.pid + 1
            return self.restart_rc, "", "Job for sglang-qwen.service failed." if self.restart_rc else ""
        raise AssertionError(f"unexpected command {argv}")

    def restarts(self) -> int:
        return sum(1 for argv in self.calls if argv[:2] == ["systemctl", "restart"])


def gate_returning(*verdicts, age: float = 5000.0):
    """A gate class whose runs return these verdicts in turn; the watcher reports ``age``."""
    queue = list(verdicts)

    class FakeGate:
        def __init__(self, client, watcher, **kw) -> None:
            self.client, self.kw = client, kw
            watcher.start_mono = time.monotonic() - age

        def run(self) -> dict:
            FakeGate.seen.append((self.client.api_key, self.kw))
            return queue.pop(0)

    FakeGate.seen = []
    return FakeGate


def one_run(s: dict, host: Host, gate, now: float = 1_000_000.0) -> tuple[str, str]:
    out = io.StringIO()
    host.lock_file = str(lockfile(s))
    event = wd.Watchdog(s, run=host, out=out, now=lambda: now, gate_class=gate).run()
    return event, out.getvalue()


def lockfile(s: dict):
    from pathlib import Path
    return Path(s["service_dir"]) / "deploy.lock"


def records(s: dict) -> list[dict]:
    from pathlib import Path
    path = Path(s["service_dir"]) / "watchdog" / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_three_wedged_probes_restart_the_unit_under_the_deploy_lock_and_record_it(tmp_path):
    s = settings(tmp_path, failures=3, timeout=20, max_tokens=4)
    host = Host()
    gate = gate_returning(OK, WEDGED, WEDGED, WEDGED)
    events = [one_run(s, host, gate)[0] for _probe in range(4)]
    assert events == ["ok", "failed", "failed", "restarted"]
    assert host.restarts() == 1
    # the gate ran with the watchdog's timeout, one generation, no settle
    assert gate.seen[0][1]["timeout"] == 20.0 and gate.seen[0][1]["settle"] == 0.0
    assert gate.seen[0][1]["generations"] == 1 and gate.seen[0][1]["max_tokens"] == 4
    # the restart ran under the host's deploy lock, held by the watchdog, released after
    assert host.lock_during_restart["controller_user"] == "root (watchdog)"
    assert host.lock_during_restart["run_id"].startswith("watchdog-")
    assert not lockfile(s).exists()
    (rec,) = records(s)
    assert rec["event"] == "restarted" and rec["failures"] == 3 and rec["invocation"] == "inv-1"
    assert rec["main_pid"] == 4242 and rec["probe"]["failure"] == "not_ready" and rec["unit"] == UNIT
    assert "3 probes in a row failed" in rec["msg"] and "restarted sglang-qwen.service" in rec["msg"]
    state = json.loads((tmp_path / "watchdog" / "state.json").read_text())
    assert state["invocation"] == "inv-1+" and state["restarts_in_a_row"] == 1 and state["failures"] == 0


def test_the_restarted_run_is_given_its_start_grace_then_recovers(tmp_path):
    s = settings(tmp_path, failures=1, start_grace=600)
    host = Host()
    assert one_run(s, host, gate_returning(dict(OK)))[0] == "ok"
    assert one_run(s, host, gate_returning(WEDGED))[0] == "restarted"
    # the new run answers nothing yet: starting, not counted; then it serves
    assert one_run(s, host, gate_returning(WEDGED, age=30.0))[0] == "starting"
    event, said = one_run(s, host, gate_returning(OK, age=60.0))
    assert event == "recovered" and said.startswith("<6>") and "(recovered)" in said
    assert [r["event"] for r in records(s)] == ["restarted", "recovered"]


def test_a_deploy_holding_the_lock_silences_the_watchdog(tmp_path):
    s = settings(tmp_path, failures=1)
    now = 1_000_000.0
    holder = {"service": UNIT, "variant": "shadow-balanced", "controller_user": "alice", "controller_host": "ctl-1",
              "controller_pid": 77, "awx_job_id": None}
    assert lock.acquire(str(lockfile(s)), "run-9", holder, lease=1800, now=lambda: now)["acquired"]
    host = Host()
    gate = gate_returning(WEDGED)
    event, said = one_run(s, host, gate, now=now)
    assert event == "deploying" and "run run-9 by alice@ctl-1" in said and "not probing" in said
    assert gate.seen == [] and host.calls == [] and records(s) == []
    # a lease that ran out is a deploy that is gone: the watchdog probes again
    event, _said = one_run(s, host, gate, now=now + 1801)
    assert event == "restarted"
    assert host.restarts() == 1 and lock.read(str(lockfile(s))) is None


def test_a_deploy_that_takes_the_lock_first_wins(tmp_path, monkeypatch):
    s = settings(tmp_path, failures=1)
    host = Host()
    real_acquire = lock.acquire

    def deploy_first(path, run_id, holder, **kw):
        real_acquire(path, "run-deploy", dict(holder, controller_user="bob"), lease=1800, now=kw["now"])
        return real_acquire(path, run_id, holder, **kw)

    monkeypatch.setattr(lock, "acquire", deploy_first)
    event, said = one_run(s, host, gate_returning(dict(WEDGED)))
    assert event == "deploying" and "a deploy took the lock first (bob@" in said
    assert host.restarts() == 0 and lock.read(str(lockfile(s)))["run_id"] == "run-deploy"


def test_a_unit_that_is_not_active_is_left_to_systemd(tmp_path):
    s = settings(tmp_path, failures=1)
    host = Host(active="failed")
    gate = gate_returning()
    event, said = one_run(s, host, gate)
    assert event == "inactive" and "is failed/running: nothing to probe" in said and gate.seen == []


def test_another_run_of_the_unit_starts_the_count_again(tmp_path):
    s = settings(tmp_path, failures=2)
    host = Host()
    assert one_run(s, host, gate_returning(OK))[0] == "ok"
    assert one_run(s, host, gate_returning(WEDGED))[0] == "failed"
    host.invocation = "inv-2"  # a deploy switched the unit meanwhile
    assert one_run(s, host, gate_returning(WEDGED))[0] == "failed"
    assert json.loads((tmp_path / "watchdog" / "state.json").read_text())["failures"] == 1


def test_an_interrupted_switch_is_not_restarted(tmp_path):
    s = settings(tmp_path, failures=1)
    (tmp_path / "switch.json").write_text("{}")
    host = Host()
    event, said = one_run(s, host, gate_returning(WEDGED))
    assert event == "interrupted_switch" and host.restarts() == 0
    assert "a switch was interrupted (switch.json)" in said and said.startswith("<3>")
    # said and recorded once, not at every probe, until the next deploy (another run) or a recovery
    assert one_run(s, host, gate_returning(WEDGED))[0] == "failed"
    assert [r["event"] for r in records(s)] == ["interrupted_switch"] and host.restarts() == 0


def test_a_failed_restart_is_recorded_as_such(tmp_path):
    s = settings(tmp_path, failures=1)
    host = Host()
    host.restart_rc = 1
    event, said = one_run(s, host, gate_returning(WEDGED))
    assert event == "restart_failed" and "Job for sglang-qwen.service failed." in said
    assert records(s)[0]["event"] == "restart_failed" and not lockfile(s).exists()
    # a failed try counts as a restart for the backoff: the next probe does not try again at once
    assert one_run(s, host, gate_returning(WEDGED))[0] == "held_back" and host.restarts() == 1


def test_report_mode_never_restarts(tmp_path):
    s = settings(tmp_path, failures=2, action="report")
    host = Host()
    events = [one_run(s, host, gate_returning(WEDGED))[0] for _probe in range(3)]
    assert events == ["failed", "report", "failed"] and host.restarts() == 0
    assert [r["event"] for r in records(s)] == ["report"]


def test_the_key_is_read_from_the_config_file_and_never_printed(tmp_path):
    config = tmp_path / "sglang-qwen.yaml"
    config.write_text('model-path: /srv/models/x\napi-key: "k3y-Secret-99"\n')
    s = settings(tmp_path, failures=1, action="report", api_key_file=str(config))
    verdict = dict(WEDGED, msg="not ready: POST /generate with Bearer k3y-Secret-99 timed out")
    gate = gate_returning(verdict)
    event, said = one_run(s, Host(), gate)
    assert gate.seen[0][0] == "k3y-Secret-99"
    assert event == "report" and "k3y-Secret-99" not in said and "********" in said
    assert "k3y-Secret-99" not in (tmp_path / "watchdog" / "state.json").read_text()
    assert "k3y-Secret-99" not in (tmp_path / "watchdog" / "history.jsonl").read_text() and records(s)[0]["event"] == "report"
    # a key the watchdog cannot read, or one the server refuses, is the watchdog's problem:
    # never counted, never a restart
    (tmp_path / "other").mkdir()
    s2 = settings(tmp_path / "other", failures=1, api_key_file=str(tmp_path / "missing.yaml"))
    host = Host()
    event, said = one_run(s2, host, gate_returning())
    assert event == "cannot_probe" and "the watchdog cannot probe" in said and "missing.yaml" in said
    refused = dict(WEDGED, failure="unauthorized", msg="unauthorized: /v1/models answered HTTP 401")
    s3 = settings(tmp_path / "other", failures=1)
    event, said = one_run(s3, host, gate_returning(refused))
    assert event == "cannot_probe" and host.restarts() == 0 and said.startswith("<3>")


def test_secret_looking_values_are_masked_in_lines_and_records_which_stay_json(tmp_path):
    """Without a key file the watchdog knows no key, yet what the gate reports can quote one
    (a log line with SGLang's server_args, a command line, a header): masked in the journal
    line and in the record, whose line still parses (a record that does not is lost)."""
    s = settings(tmp_path, failures=1, action="report")
    detail = ("server_args=ServerArgs(api_key='k3y-in-log', port=30000) --admin-api-key adm1n "
              '{"api_key": "j50n"} Authorization: Bearer b3arer')
    verdict = dict(WEDGED, msg=f"not ready: {detail}", detail=detail)
    event, said = one_run(s, Host(), gate_returning(verdict))
    assert event == "report"
    written = (tmp_path / "watchdog" / "history.jsonl").read_text()
    for secret in ("k3y-in-log", "adm1n", "j50n", "b3arer"):
        assert secret not in said and secret not in written, secret
    masked = ('server_args=ServerArgs(api_key=********, port=30000) --admin-api-key ******** '
              '{"api_key": ********} Authorization: Bearer ********')
    assert masked in said
    record = records(s)[0]
    assert record["event"] == "report" and record["probe"]["detail"] == masked and masked in record["msg"]


def test_a_service_never_deployed_is_not_watched(tmp_path):
    s = settings(tmp_path / "absent")
    host = Host()
    event, said = one_run(s, host, gate_returning())
    assert event == "not_deployed" and "nothing deployed here" in said and host.calls == []
    assert not (tmp_path / "absent").exists()


def test_a_healthy_run_writes_its_state_once(tmp_path):
    s = settings(tmp_path)
    host = Host()
    one_run(s, host, gate_returning(OK))
    state = tmp_path / "watchdog" / "state.json"
    stamp = state.stat().st_mtime_ns
    state.touch()
    os.utime(state, ns=(stamp, stamp))
    one_run(s, host, gate_returning(OK))
    assert state.stat().st_mtime_ns == stamp


def test_main_refuses_bad_settings_with_a_clear_message(tmp_path, capsys):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"unit": UNIT, "url": "u", "service_dir": str(tmp_path), "failures": 0}))
    assert wd.main([str(path)]) == 2
    assert "failures must be a number >= 1" in capsys.readouterr().err
    assert wd.main([]) == 2


def test_with_two_slots_the_watchdog_watches_and_restarts_the_live_one_current_json_names(tmp_path):
    s = settings(tmp_path, failures=1)
    (tmp_path / "current.json").write_text(json.dumps({
        "variant": "ddtree", "slot": "green", "unit": "sglang-qwen-green.service",
        "argv": ["--model-path", "/m", "--host", "127.0.0.1", "--port", "30011"]}))
    host = Host()
    gate = gate_returning(WEDGED)
    assert one_run(s, host, gate)[0] == "restarted"
    assert host.calls[0][-1] == "sglang-qwen-green.service"
    assert ["systemctl", "restart", "sglang-qwen-green.service"] in host.calls
    assert records(s)[0]["unit"] == "sglang-qwen-green.service"


class FakeGateway:
    """The worker API as the watchdog uses it: ``listed`` {url: status}; ``routes``: whether an added worker turns ready."""

    def __init__(self, listed: dict, routes: bool = True) -> None:
        self.listed, self.routes, self.calls = dict(listed), routes, []

    def __call__(self, client):
        self.calls.append(("client", client.url, client.api_key))
        return self

    def find(self, url):
        status = self.listed.get(url)
        return None if status is None else {"id": "w1", "url": url, "status": status, "healthy": status == "ready"}

    def wait_gone(self, worker_id, timeout):
        self.calls.append(("wait_gone", worker_id))
        self.listed = {u: s for u, s in self.listed.items() if s != "draining"}

    def add(self, url, api_key=None):
        self.calls.append(("add", url, api_key))
        if self.routes:  # a gateway that cannot use it drops it again (smg's job does)
            self.listed[url] = "pending"

    def wait_ready(self, url, timeout):
        if not self.routes:
            raise _gateway.GatewayError(f"the gateway did not route to {url} within {timeout:g} s: listed as pending")
        self.listed[url] = "ready"
        return {"worker": self.find(url), "seconds": 0.6}


def gateway_settings(tmp_path, **kw) -> dict:
    (tmp_path / "gateway-key").write_text("ctl-key-for-the-test\n")
    return settings(tmp_path, gateway={"url": "http://127.0.0.1:30000", "control_key_file": str(tmp_path / "gateway-key"),
                                       "timeout": 30}, **kw)


def test_behind_the_gateway_a_serving_server_it_does_not_list_is_put_back_with_its_key(tmp_path):
    s = gateway_settings(tmp_path)
    fake = FakeGateway({})
    event = wd.Watchdog(s, run=Host(), out=io.StringIO(), now=lambda: 1_000_000.0, gate_class=gate_returning(OK),
                        gateway_class=fake).run()
    assert event == "gateway_routed"
    assert fake.calls[0] == ("client", "http://127.0.0.1:30000", "ctl-key-for-the-test")
    assert ("add", s["url"].rstrip("/"), None) in fake.calls and fake.listed == {s["url"].rstrip("/"): "ready"}
    (rec,) = records(s)
    assert rec["event"] == "gateway_routed" and "put back, routed in 0.6 s" in rec["msg"]
    # listed (draining: a switch cut short after taking it out) is taken as not listed; listed ready is left alone
    fake = FakeGateway({s["url"].rstrip("/"): "draining"})
    assert wd.Watchdog(s, run=Host(), out=io.StringIO(), now=lambda: 1_000_000.0, gate_class=gate_returning(OK),
                       gateway_class=fake).run() == "gateway_routed"
    assert ("wait_gone", "w1") in fake.calls
    fake = FakeGateway({s["url"].rstrip("/"): "ready"})
    assert wd.Watchdog(s, run=Host(), out=io.StringIO(), now=lambda: 1_000_000.0, gate_class=gate_returning(OK),
                       gateway_class=fake).run() == "ok"
    assert not [c for c in fake.calls if c[0] == "add"]


def test_a_gateway_that_will_not_route_is_reported_once_and_a_server_that_does_not_serve_is_not_put_in(tmp_path):
    s = gateway_settings(tmp_path, failures=3)
    fake = FakeGateway({}, routes=False)
    for _run in range(2):
        event = wd.Watchdog(s, run=Host(), out=io.StringIO(), now=lambda: 1_000_000.0, gate_class=gate_returning(OK),
                            gateway_class=fake).run()
        assert event == "gateway_unrouted"
    assert [r["event"] for r in records(s)] == ["gateway_unrouted"]
    fake = FakeGateway({})
    assert wd.Watchdog(s, run=Host(), out=io.StringIO(), now=lambda: 1_000_000.0, gate_class=gate_returning(WEDGED),
                       gateway_class=fake).run() == "failed"
    assert fake.calls == []


# -- the GPUs' Xid events ----------------------------------------------------------------

class GpuHost(Host):
    """Host with two GPUs (0 at 01:00.0, 2 at 41:00.0) and a kernel log the test writes."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.kernel = "[    0.000000] Linux version 6.8.0\n"
        self.memory = {"01": {"unc": 0, "pending": "No"}, "41": {"unc": 0, "pending": "No"}}

    def xml(self) -> str:
        """nvidia-smi -q -x (DTD v12's elements the reader reads) of the two GPUs."""
        gpus = "".join(
            f'<gpu id="00000000:{bus}:00.0"><ecc_mode><current_ecc>Enabled</current_ecc><pending_ecc>Enabled'
            f'</pending_ecc></ecc_mode><ecc_errors><volatile><dram_uncorrectable>{m["unc"]}</dram_uncorrectable>'
            f'</volatile><aggregate><dram_uncorrectable>{m["unc"]}</dram_uncorrectable></aggregate></ecc_errors>'
            f'<remapped_rows><remapped_row_corr>0</remapped_row_corr><remapped_row_unc>{m["unc"]}</remapped_row_unc>'
            f'<remapped_row_pending>{m["pending"]}</remapped_row_pending><remapped_row_failure>No'
            f'</remapped_row_failure></remapped_rows></gpu>' for bus, m in self.memory.items())
        return f'<?xml version="1.0" ?>\n<nvidia_smi_log>{gpus}</nvidia_smi_log>'

    def log(self, time_s: float, bus: str, xid: int, text: str) -> None:
        self.kernel += f"[{time_s:12.6f}] NVRM: Xid (PCI:0000:{bus}:00): {xid}, pid=77, name=python3, {text}\n"

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        if argv[0] == "nvidia-smi" and "-q" in argv:
            return 0, self.xml(), ""
        if argv[0] == "nvidia-smi":
            self.calls.append(argv)
            return 0, ("0, NVIDIA RTX A6000, GPU-a, 00000000:01:00.0, 49140, 40000, 8.6, 580.95.05\n"
                       "2, NVIDIA RTX A6000, GPU-b, 00000000:41:00.0, 49140, 40000, 8.6, 580.95.05\n"), ""
        if argv[0] == "journalctl":
            return 0, "", ""
        if argv[0] == "dmesg":
            return 0, self.kernel, ""
        return super().__call__(argv)


def deployed_on(s: dict, gpus: list[int]) -> None:
    from pathlib import Path
    Path(s["service_dir"], "current.json").write_text(json.dumps({"variant": "nextn", "gpu_devices": gpus}))


def test_new_xids_on_the_servers_gpus_are_recorded_once_and_counted_in_the_textfile(tmp_path, monkeypatch):
    from ansible_collections.inferops.sglang.plugins.module_utils import _gpu_health
    monkeypatch.setattr(_gpu_health, "KERNEL_LOG_COMMANDS", (("journal", ["journalctl"]), ("dmesg", ["dmesg"])))
    s = settings(tmp_path / "svc", textfile_dir=str(tmp_path / "textfile"))
    os.makedirs(s["service_dir"])
    deployed_on(s, [2])
    host = GpuHost()
    host.log(100.0, "41", 13, "Graphics SM Warp Exception")
    host.log(101.0, "01", 79, "GPU has fallen off the bus.")   # GPU 0: not the server's
    event, said = one_run(s, host, gate_returning(OK))
    assert event == "ok"
    assert "GPU 2 (00000000:41:00.0): Xid 13 (Graphics Engine Exception) at 100.0 s since boot" in said
    assert "Xid 79" not in said
    host.log(102.0, "41", 13, "Graphics SM Warp Exception")
    one_run(s, host, gate_returning(OK))
    one_run(s, host, gate_returning(OK))   # nothing new: nothing said, nothing recorded
    got = [r for r in records(s) if r["event"] == "gpu_xid"]
    assert [(r["xid"]["gpu"], r["xid"]["xid"], r["xid"]["action"], r["xid"]["time"]) for r in got] == [
        (2, 13, "restart_app", 100.0), (2, 13, "restart_app", 102.0)]
    text = (tmp_path / "textfile" / "inferops_sglang_sglang-qwen.service.prom").read_text()
    assert ('inferops_sglang_gpu_xid_events_total{action="restart_app",bus_id="00000000:41:00.0",gpu="2",'
            'service="sglang-qwen.service",xid="13"} 2') in text


def test_a_server_whose_gpu_needs_a_reset_is_not_restarted_in_vain(tmp_path, monkeypatch):
    from ansible_collections.inferops.sglang.plugins.module_utils import _gpu_health
    monkeypatch.setattr(_gpu_health, "KERNEL_LOG_COMMANDS", (("dmesg", ["dmesg"]),))
    s = settings(tmp_path, failures=1)
    deployed_on(s, [0, 2])
    host = GpuHost()
    assert one_run(s, host, gate_returning(OK))[0] == "ok"
    host.log(200.0, "41", 79, "GPU has fallen off the bus.")
    event, said = one_run(s, host, gate_returning(WEDGED))
    assert event == "gpu_needs_reset" and host.restarts() == 0
    assert "not restarted: restarting cannot help, its GPU needs a reset or a reboot: GPU 2 (00000000:41:00.0): Xid 79" in said
    assert one_run(s, host, gate_returning(WEDGED))[0] == "failed"    # said once
    assert [r["event"] for r in records(s)] == ["gpu_xid", "gpu_needs_reset"]
    # the operator reset the GPU and the server serves again: the next wedge is restarted as ever
    assert one_run(s, host, gate_returning(OK))[0] == "recovered"
    assert one_run(s, host, gate_returning(WEDGED))[0] == "restarted" and host.restarts() == 1


def test_the_gpus_memory_counters_are_recorded_when_they_change_and_a_pending_remap_stops_a_restart(tmp_path, monkeypatch):
    from ansible_collections.inferops.sglang.plugins.module_utils import _gpu_health
    monkeypatch.setattr(_gpu_health, "KERNEL_LOG_COMMANDS", (("dmesg", ["dmesg"]),))
    s = settings(tmp_path / "svc", failures=1, textfile_dir=str(tmp_path / "textfile"))
    os.makedirs(s["service_dir"])
    deployed_on(s, [2])
    host = GpuHost()
    event, said = one_run(s, host, gate_returning(OK))
    assert event == "ok" and "GPU" not in said and records(s) == []   # a healthy first reading is the baseline
    host.memory["41"] = {"unc": 1, "pending": "No"}               # a count that rose, remapped already
    event, said = one_run(s, host, gate_returning(OK))
    assert "1 new uncorrectable ECC error(s) since the last check (aggregate 0 -> 1)" in said
    host.memory["41"] = {"unc": 2, "pending": "Yes"}              # a double-bit error, its row marked for remapping
    event, said = one_run(s, host, gate_returning(WEDGED))
    assert event == "gpu_needs_reset" and host.restarts() == 0
    assert "a row remap is pending" in said and "1 new uncorrectable ECC error(s) since the last check (aggregate 1 -> 2)" in said
    got = [(r["event"], r["memory"]["counters"]["aggregate_uncorrected"]) for r in records(s) if r["memory"]]
    assert got == [("gpu_memory", 1), ("gpu_memory", 2)]
    text = (tmp_path / "textfile" / "inferops_sglang_sglang-qwen.service.prom").read_text()
    assert ('inferops_sglang_gpu_ecc_uncorrected_errors{bus_id="00000000:41:00.0",count="aggregate",gpu="2",'
            'service="sglang-qwen.service"} 2') in text
    assert 'inferops_sglang_gpu_row_remap_pending{bus_id="00000000:41:00.0",gpu="2",service="sglang-qwen.service"} 1' in text
