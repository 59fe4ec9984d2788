"""sglang_switch (the module, as the async job runs it on the host): check mode, a switch, a
rollback, the deploy lock claimed for the job (and refused when another run holds it), the API
key kept out of the result, the progress file and the lease renewals (Progress), and the
node_exporter textfile. The host's systemctl, nvidia-smi, gate, drain and benchmark are a
scripted stand-in (a SystemHost subclass); the files are real, under tmp_path."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from sim_helpers import run_module

from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_lock
from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_metrics
from ansible_collections.inferops.sglang.plugins.module_utils import _job
from ansible_collections.inferops.sglang.plugins.module_utils import _switch
from ansible_collections.inferops.sglang.plugins.modules import sglang_switch

SERVICE = "sglang-qwen.service"
LOGGING = "sglang-qwen.logging.json"
RUN = "run-7f3a"
OTHER_RUN = "run-other-19c2"
# Not a secret-looking word: only the module's own secrets tuple (api_key) can mask it.
KEY = "qz7switch9f3e1d"
HOLDER = dict(service=SERVICE, variant="ddtree", controller_user="alice", controller_host="ctl-1",
              controller_pid=4242, awx_job_id=None)


def variant(name: str, port: int, **params) -> dict:
    argv = ["--model-path", "/srv/models/Qwen3.6-27B", "--host", "127.0.0.1", "--port", str(port), "--tp-size", "2"]
    return {"variant": name, "argv": argv, "sglang_version": "0.5.11",
            "params": {"gate_timeout": 600, "max_running_requests": 8, "context_length": 4096, **params}}


OLD = variant("nextn", 30000)
NEW = variant("ddtree", 30001)
BASE = variant("plain", 30000)
OLD_URL, NEW_URL = "http://127.0.0.1:30000", "http://127.0.0.1:30001"


def unit_text(v: dict) -> str:
    return (f"[Service]\n# variant={v['variant']}\n"
            f"ExecStart=/opt/sglang/bin/python -m sglang.launch_server {' '.join(v['argv'])}\n")


def logging_text(v: dict) -> str:
    return json.dumps({"version": 1, "variant": v["variant"]})


class Layout:
    """The service as an earlier deploy left it (OLD installed, serving), and this run's staging
    (NEW) and baseline (BASE), as the role renders them before the module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.etc = root / "etc"
        self.sdir = root / "svc"
        self.unit = self.etc / SERVICE
        self.logging = self.etc / LOGGING
        self.current = self.sdir / "current.json"
        self.staging = self.sdir / "staging" / RUN
        self.baseline = self.staging / "baseline"
        for d in (self.etc, self.baseline):
            d.mkdir(parents=True)
        self.install(OLD)
        self.stage(self.staging, NEW)
        self.stage(self.baseline, BASE)

    def install(self, v: dict) -> None:
        self.unit.write_text(unit_text(v))
        self.logging.write_text(logging_text(v))
        doc = {k: v[k] for k in ("variant", "params", "argv", "sglang_version")}
        self.current.write_text(json.dumps(dict(doc, gpu_devices=[0]), indent=4, sort_keys=True))

    @staticmethod
    def stage(directory: Path, v: dict) -> None:
        (directory / SERVICE).write_text(unit_text(v))
        (directory / LOGGING).write_text(logging_text(v))

    def files(self) -> list[dict]:
        return [{"name": SERVICE, "src": str(self.unit), "mode": "0644"},
                {"name": LOGGING, "src": str(self.logging), "mode": "0644"},
                {"name": "current.json", "src": str(self.current), "mode": "0600", "template": None}]

    def args(self, **extra) -> dict:
        args = dict(service=SERVICE, service_dir=str(self.sdir), files=self.files(), staging=str(self.staging),
                    baseline_staging=str(self.baseline), variant=NEW, baseline=BASE, url=NEW_URL, run_id=RUN,
                    inventory_host="gpu1", gpu_devices=[0], release_timeout=10, gate_settle=0)
        args.update(extra)
        return args

    def snapshot(self) -> dict[str, bytes]:
        """Every file under the root (path -> content): what changed and what did not."""
        return {str(p.relative_to(self.root)): p.read_bytes() for p in sorted(self.root.rglob("*")) if p.is_file()}


