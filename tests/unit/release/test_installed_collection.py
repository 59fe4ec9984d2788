"""The collection as users get it: the tarball `ansible-galaxy collection build` makes (tools/build_collection.sh,
as a release is built), installed into an empty collections path and used from there, never from this tree.
(The deploy scenario's fault matrix runs every deploy with this installed copy: molecule/deploy/faults.yml.)"""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from sim_helpers import REPO

BIN = Path(sys.executable).parent
NAME = "inferops.sglang"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("collection")
    proc = subprocess.run([str(REPO / "tools" / "build_collection.sh"), str(out)], capture_output=True, text=True,
                          check=False, env=dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    return out / f"inferops-sglang-{version}.tar.gz", out / "collections", version


def installed(collections: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    """An Ansible command that sees only the installed copy: its collections path alone, no ansible.cfg."""
    (cwd / "ansible.cfg").write_text("[defaults]\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_CONFIG=str(cwd / "ansible.cfg"),
               ANSIBLE_NOCOLOR="1", PATH=f"{BIN}:{os.environ['PATH']}")
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, cwd=cwd, env=env, check=False)


def test_the_tarball_holds_the_collection_and_not_the_lab_tests_or_caches(built):
    tarball, _collections, version = built
    with tarfile.open(tarball) as archive:
        names = set(archive.getnames())
        manifest = json.load(archive.extractfile("MANIFEST.json"))
    assert manifest["collection_info"]["version"] == version
    tops = {name.split("/")[0] for name in names}
    assert not tops & {"lab", "tests", "molecule", ".cache", ".venv", ".ci", "collections", "tune-results", "awx",
                       "inventories", "ansible.cfg", "deploy.yml", "Makefile"}, sorted(tops)
    modules = {p.name for p in (REPO / "plugins" / "modules").glob("*.py")}
    assert {n.split("/")[-1] for n in names if n.startswith("plugins/modules/")} >= modules
    for role in (REPO / "roles").glob("*/meta/argument_specs.yml"):
        assert f"roles/{role.parent.parent.name}/meta/argument_specs.yml" in names
    assert {"playbooks/deploy.yml", "playbooks/provision.yml", "playbooks/tune.yml", "CHANGELOG.rst",
            "changelogs/changelog.yaml"} <= names
    assert tarball.stat().st_size < 2 * 1024 * 1024


@pytest.mark.parametrize("kind", ["module", "filter", "callback", "role"])
def test_ansible_doc_renders_every_plugin_and_role_from_the_installed_copy_without_a_warning(built, kind, tmp_path):
    _tarball, collections, _version = built
    listed = installed(collections, "ansible-doc", "-t", kind, "-l", NAME, "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    names = sorted(json.loads(listed.stdout))
    where = {"module": "plugins/modules/*.py", "filter": "plugins/filter/*.py", "callback": "plugins/callback/*.py",
             "role": "roles/*/meta/argument_specs.yml"}[kind]
    in_tree = {(p.parent.parent.name if kind == "role" else p.stem) for p in REPO.glob(where)}
    assert {n.rsplit(".", 1)[-1] for n in names} == in_tree
    shown = installed(collections, "ansible-doc", "-t", kind, *names, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stderr.strip() == "", shown.stderr
    for name in names:
        assert re.search(rf"^> .*\b{re.escape(name)}\b", shown.stdout, re.MULTILINE), name
    assert str(collections) in shown.stdout  # read from the installed copy, not this tree
    assert str(REPO) not in shown.stdout


def test_the_playbooks_run_from_the_installed_copy(built, tmp_path):
    _tarball, collections, _version = built
    (tmp_path / "hosts.yml").write_text("sglang_servers:\n  hosts:\n    ct129:\nprometheus_servers:\n  hosts:\n    prom:\n")
    names = ("deploy", "provision", "plan", "tune", "monitoring", "inspect")
    proc = installed(collections, "ansible-playbook", "-i", "hosts.yml", *(f"{NAME}.{name}" for name in names),
                     "--syntax-check", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    # each one found in the installed copy
    where = collections / "ansible_collections" / "inferops" / "sglang" / "playbooks"
    assert [line for line in proc.stdout.splitlines() if line.startswith("playbook: ")] == [
        f"playbook: {where}/{name}.yml" for name in names]
