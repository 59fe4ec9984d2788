"""sglang_switch (the action plugin): the text of a progress line (the state, its seconds, the
masked event, no event for a no_log task), the async job's time limit (the switch's waits
summed, plus the margin), the progress_interval check, and the plugin run over a scripted host
(the job launched with that limit and a progress file, its lines, the plain calls). The job
machinery itself is tested in tests/unit/plugins/plugin_utils/test_async_job.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail
from ansible.plugins.shell.sh import ShellModule
from ansible.utils.display import Display

from ansible_collections.inferops.sglang.plugins.action import sglang_switch as action_mod
from ansible_collections.inferops.sglang.plugins.plugin_utils import _async_job

KEY = "qz7switch9f3e1d"  # not a secret-looking word: only the secrets given mask it
JID = "j555000.31"
TMP = "/home/deploy/.ansible/tmp/ansible-tmp-1767000000.1-99-5555"
PROGRESS = f"{TMP}/{action_mod.PROGRESS_NAME}"
EPOCH = 1767000000
# The module's defaults (its argument_spec) and the waits the switch makes, by hand:
# the drain 60, two benchmarks of the default budget 600, the pre-gate 60, two GPU waits of 120,
# two gates of 900 (no gate_timeout in the params) and two settles of 5; then the margin.
DEFAULT_WAITS = 60 + 2 * 600 + 60 + 2 * 120 + 2 * 900 + 2 * 5
MARGIN = 600


def variant(name: str, **params) -> dict:
    return {"variant": name, "argv": ["--port", "30000"], "params": params}


# -- progress_line --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("progress", [{}, {"state": None, "elapsed": 3}, {"state": "", "event": "x"}])
def test_no_line_before_the_first_state(progress):
    assert action_mod.progress_line("ct129", progress) is None


def test_a_line_names_the_state_its_seconds_the_total_and_the_event():
    line = action_mod.progress_line("ct129", {"state": "gate", "state_elapsed": 42.4, "elapsed": 130.6,
                                              "event": "[41.9s generation] first token"})
    assert line == "[ct129] sglang_switch: gate 42 s (131 s in all): [41.9s generation] first token"


def test_seconds_that_are_not_numbers_are_left_out_and_numeric_strings_are_read():
    assert action_mod.progress_line("h", {"state": "stop", "elapsed": "soon", "state_elapsed": None}) == \
        "[h] sglang_switch: stop"
    assert action_mod.progress_line("h", {"state": "stop", "elapsed": "7.6", "state_elapsed": "2"}) == \
        "[h] sglang_switch: stop 2 s (8 s in all)"


def test_the_event_is_masked_folded_and_clipped():
    line = action_mod.progress_line("h", {"state": "gate", "event": f"server echoed\n  {KEY}  Bearer tok123"}, (KEY,))
    assert line == "[h] sglang_switch: gate: server echoed ******** Bearer ********"
    assert KEY not in line and "tok123" not in line
    long = action_mod.progress_line("h", {"state": "gate", "event": "y" * 1000})
    prefix = "[h] sglang_switch: gate: "
    assert long.startswith(prefix)
    text = long[len(prefix):]
    assert len(text) == _async_job.LINE_TEXT_MAX and text.endswith("...") and text.startswith("y" * 100)
    # an empty secret (no api_key) masks nothing
    assert action_mod.progress_line("h", {"state": "gate", "event": "plain"}, ("",)) == "[h] sglang_switch: gate: plain"


def test_a_no_log_task_gets_no_event_text():
    progress = {"state": "restore_gate", "state_elapsed": 5, "elapsed": 500, "event": f"echo {KEY}"}
    line = action_mod.progress_line("h", progress, (KEY,), with_text=False)
    assert line == "[h] sglang_switch: restore_gate 5 s (500 s in all)"


def test_an_empty_event_adds_nothing():
    assert action_mod.progress_line("h", {"state": "inspect", "elapsed": 0, "event": ""}) == \
        "[h] sglang_switch: inspect (0 s in all)"


# -- async_limit ----------------------------------------------------------------------------------------------------

def test_the_limit_with_the_defaults_is_every_wait_plus_the_margin():
    assert action_mod.async_limit({}) == DEFAULT_WAITS + MARGIN
    # a variant without gate_timeout, or with an empty one, is gated for the module's default
    assert action_mod.async_limit({"variant": variant("nextn"), "baseline": variant("plain", gate_timeout="")}) == \
        DEFAULT_WAITS + MARGIN


def test_a_variants_gate_timeout_moves_the_limit():
    slow = action_mod.async_limit({"variant": variant("ddtree", gate_timeout=1800)})
    assert slow == DEFAULT_WAITS + (1800 - 900) + MARGIN
    both = action_mod.async_limit({"variant": variant("ddtree", gate_timeout=1800),
                                   "baseline": variant("plain", gate_timeout=300)})
    assert both == DEFAULT_WAITS + (1800 - 900) + (300 - 900) + MARGIN
    assert action_mod.async_limit({"variant": variant("ddtree", gate_timeout="1200")}) == \
        DEFAULT_WAITS + 300 + MARGIN


def test_the_task_settings_replace_the_defaults_and_fractions_round_up():
    args = {"release_timeout": 30, "drain_timeout": "10", "gate_settle": 0.3, "perf_load": {"budget": 45}}
    expected = 10 + 2 * 45 + 60 + 2 * 30 + 2 * 900 + 2 * 0.3  # 2020.6 -> 2021
    assert action_mod.async_limit(args) == 2021 + MARGIN
    assert expected < 2021 <= expected + 1


def test_settings_that_are_not_waits_do_not_count():
    # a variant or params that are not dicts: the module refuses them; the limit is the default
    assert action_mod.async_limit({"variant": "ddtree", "baseline": {"params": "x"}}) == DEFAULT_WAITS + MARGIN
    assert action_mod.async_limit({"perf_load": "heavy"}) == DEFAULT_WAITS + MARGIN


@pytest.mark.parametrize("args", [
    {"release_timeout": "soon"},
    {"drain_timeout": -1},
    {"gate_settle": "inf"},
    {"variant": variant("ddtree", gate_timeout="slow")},
    {"baseline": variant("plain", gate_timeout=float("inf"))},
    {"perf_load": {"budget": "lots"}},
    {"perf_load": {"budget": -5}},
], ids=["release-word", "drain-negative", "settle-inf", "gate-word", "baseline-inf", "budget-word", "budget-negative"])
def test_a_wait_that_is_not_a_number_gives_no_limit(args):
    assert action_mod.async_limit(args) is None


# -- progress_interval ----------------------------------------------------------------------------------------------

def test_progress_interval_defaults_to_15_and_reads_numbers():
    assert _async_job.progress_interval({}) == 15.0
    assert _async_job.progress_interval({"progress_interval": None}) == 15.0
    assert _async_job.progress_interval({"progress_interval": "4.5"}) == 4.5
    assert _async_job.progress_interval({"progress_interval": 0}) == 0


@pytest.mark.parametrize("value", [-1, "often", float("nan"), [5], {}])
def test_a_bad_progress_interval_is_refused(value):
    with pytest.raises(AnsibleActionFail, match=r"progress_interval must be 0 \(no live progress\) or a positive number"):
        _async_job.progress_interval({"progress_interval": value})


# -- the plugin over a scripted host --------------------------------------------------------------------------------

ARGS = dict(service="sglang-qwen.service", service_dir="/var/lib/inferops-sglang/sglang-qwen", run_id="r1",
            variant=variant("ddtree", gate_timeout=1200), baseline=variant("plain"), api_key=KEY)
SWITCHED = dict(changed=True, failed=False, outcome="switched", msg="gpu1: ddtree is serving.", _ansible_parsed=True)


def running() -> dict:
    return dict(started=True, finished=False, ansible_job_id=JID, results_file=f"/root/.ansible_async/{JID}",
                _ansible_parsed=True)


class Harness:
    """The action plugin with a fake clock and a scripted host: the job runs until ``done`` s
    after its launch; the progress file says the gate, its event carrying the key."""

    def __init__(self, args: dict, done: float = 40, no_log: bool = False, check_mode: bool = False) -> None:
        task = SimpleNamespace(args=dict(args), check_mode=check_mode, async_val=0, action=action_mod.MODULE,
                               no_log=no_log, environment=[])
        conn = SimpleNamespace(_shell=ShellModule(), has_native_async=False, always_pipeline_modules=False, become=None)
        self.action = action_mod.ActionModule(task, conn, None, None, None)
        self.action._load_name = "sglang_switch"
        self.task, self.shell, self.done = task, conn._shell, done
        self.now, self.launched_at = 100.0, None
        self.launches: list[dict] = []
        self.plain: list[dict] = []
        self.action._clock = lambda: self.now
        self.action._sleep = self.sleep
        self.action._execute_module = self.execute
        self.action._low_level_execute_command = self.command
        self.action._make_tmp_path = self.make_tmp
        self.action._is_become_unprivileged = lambda: False
        self.action._remote_expand_user = lambda path, sudoable=True: path.replace("~", "/root", 1)
        self.action.get_shell_option = lambda option, default=None: default

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def make_tmp(self) -> str:
        self.shell.tmpdir = TMP
        return TMP

    def execute(self, module_name=None, module_args=None, task_vars=None, wrap_async=False):
        if module_name == _async_job.ASYNC_STATUS:
            if module_args["mode"] == "cleanup":
                return dict(ansible_job_id=JID)
            t = self.now - self.launched_at
            return running() if t < self.done else dict(SWITCHED, finished=True, ansible_job_id=JID)
        assert module_name == action_mod.MODULE
        if not wrap_async:
            self.plain.append(dict(module_args))
            return dict(SWITCHED)
        self.launches.append(dict(args=dict(module_args), async_val=self.task.async_val))
        self.launched_at = self.now
        self.shell.tmpdir = None
        return dict(failed=False, started=True, finished=False, ansible_job_id=JID, changed=True)

    def command(self, cmd, sudoable=True, in_data=None):
        if cmd.startswith("date +%s && cat "):
            t = int(self.now - self.launched_at)
            doc = dict(time=EPOCH + t, state="gate", elapsed=t, state_elapsed=t - 10,
                       event=f"[{t}s generation] echoed {KEY}")
            return dict(rc=0, stdout=f"{EPOCH + t}\n{json.dumps(doc)}", stderr="")
        return dict(rc=0, stdout="", stderr="")

    def run(self) -> dict:
        return self.action.run(task_vars=dict(inventory_hostname="gpu1"))


@pytest.fixture
def shown(monkeypatch):
    lines: list[str] = []
    monkeypatch.setattr(Display(), "display", lambda msg, *args, **kwargs: lines.append(msg))
    return lines


def test_the_switch_runs_as_a_job_limited_to_its_waits_with_masked_lines(shown):
    h = Harness(dict(ARGS, progress_interval=15))
    result = h.run()
    assert result["outcome"] == "switched" and result["failed"] is False
    (launch,) = h.launches
    assert launch["async_val"] == DEFAULT_WAITS + (1200 - 900) + MARGIN
    assert launch["args"]["progress_file"] == PROGRESS and launch["args"]["api_key"] == KEY
    assert h.task.async_val == 0 and h.plain == []
    assert shown and all(line.startswith("[gpu1] sglang_switch: gate ") for line in shown)
    assert all(KEY not in line and line.endswith("echoed ********") for line in shown)


def test_a_switch_that_ends_at_once_is_seen_within_a_second(shown):
    h = Harness(dict(ARGS, progress_interval=15), done=0.6)
    assert h.run()["outcome"] == "switched"
    # polls at 0.25 and 0.75 s (waits doubling from the first), not at the 2 s period
    assert h.now - h.launched_at == 0.75


def test_a_no_log_task_shows_no_event_text(shown):
    h = Harness(dict(ARGS, progress_interval=5), no_log=True)
    h.run()
    assert shown and all(line.endswith(" s in all)") and "echoed" not in line for line in shown)


@pytest.mark.parametrize("why, args, check_mode", [
    ("interval 0", dict(ARGS, progress_interval=0), False),
    ("no limit", dict(ARGS, release_timeout="soon"), False),
    ("check mode", ARGS, True),
])
def test_the_module_runs_as_a_plain_call_when_there_is_no_live_progress(shown, why, args, check_mode):
    h = Harness(args, check_mode=check_mode)
    assert h.run()["outcome"] == "switched"
    assert h.launches == [] and len(h.plain) == 1 and "progress_file" not in h.plain[0] and shown == []


def test_a_bad_progress_interval_fails_the_task_before_anything_runs(shown):
    h = Harness(dict(ARGS, progress_interval=-2))
    with pytest.raises(AnsibleActionFail, match="progress_interval must be 0"):
        h.run()
    assert h.launches == [] and h.plain == []


# -- the rotation hooks around the job ------------------------------------------------------------------------------

OUT = {"command": ["/usr/local/bin/lb", "out", "--token", "tok-out-1"], "where": "host"}
IN = {"url": "https://lb.example/in", "headers": {"Authorization": "Bearer tok-in-2"}}
RECORD = {"run_id": "r1", "outcome": "switched", "rotation": None}


class Rotating(Harness):
    """The harness with the hooks stubbed (their results scripted, their runs kept), the module's
    check-mode plan scripted (``would``), the job's result scripted, and the record's amendment."""

    def __init__(self, args: dict, monkeypatch, would=("drain", "stop", "switched"), job: dict | None = None,
                 hook_ok: dict | None = None, check_mode: bool = False) -> None:
        super().__init__(args, done=0.5, check_mode=check_mode)
        self.would, self.hook_ok, self.check_task = list(would), dict(hook_ok or {}), check_mode
        self.job = dict(job or dict(SWITCHED, record=dict(RECORD), summary="gpu1: ddtree is serving."))
        self.hooks: list[str] = []
        self.plans: list[dict] = []
        self.amends: list[dict] = []

        def run_hook(_action, _task_vars, hook):
            name = "out" if hook is OUT or hook == OUT else "in"
            self.hooks.append(name)
            ok = self.hook_ok.get(name, True)
            return {"ok": ok, "msg": "command exit 0" if ok else f"{name} refused"}
        monkeypatch.setattr(action_mod._rotation, "run_hook", run_hook)

    def execute(self, module_name=None, module_args=None, task_vars=None, wrap_async=False):
        if module_name == action_mod.AMEND_MODULE:
            self.amends.append(dict(module_args))
            record = dict(module_args["record"], rotation=module_args["rotation"])
            return dict(changed=True, record=record, summary="gpu1: amended summary")
        # the plan: a check-mode call the action makes itself (not a check-mode task's plain call)
        if module_name == action_mod.MODULE and not wrap_async and self.task.check_mode and not self.check_task:
            self.plans.append(dict(module_args))
            return dict(changed=True, switch=True, would=self.would, before={"variant": "nextn"}, msg="would switch")
        if module_name == _async_job.ASYNC_STATUS and module_args["mode"] != "cleanup" and self.now - self.launched_at >= self.done:
            return dict(self.job, finished=True, ansible_job_id=JID)
        return super().execute(module_name, module_args, task_vars, wrap_async)


def hooked(**more) -> dict:
    return dict(ARGS, progress_interval=15, rotation_out=OUT, rotation_in=IN, **more)


def test_no_hooks_no_plan_call_and_nothing_to_fail(shown, monkeypatch):
    h = Rotating(dict(ARGS, progress_interval=15), monkeypatch)
    result = h.run()
    assert h.plans == [] and h.hooks == [] and h.amends == []
    assert h.launches[0]["args"]["rotation"] == {}
    assert result["failure"] is None and result["rotation"] == {} and result["failed"] is False


def test_out_and_in_around_a_switch_the_in_hooks_result_amended_into_the_record(shown, monkeypatch):
    h = Rotating(hooked(), monkeypatch)
    result = h.run()
    assert len(h.plans) == 1 and h.hooks == ["out", "in"]
    (launch,) = h.launches
    # the job records the out hook's result; the hooks themselves never reach the host's module
    assert launch["args"]["rotation"] == {"out": {"ok": True, "msg": "command exit 0"}}
    assert "rotation_out" not in launch["args"] and "rotation_in" not in launch["args"]
    assert "rotation_out" not in h.plans[0] and "rotation_in" not in h.plans[0]
    (amend,) = h.amends
    assert amend["step"] == "amend" and amend["record"]["run_id"] == "r1"
    assert set(amend["rotation"]) == {"out", "in"}
    assert result["record"]["rotation"] == amend["rotation"] and result["summary"] == "gpu1: amended summary"
    assert result["failure"] is None and result["changed"] is True


def test_a_switch_that_will_not_drain_runs_no_hook(shown, monkeypatch):
    h = Rotating(hooked(), monkeypatch, would=["steady", "unchanged"],
                 job=dict(SWITCHED, outcome="unchanged", changed=False, record=None, summary="unchanged"))
    result = h.run()
    assert len(h.plans) == 1 and h.hooks == [] and h.amends == []
    assert result["failure"] is None and result["changed"] is False and result["rotation"] == {}


def test_a_failed_out_hook_starts_no_job_and_tries_the_in_hook(shown, monkeypatch):
    h = Rotating(hooked(), monkeypatch, hook_ok={"out": False})
    result = h.run()
    assert h.hooks == ["out", "in"] and h.launches == [] and h.plain == [] and h.amends == []
    assert result["failed"] is True and result["failure"] == result["msg"] == (
        "gpu1: the rotation out hook failed (out refused); nothing was changed, nextn still runs; "
        "rotation in hook: command exit 0")
    assert "outcome" not in result and "record" not in result


def test_a_rollback_brings_the_host_back_in_and_fails_with_the_amended_summary(shown, monkeypatch):
    rolled = dict(SWITCHED, failed=True, outcome="rolled_back", record=dict(RECORD, outcome="rolled_back"),
                  summary="gpu1: variant ddtree FAILED and was rolled back.", msg="gpu1: variant ddtree FAILED and was rolled back.")
    h = Rotating(hooked(), monkeypatch, job=rolled)
    result = h.run()
    assert h.hooks == ["out", "in"] and len(h.amends) == 1
    assert result["failed"] is True and result["failure"] == "gpu1: amended summary"


def test_a_failed_rollback_keeps_the_host_out_of_rotation(shown, monkeypatch):
    broken = dict(SWITCHED, failed=True, outcome="rollback_failed", record=dict(RECORD, outcome="rollback_failed"),
                  summary="gpu1: ROLLBACK FAILED.", msg="gpu1: ROLLBACK FAILED.")
    h = Rotating(hooked(), monkeypatch, job=broken)
    result = h.run()
    assert h.hooks == ["out"] and h.amends == []
    assert result["failure"] == "gpu1: ROLLBACK FAILED." and result["rotation"] == {"out": {"ok": True, "msg": "command exit 0"}}


def test_a_drain_that_failed_changed_nothing_the_host_goes_back_and_the_failure_says_both(shown, monkeypatch):
    before = dict(SWITCHED, failed=True, changed=False, outcome="failed_before_switching", record=None, summary=None,
                  msg="gpu1: the drain timed out; nothing was changed, nextn still runs")
    h = Rotating(hooked(), monkeypatch, job=before, hook_ok={"in": False})
    result = h.run()
    assert h.hooks == ["out", "in"] and h.amends == []  # no record to amend
    assert result["failure"] == "gpu1: the drain timed out; nothing was changed, nextn still runs; rotation in hook: in refused"


def test_a_variant_that_serves_while_the_in_hook_failed_fails_the_deploy(shown, monkeypatch):
    h = Rotating(hooked(), monkeypatch, hook_ok={"in": False})
    result = h.run()
    assert result["outcome"] == "switched" and result["failed"] is True
    assert result["failure"] == ("gpu1: ddtree serves, but the host is NOT back in rotation: the rotation in hook failed "
                                 "(in refused). Put it back by hand.")


def test_a_job_without_an_outcome_says_where_to_look_and_that_the_host_is_out(shown, monkeypatch):
    h = Rotating(hooked(), monkeypatch, job=dict(failed=True, msg="the async job j1 was lost"))
    result = h.run()
    assert h.hooks == ["out"]
    assert result["failure"].startswith("gpu1: the switch job on the host ended without an outcome (the async job j1 was lost); "
                                        "/var/lib/inferops-sglang/sglang-qwen/switch.json says where it stopped")
    assert result["failure"].endswith("; the host is OUT of rotation")


def test_check_mode_runs_no_hook_and_fails_nothing(shown, monkeypatch):
    h = Rotating(hooked(), monkeypatch, check_mode=True)
    result = h.run()
    assert h.hooks == [] and h.plans == [] and h.launches == [] and len(h.plain) == 1
    assert "rotation_out" not in h.plain[0] and "failure" not in result


def test_the_fault_tests_hold_point_reaches_the_module_only_when_set(shown, monkeypatch):
    monkeypatch.delenv(action_mod.HOLD_ENV, raising=False)
    plain = Rotating(dict(ARGS, progress_interval=15), monkeypatch)
    plain.run()
    assert "hold_at" not in plain.launches[0]["args"]
    monkeypatch.setenv(action_mod.HOLD_ENV, "install")
    held = Rotating(dict(ARGS, progress_interval=15), monkeypatch)
    held.run()
    assert held.launches[0]["args"]["hold_at"] == "install"
