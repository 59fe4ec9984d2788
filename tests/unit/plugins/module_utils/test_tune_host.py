"""The tune's trial units on systemd (_tune_host.SystemTrials) through a fake host: the role's
rendering installed, each candidate's command line in a drop-in that resets ExecStart and turns
restarts off, trials started without being enabled, a dead trial stopped with its verdict, and
everything removed at the end; and the sglang_tune module's run of a whole tune on them."""

from __future__ import annotations

import json

import pytest
from sim_helpers import run_module

from ansible_collections.inferops.sglang.plugins.module_utils import _tune_host, _variants
from ansible_collections.inferops.sglang.plugins.modules import sglang_tune

SERVER = {"model_path": "/srv/models/q", "served_model_name": "q", "host": "127.0.0.1", "tp_size": 2}
BASE = {"speculative_algorithm": "NEXTN", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4, "context_length": 32768, "max_running_requests": 4,
        "mem_fraction_static": 0.85, "cuda_graph": False, "disable_radix_cache": True}


def trial(role: str, port: int) -> dict:
    server = dict(SERVER, port=port)
    args = _variants.quote(_variants.argv(BASE, server, (0, 5, 11)))
    unit = f"sglang-qwen-tune-{role}.service"
    text = (f"[Unit]\nDescription=trial\n[Service]\nUser=sglang\nExecStart=/opt/sglang/bin/python -m sglang.launch_server "
            f"{args} --config %d/sglang-qwen.yaml\nRestart=on-failure\nSyslogIdentifier=sglang-qwen-tune-{role}\n")
    return {"role": role, "unit": unit, "port": port, "url": f"http://127.0.0.1:{port}", "gpus": [3, 4],
            "unit_text": text, "render": {"exec_args": args, "server": server, "sglang_version": "0.5.11",
                                          "gpu_memory_mib": []}}


def rate(argv: list[str]) -> float:
    """The fake's tokens/s: a server that runs 8 requests at once is 1.5 times one that runs fewer."""
    flag = "--max-running-requests"
    return 150.0 if flag in argv and argv[argv.index(flag) + 1] == "8" else 100.0


class FakeHost:
    """SystemHost's surface the trials use: systemctl calls kept, the gate and the benchmark scripted."""

    def __init__(self, dies=lambda argv: False) -> None:
        self.calls: list[list[str]] = []
        self.dies = dies
        self.running: dict[str, list[str]] = {}
        self.unit_dir = None

    def systemctl(self, *args):
        self.calls.append(["systemctl", *args])
        if args[0] == "start":
            unit = args[-1]
            dropin = self.unit_dir / f"{unit}.d" / _tune_host.DROPIN
            line = [x for x in dropin.read_text().splitlines() if x.startswith("ExecStart=/")][0]
            self.running[unit] = line.split()
        return ""

    def run_command(self, argv):
        self.calls.append(list(argv))
        if argv[1] == "stop":
            self.running.pop(argv[-1], None)
        return 0, "", ""

    def gate(self, url, api_key_file, timeout, settle, unit=None):
        if self.dies(self.running.get(unit, [])):
            return {"ready": False, "failure": "process_exited", "cause": "cuda_oom",
                    "cause_summary": "CUDA out of memory while capturing CUDA graphs"}
        argv = self.running.get(unit, [])
        running = int(argv[argv.index("--max-running-requests") + 1]) if "--max-running-requests" in argv else 48
        return {"ready": True, "server": {"max_total_tokens": 5120, "max_running_requests": running}}

    def bench_pair(self, reference, candidate, load, thresholds):
        ref, cand = self.running[reference["unit"]], self.running[candidate["unit"]]
        pairs = max(2, load["rounds"])
        r = [rate(ref) * (1 + 0.01 * (i % 2)) for i in range(pairs)]
        c = [rate(cand) * (1 - 0.01 * (i % 2)) for i in range(pairs)]
        from ansible_collections.inferops.sglang.plugins.module_utils import _stats  # pylint: disable=import-outside-toplevel
        interval = _stats.ratio_interval(r, c)
        check = dict(interval, figure="output_tokens_per_s", verdict=_stats.verdict(interval, True))
        return {"ok": True, "figures": {"output_tokens_per_s": c[0], "ttft_p95": 0.1},
                "reference": {"figures": {"output_tokens_per_s": r[0], "ttft_p95": 0.1}},
                "comparison": {"checks": [check]}, "seconds": 1.0}


@pytest.fixture
def trials(tmp_path):
    host = FakeHost()
    host.unit_dir = tmp_path
    made = _tune_host.SystemTrials(host, [trial("reference", 30020), trial("candidate", 30021)],
                                   {"timeout": 60, "settle": 1}, unit_dir=str(tmp_path))
    return made, host, tmp_path


def test_install_writes_both_rendered_units_and_reloads(trials):
    made, host, unit_dir = trials
    made.install()
    for role in ("reference", "candidate"):
        path = unit_dir / f"sglang-qwen-tune-{role}.service"
        assert path.read_text() == made.trials[role]["unit_text"] and (path.stat().st_mode & 0o777) == 0o644
    assert host.calls == [["systemctl", "daemon-reload"]]