class Script:
    """What the stand-in host does: the unit's state, each gate's readiness in turn (True once
    the list runs out), and every call made."""

    def __init__(self) -> None:
        self.unit = {"active": True, "loaded": True}
        self.gates: list[bool] = []
        self.calls: list[tuple] = []
        self.hosts: list[_switch.SystemHost] = []
        self.progress_file: Path | None = None
        self.progress_seen: list[dict] = []

    def kinds(self, *names: str) -> list[str]:
        return [c[0] for c in self.calls if c[0] in names]


@pytest.fixture
def script(monkeypatch) -> Script:
    s = Script()

    def refuse(argv, *args, **kwargs):
        raise AssertionError(f"the stand-in host ran a command: {argv}")

    class ScriptedHost(_switch.SystemHost):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.run_command = refuse
            s.hosts.append(self)

        def unit_state(self, unit):
            s.calls.append(("unit_state", unit))
            return dict(s.unit)

        def stop(self, unit):
            s.calls.append(("stop", unit))
            s.unit["active"] = False

        def start(self, unit):
            s.calls.append(("start", unit))
            s.unit.update(active=True, loaded=True)

        def gpu_memory_used(self, gpus):
            s.calls.append(("gpu", tuple(gpus)))
            return [120 for dummy in gpus]

        def gpu_xids(self, gpus):
            s.calls.append(("xids", tuple(gpus)))
            return {"boot_id": "boot-1", "time": 0.0, "source": "journal", "events": []}

        def gate(self, url, api_key_file, timeout, settle, unit=None):
            s.calls.append(("gate", url, timeout, settle))
            # the gate's last line, the key in it as a server might echo it (unmasked here)
            self.progress({"gate": f"[3.0s generation] {url} echoed {self.api_key}"})
            if s.progress_file is not None and s.progress_file.exists():
                s.progress_seen.append(json.loads(s.progress_file.read_text()))
            ready = s.gates.pop(0) if s.gates else True
            if ready:
                return {"ready": True, "phase": "settled", "failure": None, "cause": None, "elapsed": 3.0,
                        "server": {"version": "0.5.11"}, "msg": f"ready on {url}"}
            return {"ready": False, "phase": "generation", "failure": "unit_failed", "cause": "cuda_oom",
                    "elapsed": 3.0, "server": None,
                    "msg": f"does not serve on {url}: CUDA out of memory (key {self.api_key})"}

        def drain(self, url, api_key_file, timeout, interval, unit=None):
            s.calls.append(("drain", url))
            return {"drained": True, "timed_out": False, "seconds": 0.2, "timeout": timeout, "polls": 1,
                    "in_flight_at_start": 0, "in_flight_at_stop": 0, "running_at_stop": 0, "waiting_at_stop": 0,
                    "endpoint": "/v1/loads", "error": None, "msg": "nothing in flight"}

        def bench(self, *args, **kwargs):
            raise AssertionError("the performance gate is off")

        def sleep(self, seconds):
            s.calls.append(("sleep", seconds))

    monkeypatch.setattr(_switch, "SystemHost", ScriptedHost)
    return s


@pytest.fixture
def layout(tmp_path) -> Layout:
    return Layout(tmp_path / "host")


def run(capsys, args: dict, check_mode: bool = False) -> tuple[int, dict, str]:
    return run_module(sglang_switch.main, capsys, args, check_mode=check_mode)


def history(layout: Layout) -> list[dict]:
    path = layout.sdir / "history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# -- check mode ---------------------------------------------------------------------------------------------------

