"""wait_for_sglang under real systemd against every field-story case (molecule verify).

The gate's half of the lab scenario: the hosts, units and simulator that
test_field_story.py checks, gated case by case by readiness.yml (its own
ansible-playbook run on the scenario's inventory), which asserts each case's
verdict, failure, cause, evidence and time to verdict. It runs after
test_field_story.py (pytest takes the files in name order); each case is
started alone on its host, as the field story's are.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCENARIO = Path(__file__).resolve().parent.parent


def test_gate_reaches_the_expected_verdict_on_every_field_case():
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", os.environ["MOLECULE_INVENTORY_FILE"],
            str(SCENARIO / "readiness.yml")]
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    run = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False, env=env)
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    assert "failed=0" in run.stdout and "ok=" in run.stdout, run.stdout[-2000:]
