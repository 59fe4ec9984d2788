"""wait_for_sglang's live progress through real ansible-playbook runs on localhost:
the real module, run by the action plugin as an async job, gates a scripted
server (fake_sglang_http.py) watched by its PID and log file. The progress lines
must reach ansible-playbook's stdout while the task runs, and the task must end
with the module's own verdict: ok for a ready server, failed with the module's
message for one that dies. Through ansible-runner (as AWX runs a job), the lines
must be events of their own in the job's output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sim_helpers import free_port

REPO = Path(__file__).resolve().parents[4]
FAKE = REPO / "tests" / "unit" / "fake_sglang_http.py"
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
# A line as SGLang logs it while it loads the weights, before its HTTP server binds.
WEIGHTS_LINE = "[2026-05-01 10:00:00] Load weight begin. avail mem=70.12 GB"
PROGRESS = re.compile(r"^\[localhost\] wait_for_sglang: (\d+) s, phase (\w+)(?:, stage (\w+) \d+ s)?(?:: (.*))?$")

PLAYBOOK = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: gate with live progress
      inferops.sglang.wait_for_sglang:
        url: "http://127.0.0.1:{{ server_port }}"
        pid: "{{ pid }}"
        log_file: "{{ log }}"
        timeout: 60
        interval: 0.2
        settle: 0.5
        progress_interval: 1
      register: live
      ignore_errors: true
    - name: gate as a plain call
      inferops.sglang.wait_for_sglang:
        url: "http://127.0.0.1:{{ server_port }}"
        pid: "{{ pid }}"
        log_file: "{{ log }}"
        timeout: 60
        interval: 0.2
        settle: 0.5
        progress_interval: 0
      register: plain
      when: live is not failed
    - name: results
      ansible.builtin.copy:
        content: "{{ {'live': live, 'plain': plain} | to_json }}"
        dest: "{{ out }}"
"""


@pytest.fixture
def server(tmp_path):
    """start(**scenario) -> (pid, port, log): the scripted server, its log beginning with
    SGLang's weight-loading line (the gate reads the log from before its start). Its
    clock starts when the gate writes its first progress file (under the remote
    temporary directory of environment()): how long ansible-playbook and the async
    launch took (seconds on a loaded machine) does not eat into the start-up the gate
    must watch."""
    procs: list[subprocess.Popen] = []

    def start(**scenario) -> tuple[int, int, Path]:
        port = free_port()
        log = tmp_path / f"server-{port}.log"
        log.write_text(WEIGHTS_LINE + "\n")
        scenario = {"start_on": str(tmp_path / "remote-tmp" / "*" / "wait_for_sglang.progress.json"), **scenario}
        proc = subprocess.Popen([sys.executable, str(FAKE), str(port), json.dumps(scenario)], stdout=log.open("a"), stderr=subprocess.STDOUT)
        procs.append(proc)
        return proc.pid, port, log

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def environment(tmp_path: Path) -> dict:
    (tmp_path / "ansible.cfg").write_text("[defaults]\nretry_files_enabled = False\n")
    return dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
                ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"), ANSIBLE_LOCALHOST_WARNING="0",
                ANSIBLE_ASYNC_DIR=str(tmp_path / "async"), ANSIBLE_REMOTE_TMP=str(tmp_path / "remote-tmp"), NO_PROXY="127.0.0.1")


def play(tmp_path: Path, pid: int, port: int, log: Path) -> tuple[int, list[tuple[float, str]], dict]:
    """Run the playbook; (exit code, each stdout line with the time it arrived, the registered results)."""
    (tmp_path / "gate.yml").write_text(PLAYBOOK)
    variables = dict(server_port=port, pid=pid, log=str(log), out=str(tmp_path / "results.json"))
    cmd = [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local", "gate.yml", "-e", json.dumps(variables)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=environment(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [(time.monotonic(), line.rstrip("\n")) for line in proc.stdout]
    rc = proc.wait(timeout=120)
    out = "\n".join(line for when, line in lines)
    assert (tmp_path / "results.json").exists(), out
    return rc, lines, json.loads((tmp_path / "results.json").read_text())


def task_lines(lines: list[tuple[float, str]], name: str) -> list[tuple[float, str]]:
    """The lines from a task's banner to the next banner."""
    start = next(i for i, (when, line) in enumerate(lines) if line.startswith(f"TASK [{name}]"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i][1].startswith(("TASK [", "PLAY RECAP"))), len(lines))
    return lines[start + 1:end]


