"""_deploy: the deploy state machine, transition by transition."""

from __future__ import annotations

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _deploy
from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_metrics

FILES = [
    {"name": "sglang-qwen.service", "src": "/etc/systemd/system/sglang-qwen.service", "mode": "0644"},
    {"name": "sglang-qwen.yaml", "src": "/etc/sglang/sglang-qwen.yaml", "mode": "0600"},
    {"name": "sglang-qwen.logging.json", "src": "/etc/sglang/sglang-qwen.logging.json", "mode": "0644"},
    {"name": "current.json", "src": "/var/lib/inferops-sglang/sglang-qwen/current.json", "mode": "0600"},
]
URL = "http://127.0.0.1:30000"
NEXTN_ARGV = ["--model-path", "/srv/models/Qwen3.6-27B", "--host", "127.0.0.1", "--port", "30001", "--tp-size", "2"]


# -- decide ----------------------------------------------------------------------------------------------------------

def test_same_files_active_service_no_marker_is_unchanged():
    differ = _deploy.differing(["a", "b"], ["1", "2"], ["1", "2"])
    assert differ == [] and _deploy.switch_reasons(differ, active=True, interrupted=False) == []


@pytest.mark.parametrize("staged,installed,active,interrupted,expect", [
    (["1", "2"], ["1", "3"], True, False, ["differs from what is installed: b"]),
    (["1", "2"], [None, None], True, False, ["differs from what is installed: a, b"]),   # first deploy: nothing installed
    ([None, "2"], ["1", "2"], True, False, ["differs from what is installed: a"]),       # staging lost
    (["1", "2"], ["1", "2"], False, False, ["the service is not active"]),
    (["1", "2"], ["1", "2"], True, True, ["an earlier switch was interrupted (switch.json is there)"]),
])
def test_each_reason_to_switch(staged, installed, active, interrupted, expect):
    differ = _deploy.differing(["a", "b"], staged, installed)
    assert _deploy.switch_reasons(differ, active, interrupted) == expect


def test_differing_needs_one_checksum_per_file():
    with pytest.raises(_deploy.DeployStateError):
        _deploy.differing(["a", "b"], ["1"], ["1", "2"])


# -- restore plan ----------------------------------------------------------------------------------------------------

def test_first_deploy_restores_the_baseline():
    plan = _deploy.restore_plan({f["name"]: False for f in FILES}, None, saved_this_run=False, baseline="nextn",
                                files=FILES, current_url=URL, baseline_gate_timeout=1200)
    assert plan["source"] == "baseline" and plan["variant"] == "nextn" and plan["files"] == []
    assert plan["url"] == URL and plan["api_key_file"] is None
    assert plan["gate_timeout"] == 1200


def test_known_good_is_restored_and_gated_as_itself():
    """After a key and port change the restored service answers on its own port with its own key."""
    record = {"variant": "nextn", "argv": NEXTN_ARGV, "params": {"gate_timeout": 900}}
    plan = _deploy.restore_plan({f["name"]: True for f in FILES}, record, saved_this_run=True, baseline="nextn",
                                files=FILES, current_url="http://127.0.0.1:30002", baseline_gate_timeout=1200)
    assert plan["source"] == "known_good" and plan["variant"] == "nextn" and plan["saved_this_run"]
    assert [f["name"] for f in plan["files"]] == [f["name"] for f in FILES]
    assert plan["url"] == "http://127.0.0.1:30001"
    assert plan["api_key_file"] == "/etc/sglang/sglang-qwen.yaml"
    assert plan["gate_timeout"] == 900


def test_unmanaged_known_good_restores_only_what_was_saved():
    present = {"sglang-qwen.service": True, "sglang-qwen.yaml": False, "sglang-qwen.logging.json": False, "current.json": False}
    plan = _deploy.restore_plan(present, None, saved_this_run=True, baseline="nextn", files=FILES, current_url=URL,
                                baseline_gate_timeout=1200)
    assert plan["source"] == "known_good" and plan["variant"] == "the previous (unmanaged) service"
    assert [f["name"] for f in plan["files"]] == ["sglang-qwen.service"]
    assert plan["url"] == URL and plan["api_key_file"] is None
    # no record says how long it takes to come up: the baseline's timeout (the role's YAML
    # fell back to the FAILED variant's)
    assert plan["gate_timeout"] == 1200