def test_a_candidate_runs_its_own_arguments_from_a_drop_in_without_restarts_or_enable(trials):
    made, host, unit_dir = trials
    made.install()
    started = made.start("candidate", dict(BASE, max_running_requests=8, cuda_graph=True, cuda_graph_max_bs=8))
    assert started["ready"]
    dropin = (unit_dir / "sglang-qwen-tune-candidate.service.d" / _tune_host.DROPIN).read_text()
    assert dropin.startswith("[Service]\nRestart=no\nExecStart=\nExecStart=/opt/sglang/bin/python -m sglang.launch_server ")
    assert "--max-running-requests 8" in dropin and "--cuda-graph-max-bs 8" in dropin and "--disable-cuda-graph" not in dropin
    # the rest of the rendered line stays: the port, the credential
    assert "--port 30021" in dropin and dropin.rstrip().endswith("--config %d/sglang-qwen.yaml")
    assert not any(c[:2] == ["systemctl", "enable"] for c in host.calls)
    assert ["systemctl", "start", "--", "sglang-qwen-tune-candidate.service"] in host.calls


def test_a_trial_that_dies_is_stopped_with_its_gates_verdict(tmp_path):
    host = FakeHost(dies=lambda argv: "--cuda-graph-max-bs" in argv)
    host.unit_dir = tmp_path
    made = _tune_host.SystemTrials(host, [trial("reference", 30020), trial("candidate", 30021)], {"timeout": 60},
                                   unit_dir=str(tmp_path))
    made.install()
    died = made.start("candidate", dict(BASE, cuda_graph=True, cuda_graph_max_bs=8))
    assert not died["ready"] and died["verdict"] == "process_exited" and "CUDA out of memory" in died["cause"]
    assert host.calls[-1] == ["systemctl", "stop", "--", "sglang-qwen-tune-candidate.service"]


def test_remove_leaves_no_trial_file_and_a_rendering_that_disagrees_is_refused(trials):
    made, host, unit_dir = trials
    made.install()
    made.start("reference", BASE)
    made.remove()
    assert list(unit_dir.iterdir()) == []
    assert ["systemctl", "stop", "--", "sglang-qwen-tune-reference.service"] in host.calls
    with pytest.raises(_tune_host.TrialError, match="no single ExecStart line"):
        _tune_host.exec_start("[Service]\nExecStart=/bin/true\n", "--model-path /m", "--model-path /n")


def test_the_module_runs_a_tune_on_the_trials_and_removes_them(capsys, tmp_path, monkeypatch):
    host = FakeHost()
    host.unit_dir = tmp_path / "units"
    host.unit_dir.mkdir()
    monkeypatch.setattr(sglang_tune._switch, "SystemHost", lambda *a, **kw: host)
    monkeypatch.setattr(sglang_tune._tune_host, "UNIT_DIR", str(host.unit_dir))
    args = {"service": "sglang-qwen.service", "run_id": "r1", "base_name": "nextn-small", "base": BASE,
            "trials": [trial("reference", 30020), trial("candidate", 30021)],
            "objective": {"concurrency": 8, "max_tokens": 32},
            "space": {"max_running_requests": [4, 8], "mem_fraction_static": [0.85, 0.88]},
            "budget": {"trials": 6}, "store_dir": str(tmp_path / "store"), "identity": {"host": "ct129", "model": "q"},
            "model_path": str(tmp_path), "check_gpus": False, "api_key": "tune-secret-key"}
    rc, result, _out = run_module(sglang_tune.main, capsys, args)
    assert rc == 0, result
    assert result["verdict"] == "better" and "max_running_requests 8" in result["msg"]
    entry = result["variant"]["nextn-small-tuned"]
    assert entry["inherits"] == "nextn-small" and entry["max_running_requests"] == 8
    assert entry["provenance"]["run"] == "r1" and entry["provenance"]["sglang_version"] == "0.5.11"
    assert "| rung |" in result["report"] and result["plot"].startswith("<svg")
    # what each started server resolved is its evidence: the winner runs the 8 it was given
    assert "| - / 5120 | - / 8 |" in result["report"], result["report"]
    assert list(host.unit_dir.iterdir()) == []  # the trial units are gone
    stored = json.loads((tmp_path / "store").joinpath(result["store"].rsplit("/", 1)[1]).read_text())
    assert stored and "tune-secret-key" not in json.dumps(result) + json.dumps(stored)
    # the second run measures nothing again
    rc, again, _out = run_module(sglang_tune.main, capsys, args)
    assert rc == 0 and again["result"]["launches"] == 0 and again["result"]["reused"] == result["result"]["launches"]


def test_the_module_refuses_a_bad_objective_before_anything_changes(capsys, tmp_path):
    args = {"service": "s.service", "run_id": "r1", "base_name": "b", "base": BASE,
            "trials": [trial("reference", 30020), trial("candidate", 30021)], "objective": {"concurrency": 0},
            "store_dir": str(tmp_path / "store"), "model_path": str(tmp_path)}
    rc, result, _out = run_module(sglang_tune.main, capsys, args)
    assert rc == 1 and result["msg"].startswith("nothing was changed: objective.concurrency")
    assert not (tmp_path / "store").exists()