def progress_of(lines: list[tuple[float, str]]) -> list[tuple[float, re.Match]]:
    return [(when, m) for when, line in lines if (m := PROGRESS.match(line))]


def test_a_ready_server_shows_progress_while_the_task_runs_and_the_task_is_ok(tmp_path, server):
    # The server's clock starts with the gate: 8 s to bind and 1 s more to be ready. A line
    # comes at each poll of the job (progress_interval 1 s), and a poll is a module run: on a
    # loaded machine (xdist workers beside lint and sanity) polls 2.4 s apart were seen, so
    # the gate runs long enough for three lines at that pace.
    pid, port, log = server(bind_after=8, ready_after=1)
    rc, lines, results = play(tmp_path, pid, port, log)
    out = "\n".join(line for when, line in lines)
    assert rc == 0, out
    live = task_lines(lines, "gate with live progress")
    progress = progress_of(live)
    verdict = [when for when, line in live if line.startswith("ok: [localhost]")]
    assert len(progress) >= 3 and verdict, out
    # the lines came while the task ran, one a second or so, not all at its end
    assert verdict[0] - progress[0][0] >= 2, out
    assert all(later[0] - earlier[0] >= 0.5 for earlier, later in zip(progress, progress[1:])), out
    weights = [m for when, m in progress if m.group(3) == "weights"]
    assert weights and weights[0].group(4) == "Load weight begin. avail mem=70.12 GB", out
    assert [int(m.group(1)) for when, m in progress] == sorted(int(m.group(1)) for when, m in progress)
    assert progress_of(task_lines(lines, "gate as a plain call")) == []
    # the module's own result, with the same keys as the plain call's
    live_result, plain_result = results["live"], results["plain"]
    assert live_result["ready"] is True and live_result["phase"] == "settled" and not live_result.get("failed"), live_result
    assert plain_result["ready"] is True
    assert set(live_result) == set(plain_result)
    assert "ansible_job_id" not in live_result and "finished" not in live_result
    # nothing is left on the host: no job record, no temporary directory
    assert list((tmp_path / "async").iterdir()) == [] and list((tmp_path / "remote-tmp").iterdir()) == []


def test_a_server_that_dies_fails_the_task_with_the_modules_message(tmp_path, server):
    # It dies 5 s after the gate starts, which watches it and prints progress before.
    pid, port, log = server(bind_after=1, ready_after=60, exit_after=4)
    rc, lines, results = play(tmp_path, pid, port, log)
    out = "\n".join(line for when, line in lines)
    live = task_lines(lines, "gate with live progress")
    result = results["live"]
    assert result["failed"] is True and result["ready"] is False and result["failure"] == "process_exited", result
    assert result["msg"] and "async" not in result["msg"], result
    fatal = [line for when, line in live if line.startswith("fatal: [localhost]: FAILED!")]
    assert fatal and json.dumps(result["msg"]) in out, out
    assert len(progress_of(live)) >= 1, out
    assert results["plain"].get("skipped") and rc == 0


def test_under_ansible_runner_the_progress_lines_are_job_events(tmp_path, server):
    ansible_runner = pytest.importorskip("ansible_runner")
    pid, port, log = server(bind_after=2, ready_after=0)
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "gate.yml").write_text(PLAYBOOK)
    env = {key: value for key, value in environment(tmp_path).items() if key.startswith(("ANSIBLE_", "NO_PROXY"))}
    env["PATH"] = f"{ANSIBLE_PLAYBOOK.parent}{os.pathsep}{os.environ['PATH']}"
    variables = dict(server_port=port, pid=pid, log=str(log), out=str(tmp_path / "results.json"))
    run = ansible_runner.run(private_data_dir=str(tmp_path), playbook="gate.yml", inventory="localhost ansible_connection=local",
                             extravars=variables, envvars=env, quiet=True, settings={"suppress_ansible_output": True})
    assert run.rc == 0, run.stdout.read()
    events = list(run.events)
    progress = [e for e in events if PROGRESS.match(e.get("stdout", ""))]
    assert progress, [e.get("stdout") for e in events]
    # at default verbosity, an event of its own, as AWX shows it in the job output
    assert {e["event"] for e in progress} == {"verbose"}
    assert json.loads((tmp_path / "results.json").read_text())["live"]["ready"] is True
