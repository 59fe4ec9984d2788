"""deploy_summary: the rollout summary from the records deploy.yml publishes."""

from __future__ import annotations

from ansible_collections.inferops.sglang.plugins.callback.deploy_summary import failure_message, summary_lines

ROLLOUT = {"variant": "balanced", "hosts": ["fleet-01", "fleet-02", "fleet-03", "fleet-04", "fleet-05"],
           "canary": 1, "batch": "25%", "max_fail_percentage": 0}


def record(outcome: str, running: str | None, failure=None, cause=None, rollback_ready=True, msg="") -> dict:
    return {"outcome": outcome, "running": running,
            "rollback": {"ready": rollback_ready} if outcome in ("rolled_back", "rollback_failed") else None,
            "verdict": {"ready": outcome == "switched", "failure": failure, "cause": cause, "msg": msg}}


def rows(lines: list[str]) -> dict:
    return {line.split()[0]: line for line in lines[2:] if line.startswith("fleet-")}


def test_every_host_is_listed_with_how_far_the_rollout_went():
    records = {
        "fleet-01": record("switched", "shadow-balanced"),
        "fleet-02": record("unchanged", "shadow-balanced"),
        "fleet-03": record("rolled_back", "nextn", "unit_restarted", "cuda_library", msg="variant shadow-balanced FAILED"),
    }
    lines = summary_lines(ROLLOUT, records, {}, {"fleet-01", "fleet-02", "fleet-03"})
    assert lines[0] == ("DEPLOY SUMMARY: variant balanced, canary 1 then batches of 25%, stop above 0% failed in a batch")
    table = rows(lines)
    assert table["fleet-01"].split() == ["fleet-01", "switched", "shadow-balanced", "ready", "-", "-"]
    assert table["fleet-02"].split()[1] == "unchanged"
    assert table["fleet-03"].split() == ["fleet-03", "rolled", "back", "nextn", "unit_restarted", "-", "cuda_library"]
    assert table["fleet-04"].split()[1:3] == ["not", "reached"]
    assert "fleet-03: variant shadow-balanced FAILED" in lines
    assert lines[1].split() == ["host", "outcome", "running", "now", "verdict", "perf", "cause"]
    assert lines[-1] == ("The rollout stopped after fleet-03: 2 host(s) not reached and left as they were "
                         "(fleet-04, fleet-05).")


def test_failed_rollback_and_preflight_refusal_stand_out():
    # the outcome the role records when the known-good service does not come back
    records = {"fleet-01": record("rollback_failed", None, "unit_failed", "kv_pool_too_small", rollback_ready=False)}
    failures = {"fleet-02": "variant shadow does not fit in GPU memory (static pool, ...)"}
    lines = summary_lines(ROLLOUT, records, failures, {"fleet-01", "fleet-02"})
    table = rows(lines)
    assert table["fleet-01"].split()[1:5] == ["ROLLBACK", "FAILED", "nothing", "healthy"]
    assert table["fleet-02"].split()[1:4] == ["failed", "before", "switching"]
    assert "fleet-02: variant shadow does not fit in GPU memory (static pool, ...)" in lines
    assert "The rollout stopped after fleet-01, fleet-02: 3 host(s) not reached" in lines[-1]


def test_a_single_host_that_switched_has_no_tail():
    lines = summary_lines(dict(ROLLOUT, hosts=["ct200"]), {"ct200": record("switched", "shadow-balanced")}, {}, {"ct200"})
    assert len(lines) == 3 and lines[-1].startswith("ct200  switched")


def test_a_failed_loop_reports_its_failed_item():
    """The preflight's argument checks run in a loop: the refusal, not "One or more items failed"."""
    result = {"msg": "One or more items failed", "results": [
        {"failed": False, "msg": "ok"},
        {"failed": True, "msg": "SGLang 0.5.11 refuses variant cpu-ngram: Ngram speculative decoding only supports CUDA device."}]}
    assert failure_message(result).startswith("SGLang 0.5.11 refuses variant cpu-ngram")
    assert failure_message({"msg": "plain"}) == "plain" and failure_message({}) == "failed"