def test_check_mode_says_what_a_run_would_do_and_changes_nothing(capsys, script, layout):
    lock = layout.root / "deploy.lock"
    _deploy_lock.acquire(str(lock), RUN, HOLDER)
    before = layout.snapshot()
    rc, result, _out = run(capsys, layout.args(lock_file=str(lock), progress_file=str(layout.root / "p.json")),
                           check_mode=True)
    assert rc == 0, result
    assert result["switch"] is True and result["changed"] is True
    assert result["msg"].startswith(f"would switch {SERVICE} from nextn to ddtree")
    for step in ("drain", "stop", "install", "start", "gate", "commit"):
        assert step in result["would"], result["would"]
    assert result["would"][-1] == "switched"
    assert result["before"]["variant"] == "nextn" and result["before"]["active"] is True
    assert result["reasons"]
    # nothing ran and nothing was written: no stop, start, gate or drain, no file (marker, lock, progress)
    assert script.kinds("stop", "start", "gate", "drain", "gpu") == []
    assert layout.snapshot() == before
    assert "outcome" not in result and "record" not in result


def test_check_mode_of_a_service_that_already_is_the_variant_would_keep_it(capsys, script, layout):
    layout.install(NEW)
    before = layout.snapshot()
    rc, result, _out = run(capsys, layout.args(), check_mode=True)
    assert rc == 0, result
    assert result["switch"] is False and result["changed"] is False and result["reasons"] == []
    assert result["would"][-1] == "unchanged" and "stop" not in result["would"]
    assert result["msg"].startswith(f"would keep {SERVICE} on ddtree")
    assert layout.snapshot() == before and script.kinds("stop", "start", "gate") == []


# -- a run --------------------------------------------------------------------------------------------------------

def test_a_switch_installs_the_variant_records_it_and_clears_the_marker(capsys, script, layout):
    rc, result, _out = run(capsys, layout.args())
    assert rc == 0, result
    assert result["outcome"] == "switched" and result["changed"] is True and result["failed"] is False
    # the order on the host: drain the old, pre-gate it, stop, wait for the GPUs, start, gate the new
    assert script.kinds("drain", "gate", "stop", "gpu", "start") == ["drain", "gate", "stop", "gpu", "start", "gate"]
    assert [c[1] for c in script.calls if c[0] == "gate"] == [OLD_URL, NEW_URL]
    # the staged files installed, current.json says the variant, and known-good/ holds the new service
    assert layout.unit.read_text() == unit_text(NEW) and layout.logging.read_text() == logging_text(NEW)
    assert json.loads(layout.current.read_text())["variant"] == "ddtree"
    assert (layout.sdir / "known-good" / SERVICE).read_text() == unit_text(NEW)
    # the record: one line in history.jsonl, the same as returned; the marker is gone
    (line,) = history(layout)
    assert line["outcome"] == "switched" and line["variant"] == "ddtree" and line["from"] == "nextn"
    assert line["run_id"] == RUN
    assert result["record"] == line
    assert not (layout.sdir / "switch.json").exists()
    # the attempt's files are kept; this run's staging is cleared
    assert (layout.sdir / "attempts" / result["attempt"] / SERVICE).read_text() == unit_text(NEW)
    assert not layout.staging.exists()
    assert result["msg"] == result["summary"] and "ddtree is serving" in result["summary"]
    assert [t[2] for t in result["trail"]][-1] == "switched"
    assert result["textfile_changed"] is False  # no textfile_dir


def test_a_failing_gate_rolls_back_to_the_known_good_service_and_fails(capsys, script, layout):
    script.gates = [True, False, True]  # the pre-gate passes, the variant fails, the restored service passes
    rc, result, _out = run(capsys, layout.args())
    assert rc == 0, result  # exit_json with failed=True: the task fails, the result is whole
    assert result["outcome"] == "rolled_back" and result["failed"] is True and result["changed"] is True
    assert result["msg"] == result["summary"] and "FAILED and was rolled back" in result["summary"]
    # the variant stopped, the known-good files back in place and started, gated as themselves
    assert script.kinds("stop", "start") == ["stop", "start", "stop", "start"]
    assert [c[1] for c in script.calls if c[0] == "gate"] == [OLD_URL, NEW_URL, OLD_URL]
    assert layout.unit.read_text() == unit_text(OLD) and layout.logging.read_text() == logging_text(OLD)
    assert json.loads(layout.current.read_text())["variant"] == "nextn"
    (line,) = history(layout)
    assert line["outcome"] == "rolled_back" and line["rollback"]["variant"] == "nextn"
    assert not (layout.sdir / "switch.json").exists()


