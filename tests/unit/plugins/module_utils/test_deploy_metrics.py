"""_deploy_metrics: a service's deploy state as node_exporter textfile metrics, from its records;
_state_files: the small state files it and the deploy state module read and write."""

from __future__ import annotations

import json
import os
import stat
from datetime import datetime, timezone

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_metrics as dm
from ansible_collections.inferops.sglang.plugins.module_utils import _state_files as files

SERVICE = "sglang-qwen.service"


def deploy(outcome, variant, time_, ready=True, failure=None, cause=None, running=None, perf=None, run_id="r"):
    rec = {"time": time_, "service": SERVICE, "run_id": run_id, "variant": variant, "outcome": outcome,
           "running": running if running is not None else (variant if outcome in ("switched", "unchanged") else "nextn"),
           "sglang_version": "0.5.11", "verdict": {"ready": ready, "failure": failure, "cause": cause}}
    if perf:
        rec["performance"] = {"measured_ok": True, "figures": perf}
    return rec


def samples(text):
    """{(sample name, frozenset(labels)): value} of a text exposition, read back with the parser."""
    out = {}
    for family in dm.parse(text).values():
        for name, labels, value in family["samples"]:
            out[(name, frozenset(labels.items()))] = value
    return out


def value(text, name, **labels):
    labels.setdefault("service", SERVICE)
    return samples(text)[(name, frozenset(labels.items()))]


def test_a_switch_then_a_rollback_read_as_the_last_outcome_and_counts():
    records = [
        deploy("switched", "nextn", "2026-12-03T01:00:00Z", perf={"output_tokens_per_s": 812.5, "ttft_p95": 0.12,
                                                                  "accept_length": None}),
        deploy("rolled_back", "balanced", "2026-12-03T02:00:00Z", ready=False, failure="unit_failed",
               cause='CUDA error: "no kernel image"\nat line 3', run_id="r2"),
    ]
    text = dm.textfile(SERVICE, records)
    assert value(text, "inferops_sglang_deploy_info", variant="balanced", outcome="rolled_back", running="nextn",
                 sglang_version="0.5.11", run_id="r2", slot="") == 1
    assert value(text, "inferops_sglang_deploy_timestamp_seconds") == datetime(2026, 12, 3, 2, tzinfo=timezone.utc).timestamp()
    assert value(text, "inferops_sglang_deploy_healthy") == 1  # rolled back: the known-good serves
    assert value(text, "inferops_sglang_deploy_gate_ready") == 0
    # the cause keeps its quote and newline through the escaping (whitespace folded to one line)
    assert value(text, "inferops_sglang_deploy_verdict_info", variant="balanced", failure="unit_failed",
                 cause='CUDA error: "no kernel image" at line 3') == 1
    assert value(text, "inferops_sglang_deploys_total", outcome="switched") == 1
    assert value(text, "inferops_sglang_deploys_total", outcome="rolled_back") == 1
    assert value(text, "inferops_sglang_deploys_total", outcome="rollback_failed") == 0
    assert value(text, "inferops_sglang_rollbacks_total") == 1
    # the newest measurement's figures (the rollback measured nothing); None figures are left out
    assert value(text, "inferops_sglang_perf_figure", variant="nextn", figure="output_tokens_per_s") == 812.5
    assert value(text, "inferops_sglang_perf_figure", variant="nextn", figure="ttft_p95") == 0.12
    assert not [k for k in samples(text) if ("figure", "accept_length") in k[1]]
    families = dm.parse(text)
    assert families["inferops_sglang_deploys_total"]["type"] == "counter"
    assert families["inferops_sglang_deploy_info"]["type"] == "gauge"


def test_the_outage_behind_the_gateway_is_the_last_deploys_and_summed():
    records = [deploy("switched", "nextn", "2026-12-03T01:00:00Z"),
               dict(deploy("switched", "balanced", "2026-12-03T02:00:00Z"), gateway={"unavailable_s": 26.38}),
               dict(deploy("rolled_back", "shadow", "2026-12-03T03:00:00Z"), gateway={"unavailable_s": 45.64}),
               dict(deploy("unchanged", "nextn", "2026-12-03T04:00:00Z"), gateway={"in": {"added": False}})]
    text = dm.textfile(SERVICE, records)
    assert value(text, "inferops_sglang_deploy_unavailable_seconds") == 45.64
    assert value(text, "inferops_sglang_unavailable_seconds_total") == 72.02
    assert "unavailable" not in dm.textfile(SERVICE, records[:1])  # no gateway, no series


def test_a_failed_rollback_is_not_healthy_and_nothing_serves():
    text = dm.textfile(SERVICE, [deploy("rollback_failed", "balanced", "2026-12-03T02:00:00Z", ready=False,
                                        failure="timeout", cause="", running="")])
    assert value(text, "inferops_sglang_deploy_healthy") == 0
    assert value(text, "inferops_sglang_rollbacks_total") == 1
    assert value(text, "inferops_sglang_deploy_info", variant="balanced", outcome="rollback_failed", running="",
                 sglang_version="0.5.11", run_id="r", slot="") == 1


