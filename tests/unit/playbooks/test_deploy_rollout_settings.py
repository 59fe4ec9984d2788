"""deploy.yml refuses a bad rollout setting (rollout_canary, rollout_batch,
rollout_max_fail_percentage) before the deploy play starts, for a command-line
run (-e key=value: strings) and for an AWX job (ansible-runner's extra vars:
integers or strings).

Every value is checked against deploy.yml's own check (its assert's expression,
read from the playbook and rendered by Ansible's templating in this process).
The plumbing around it runs for real, with ansible-playbook and ansible-runner,
against an inventory of hosts on a local connection in a temporary directory:
a refused run never reaches the sglang_service role and writes nothing; a
valid setting passes the check and the run goes on to the role, which then
stops at the missing host manifest (no host was provisioned here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ansible_runner
import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
HOSTS = ["h1", "h2", "h3"]
REFUSED = "rollout settings refused, no host was touched: "
DEPLOY_PLAY = "PLAY [Deploy an SGLang variant]"
ROLE_TASK = "sglang_service :"
NO_MANIFEST = "no host manifest"

BATCH = "must be an integer, 1 or more, or a percentage from 1% to 100%"
CANARY = "must be an integer, 1 or more"
FAIL = "must be an integer from 0 to 100"


def env() -> dict:
    out = dict(os.environ)
    out.update(ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", PATH=f"{BIN}{os.pathsep}{out.get('PATH', '')}")
    return out


@pytest.fixture(name="lab")
def fixture_lab(tmp_path: Path) -> Path:
    """Three hosts on a local connection; every path the role would write or read lies under tmp_path."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"children": {"sglang_servers": {
        "hosts": {name: dict(local) for name in HOSTS},
        "vars": {
            "inferops_model_path": str(tmp_path / "host" / "model"),
            "sglang_service_host_manifest": str(tmp_path / "host" / "host.json"),
            "sglang_service_state_dir": str(tmp_path / "host" / "state"),
            "sglang_service_ddtree_manifest": str(tmp_path / "host" / "state" / "ddtree.json"),
        }}}}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    return tmp_path