def test_a_rollback_that_fails_too_keeps_the_marker_and_fails(capsys, script, layout):
    script.gates = [True, False, False]
    rc, result, _out = run(capsys, layout.args())
    assert rc == 0, result
    assert result["outcome"] == "rollback_failed" and result["failed"] is True
    assert "ROLLBACK FAILED" in result["msg"]
    assert json.loads((layout.sdir / "switch.json").read_text())["run_id"] == RUN


# -- the deploy lock ----------------------------------------------------------------------------------------------

def test_the_job_claims_this_runs_lock_with_its_pid_and_boot_id(capsys, script, layout, monkeypatch):
    monkeypatch.setattr(_deploy_lock, "boot_id", lambda path=_deploy_lock.BOOT_ID_FILE: "boot-4c1d")
    lock = layout.root / "deploy.lock"
    _deploy_lock.acquire(str(lock), RUN, HOLDER, lease=900, now=lambda: 1000.0)  # long expired: the claim renews
    rc, result, _out = run(capsys, layout.args(lock_file=str(lock), lock_lease=1800))
    assert rc == 0, result
    assert result["outcome"] == "switched"
    record = json.loads(lock.read_text())
    assert record["run_id"] == RUN and record["job_pid"] == os.getpid() and record["job_boot_id"] == "boot-4c1d"
    # the holder's own fields kept, the lease extended from now
    assert record["controller_user"] == "alice" and record["controller_pid"] == 4242 and record["variant"] == "ddtree"
    assert record["lease_s"] == 1800 and record["expires"] > 1000 + 900


def test_the_record_keeps_of_the_lock_task_s_result_only_who_held_it_and_how(capsys, script, layout):
    """The role passes sglang_deploy_lock's whole result (its ``before`` included)."""
    holder = dict(HOLDER, run_id=RUN)
    acquired = {"changed": False, "acquired": True, "run_id": RUN, "holder": holder, "previous": None,
                "taken_over": False, "waited": 2.5, "lost": False, "before": {"variant": "nextn", "argv": ["--port", "1"]}}
    rc, result, _out = run(capsys, layout.args(lock=acquired))
    assert rc == 0, result
    assert result["record"]["lock"] == {"run_id": RUN, "holder": holder, "taken_over": False, "previous": None,
                                        "waited": 2.5}
    assert history(layout)[-1]["lock"] == result["record"]["lock"]


def test_a_lock_held_by_another_run_stops_the_job_before_anything_changes(capsys, script, layout):
    lock = layout.root / "deploy.lock"
    _deploy_lock.acquire(str(lock), OTHER_RUN, dict(HOLDER, controller_user="bob"))
    held = lock.read_bytes()
    before = layout.snapshot()
    rc, result, _out = run(capsys, layout.args(lock_file=str(lock)))
    assert rc == 1 and result["failed"] is True
    assert f"this run ({RUN}) no longer holds the deploy lock {lock}" in result["msg"]
    assert "bob@ctl-1" in result["msg"] and result["msg"].endswith("nothing was changed")
    assert script.kinds("stop", "start", "drain", "gate") == []
    assert lock.read_bytes() == held
    assert layout.snapshot() == before


def test_a_removed_lock_stops_the_job_too(capsys, script, layout):
    lock = layout.root / "deploy.lock"
    before = layout.snapshot()
    rc, result, _out = run(capsys, layout.args(lock_file=str(lock)))
    assert rc == 1 and "no longer holds the deploy lock" in result["msg"] and "held by nobody" in result["msg"]
    assert script.kinds("stop", "start") == [] and layout.snapshot() == before and not lock.exists()


