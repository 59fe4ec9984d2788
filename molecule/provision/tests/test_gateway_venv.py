"""The gateway's venv on the provisioned ct129 stand-in (molecule verify, pytest-testinfra).

Converge ran the sglang_runtime role with sglang_runtime_gateway: SGLang's model
gateway, the real smg wheel at the collection's pin (_gateway.PINNED) and its
dependencies at the role's lock, installed from the same offline wheelhouse as
SGLang (lab/wheels/gateway_wheels.py put them there) into a venv of its own; the
scenario's idempotence step proved a second run changes nothing. Check mode and
a pin that is no longer met are tested with the role's gateway tasks alone
(gateway.yml, the entry point lab/playbooks/prepare.yml uses).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import testinfra

HOST = testinfra.get_host("podman://prov-ct129")
VENV = "/opt/sglang/gateway"
PYTHON = f"{VENV}/bin/python"
SGLANG_VENV = "/opt/sglang/venv"
PROJECT = Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
SCENARIO = Path(__file__).resolve().parent.parent
PINNED = re.search(r'^PINNED = "(.*)"$', (PROJECT / "plugins/module_utils/_gateway.py").read_text(), re.M).group(1)
LOCK = PROJECT / f"roles/sglang_runtime/files/constraints/smg-{PINNED}.txt"
PROBE = "import importlib.metadata as m, smg.cli; print(m.version(\"smg\"))"
LIST = "import importlib.metadata as m; print(*sorted(d.metadata[\"Name\"].lower() for d in m.distributions()))"


def gateway(*options: str) -> subprocess.CompletedProcess:
    """The role's gateway tasks alone with the scenario's settings (gateway.yml)."""
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", os.environ["MOLECULE_INVENTORY_FILE"],
            str(SCENARIO / "gateway.yml"), *options]
    env = {**os.environ, "ANSIBLE_CALLBACK_RESULT_FORMAT": "json", "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, env=env)


def test_the_venv_is_roots_and_readable_by_the_service_user():
    venv = HOST.file(VENV)
    assert (venv.user, venv.group, venv.mode) == ("root", "root", 0o755)
    assert HOST.file(PYTHON).exists
    # what the gateway's unit runs, as a user other than root
    run = HOST.run(f"runuser -u nobody -- {PYTHON} -I -c '{PROBE}'")
    assert run.rc == 0 and run.stdout.strip() == PINNED, run.stderr


def test_smg_at_the_pin_with_the_lock():
    assert HOST.check_output(f"{PYTHON} -I -c '{PROBE}'") == PINNED
    lock = HOST.file(f"{VENV}/inferops-constraints.txt")
    assert (lock.user, lock.group, lock.mode) == ("root", "root", 0o644)
    assert lock.content_string == LOCK.read_text()
    freeze = HOST.check_output(f"{PYTHON} -m pip freeze --all --disable-pip-version-check").lower().splitlines()
    pins = [line.lower() for line in LOCK.read_text().splitlines() if "==" in line and not line.startswith("#")]
    assert set(pins) <= set(freeze), sorted(set(pins) - set(freeze))


def test_the_same_offline_sources_as_sglang():
    conf = HOST.file(f"{VENV}/pip.conf")
    assert (conf.user, conf.mode) == ("root", 0o600)
    text = conf.content_string
    assert "no-index = true" in text and "find-links = /var/cache/inferops-sglang/wheelhouse" in text, text
    assert text.replace(VENV, SGLANG_VENV) == HOST.file(f"{SGLANG_VENV}/pip.conf").content_string


def test_the_gateway_and_sglang_do_not_share_a_venv():
    assert "smg" not in HOST.check_output(f"{SGLANG_VENV}/bin/python -I -c '{LIST}'").split()
    assert not {"sglang", "torch"} & set(HOST.check_output(f"{PYTHON} -I -c '{LIST}'").split())


def test_check_mode_says_what_it_would_install_then_a_run_installs_it():
    HOST.check_output(f"{PYTHON} -m pip uninstall -q -y --disable-pip-version-check smg")
    check = gateway("--check")
    out = " ".join((check.stdout + check.stderr).split())
    assert check.returncode == 0, out[-4000:]
    assert (f"Would install -c {VENV}/inferops-constraints.txt smg=={PINNED} into {VENV}: smg is not installed"
            in out), out[-4000:]
    assert HOST.run(f"{PYTHON} -I -c '{PROBE}'").rc != 0  # check mode installed nothing

    run = gateway()
    out = " ".join((run.stdout + run.stderr).split())
    assert run.returncode == 0, out[-4000:]
    assert re.search(r"PLAY RECAP .*prov-ct129 *: ok=\d+ +changed=1 ", out), out[-2000:]
    assert HOST.check_output(f"{PYTHON} -I -c '{PROBE}'") == PINNED
