"""The performance gate: the role's own tasks (switch.yml's "Measure the variant
against the known-good service" and "The performance gate's verdict on"), run by
ansible-playbook on localhost against the lab's SGLang simulator, with the
known-good figures as the history or the drain would give them. A regression
fails the switch (its rescue rolls back) with the comparison in the message,
unless the gate only reports; the record's performance is composed from what
these tasks leave (_deploy.record, tests/unit/plugins/module_utils/test_deploy.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from sim_helpers import MODEL, NEXTN, REPO, run_local_play
from test_sglang_service_rotation import find

TASKS = REPO / "roles" / "sglang_service" / "tasks"
KEY = "perf-key-31b9"
LOAD = {"requests": 4, "concurrency": 2, "max_tokens": 16, "rounds": 2, "warmup": True, "timeout": 30, "budget": 30}
ROLE_VARS = yaml.safe_load((REPO / "roles" / "sglang_service" / "vars" / "main.yml").read_text())


@pytest.fixture(name="sim", scope="module")
def fixture_sim(tmp_path_factory, sim_install, host_libraries):
    """One simulated NEXTN server for the module (a real process, as the launch fixture starts)."""
    import socket
    import time
    import urllib.request

    site = sim_install("0.5.23", False)
    tmp = tmp_path_factory.mktemp("perf")
    data = json.loads((REPO / "lab/hosts/ct200/hardware.json").read_text())
    data["time_scale"] = 0.01
    data["performance"].pop("time_scale")
    (tmp / "hw.json").write_text(json.dumps(data))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(site), SGLANG_SIM_HARDWARE=str(tmp / "hw.json"),
               SGLANG_SIM_STATE=str(tmp / "gpu"), CUDA_VISIBLE_DEVICES="0,1")
    proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", "--port", str(port), *MODEL, *NEXTN,
                             "--api-key", KEY], env=env, stdout=(tmp / "log").open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while True:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200:
                break
        except OSError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, (tmp / "log").read_text()[-2000:]
        time.sleep(0.3)
    yield port, tmp
    proc.kill()
    proc.wait()


def run(sim, tmp_path, mode: str, baseline: dict | None, thresholds: dict | None = None,
        variant: str = "shadow-balanced", key: str = KEY) -> tuple[int, str, dict]:
    port, _tmp = sim
    tmp_path.mkdir(parents=True, exist_ok=True)
    switch = yaml.safe_load((TASKS / "switch.yml").read_text())
    config = tmp_path / "sglang-qwen.yaml"
    config.write_text(f"api-key: {json.dumps(key)}\n")
    facts = tmp_path / "facts.json"
    play = [{
        "hosts": "localhost", "gather_facts": False,
        "vars": {
            "_sglang_service_url": f"http://127.0.0.1:{port}", "_sglang_service_config_file": str(config),
            "__sglang_service_variant": {
                "variant": variant, "params": {"perf_thresholds": thresholds or {}}, "baseline": {"variant": "nextn"}},
            "sglang_service_perf_gate": mode, "sglang_service_perf_thresholds": {},
            "__sglang_service_perf_plan": {"load": LOAD, "known_good": None},
            "_sglang_service_perf_baseline": baseline, "_sglang_service_perf_failure": None,
            "__sglang_service_gate": {"ready": True, "server": {"version": "0.5.23"}},
            **{k: v for k, v in ROLE_VARS.items() if k.startswith("_sglang_service_perf") or k == "_sglang_service_baseline"},
        },
        "tasks": [{"name": "The switch", "block": [
            find(switch, "Measure the variant against the known-good service"),
            find(switch, "The performance gate's verdict on"),
        ], "always": [{"name": "Keep the facts", "ansible.builtin.copy": {
            "dest": str(facts),
            "content": "{{ {'perf': __sglang_service_perf, 'failure': _sglang_service_perf_failure,"
                       " 'mode': _sglang_service_perf_mode} | to_json }}"}}]}],
    }]
    rc, output = run_local_play(tmp_path, play)
    assert KEY not in output
    return rc, " ".join(output.split()), json.loads(facts.read_text())


@pytest.fixture(name="measured", scope="module")
def fixture_measured(sim, tmp_path_factory) -> dict:
    """This server's figures (measured once for the module, by the tasks under test with no
    known-good service: they pass), with a first-token latency no measurement here can regress
    from (the tests compare tokens/s; a busy machine moves a short load's TTFT p95)."""
    rc, output, facts = run(sim, tmp_path_factory.mktemp("first"), "enforce", None)
    assert rc == 0, output[-3000:]
    return dict(facts["perf"]["figures"], ttft_p95=100.0)


def test_a_variant_slower_than_the_known_good_fails_the_switch_with_the_comparison(sim, measured, tmp_path):
    faster = dict(measured, output_tokens_per_s=10 * measured["output_tokens_per_s"])
    rc, output, facts = run(sim, tmp_path, "enforce", {"variant": "nextn", "source": "history", "figures": faster})
    assert rc == 2
    assert ("shadow-balanced serves but failed the performance gate against the known-good nextn on this host: "
            "slower than the known-good service: output_tokens_per_s") in output, output[-3000:]
    failure = facts["failure"]
    assert failure["phase"] == "performance" and failure["failure"] == "slower_than_known_good"
    assert failure["cause"] == "output_tokens_per_s"
    assert facts["perf"]["comparison"]["checks"][0]["ratio"] < 0.5  # about 0.1; a shared machine moves it


def test_report_mode_and_a_variants_own_threshold(sim, measured, tmp_path):
    faster = dict(measured, output_tokens_per_s=10 * measured["output_tokens_per_s"])
    known = {"variant": "nextn", "source": "history", "figures": faster}
    rc, output, facts = run(sim, tmp_path / "report", "report", known)
    assert rc == 0 and facts["perf"]["passed"] is False and facts["failure"] is None, output[-3000:]
    # a variant that may be this much slower (its own perf_thresholds) passes under enforce
    rc, output, facts = run(sim, tmp_path / "own", "enforce", known, thresholds={"output_tokens_per_s": 0.01})
    assert rc == 0 and facts["perf"]["passed"] is True, output[-3000:]
    assert facts["perf"]["comparison"]["checks"][0]["limit"] == ">= 0.01x"


def test_the_baseline_variant_is_only_reported_and_off_measures_nothing(sim, measured, tmp_path):
    known = {"variant": "shadow-balanced", "source": "history",
             "figures": dict(measured, output_tokens_per_s=10 * measured["output_tokens_per_s"])}
    # an explicit rollback to the baseline (nextn, here through its alias) is compared but never rolled back
    rc, output, facts = run(sim, tmp_path / "baseline", "enforce", known, variant="nextn")
    assert rc == 0 and facts["mode"] == "report" and facts["perf"]["passed"] is False, output[-3000:]
    rc, output, facts = run(sim, tmp_path / "off", "off", known)
    assert rc == 0 and facts["perf"].get("skipped") is True and facts["failure"] is None


def test_a_variant_that_fails_under_the_load_fails_the_switch(sim, tmp_path):
    # a key the server does not take stands for a server that passed its readiness gate but fails the load
    rc, output, facts = run(sim, tmp_path, "enforce", None, key="not-the-servers-key")
    assert rc == 2
    assert facts["failure"]["failure"] == "failed_under_load" and facts["failure"]["cause"] == "requests_failed"
    assert ("shadow-balanced serves but failed the performance gate against the known-good service on this host: "
            "the warmup round failed: 2 of 2 requests (POST /generate: HTTP 401") in output, output[-3000:]
    assert "not-the-servers-key" not in output