def test_a_lease_under_a_minute_is_refused(capsys, script, layout):
    before = layout.snapshot()
    rc, result, _out = run(capsys, layout.args(lock_lease=59))
    assert rc == 1 and result["msg"] == "lock_lease must be at least 60 seconds, got 59"
    assert script.calls == [] and layout.snapshot() == before


# -- the API key --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gates", [[], [True, False, True]], ids=["switched", "rolled_back"])
def test_the_api_key_never_appears_in_the_result_or_the_progress_file(capsys, script, layout, gates):
    script.gates = list(gates)
    script.progress_file = layout.root / "progress.json"
    rc, result, out = run(capsys, layout.args(api_key=KEY, progress_file=str(script.progress_file)))
    assert rc == 0, result
    (host,) = script.hosts
    assert host.api_key == KEY  # the host was given it: its gate, drain and benchmark send it
    assert KEY not in out and KEY not in json.dumps(result)
    # the progress file as the gate's line left it: the key masked there by the module itself
    assert script.progress_seen
    for seen in script.progress_seen:
        assert seen["state"] in ("pregate", "gate", "restore_gate")
        assert KEY not in json.dumps(seen) and "echoed ********" in seen["event"]


# -- the textfile -------------------------------------------------------------------------------------------------

def test_a_switch_rewrites_node_exporters_textfile(capsys, script, layout):
    textfile_dir = layout.root / "textfile"
    rc, result, _out = run(capsys, layout.args(textfile_dir=str(textfile_dir)))
    assert rc == 0, result
    assert result["outcome"] == "switched" and result["textfile_changed"] is True
    (prom,) = list(textfile_dir.iterdir())
    assert prom.name.endswith(".prom") and SERVICE in prom.name
    families = _deploy_metrics.parse(prom.read_text())
    (info,) = families["inferops_sglang_deploy_info"]["samples"]
    labels = info[1]
    assert labels["service"] == SERVICE and labels["variant"] == "ddtree" and labels["outcome"] == "switched"
    assert labels["run_id"] == RUN
    # the next deploy (another variant, rolled back) rewrites it
    shadow = variant("shadow", 30002)
    layout.baseline.mkdir(parents=True)
    layout.stage(layout.staging, shadow)
    layout.stage(layout.baseline, BASE)
    script.gates = [True, False, True]
    rc, result, _out = run(capsys, layout.args(textfile_dir=str(textfile_dir), variant=shadow,
                                               url="http://127.0.0.1:30002"))
    assert rc == 0 and result["outcome"] == "rolled_back" and result["textfile_changed"] is True
    (info,) = _deploy_metrics.parse(prom.read_text())["inferops_sglang_deploy_info"]["samples"]
    assert info[1]["outcome"] == "rolled_back"


# -- Progress -----------------------------------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def progress_of(tmp_path, clock, lock_file=None, lease=1800, path="progress.json"):
    warnings: list[str] = []
    module = SimpleNamespace(params=dict(progress_file=str(tmp_path / path) if path else None, lock_file=lock_file,
                                         run_id=RUN, lock_lease=lease),
                             warn=warnings.append)
    return _job.Progress(module, (KEY,), clock=clock, wall=lambda: 1767000000.0), warnings


def test_progress_writes_the_state_its_seconds_and_the_masked_event(tmp_path):
    clock = Clock()
    progress, warnings = progress_of(tmp_path, clock)
    file = tmp_path / "progress.json"
    clock.now += 2
    progress({"state": "inspect", "from": None, "event": None})
    doc = json.loads(file.read_text())
    assert doc == {"time": 1767000000.0, "state": "inspect", "elapsed": 2.0, "state_elapsed": 0.0,
                   "event": "start -> inspect (begin)"}
    assert oct(os.stat(file).st_mode & 0o777) == oct(0o600)
    clock.now += 5
    progress({"state": "gate", "from": "start", "event": "started"})
    clock.now += 7.25
    progress({"gate": f"[7.3s generation]\n  the server said   {KEY}"})
    doc = json.loads(file.read_text())
    assert doc["state"] == "gate" and doc["elapsed"] == 14.2 and doc["state_elapsed"] == 7.2
    assert doc["event"] == "[7.3s generation] the server said ********"  # masked, whitespace folded
    # an event that is neither a state nor a gate line keeps the last text
    progress({"other": 1})
    assert json.loads(file.read_text())["event"] == doc["event"]
    assert warnings == []


