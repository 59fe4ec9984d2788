"""playbooks/inspect.yml, without a host: every variable it reads is defined
for every host it runs on (by the inventories, or by the play itself), and its
report says how many GPUs the host manifest records, or why it cannot.

Both are read from the playbook (its templates parsed by Jinja, its report's
expression rendered by Ansible's templating in this process): nothing runs on
a host, so the test takes well under a second."""

from __future__ import annotations

from pathlib import Path

import jinja2
import jinja2.meta
import pytest
import yaml
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible.vars.manager import VariableManager

REPO = Path(__file__).resolve().parents[3]
PLAY = yaml.safe_load((REPO / "playbooks" / "inspect.yml").read_text())[0]
# Task keywords whose value is a bare expression, not a template
CONDITIONALS = ("when", "failed_when", "changed_when")


def _read(value, bare: bool = False):
    """The names a keyword's value reads."""
    if isinstance(value, dict):
        return set().union(*(_read(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_read(v, bare) for v in value)) if value else set()
    if not isinstance(value, str) or not (bare or "{{" in value or "{%" in value):
        return set()
    source = "{{ " + value + " }}" if bare else value
    return set(jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(source)))


def _reads_and_defines() -> tuple[set, set]:
    reads, defines = _read(PLAY.get("vars", {})), set(PLAY.get("vars", {}))
    for task in PLAY["tasks"]:
        defines |= set(task.get("vars", {})) | ({task["register"]} if "register" in task else set())
        for key, value in task.items():
            reads |= _read(value, bare=key in CONDITIONALS)
    return reads, defines


def test_the_play_reads_something_from_the_inventory():
    reads, defines = _reads_and_defines()
    assert {"inferops_service_name", "inferops_service_port"} <= reads - defines


@pytest.mark.parametrize("inventory", ["production", "lab"])
def test_every_variable_it_reads_is_defined_for_every_host(inventory):
    reads, defines = _reads_and_defines()
    loader = DataLoader()
    hosts = InventoryManager(loader=loader, sources=[str(REPO / "inventories" / inventory)])
    variables = VariableManager(loader=loader, inventory=hosts)
    servers = hosts.get_hosts(PLAY["hosts"])
    assert servers
    missing = {host.name: sorted(name for name in reads - defines if name not in variables.get_vars(host=host))
               for host in servers}
    assert missing == {host.name: [] for host in servers}


def _gpu_count(result: dict) -> str:
    (report,) = [task for task in PLAY["tasks"] if "gpu_count" in (task.get("vars") or {})]
    templar = Templar(loader=DataLoader(), variables={"__inspect_host": result})
    return str(templar.template(trust_as_template(report["vars"]["gpu_count"])))


MISSING = ("the host manifest refuses this deploy: no TP size and GPUs: the host manifest has none "
           "(run provision.yml) and sglang_service_tp_size / sglang_service_gpu_devices are not set")


@pytest.mark.parametrize("result, shown", [
    ({"changed": False, "exists": True, "manifest": {"gpus": {"count": 8, "usable": []}}}, "8"),
    ({"failed": True, "msg": MISSING, "exists": True, "manifest": {"gpus": None}},
     "? (the host manifest records no GPUs)"),
    ({"failed": True, "msg": MISSING, "exists": False}, "? (no host manifest: run provision.yml)"),
    ({"failed": True, "msg": "/etc/inferops-sglang/host.json is not JSON", "exists": True},
     "? (/etc/inferops-sglang/host.json is not JSON)"),
])
def test_the_report_counts_the_manifests_gpus_or_says_why_not(result, shown):
    """sglang_host_manifest reads a manifest as a deploy does and fails where no deploy
    could start: the play goes on (failed_when: false) and the report says why."""
    assert _gpu_count(result) == shown
    manifest_read = next(task for task in PLAY["tasks"] if task.get("register") == "__inspect_host")
    assert manifest_read["failed_when"] is False