def playbook(lab: Path, *args: str) -> tuple[int, str]:
    """ansible-playbook deploy.yml -e variant=balanced ARGS: the exit code and the output."""
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(lab / "hosts.yml"), "deploy.yml", "-e", "variant=balanced", *args],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=300, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def runner(lab: Path, extravars: dict, limit: str | None = None) -> tuple[int, str]:
    """deploy.yml as AWX runs a job: ansible-runner with the survey's answers as extra vars, and the limit."""
    (lab / "runner").mkdir(exist_ok=True)
    result = ansible_runner.run(
        private_data_dir=str(lab / "runner"), project_dir=str(REPO), playbook="deploy.yml",
        inventory=str(lab / "hosts.yml"), extravars={"variant": "balanced", **extravars}, limit=limit,
        envvars={"ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}, quiet=True)
    return result.rc, result.stdout.read().replace("\r\n", "\n")


def summary(output: str, hosts: list[str]) -> dict[str, str]:
    """The deploy summary's rows (one per host, after the header): host -> outcome, by the header's columns."""
    assert "DEPLOY SUMMARY: " in output, output[-3000:]
    header, *rows = output[output.index("DEPLOY SUMMARY: "):].splitlines()[1:2 + len(hosts)]
    start, end = header.index("outcome"), header.index("running now")
    return {row.split()[0]: row[start:end].strip() for row in rows}


def assert_refused(lab: Path, rc: int, output: str, message: str, hosts: list[str]) -> None:
    assert rc == 2, output[-3000:]
    assert REFUSED + message in output, output[-3000:]
    # the deploy play never started: no task of the role ran, nothing was written
    assert DEPLOY_PLAY not in output and ROLE_TASK not in output, output[-3000:]
    assert "Traceback" not in output and "unexpected" not in output.lower()
    assert not (lab / "host").exists()
    # the summary: the host that ran the check failed before switching, every other was not reached
    assert summary(output, hosts) == {hosts[0]: "failed before switching", **{h: "not reached" for h in hosts[1:]}}
    assert f"{hosts[0]}: {REFUSED}" in output


def rollout_errors(**settings) -> list[str]:
    """deploy.yml's rollout check on these settings (the play's defaults for the rest), as Ansible renders it."""
    (play, *_rest) = yaml.safe_load((REPO / "playbooks" / "deploy.yml").read_text())
    (task,) = [t for t in play["tasks"] if "_rollout_errors" in (t.get("vars") or {})]
    variables = {**play["vars"], "variant": "balanced", **settings}
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(task["vars"]["_rollout_errors"]))


# -e key=value: every value arrives as a string
@pytest.mark.parametrize(("name", "value", "why"), [
    ("rollout_batch", "0", BATCH),      # Ansible's serial 0 or less: every remaining host at once
    ("rollout_batch", "-1", BATCH),
    ("rollout_batch", "abc", BATCH),    # an internal error when the play starts
    ("rollout_batch", "", BATCH),
    ("rollout_batch", "0%", BATCH),
    ("rollout_batch", "101%", BATCH),
    ("rollout_batch", "2.5", BATCH),
    ("rollout_canary", "0", CANARY),    # no canary
    ("rollout_canary", "-1", CANARY),
    ("rollout_canary", "abc", CANARY),
    ("rollout_canary", "", CANARY),
    ("rollout_canary", "25%", CANARY),
    ("rollout_max_fail_percentage", "-5", FAIL),   # stops after the canary whatever happens
    ("rollout_max_fail_percentage", "101", FAIL),
    ("rollout_max_fail_percentage", "abc", FAIL),
    ("rollout_max_fail_percentage", "", FAIL),
    ("rollout_max_fail_percentage", "50%", FAIL),
])
def test_a_bad_setting_on_the_command_line_is_refused(name, value, why):
    assert rollout_errors(**{name: value}) == [f'{name}="{value}" {why}']


# ansible-runner's extra vars (AWX): integers stay integers, and a launcher may send anything
@pytest.mark.parametrize(("extravars", "message"), [
    ({"rollout_batch": 0}, f'rollout_batch="0" {BATCH}'),
    ({"rollout_batch": -1}, f'rollout_batch="-1" {BATCH}'),
    ({"rollout_canary": 0}, f'rollout_canary="0" {CANARY}'),
    ({"rollout_canary": True}, f'rollout_canary="True" {CANARY}'),
    ({"rollout_max_fail_percentage": -5}, f'rollout_max_fail_percentage="-5" {FAIL}'),
    ({"rollout_max_fail_percentage": 101}, f'rollout_max_fail_percentage="101" {FAIL}'),
    ({"rollout_max_fail_percentage": False}, f'rollout_max_fail_percentage="False" {FAIL}'),
    ({"rollout_batch": None}, f'rollout_batch="None" {BATCH}'),
    ({"rollout_batch": [1, 2]}, f'rollout_batch="[1, 2]" {BATCH}'),
], ids=lambda v: str(v) if isinstance(v, dict) else "")
def test_a_bad_setting_as_an_extra_var_is_refused(extravars, message):
    assert rollout_errors(**extravars) == [message]


def survey_batches() -> list[str]:
    survey = yaml.safe_load((REPO / "awx" / "vars" / "main.yml").read_text())["awx_deploy_survey"]
    (batch,) = [q for q in survey["spec"] if q["variable"] == "rollout_batch"]
    return batch["choices"]


@pytest.mark.parametrize(("canary", "batch", "fail"), [
    ("1", "1", "0"), ("2", "10%", "100"), ("1000", "100%", "50"), ("3", "7", "1"),
    (2, 7, 0), (1, "25%", 100),
])
def test_good_settings_pass(canary, batch, fail):
    assert rollout_errors(rollout_canary=canary, rollout_batch=batch, rollout_max_fail_percentage=fail) == []


@pytest.mark.parametrize("batch", survey_batches())
def test_every_survey_batch_passes(batch):
    """Each answer the deploy survey offers, with the survey's bounds for the integers, as AWX passes them."""
    assert rollout_errors(rollout_canary=1, rollout_batch=batch, rollout_max_fail_percentage=100) == []
    assert rollout_errors(rollout_canary=1000, rollout_batch=batch, rollout_max_fail_percentage=0) == []


# The plumbing, for real: the check runs before the deploy play, once, whatever the limit or the tags.

def test_a_bad_setting_on_the_command_line_stops_the_run_before_any_host(lab):
    rc, output = playbook(lab, "-e", "rollout_batch=0")
    assert_refused(lab, rc, output, f'rollout_batch="0" {BATCH}', HOSTS)


def test_every_bad_setting_is_named_and_a_limit_is_checked_too(lab):
    rc, output = playbook(lab, "-l", "h2", "-e", "rollout_canary=0", "-e", "rollout_batch=-1",
                          "-e", "rollout_max_fail_percentage=abc")
    assert_refused(lab, rc, output, f'rollout_canary="0" {CANARY}; rollout_batch="-1" {BATCH}; '
                                    f'rollout_max_fail_percentage="abc" {FAIL}', ["h2"])


def test_a_run_limited_by_tags_is_checked_too(lab):
    rc, output = playbook(lab, "--tags", "sglang_service_preflight", "-e", "rollout_canary=abc")
    assert_refused(lab, rc, output, f'rollout_canary="abc" {CANARY}', HOSTS)


def test_a_bad_setting_from_ansible_runner_stops_the_job_before_any_host(lab):
    """AWX hands the survey's answers to ansible-runner as extra vars: integers stay integers."""
    rc, output = runner(lab, {"rollout_max_fail_percentage": 101}, limit="h2,h3")
    assert_refused(lab, rc, output, f'rollout_max_fail_percentage="101" {FAIL}', ["h2", "h3"])


def assert_checked_and_deployed(lab: Path, rc: int, output: str, canary: int, hosts: list[str]) -> None:
    """The check passed and the deploy play ran its first batch (the canary), which stopped at the host manifest."""
    assert REFUSED not in output, output[-3000:]
    assert DEPLOY_PLAY in output and ROLE_TASK in output, output[-3000:]
    assert rc == 2 and NO_MANIFEST in output, output[-3000:]
    batch = hosts[:canary]
    assert summary(output, hosts) == {h: "failed before switching" if h in batch else "not reached" for h in hosts}
    assert not (lab / "host").exists()


def test_good_settings_on_the_command_line_pass(lab):
    rc, output = playbook(lab, "-e", "rollout_canary=2", "-e", "rollout_batch=10%", "-e", "rollout_max_fail_percentage=100")
    assert_checked_and_deployed(lab, rc, output, 2, HOSTS)


def test_the_defaults_pass(lab):
    rc, output = playbook(lab)
    assert_checked_and_deployed(lab, rc, output, 1, HOSTS)
    assert "canary 1 then batches of 25%, stop above 0% failed in a batch" in output


def test_a_survey_answer_passes_through_ansible_runner(lab):
    """The survey's answers as AWX passes them: integers, and a batch that is a percentage."""
    rc, output = runner(lab, {"rollout_canary": 2, "rollout_batch": survey_batches()[-1], "rollout_max_fail_percentage": 100})
    assert_checked_and_deployed(lab, rc, output, 2, HOSTS)