def test_progress_clips_long_text_and_survives_an_unwritable_file(tmp_path):
    clock = Clock()
    progress, _w = progress_of(tmp_path, clock)
    progress({"gate": "x" * 1000})
    assert len(json.loads((tmp_path / "progress.json").read_text())["event"]) == _job.TEXT_MAX
    nowhere, _w = progress_of(tmp_path, clock, path="missing-dir/progress.json")
    nowhere({"state": "inspect"})  # OSError swallowed: the switch goes on
    assert not (tmp_path / "missing-dir").exists()
    silent, _w = progress_of(tmp_path, clock, path=None)
    silent({"state": "inspect"})  # no progress_file: nothing written


def test_progress_renews_the_lease_only_every_renew_every_seconds(tmp_path):
    clock = Clock()
    lock = str(tmp_path / "deploy.lock")
    _deploy_lock.acquire(lock, RUN, HOLDER, lease=900, now=lambda: 1000.0)
    first = json.loads(Path(lock).read_text())
    progress, warnings = progress_of(tmp_path, clock, lock_file=lock, lease=1800)
    for step in range(5):
        clock.now += (_job.RENEW_EVERY - 1) / 5
        progress({"state": f"s{step}"})
    assert json.loads(Path(lock).read_text()) == first  # under RENEW_EVERY of the injected clock: no renewal
    clock.now += 1.5
    progress({"gate": "still loading"})
    renewed = json.loads(Path(lock).read_text())
    assert renewed["expires"] > first["expires"] and renewed["lease_s"] == 1800 and renewed["run_id"] == RUN
    # the next renewal waits RENEW_EVERY again, counted from this one
    clock.now += _job.RENEW_EVERY - 1
    Path(lock).write_text(json.dumps(dict(renewed, expires=1234)))
    progress({"gate": "still loading"})
    assert json.loads(Path(lock).read_text())["expires"] == 1234
    clock.now += 1
    progress({"gate": "still loading"})
    assert json.loads(Path(lock).read_text())["expires"] > 1234
    assert warnings == []


def test_progress_warns_once_when_the_lock_was_lost(tmp_path):
    clock = Clock()
    lock = str(tmp_path / "deploy.lock")
    _deploy_lock.acquire(lock, OTHER_RUN, dict(HOLDER, controller_user="bob"))
    held = Path(lock).read_bytes()
    progress, warnings = progress_of(tmp_path, clock, lock_file=lock)
    progress.renew(force=True)
    clock.now += _job.RENEW_EVERY
    progress({"state": "gate"})
    assert len(warnings) == 1 and "lost the deploy lock" in warnings[0] and "bob@ctl-1" in warnings[0]
    assert progress.lost and Path(lock).read_bytes() == held  # another run's lock is never renewed


# -- the fault tests' hold point ------------------------------------------------------------------------------------

class Held(Exception):
    """Ends the module's wait in the test (where a real run waits to be killed)."""


def test_hold_at_stops_the_job_in_that_state_with_its_marker_written(capsys, script, layout, monkeypatch):
    def sleep(_seconds):
        raise Held
    monkeypatch.setattr(sglang_switch.time, "sleep", sleep)
    with pytest.raises(Held):
        run(capsys, layout.args(hold_at="install"))
    marker = json.loads((layout.sdir / "switch.json").read_text())
    assert marker["state"] == "install"
    # held before the new unit started: the old one was stopped, nothing else ran
    assert script.kinds("start") == [] and not history(layout)


def test_hold_at_must_name_a_state_and_nothing_changes_otherwise(capsys, script, layout):
    before = layout.snapshot()
    rc, result, _out = run(capsys, layout.args(hold_at="halfway"))
    assert rc == 1 and "hold_at must be one of the switch's states" in result["msg"]
    assert layout.snapshot() == before and script.calls == []
