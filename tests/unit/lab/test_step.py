"""lab/step.py, the story `make lab` prints: what a step shows of its output (the deploy summary of a
deploy, the messages of the checks), its exit status checked against the expected one, the whole
output kept in the log."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from sim_helpers import REPO

STEP = REPO / "lab" / "step.py"
spec = importlib.util.spec_from_file_location("lab_step", STEP)
step = importlib.util.module_from_spec(spec)
spec.loader.exec_module(step)

DEPLOY = """\
TASK [inferops.sglang.sglang_service : Release the host's deploy lock] *********
ok: [ct129]

PLAY RECAP *********************************************************************
ct129                      : ok=15   changed=1    unreachable=0    failed=1    skipped=4    rescued=0    ignored=0

INFEROPS DEPLOY SUMMARY ********************************************************
DEPLOY SUMMARY: variant balanced, canary 2 then batches of 25%, stop above 0% failed in a batch
host   outcome      running now      verdict         perf          cause
ct129  rolled back  nextn            unit_restarted  -             cuda_library
ct200  switched     shadow-balanced  ready           1.167x tok/s  -
"""

CHECKS = """\
TASK [The outcome is the field story's] ****************************************
ok: [ct129] =>
    changed: false
    msg: 'ct129: tried shadow-balanced -> rolled_back (unit_restarted, cuda_library);
        running now: nextn'
ok: [ct200] =>
    msg:
    - 'GPUs usable: 0,1 of 2'
    - 'GPUs lost: 1: Unable to determine the device handle for GPU0000:21:00.0: GPU is
        lost.  Reboot the system to recover this GPU'
    - 'API: serves Qwen3.6-27B'
ok: [ct200]

PLAY RECAP *********************************************************************
"""


def test_a_deploy_shows_its_summary_and_not_the_recap():
    assert step.summary(DEPLOY.splitlines()) == [
        "DEPLOY SUMMARY: variant balanced, canary 2 then batches of 25%, stop above 0% failed in a batch",
        "host   outcome      running now      verdict         perf          cause",
        "ct129  rolled back  nextn            unit_restarted  -             cuda_library",
        "ct200  switched     shadow-balanced  ready           1.167x tok/s  -"]


def test_a_check_shows_each_message_folded_lines_joined_and_named_by_host():
    assert step.summary(CHECKS.splitlines()) == []
    assert step.messages(CHECKS.splitlines()) == [
        "ct129: tried shadow-balanced -> rolled_back (unit_restarted, cuda_library); running now: nextn",
        "ct200: GPUs usable: 0,1 of 2",
        "ct200: GPUs lost: 1: Unable to determine the device handle for GPU0000:21:00.0: GPU is lost.  Reboot the "
        "system to recover this GPU",
        "ct200: API: serves Qwen3.6-27B"]


def run(tmp_path, *argv):
    env = dict(os.environ, INFEROPS_LAB_LOG=str(tmp_path / "make-lab.log"))
    return subprocess.run([sys.executable, str(STEP), *argv], capture_output=True, text=True, env=env, check=False)


def test_a_step_that_exits_otherwise_than_expected_fails_make_lab_and_the_log_keeps_everything(tmp_path):
    assert run(tmp_path, "--begin").returncode == 0
    ok = run(tmp_path, "--expect", "2", "A refusal", "--", sys.executable, "-c", "print('refused'); raise SystemExit(2)")
    assert ok.returncode == 0 and "A refusal ..." in ok.stdout and "ok (exit 2, as expected)" in ok.stdout
    bad = run(tmp_path, "A switch", "--", sys.executable, "-c", "print('it broke'); raise SystemExit(2)")
    assert bad.returncode == 1
    assert "FAILED: exit 2, expected 0" in bad.stdout and "| it broke" in bad.stdout
    log = (tmp_path / "make-lab.log").read_text()
    assert "===== A refusal" in log and "refused\n===== exit 2" in log and "it broke\n===== exit 2" in log