def test_watchdog_events_are_counted_by_event():
    events = [{"time": "2026-12-03T03:00:00Z", "event": "restarted"}, {"time": "2026-12-03T03:05:00Z", "event": "restarted"},
              {"time": "2026-12-03T03:06:00Z", "event": "recovered"}, {"time": "x", "event": "not-an-event"}]
    text = dm.textfile(SERVICE, [], events)
    assert value(text, "inferops_sglang_watchdog_events_total", event="restarted") == 2
    assert value(text, "inferops_sglang_watchdog_events_total", event="recovered") == 1
    assert value(text, "inferops_sglang_watchdog_events_total", event="held_back") == 0
    assert value(text, "inferops_sglang_watchdog_last_event_timestamp_seconds") == datetime(2026, 12, 3, 3, 6, tzinfo=timezone.utc).timestamp()
    assert "deploy_info" not in text
    assert dm.textfile(SERVICE, [], []) == ""


def test_refresh_writes_once_world_readable_and_in_one_step(tmp_path):
    service_dir = tmp_path / "state"
    (service_dir / "watchdog").mkdir(parents=True)
    (service_dir / "history.jsonl").write_text(json.dumps(deploy("switched", "nextn", "2026-12-03T01:00:00Z")) + "\n"
                                               + '{"cut short\n')
    out = tmp_path / "textfile"
    assert dm.refresh(str(service_dir), SERVICE, str(out)) is True
    path = out / "inferops_sglang_sglang-qwen.service.prom"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    mtime = os.stat(path).st_mtime_ns
    assert dm.refresh(str(service_dir), SERVICE, str(out)) is False  # the same records: not rewritten
    assert os.stat(path).st_mtime_ns == mtime
    assert value(path.read_text(), "inferops_sglang_deploys_total", outcome="switched") == 1
    files.append_line(str(service_dir / "watchdog" / "history.jsonl"),
                      json.dumps({"time": "2026-12-03T03:00:00Z", "event": "restarted"}))
    assert dm.refresh(str(service_dir), SERVICE, str(out)) is True
    assert value(path.read_text(), "inferops_sglang_watchdog_events_total", event="restarted") == 1
    assert [p.name for p in out.iterdir()] == [path.name]  # no temporary file left behind


NOBODY = 65534


def another_users(path) -> None:
    """``path`` made another user's, as Debian's package makes /var/lib/prometheus and its
    node-exporter directory the prometheus user's (a run as another user than root: already so)."""
    if os.geteuid() == 0:
        os.chown(path, NOBODY, NOBODY, follow_symlinks=False)


def switched_once(tmp_path):
    """A service's state directory whose history holds one switch to nextn."""
    service_dir = tmp_path / "state"
    service_dir.mkdir()
    (service_dir / "history.jsonl").write_text(json.dumps(deploy("switched", "nextn", "2026-12-03T01:00:00Z")) + "\n")
    return service_dir


def test_refresh_never_writes_through_a_link_the_directorys_owner_planted(tmp_path):
    """Issue 29: node_exporter's user owns the textfile directory and its parent. A link it puts
    in place of the directory, or at the file's name, made root write (0644, the metrics text)
    wherever it pointed. Now the directory is opened without following a link another user could
    have planted, and the file is replaced by rename, never written through a link."""
    service_dir = switched_once(tmp_path)
    victim = tmp_path / "etc"
    victim.mkdir()
    secret = victim / "shadow"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    prometheus = tmp_path / "prometheus"
    prometheus.mkdir()
    another_users(prometheus)
    # the directory replaced by a link to the victim's
    (prometheus / "node-exporter").symlink_to(victim)
    with pytest.raises(OSError, match="node-exporter is a symbolic link in a directory that another user than root can change"):
        dm.refresh(str(service_dir), SERVICE, str(prometheus / "node-exporter"))
    assert sorted(p.name for p in victim.iterdir()) == ["shadow"]
    # a link at the file's name, to a root-only file: replaced, the file untouched
    (prometheus / "node-exporter").unlink()
    textfiles = prometheus / "node-exporter"
    textfiles.mkdir()
    another_users(textfiles)
    (textfiles / dm.file_name(SERVICE)).symlink_to(secret)
    assert dm.refresh(str(service_dir), SERVICE, str(textfiles)) is True
    assert secret.read_text() == "root only\n" and stat.S_IMODE(secret.stat().st_mode) == 0o600
    written = textfiles / dm.file_name(SERVICE)
    assert not written.is_symlink() and value(written.read_text(), "inferops_sglang_deploys_total", outcome="switched") == 1
    # no records: the file goes (a link there would be removed, not followed)
    (service_dir / "history.jsonl").write_text("")
    assert dm.refresh(str(service_dir), SERVICE, str(textfiles)) is True and not written.exists()


