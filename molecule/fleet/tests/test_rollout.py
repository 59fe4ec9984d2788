"""A rolling deploy across the lab fleet, run through ansible-runner as AWX runs
a job template: the same playbook, extra vars (the deploy survey's answers)
and limit. Converge left NEXTN on all four hosts.

fleet-03 stands in for ct129, where the balanced variant dies on its first
request; the others serve it. With a canary and batches of one host, fleet-03
is the third batch: the rollout must stop there, fleet-04 must never be
touched, fleet-03 must be back on NEXTN, and the job's artifacts (what AWX
shows) must carry each host's deploy record.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import time
from pathlib import Path

import ansible_runner
import testinfra

REPO = Path(__file__).resolve().parents[3]
HOSTS = ["fleet-01", "fleet-02", "fleet-03", "fleet-04"]
UNIT = "/etc/systemd/system/sglang-qwen.service"
HISTORY = "/var/lib/inferops-sglang/sglang-qwen/history.jsonl"


def host(name: str):
    return testinfra.get_host(f"podman://{name}")


def state(name: str) -> dict:
    """What a host runs: unit checksum, main PID, deploy records."""
    target = host(name)
    records = [json.loads(line) for line in target.file(HISTORY).content_string.splitlines() if line.strip()]
    return {
        "unit": hashlib.sha256(target.file(UNIT).content).hexdigest(),
        "pid": target.check_output("systemctl show -p MainPID --value sglang-qwen.service"),
        "active": target.service("sglang-qwen.service").is_running,
        "records": records,
    }


def run_job(tmp_path: Path, extravars: dict, limit: str | None = None):
    """deploy.yml through ansible-runner with a job template's extra vars and limit."""
    runner = ansible_runner.run(
        private_data_dir=str(tmp_path),
        project_dir=str(REPO),
        playbook=str(REPO / "deploy.yml"),
        inventory=os.environ["MOLECULE_INVENTORY_FILE"],
        extravars=extravars,
        limit=limit,
        quiet=True,
    )
    stats = [e for e in runner.events if e.get("event") == "playbook_on_stats"]
    assert stats, "no playbook_on_stats event in the job's artifacts"
    artifact = stats[-1]["event_data"].get("artifact_data") or {}
    stdout = runner.stdout.read()
    return runner, artifact, stdout


def survey(**answers) -> dict:
    """The deploy survey's answers, as AWX passes them (extra vars: a choice is a string, an integer an integer)."""
    base = {"variant": "balanced", "memory_override": "false", "rollout_canary": 1, "rollout_batch": "1",
            "rollout_max_fail_percentage": 0}
    base.update(answers)
    return base


def test_failure_in_the_third_batch_stops_the_rollout(tmp_path):
    before = {name: state(name) for name in HOSTS}
    assert all(s["records"][-1]["variant"] == "nextn" and s["active"] for s in before.values())

    runner, artifact, stdout = run_job(tmp_path, survey())
    assert runner.rc == 2 and runner.status == "failed", stdout[-3000:]

    records = artifact["inferops_deploy"]
    assert records["fleet-01"]["outcome"] == "switched" and records["fleet-01"]["running"] == "shadow-balanced"
    assert records["fleet-02"]["outcome"] == "switched"
    failed = records["fleet-03"]
    assert failed["outcome"] == "rolled_back" and failed["running"] == "nextn"
    assert failed["verdict"]["cause"] == "cuda_library" and failed["rollback"]["ready"]
    assert "fleet-04" not in records
    assert artifact["inferops_rollout"]["hosts"] == HOSTS

    # fleet-04 was never touched: same unit, same process, no new record
    after = state("fleet-04")
    assert after["unit"] == before["fleet-04"]["unit"] and after["pid"] == before["fleet-04"]["pid"]
    assert after["records"] == before["fleet-04"]["records"]
    # fleet-03 serves NEXTN again, from the same unit as before
    again = state("fleet-03")
    assert again["active"] and again["unit"] == before["fleet-03"]["unit"]
    assert again["records"][-1]["outcome"] == "rolled_back"

    # the summary AWX shows at the end of the job output
    summary = stdout[stdout.index("DEPLOY SUMMARY"):]
    lines = {line.split()[0]: line for line in summary.splitlines()[2:7] if line.strip()}
    assert "switched" in lines["fleet-01"] and "shadow-balanced" in lines["fleet-01"]
    assert "rolled back" in lines["fleet-03"] and "cuda_library" in lines["fleet-03"]
    assert "not reached" in lines["fleet-04"]
    assert "The rollout stopped after fleet-03: 1 host(s) not reached" in summary


def test_a_failed_canary_touches_no_other_host(tmp_path):
    before = state("fleet-04")
    runner, artifact, stdout = run_job(tmp_path, survey(rollout_batch="50%"), limit="fleet-03,fleet-04")
    assert runner.rc == 2, stdout[-3000:]
    assert list(artifact["inferops_deploy"]) == ["fleet-03"]
    assert artifact["inferops_deploy"]["fleet-03"]["running"] == "nextn"
    after = state("fleet-04")
    assert (after["unit"], after["pid"], after["records"]) == (before["unit"], before["pid"], before["records"])
    assert "not reached" in stdout[stdout.index("DEPLOY SUMMARY"):]