def test_known_good_without_its_unit_falls_back_to_the_baseline():
    present = {f["name"]: f["name"] != "sglang-qwen.service" for f in FILES}
    plan = _deploy.restore_plan(present, {"variant": "nextn"}, saved_this_run=False, baseline="nextn", files=FILES,
                                current_url=URL)
    assert plan["source"] == "baseline"


@pytest.mark.parametrize("argv,url", [
    (["--host", "0.0.0.0", "--port", "8000"], "http://127.0.0.1:8000"),
    (["--host", "::", "--port", "8000"], "http://[::1]:8000"),  # its own family's loopback (issue 29)
    (["--host", "fd00::1", "--port", "8000"], "http://[fd00::1]:8000"),
    (["--port=8001"], "http://127.0.0.1:8001"),
    (["--host", "10.0.0.5"], "http://10.0.0.5:30000"),
    ([], None),
])
def test_url_of_the_flags(argv, url):
    assert _deploy.url_of(argv) == url


# -- outcomes and records --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gate,rollback,expect", [
    (True, None, "switched"), (False, True, "rolled_back"), (False, False, "rollback_failed"), (False, None, "rollback_failed"),
])
def test_outcome(gate, rollback, expect):
    assert _deploy.outcome(gate, rollback) == expect


def fields(outcome, **extra):
    base = {"host": "ct129", "variant": "shadow-balanced", "outcome": outcome, "verdict": {"ready": outcome == "switched",
            "failure": None if outcome == "switched" else "unit_failed", "cause": None, "msg": "m"},
            "memory_plan": {"fits": False, "binding": "dynamic", "reason": "r", "extra": 1},
            "ddtree_build": {"state": "applied", "build_id": "x" * 64, "noise": True}}
    base.update(extra)
    return base


def test_switched_record_runs_the_variant_and_keeps_only_the_schema():
    rec = _deploy.record(fields("switched"))
    assert list(rec) == list(_deploy.RECORD_KEYS)
    assert rec["running"] == "shadow-balanced" and rec["verdict"]["ready"] is True
    assert rec["memory_plan"] == {"fits": False, "binding": "dynamic", "reason": "r", "override": True}
    assert rec["ddtree_build"] == {"state": "applied", "build_id": "x" * 64}


PLAN = {"fits": True, "max_total_tokens": 197762, "max_running_requests": 16, "chunked_prefill_size": 2048,
        "cuda_graph_max_bs": 16, "mem_fraction_static": 0.88, "context_length": 131072, "sglang_version": "0.5.11"}
SERVER = {"version": "0.5.11", "max_total_tokens": 197000, "max_running_requests": 16, "chunked_prefill_size": 2048,
          "mem_fraction_static": 0.88, "context_length": 131072, "cuda_graph_bs": [1, 2, 4, 8, 12, 16]}


def test_plan_check_within_tolerance_differs_in_nothing():
    check = _deploy.plan_check(PLAN, SERVER)
    assert check["differs"] == [] and check["figures"]["max_total_tokens"] == {"planned": 197762, "server": 197000}
    assert check["figures"]["cuda_graph_max_bs"] == {"planned": 16, "server": 16}


@pytest.mark.parametrize("server, differs", [
    ({"max_total_tokens": 150000}, ["max_total_tokens"]),  # 24% fewer tokens than planned
    ({"max_running_requests": 48}, ["max_running_requests"]),
    ({"chunked_prefill_size": 4096}, ["chunked_prefill_size"]),  # 0.5.23's default for a 20-35 GiB GPU
    ({"mem_fraction_static": 0.85}, ["mem_fraction_static"]),
    ({"cuda_graph_bs": [1, 2, 4, 8]}, ["cuda_graph_max_bs"]),
    ({"version": "0.5.23"}, ["sglang_version"]),
])
def test_plan_check_names_each_figure_beyond_tolerance(server, differs):
    check = _deploy.plan_check(PLAN, {**SERVER, **server})
    assert check["differs"] == differs
    assert check["msg"].startswith("the server resolved other figures than planned (" + differs[0] + ": planned ")


def test_plan_check_needs_both_sides_and_the_record_keeps_it():
    assert _deploy.plan_check(PLAN, None) is None and _deploy.plan_check(None, SERVER) is None
    rec = _deploy.record(fields("switched", memory_plan=PLAN, verdict={"ready": True, "server": {**SERVER, "max_total_tokens": 1}}))
    assert rec["plan_check"]["differs"] == ["max_total_tokens"] and rec["verdict"]["server"]["max_total_tokens"] == 1
    loose = _deploy.record(fields("switched", memory_plan=PLAN, plan_tolerance=1.0,
                                  verdict={"ready": True, "server": {**SERVER, "max_total_tokens": 1}}))
    assert loose["plan_check"]["differs"] == []


