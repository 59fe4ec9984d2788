"""sglang_deploy_state: each step on a real state directory."""

from __future__ import annotations

import json
import os
import stat

from sim_helpers import run_module

from ansible_collections.inferops.sglang.plugins.modules import sglang_deploy_state


def layout(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    state = tmp_path / "state"
    for sub in ("staging/run1", "known-good", "attempts"):
        (state / sub).mkdir(parents=True)
    files = [
        {"name": "u.service", "src": str(etc / "u.service"), "mode": "0644", "template": "sglang.service.j2"},
        {"name": "u.yaml", "src": str(etc / "u.yaml"), "mode": "0600", "template": "sglang.config.yaml.j2"},
        {"name": "current.json", "src": str(state / "current.json"), "mode": "0600", "template": None},
    ]
    return state, files


def run(capsys, **args):
    code, result = run_module(sglang_deploy_state.main, capsys, args)[:2]
    return code, result


def test_decide_compares_this_runs_staging_with_the_installed_files(tmp_path, capsys):
    state, files = layout(tmp_path)
    staged = files[:2]
    for f in staged:
        (state / "staging/run1" / f["name"]).write_text("new " + f["name"])
    code, result = run(capsys, step="decide", service_dir=str(state), run_id="run1", files=staged, active=True)
    assert code == 0 and result["switch"] and result["reasons"] == ["differs from what is installed: u.service, u.yaml"]
    for f in staged:
        with open(f["src"], "w", encoding="utf-8") as handle:
            handle.write("new " + f["name"])
    code, result = run(capsys, step="decide", service_dir=str(state), run_id="run1", files=staged, active=True)
    assert code == 0 and not result["switch"] and result["reasons"] == []
    # another run's staging is not this run's
    code, result = run(capsys, step="decide", service_dir=str(state), run_id="run2", files=staged, active=True)
    assert result["switch"]


def test_inspect_reads_the_record_the_marker_and_the_known_good(tmp_path, capsys):
    state, files = layout(tmp_path)
    argv = ["--host", "0.0.0.0", "--port", "30001"]
    (state / "current.json").write_text(json.dumps({"variant": "nextn", "argv": argv}))
    (state / "switch.json").write_text(json.dumps({"variant": "shadow", "run_id": "dead"}))
    (state / "known-good/u.service").write_text("unit")
    (state / "known-good/current.json").write_text(json.dumps({"variant": "nextn", "argv": argv}))
    with open(files[1]["src"], "w", encoding="utf-8") as handle:
        handle.write("{}\n")
    code, result = run(capsys, step="inspect", service_dir=str(state), files=files)
    before = result["before"]
    assert code == 0 and before["variant"] == "nextn" and before["url"] == "http://127.0.0.1:30001"
    assert before["interrupted"] and before["marker"]["run_id"] == "dead"
    assert before["known_good"] and before["known_good_variant"] == "nextn"
    assert before["api_key_file"] == files[1]["src"]


def test_restore_plans_the_baseline_on_a_first_deploy(tmp_path, capsys):
    state, files = layout(tmp_path)
    code, result = run(capsys, step="restore", service_dir=str(state), files=files, baseline="nextn", url="http://127.0.0.1:1",
                       baseline_gate_timeout=1200)
    assert code == 0 and result["plan"]["source"] == "baseline" and result["plan"]["variant"] == "nextn"
    assert result["plan"]["gate_timeout"] == 1200
    code, result = run(capsys, step="restore", service_dir=str(state), files=files, baseline="nextn", url="http://127.0.0.1:1")
    assert code == 1 and "baseline_gate_timeout" in result["msg"]


def test_record_appends_clears_the_marker_prunes_and_removes_staging(tmp_path, capsys):
    state, files = layout(tmp_path)
    (state / "switch.json").write_text("{}")
    (state / "staging/killed-run").mkdir()
    (state / "staging/sglang-qwen.service").write_text("the older shared layout")
    for day in range(1, 5):
        (state / f"attempts/202612{day:02d}T000000Z-shadow").mkdir()
    code, result = run(capsys, step="record", service_dir=str(state), run_id="run1", keep_attempts=2,
                       fields={"host": "ct129", "variant": "nextn", "outcome": "switched", "verdict": {"ready": True, "msg": "ok"}})
    assert code == 0 and result["changed"] and result["record"]["running"] == "nextn"
    lines = (state / "history.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["run_id"] == "run1"
    assert stat.S_IMODE(os.stat(state / "history.jsonl").st_mode) == 0o600
    assert not (state / "switch.json").exists() and os.listdir(state / "staging") == []
    assert sorted(os.listdir(state / "attempts")) == ["20261203T000000Z-shadow", "20261204T000000Z-shadow"]
    assert result["pruned"] == ["20261201T000000Z-shadow", "20261202T000000Z-shadow"]


def test_a_failed_rollback_keeps_the_marker(tmp_path, capsys):
    state, files = layout(tmp_path)
    (state / "switch.json").write_text("{}")
    code, result = run(capsys, step="record", service_dir=str(state), run_id="run1",
                       fields={"variant": "shadow", "outcome": "rollback_failed", "verdict": {"failure": "unit_failed"},
                               "rollback": {"variant": "nextn", "ready": False}})
    assert code == 0 and result["record"]["outcome"] == "rollback_failed" and (state / "switch.json").exists()


def test_an_impossible_record_fails(tmp_path, capsys):
    state = layout(tmp_path)[0]
    code, result = run(capsys, step="record", service_dir=str(state), run_id="run1",
                       fields={"variant": "shadow", "outcome": "rolled_back", "verdict": {}, "rollback": {"ready": False}})
    assert code == 1 and "rollback_failed" in result["msg"] and not (state / "history.jsonl").exists()


def test_unchanged_is_composed_but_not_written(tmp_path, capsys):
    state = layout(tmp_path)[0]
    code, result = run(capsys, step="record", service_dir=str(state), run_id="run1", history=False,
                       fields={"variant": "nextn", "outcome": "unchanged", "verdict": {"ready": True}})
    assert code == 0 and not result["changed"] and not (state / "history.jsonl").exists()
    assert not (state / "staging/run1").exists()
    assert result["record"]["running"] == "nextn"


def test_run_id_must_be_a_plain_name(tmp_path, capsys):
    state, files = layout(tmp_path)
    code, result = run(capsys, step="decide", service_dir=str(state), run_id="../x", files=files)
    assert code == 1 and "run_id" in result["msg"]


def test_figures_finds_the_running_services_measurement_written_by_an_earlier_record(tmp_path, capsys):
    """The record step writes the switched variant's figures; a later figures step of the same service
    under the same load finds them (a cut-short line is skipped), and another load does not."""
    state = layout(tmp_path)[0]
    argv = ["--model-path", "/m", "--port", "30000"]
    load = {"requests": 16, "concurrency": 8, "max_tokens": 128, "rounds": 3, "warmup": True}
    result = {"passed": True, "figures": {"output_tokens_per_s": 812.5}, "load": load, "seconds": 4.0,
              "comparison": {"passed": True, "checks": [], "msg": "no known-good figures to compare with"}, "msg": "812.5 output tokens/s"}
    code, written = run(capsys, step="record", service_dir=str(state), run_id="run1",
                        fields={"variant": "nextn", "outcome": "switched", "verdict": {"ready": True}, "argv": argv,
                                "sglang_version": "0.5.11", "gpu_devices": [0],
                                "performance": {"mode": "enforce", "result": result, "known_good": None}})
    assert code == 0 and written["record"]["performance"]["measured_ok"]
    with open(state / "history.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"cut short')
    service = {"argv": argv, "sglang_version": "0.5.11", "gpu_devices": [0], "variant": "nextn", "active": True}
    code, got = run(capsys, step="figures", service_dir=str(state), service=service,
                    variant_params={"max_running_requests": 16, "context_length": 131072})
    assert code == 0 and got["load"]["concurrency"] == 8 and got["load"]["timeout"] == 60
    assert got["known_good"]["figures"] == {"output_tokens_per_s": 812.5} and got["known_good"]["source"] == "history"
    # a variant with 4 running requests is measured at concurrency 4: the figures at 8 do not count
    code, got = run(capsys, step="figures", service_dir=str(state), service=service, variant_params={"max_running_requests": 4})
    assert code == 0 and got["load"]["concurrency"] == 4 and got["known_good"] is None
    # no running service (a first deploy): the load only
    code, got = run(capsys, step="figures", service_dir=str(state), variant_params={}, load={"max_tokens": 64})
    assert code == 0 and got["load"]["max_tokens"] == 64 and got["known_good"] is None
    code, got = run(capsys, step="figures", service_dir=str(state), load={"rounds": 0})
    assert code == 1 and got["msg"] == "sglang_service_perf_load: load.rounds must be an integer in [1, 4096], got 0"


def test_record_writes_the_deploy_state_for_node_exporter_also_for_an_unchanged_host(tmp_path, capsys):
    """The textfile is rewritten from history.jsonl at each record: after a rollback it says so; an
    unchanged host's record (no history line) writes it when it is missing and changes nothing after."""
    state = layout(tmp_path)[0]
    textfiles = tmp_path / "node-exporter"
    prom = textfiles / "inferops_sglang_u.service.prom"
    code, result = run(capsys, step="record", service_dir=str(state), run_id="run1", textfile_dir=str(textfiles),
                       fields={"service": "u.service", "variant": "balanced", "outcome": "rolled_back",
                               "time": "2026-12-03T02:00:00Z",
                               "verdict": {"ready": False, "failure": "unit_failed", "cause": "CUDA error"},
                               "rollback": {"variant": "nextn", "ready": True}})
    assert code == 0 and result["changed"] and result["textfile_changed"]
    text = prom.read_text()
    assert 'inferops_sglang_deploy_info{outcome="rolled_back",run_id="run1",running="nextn",service="u.service"' in text
    assert 'inferops_sglang_rollbacks_total{service="u.service"} 1' in text
    prom.unlink()
    code, result = run(capsys, step="record", service_dir=str(state), run_id="run2", history=False,
                       textfile_dir=str(textfiles),
                       fields={"service": "u.service", "variant": "nextn", "outcome": "unchanged", "verdict": {"ready": True}})
    assert code == 0 and result["changed"] and prom.read_text() == text  # from the history, not this record
    code, result = run(capsys, step="record", service_dir=str(state), run_id="run3", history=False,
                       textfile_dir=str(textfiles),
                       fields={"service": "u.service", "variant": "nextn", "outcome": "unchanged", "verdict": {"ready": True}})
    assert code == 0 and not result["changed"]
