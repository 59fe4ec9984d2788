"""CI's per-part wall times: .ci/timed notes each part (its exit status passed
through unchanged) and .ci/times.py prints them as one table."""

from __future__ import annotations

import importlib.util
import os
import subprocess

from sim_helpers import REPO

TIMED = REPO / ".ci" / "timed"
spec = importlib.util.spec_from_file_location("ci_times", REPO / ".ci" / "times.py")
times = importlib.util.module_from_spec(spec)
spec.loader.exec_module(times)


def timed(tmp_path, part: str, *argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, INFEROPS_CI_TIMES=str(tmp_path / "times.tsv"))
    return subprocess.run([str(TIMED), part, *argv], env=env, capture_output=True, text=True, check=False, timeout=30)


def test_timed_passes_the_exit_status_and_output_through_and_notes_the_part(tmp_path):
    ok = timed(tmp_path, "units", "sh", "-c", "echo out; echo err >&2")
    # a CPU-bound child: its CPU time is the part's, measured after it was waited for
    busy = timed(tmp_path, "busy", "python3", "-c",
                 "import time\nend = time.process_time() + 1.2\nwhile time.process_time() < end: pass")
    failed = timed(tmp_path, "molecule deploy", "sh", "-c", "exit 3")
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "out\n", "err\n")
    assert failed.returncode == 3
    lines = [line.split("\t") for line in (tmp_path / "times.tsv").read_text().splitlines()]
    assert [(line[0], line[3]) for line in lines] == [("units", "0"), ("busy", "0"), ("molecule deploy", "3")]
    assert all(int(line[1]) <= int(line[2]) for line in lines)
    assert [int(line[4]) for line in lines] == [0, 1, 0]


def test_table_orders_by_start_shows_overlap_failures_and_the_whole_wall_time():
    out = times.table(["units\t1000\t1300\t0\t410\n", "lint\t1000\t1100\t0\t90\n",
                       "molecule deploy\t1300\t1900\t2\n", "a torn line\n"])
    rows = [row.split() for row in out.splitlines()]
    assert rows[0] == ["part", "from", "wall", "cpu", "result"]
    assert rows[1][:4] == ["lint", "0s", "100s", "90s"]
    assert rows[2][:5] == ["units", "0s", "300s", "410s", "ok"]
    assert rows[3][:6] == ["molecule", "deploy", "300s", "600s", "-", "FAILED"]
    assert rows[-1] == ["all", "0s", "900s"]


def test_table_of_nothing_says_so():
    assert "no part ran" in times.table([])


steps_spec = importlib.util.spec_from_file_location("ci_molecule_steps", REPO / ".ci" / "molecule-steps.py")
steps_mod = importlib.util.module_from_spec(steps_spec)
steps_spec.loader.exec_module(steps_mod)


def test_each_molecule_step_becomes_a_part_and_a_step_left_open_failed(tmp_path):
    now = iter([100, 160, 160, 400, 400, 401, 900])
    steps = steps_mod.Steps(tmp_path / "times.tsv", clock=lambda: next(now))
    for text in ["INFO     [deploy > discovery] scenario test matrix: destroy, create, converge",
                 "INFO     [deploy > create] Executing",
                 "PLAY [Create] ***",
                 "INFO     [deploy > create] Executed: Successful",
                 "INFO     [deploy > converge] Executing",
                 "INFO     [deploy > converge] Executed: Failed",
                 "INFO     [deploy > verify] Executing"]:
        steps.line(text + "\n")
    steps.close()
    lines = [line.split("\t") for line in (tmp_path / "times.tsv").read_text().splitlines()]
    assert lines == [["molecule deploy: create", "100", "160", "0"], ["molecule deploy: converge", "160", "400", "1"],
                     ["molecule deploy: verify", "400", "401", "1"]]
    rows = [row.split() for row in times.table((tmp_path / "times.tsv").read_text().splitlines(keepends=True)).splitlines()]
    assert rows[2][:7] == ["molecule", "deploy:", "converge", "60s", "240s", "-", "FAILED"]


def test_the_filter_passes_the_output_through_unchanged(tmp_path):
    text = "INFO     [lab > create] Executing\nsome output\nINFO     [lab > create] Executed: Successful\n"
    env = dict(os.environ, INFEROPS_CI_TIMES=str(tmp_path / "times.tsv"))
    out = subprocess.run(["python3", str(REPO / ".ci" / "molecule-steps.py")], input=text, env=env, capture_output=True,
                         text=True, check=True, timeout=30)
    assert out.stdout == text
    assert (tmp_path / "times.tsv").read_text().startswith("molecule lab: create\t")