def test_a_link_only_root_could_have_made_is_followed(tmp_path):
    """A host whose /var/lib is a link (root's, in root's /) keeps working: a link in a directory
    that only root can change is followed (/proc/self, in root's 0555 /proc, for any user); the same
    link in a directory another user can change is not."""
    fd = files.open_directory("/proc/self")
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(f"/proc/{os.getpid()}"))
    finally:
        os.close(fd)
    service_dir = switched_once(tmp_path)
    real = tmp_path / "data"
    real.mkdir()
    roots = tmp_path / "roots"
    roots.mkdir(mode=0o755)
    (roots / "lib").symlink_to(real)
    if os.geteuid() == 0:  # only root makes a directory that only root can change: written through the link
        assert dm.refresh(str(service_dir), SERVICE, str(roots / "lib" / "node-exporter")) is True
        assert (real / "node-exporter" / dm.file_name(SERVICE)).is_file()
    roots.chmod(0o777)
    with pytest.raises(OSError, match="lib is a symbolic link in a directory that another user than root can change"):
        dm.refresh(str(service_dir), SERVICE, str(roots / "lib" / "node-exporter"))


def test_the_parser_refuses_what_is_not_the_text_format():
    with pytest.raises(ValueError, match="not a sample"):
        dm.parse("sglang:num_requests_total{a=\"1\"}\n")
    with pytest.raises(ValueError, match="bad labels"):
        dm.parse('x{a=1} 2\n')
    histogram = dm.parse('# TYPE h histogram\nh_bucket{le="+Inf"} 3.0\nh_sum 1.5\nh_count 3.0\n')
    assert histogram["h"]["type"] == "histogram" and len(histogram["h"]["samples"]) == 3


def test_state_files_read_what_parses_and_replace_only_on_change(tmp_path):
    assert files.read_json(str(tmp_path / "missing.json")) is None
    (tmp_path / "list.json").write_text("[1]")
    assert files.read_json(str(tmp_path / "list.json")) is None
    (tmp_path / "h.jsonl").write_text('{"a": 1}\n[2]\n{"cut\n{"b": 2}\n')
    assert files.read_jsonl(str(tmp_path / "h.jsonl")) == [{"a": 1}, {"b": 2}]
    target = str(tmp_path / "f")
    assert files.replace(target, "one", 0o600) is True
    assert files.replace(target, "one", 0o600) is False
    assert files.replace(target, "one", 0o644) is True  # the mode alone differs
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644


def test_a_candidate_refused_beside_the_live_slot_is_healthy_and_says_its_slot():
    refused = dict(deploy("refused", "balanced", "2026-12-03T02:00:00Z", ready=False, failure="unit_failed",
                          cause="cuda_library"), running="nextn", slot={"mode": "blue_green", "slot": "green"})
    text = dm.textfile(SERVICE, [refused])
    assert value(text, "inferops_sglang_deploy_info", variant="balanced", outcome="refused", running="nextn",
                 sglang_version="0.5.11", run_id=refused["run_id"], slot="green") == 1
    assert value(text, "inferops_sglang_deploy_healthy") == 1 and value(text, "inferops_sglang_rollbacks_total") == 0
    assert value(text, "inferops_sglang_deploys_total", outcome="refused") == 1


# smg 1.13.0's /metrics, as it answered here after three /generate with no worker registered and one
# /readiness (the lines of the two families the switch reads, HELP shortened)
SMG_METRICS = """# HELP smg_http_responses_total Total HTTP responses by path, status_code and error_code
# TYPE smg_http_responses_total counter
smg_http_responses_total{path="/generate",status_code="404",error_code="model_not_found"} 3
smg_http_responses_total{path="/readiness",status_code="503",error_code=""} 1
# HELP smg_http_requests_total Total HTTP requests by method and path
# TYPE smg_http_requests_total counter
smg_http_requests_total{method="GET",path="/readiness"} 1
smg_http_requests_total{method="POST",path="/generate"} 3
"""


def test_the_gateways_own_counters_give_the_clients_answered_and_failed_requests():
    assert dm.gateway_responses(SMG_METRICS) == {"answered": 3, "failed": 3}
    served = SMG_METRICS + ('smg_http_responses_total{path="/generate",status_code="200",error_code=""} 40\n'
                            'smg_http_responses_total{path="/v1/chat/completions",status_code="502",error_code=""} 2\n'
                            'smg_http_responses_total{path="/v1/chat/completions",status_code="401",error_code=""} 5\n'
                            'smg_http_responses_total{path="/workers",status_code="202",error_code=""} 2\n')
    # a client's bad key (401) was answered, not failed; the worker API is not a client's
    assert dm.gateway_responses(served) == {"answered": 50, "failed": 5}
    with pytest.raises(ValueError):
        dm.gateway_responses("not an exposition {")
    text = dm.textfile(SERVICE, [dict(deploy("switched", "nextn", "2026-12-03T02:00:00Z"),
                                      gateway={"unavailable_s": 0.0, "requests": {"answered": 50, "failed": 0}})])
    assert value(text, "inferops_sglang_deploy_gateway_requests", result="answered") == 50
    assert value(text, "inferops_sglang_deploy_gateway_requests", result="failed") == 0