def test_a_bad_rollout_setting_touches_no_host(tmp_path):
    """A batch of -1 (every remaining host at once, were it let through): refused before the deploy play
    starts; every host of the fleet keeps its unit, its process and its history. Every other bad setting
    (a batch of 0 or "abc", no canary, a threshold outside 0..100, as strings and as AWX's integers) is
    refused by the same check: tests/unit/playbooks/test_deploy_rollout_settings.py renders that check
    for each, and runs ansible-playbook and ansible-runner to prove the refusal stops the run."""
    before = {name: state(name) for name in HOSTS}
    runner, artifact, stdout = run_job(tmp_path, survey(rollout_batch=-1))
    assert runner.rc == 2, stdout[-3000:]
    assert "rollout settings refused, no host was touched" in stdout
    assert "PLAY [Deploy an SGLang variant]" not in stdout
    assert "inferops_deploy" not in artifact and artifact["inferops_rollout"]["hosts"] == HOSTS
    assert {name: state(name) for name in HOSTS} == before
    summary = stdout[stdout.index("DEPLOY SUMMARY"):]
    rows = {line.split()[0]: line for line in summary.splitlines()[1:] if line.split() and line.split()[0] in HOSTS}
    assert set(rows) == set(HOSTS), summary
    assert "failed before switching" in rows["fleet-01"]
    assert all("not reached" in rows[name] for name in HOSTS[1:])
    assert "The rollout stopped after fleet-01: 3 host(s) not reached" in summary


def prometheus(query: str) -> list[dict]:
    """The lab's Prometheus (the Debian package on fleet-01, written by monitoring.yml): an instant
    query through its HTTP API; the result's series."""
    out = host("fleet-01").check_output(
        f"curl -sf --get --data-urlencode {shlex.quote('query=' + query)} http://127.0.0.1:9090/api/v1/query")
    answer = json.loads(out)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def by_host(query: str) -> dict[str, dict]:
    return {series["metric"]["host"]: series for series in prometheus(query)}


def eventually(check, timeout: float = 90.0):
    """check() until it passes: Prometheus scrapes every 5 s in the lab (converge.yml)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(2)


def test_prometheus_sees_the_switches_the_rollbacks_and_sglangs_own_metrics():
    """After the rollouts above, a real Prometheus scraping the fleet (file_sd targets from the
    inventory) reads each host's deploy state from node_exporter's textfile collector: fleet-01
    and -02 switched to shadow-balanced, fleet-03 rolled back twice (the third batch, the failed
    canary) and serving NEXTN, fleet-04 still on the converge's NEXTN. SGLang's own metrics come
    from the servers it can reach: fleet-02 across the network (it listens on 0.0.0.0), fleet-01
    its own loopback; fleet-03 and -04 listen on loopback only and are left out of the targets."""
    def deploy_state():
        info = by_host("inferops_sglang_deploy_info")
        assert set(info) == set(HOSTS), info
        labels = {h: (s["metric"]["variant"], s["metric"]["outcome"], s["metric"]["running"]) for h, s in info.items()}
        assert labels == {"fleet-01": ("shadow-balanced", "switched", "shadow-balanced"),
                          "fleet-02": ("shadow-balanced", "switched", "shadow-balanced"),
                          "fleet-03": ("shadow-balanced", "rolled_back", "nextn"),
                          "fleet-04": ("nextn", "switched", "nextn")}, labels
        return info

    eventually(deploy_state)
    rollbacks = {h: float(s["value"][1]) for h, s in by_host("inferops_sglang_rollbacks_total").items()}
    assert rollbacks == {"fleet-01": 0, "fleet-02": 0, "fleet-03": 2, "fleet-04": 0}, rollbacks
    verdict = by_host("inferops_sglang_deploy_verdict_info")["fleet-03"]["metric"]
    assert verdict["cause"] and verdict["failure"], verdict
    healthy = {h: float(s["value"][1]) for h, s in by_host("inferops_sglang_deploy_healthy").items()}
    assert healthy == dict.fromkeys(HOSTS, 1.0), healthy
    assert {h for h, s in by_host('up{job="node"}').items() if s["value"][1] == "1"} == set(HOSTS)

    def sglang_metrics():
        served = by_host("sum by (host) (sglang:num_requests_total)")
        assert set(served) == {"fleet-01", "fleet-02"}, served
        assert all(float(s["value"][1]) > 0 for s in served.values()), served
        return served

    eventually(sglang_metrics)
    assert set(by_host('up{job="sglang"}')) == {"fleet-01", "fleet-02"}
    targets = json.loads(host("fleet-01").file("/etc/prometheus/file_sd/inferops-sglang.json").content_string)
    assert [g["labels"]["host"] for g in targets] == ["fleet-01", "fleet-02"]
    assert targets[0]["targets"] == ["127.0.0.1:30000"] and not targets[1]["targets"][0].startswith("127.")