def test_rolled_back_record_runs_the_restored_variant():
    rec = _deploy.record(fields("rolled_back", rollback={"variant": "nextn", "ready": True}))
    assert rec["running"] == "nextn" and rec["verdict"]["failure"] == "unit_failed"


def test_rollback_failed_record_runs_nothing():
    rec = _deploy.record(fields("rollback_failed", rollback={"variant": "nextn", "ready": False}))
    assert rec["running"] is None
    assert _deploy.summary_row(rec)[:2] == ("ROLLBACK FAILED", "nothing healthy")


def test_a_rolled_back_record_with_a_failed_rollback_is_refused():
    with pytest.raises(_deploy.DeployStateError, match="rollback_failed"):
        _deploy.record(fields("rolled_back", rollback={"variant": "nextn", "ready": False}))


@pytest.mark.parametrize("outcome", ["not_reached", "failed_before_switching", "done", None])
def test_only_outcomes_a_host_can_record(outcome):
    with pytest.raises(_deploy.DeployStateError, match="outcome must be one of"):
        _deploy.record(fields(outcome))


def test_a_failure_outside_the_gate_names_its_task():
    rec = _deploy.record(fields("rolled_back", verdict={"msg": "Could not find the requested service"},
                                failed_task="Start shadow-balanced", rollback={"variant": "nextn", "ready": True}))
    assert rec["verdict"]["failure"] == "task_failed"
    assert rec["verdict"]["msg"] == 'task "Start shadow-balanced" failed: Could not find the requested service'


def test_unchanged_runs_the_variant_only_when_its_gate_passed():
    ready = _deploy.record(fields("unchanged", verdict={"ready": True, "msg": "ok"}))
    down = _deploy.record(fields("unchanged", verdict={"ready": False, "failure": "connection_refused", "msg": "no"}))
    assert ready["running"] == "shadow-balanced" and down["running"] is None
    assert "already serving, unchanged" in _deploy.summary_text(ready, "/d")
    assert "does not serve" in _deploy.summary_text(down, "/d")


def test_summaries_say_what_runs_and_where_the_files_are():
    rolled = _deploy.record(fields("rolled_back", rollback={"variant": "nextn", "ready": True, "msg": "ready in 9 s"}))
    failed = _deploy.record(fields("rollback_failed", rollback={"variant": "nextn", "ready": False, "msg": "unit_failed"}))
    text = _deploy.summary_text(rolled, "/var/lib/x")
    assert "FAILED and was rolled back" in text and "Now running: nextn, healthy (ready in 9 s)." in text
    text = _deploy.summary_text(failed, "/var/lib/x")
    assert text.startswith("ct129: ROLLBACK FAILED.") and "/var/lib/x/switch.json" in text


def test_every_outcome_has_a_label():
    assert set(_deploy.RECORDED) <= set(_deploy.OUTCOMES) and set(_deploy_metrics.HEALTHY) <= set(_deploy.RECORDED)


# -- retention -------------------------------------------------------------------------------------------------------

def test_only_the_newest_attempts_are_kept():
    names = [f"202612{d:02d}T000000Z-shadow" for d in range(1, 26)] + ["notes", "lost+found"]
    pruned = _deploy.attempts_to_prune(names, 20)
    assert pruned == [f"202612{d:02d}T000000Z-shadow" for d in range(1, 6)]
    assert _deploy.attempts_to_prune(names[:3], 20) == []
    with pytest.raises(_deploy.DeployStateError):
        _deploy.attempts_to_prune(names, 0)


DRAIN = {"changed": False, "drained": True, "timed_out": False, "seconds": 3.2, "timeout": 60.0, "polls": 17,
         "in_flight_at_start": 2, "in_flight_at_stop": 0, "running_at_stop": 0, "waiting_at_stop": 0,
         "endpoint": "/v1/loads", "error": None, "msg": "drained in 3.2 s (2 request(s) in flight at the start)"}


def test_the_record_keeps_the_drain_and_the_rotation_hooks():
    rec = _deploy.record(fields("switched", drain=DRAIN, rotation={
        "out": {"ok": True, "msg": "HTTP 204"}, "in": {"ok": True, "msg": "HTTP 204"}, "noise": {"ok": 1}}))
    assert rec["drain"] == {k: v for k, v in DRAIN.items() if k not in ("changed", "polls")}
    assert rec["rotation"] == {"out": {"ok": True, "msg": "HTTP 204"}, "in": {"ok": True, "msg": "HTTP 204"}}
    text = _deploy.summary_text(rec, "/d")
    assert text.splitlines()[-1] == "Before the stop: drained in 3.2 s (2 request(s) in flight at the start)."
    # nothing ran (no switch, no hook): neither is recorded nor said
    rec = _deploy.record(fields("unchanged", verdict={"ready": True, "msg": "ok"}, drain=None, rotation={}))
    assert rec["drain"] is None and rec["rotation"] is None
    assert _deploy.summary_text(rec, "/d") == "ct129: shadow-balanced already serving, unchanged. ok"


def test_a_host_left_out_of_rotation_is_said_so():
    # the variant failed, and so did the rollback: the in hook never ran
    rec = _deploy.record(fields("rollback_failed", rollback={"variant": "nextn", "ready": False, "msg": "unit_failed"},
                                drain=DRAIN, rotation={"out": {"ok": True, "msg": "command exit 0"}}))
    assert "The host is OUT of rotation (the in hook did not run)." in _deploy.summary_text(rec, "/d")
    # the variant serves, the in hook failed
    rec = _deploy.record(fields("switched", drain=DRAIN, rotation={"out": {"ok": True, "msg": "HTTP 204"},
                                                                   "in": {"ok": False, "msg": "HTTP 503 (expected 200): x"}}))
    assert _deploy.summary_text(rec, "/d").endswith("The host is OUT of rotation (HTTP 503 (expected 200): x).")


PERF_RESULT = {"passed": True, "figures": {"output_tokens_per_s": 1240.0}, "load": {"requests": 8, "concurrency": 4,
               "max_tokens": 128}, "seconds": 6.1,
               "comparison": {"passed": True, "checks": [{"figure": "output_tokens_per_s", "new": 1240.0, "known_good": 1000.0,
                                                          "ratio": 1.24, "limit": ">= 0.9x", "ok": True}],
                              "msg": "as fast as the known-good service: output_tokens_per_s 1240.0 vs 1000.0 (1.24x, limit >= 0.9x)"},
               "msg": "1240.0 output tokens/s; as fast as the known-good service: output_tokens_per_s 1240.0 vs 1000.0 (1.24x, limit >= 0.9x)"}


def test_the_record_and_the_summary_carry_the_performance_gate():
    rec = _deploy.record(fields("switched", performance={"mode": "enforce", "result": PERF_RESULT,
                                                         "known_good": {"variant": "nextn", "source": "measured"}}))
    assert rec["performance"]["figures"] == {"output_tokens_per_s": 1240.0} and rec["performance"]["enforced"]
    assert _deploy.summary_text(rec, "/d").splitlines()[-1] == (
        "Performance gate (enforce): 1240.0 output tokens/s; as fast as the known-good service: "
        "output_tokens_per_s 1240.0 vs 1000.0 (1.24x, limit >= 0.9x).")
    assert _deploy.summary_row(rec) == ("switched", "shadow-balanced", "ready", "1.24x tok/s", "-")
    # a regression: the row names what regressed
    slow = dict(PERF_RESULT, passed=False, comparison=dict(PERF_RESULT["comparison"], checks=[
        dict(PERF_RESULT["comparison"]["checks"][0], ratio=0.5, ok=False)]))
    rec = _deploy.record(fields("rolled_back", rollback={"variant": "nextn", "ready": True, "msg": "ok"},
                                verdict={"ready": False, "failure": "slower_than_known_good", "cause": "output_tokens_per_s",
                                         "msg": "slower"},
                                performance={"mode": "enforce", "result": slow, "known_good": None}))
    assert _deploy.summary_row(rec) == ("rolled back", "nextn", "slower_than_known_good",
                                        "0.5x tok/s, output_tokens_per_s regressed", "output_tokens_per_s")
    # a variant that failed under the load, and one that never got to the gate (its readiness gate failed)
    failed = {"passed": False, "figures": None, "rounds": [], "seconds": 3.5, "msg": "round 1 failed: 2 of 4 requests"}
    rec = _deploy.record(fields("rolled_back", rollback={"variant": "nextn", "ready": True, "msg": "ok"},
                                performance={"mode": "enforce", "result": failed, "known_good": None}))
    assert _deploy.summary_row(rec)[3] == "failed under load"
    assert rec["performance"]["msg"] == "not measured: round 1 failed: 2 of 4 requests"
    rec = _deploy.record(fields("rolled_back", rollback={"variant": "nextn", "ready": True, "msg": "ok"},
                                performance={"mode": "enforce", "result": None,
                                             "known_good": {"variant": "nextn", "source": "measured", "figures": {"x": 1}}}))
    assert _deploy.summary_row(rec)[3] == "-" and rec["performance"]["known_good"]["figures"] == {"x": 1}
    # off, or an unchanged host: nothing measured, nothing said
    for perf in ({"mode": "off", "result": PERF_RESULT}, {"mode": "enforce", "result": None}, None):
        rec = _deploy.record(fields("switched", performance=perf))
        assert rec["performance"] is None and _deploy.summary_row(rec)[3] == "-"
        assert "Performance" not in _deploy.summary_text(rec, "/d")


# -- the command lines the host's SGLang argues before a switch ----------------------------------------------------

NEXTN = ["--model-path", "/m", "--speculative-algorithm", "NEXTN"]
BALANCED = ["--model-path", "/m", "--speculative-algorithm", "DDTREE"]


def variant_of(argv: list[str], name: str = "shadow-balanced", version: str = "0.5.11") -> dict:
    return {"variant": name, "argv": argv, "sglang_version": version}


def running(argv: list[str] | None = None, **more) -> dict:
    """The service before a deploy: NEXTN running (``argv`` another command line; ``active=False``: none)."""
    argv = list(argv or NEXTN)
    before = {"active": True, "variant": "nextn", "argv": argv, "sglang_version": "0.5.11",
              "gpu_devices": [0, 2], "interrupted": False, "known_good": False, "known_good_variant": None,
              "known_good_argv": None}
    before.update(more)
    return before


def labels(checks: list[dict]) -> list[str]:
    return [c["label"] for c in checks]


def test_a_switch_argues_the_variant_only_when_the_running_service_is_proven():
    checks = _deploy.argument_checks(running(), variant_of(BALANCED), variant_of(NEXTN, "nextn"), [0, 2])
    assert checks == [{"label": "variant shadow-balanced", "argv": BALANCED}]


def test_a_redeploy_of_the_running_service_argues_nothing_and_anything_else_argues_the_variant():
    """The running service's own command line, SGLang and GPUs: proven when it started (one import of SGLang,
    10-20 s on a GPU host, off every no-op deploy). Another release, other GPUs or an interrupted switch: argued."""
    nextn = variant_of(NEXTN, "nextn")
    assert _deploy.argument_checks(running(), nextn, None, [0, 2]) == []
    for before, gpus, version in ((running(), [0, 1], "0.5.11"), (running(), [0, 2], "0.5.23"),
                                  (running(interrupted=True), [0, 2], "0.5.11"), (running(active=False), [0, 2], "0.5.11")):
        checks = _deploy.argument_checks(before, variant_of(NEXTN, "nextn", version), None, gpus)
        assert labels(checks)[0] == "variant nextn", (before, gpus, version)
    # another release: the running command line is a rollback target that the new SGLang must take too
    assert labels(_deploy.argument_checks(running(), variant_of(BALANCED, version="0.5.23"), None, [0, 2])) == [
        "variant shadow-balanced", "rollback target nextn (running now)"]


def test_a_first_deploy_argues_the_baseline_and_a_saved_known_good_service_replaces_it():
    baseline = variant_of(NEXTN, "nextn")
    first = running(active=False, variant=None)
    assert labels(_deploy.argument_checks(first, variant_of(BALANCED), baseline, [0, 2])) == [
        "variant shadow-balanced", "rollback target nextn (baseline)"]
    saved = running(active=False, variant=None, known_good=True, known_good_variant="nextn", known_good_argv=NEXTN + ["--x"])
    assert labels(_deploy.argument_checks(saved, variant_of(BALANCED), baseline, [0, 2])) == [
        "variant shadow-balanced", "rollback target nextn (known-good)"]
    # the same command line twice is argued once, under its first label
    assert labels(_deploy.argument_checks(first, variant_of(NEXTN, "nextn"), baseline, [0, 2])) == ["variant nextn"]
