"""execution-environment.yml: ansible-builder (v3 schema) accepts it and writes a
build context carrying the pins, and the EE holds exactly the collections the
playbooks and roles use (found by scanning them)."""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from awx_helpers import REPO, ansible_env, tool

EE_FILE = REPO / "execution-environment.yml"
# Collections an AWX job never needs from the EE: ansible.builtin/legacy ship in
# ansible-core; inferops.sglang comes from the project checkout (collections/).
PROVIDED = {"ansible.builtin", "ansible.legacy", "inferops.sglang"}
# Keywords of plays, blocks and tasks: anything else with dots in a task is a module.
FQCN = r"[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*"


def pins() -> dict:
    out = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)", line.strip())
        if match:
            out[re.sub(r"\[.*\]", "", match.group(1)).lower()] = match.group(2)
    return out


def ee() -> dict:
    return yaml.safe_load(EE_FILE.read_text())


@pytest.fixture(scope="module")
def context(tmp_path_factory) -> Path:
    """ansible-builder create: the build context, no image build, no registry. The definition is copied beside
    the collection's tarball, built as ee/build.sh builds it (tools/build_collection.sh)."""
    work = tmp_path_factory.mktemp("ee")
    shutil.copy(EE_FILE, work / EE_FILE.name)
    built = subprocess.run([str(REPO / "tools" / "build_collection.sh"), str(work / "build")], env=ansible_env(),
                           capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stdout + built.stderr
    (work / ".cache" / "ee" / "collection").mkdir(parents=True)
    for tarball in (work / "build").glob("*.tar.gz"):
        shutil.move(tarball, work / ".cache" / "ee" / "collection" / tarball.name)
    ctx = work / "context"
    proc = subprocess.run([tool("ansible-builder"), "create", "-f", str(work / EE_FILE.name), "-c", str(ctx), "-v", "3"],
                          cwd=work, env=ansible_env(), capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return ctx


def test_ansible_builder_version_is_pinned():
    proc = subprocess.run([tool("ansible-builder"), "--version"], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == pins()["ansible-builder"]


def test_schema_version_3():
    assert ee()["version"] == 3


def test_build_context_carries_the_pins(context):
    containerfile = (context / "Containerfile").read_text()
    refs = re.search(r'^ARG ANSIBLE_INSTALL_REFS="([^"]*)"', containerfile, re.M).group(1).split()
    assert f"ansible-core=={pins()['ansible-core']}" in refs
    runner = [r for r in refs if r.startswith("ansible-runner==")]
    assert len(runner) == 1, refs
    if "ansible-runner" in pins():
        assert runner[0] == f"ansible-runner=={pins()['ansible-runner']}"
    assert len(refs) == 2, f"nothing but ansible-core and ansible-runner: {refs}"
    # the base image's venv of Debian 12's Python 3.11 (ansible-core 2.19 needs 3.11+ on the controller)
    assert re.search(r'^ARG PYCMD="/opt/python3/bin/python3"', containerfile, re.M)
    assert 'python3 -m venv /opt/python3' in (REPO / "ee" / "base" / "build.sh").read_text()


def test_base_image_has_no_registry_host_and_can_be_overridden(context):
    containerfile = (context / "Containerfile").read_text()
    base = re.search(r'^ARG EE_BASE_IMAGE="([^"]+)"', containerfile, re.M).group(1)
    assert base == ee()["images"]["base_image"]["name"]
    first = base.split("/")[0]
    # a registry host is a first component with a dot or a port, or localhost
    assert "/" not in base or not ("." in first or ":" in first or first == "localhost"), base
    # a global ARG used by FROM: `ansible-builder build --build-arg EE_BASE_IMAGE=...` replaces it
    assert containerfile.index('ARG EE_BASE_IMAGE="') < containerfile.index("FROM $EE_BASE_IMAGE AS base")


def test_system_packages_come_with_the_base_image(context):
    """Nothing for bindep to install: the base image (ee/base/packages.txt) carries Python and the SSH client."""
    bindep = context / "_build" / "bindep.txt"
    assert not bindep.exists() or not bindep.read_text().strip()
    assert not (context / "_build" / "requirements.txt").exists(), "no Python packages besides ansible-core/runner"
    packages = [line.strip() for line in (REPO / "ee" / "base" / "packages.txt").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    assert {"python3", "python3-venv", "openssh-client"} <= set(packages)


def test_the_base_images_wheelhouse_pins_what_the_build_installs():
    """ee/base/requirements.txt: every package pinned; ansible-core and ansible-runner as requirements.txt pins them."""
    lines = [line.strip() for line in (REPO / "ee" / "base" / "requirements.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    locked = dict(line.split("==") for line in lines)
    assert all("==" in line for line in lines) and len(locked) == len(lines)
    assert locked["ansible-core"] == pins()["ansible-core"] and locked["ansible-runner"] == pins()["ansible-runner"]
    assert {"dumb-init", "bindep", "pyyaml", "packaging"} <= set(locked)  # what ansible-builder's stages install


def test_the_final_image_holds_the_collection_and_not_the_wheelhouse(context):
    containerfile = (context / "Containerfile").read_text()
    final = containerfile[containerfile.rindex("FROM "):]
    assert list((context / "_build" / "collection").glob("inferops-sglang-*.tar.gz"))
    install = next(line for line in final.splitlines() if "ansible-galaxy collection install" in line)
    assert "--offline" in install and "/usr/share/ansible/collections" in install
    assert "rm -rf /tmp/inferops-collection /opt/inferops-ee/wheels /etc/pip.conf" in install
    assert final.index(install) < final.index("USER 1000")
    # the deploy summary, as this repository's ansible.cfg enables it (a job's project may have no ansible.cfg)
    assert "ENV ANSIBLE_CALLBACKS_ENABLED=inferops.sglang.deploy_summary" in final.splitlines()


def ee_collections() -> set:
    galaxy = ee()["dependencies"].get("galaxy")
    if galaxy is None:
        return set()
    if isinstance(galaxy, str):
        galaxy = yaml.safe_load((EE_FILE.parent / galaxy).read_text())
    return {c["name"] if isinstance(c, dict) else c for c in galaxy.get("collections") or []}


def test_galaxy_stage_matches_the_collections(context):
    containerfile = (context / "Containerfile").read_text()
    assert ("FROM base AS galaxy" in containerfile) == bool(ee_collections())


# --- which collections the playbooks and roles use ---------------------------

def tasks_of(node, found: list) -> list:
    if isinstance(node, list):
        for item in node:
            tasks_of(item, found)
    elif isinstance(node, dict):
        if "hosts" in node or "import_playbook" in node:
            for section in ("pre_tasks", "tasks", "post_tasks", "handlers"):
                tasks_of(node.get(section) or [], found)
            for role in node.get("roles") or []:
                found.append({"_role": role if isinstance(role, str) else role.get("role", role.get("name"))})
        elif any(k in node for k in ("block", "rescue", "always")):
            for section in ("block", "rescue", "always"):
                tasks_of(node.get(section) or [], found)
        else:
            found.append(node)
    return found


def strings_of(node):
    """Every string of a YAML document, keys included (Jinja lives in both)."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from strings_of(key)
            yield from strings_of(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings_of(item)


def collections_in_text(text: str) -> set:
    """Plugins named in Jinja: lookups, queries, filters and tests, and FQCN role names."""
    names = set()
    names.update(re.findall(rf"""(?:lookup|query|q)\(\s*['"]({FQCN})['"]""", text))
    names.update(re.findall(rf"\|\s*({FQCN})\b", text))
    names.update(re.findall(rf"\bis\s+(?:not\s+)?({FQCN})\b", text))
    return {".".join(n.split(".")[:2]) for n in names}


def collections_used(files: list[Path], cfg: Path, plugins: Path) -> set:
    used = set()
    for path in files:
        text = path.read_text()
        if path.suffix == ".j2":
            used |= collections_in_text(text)
            continue
        data = yaml.safe_load(text)
        for string in strings_of(data):
            used |= collections_in_text(string)
        for task in tasks_of(data, []) if isinstance(data, list) else []:
            for key, value in task.items():
                if re.fullmatch(FQCN, key):
                    used.add(".".join(key.split(".")[:2]))
                if key in ("_role", "ansible.builtin.include_role", "ansible.builtin.import_role"):
                    name = value if isinstance(value, str) else (value or {}).get("name", "")
                    if re.fullmatch(FQCN, name or ""):
                        used.add(".".join(name.split(".")[:2]))
    # roles' dependencies
    for meta in (f for f in files if f.parts[-2:] == ("meta", "main.yml")):
        for dep in (yaml.safe_load(meta.read_text()) or {}).get("dependencies") or []:
            name = dep if isinstance(dep, str) else dep.get("role", dep.get("name", ""))
            if re.fullmatch(FQCN, name):
                used.add(".".join(name.split(".")[:2]))
    # callbacks and other plugins named in ansible.cfg
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(cfg)
    for section in parser.sections():
        for value in dict(parser.items(section)).values():
            for name in re.findall(FQCN, value):
                used.add(".".join(name.split(".")[:2]))
    # controller-side Python (callbacks, filters...) importing another collection
    for py in plugins.rglob("*.py"):
        for ns, coll in re.findall(r"ansible_collections\.([a-z_0-9]+)\.([a-z_0-9]+)", py.read_text()):
            used.add(f"{ns}.{coll}")
    return used - PROVIDED


def repo_files() -> list[Path]:
    """What AWX runs: the playbooks at the root and in playbooks/, and the roles (lab/, molecule/,
    awx/ and tests/ are not run by the job templates)."""
    root = [p for p in REPO.glob("*.yml") if isinstance(yaml.safe_load(p.read_text()), list)]
    roles = [p for p in (REPO / "roles").rglob("*") if p.suffix in (".yml", ".yaml", ".j2") and p.is_file()]
    return sorted(root + sorted((REPO / "playbooks").glob("*.yml")) + roles)


def test_root_playbooks_are_the_job_templates_playbooks():
    names = {p.name for p in REPO.glob("*.yml") if isinstance(yaml.safe_load(p.read_text()), list)}
    assert {"provision.yml", "plan.yml", "deploy.yml"} <= names


def test_ee_collections_equal_what_the_repository_uses():
    used = collections_used(repo_files(), REPO / "ansible.cfg", REPO / "plugins")
    assert ee_collections() == used, (
        f"execution-environment.yml lists {sorted(ee_collections())}, the playbooks and roles use {sorted(used)}")


def test_the_scan_finds_other_collections(tmp_path):
    """The scan is not vacuous: a module, a filter, a lookup and a role from other collections are found."""
    tasks = tmp_path / "roles" / "x" / "tasks" / "main.yml"
    tasks.parent.mkdir(parents=True)
    tasks.write_text(yaml.safe_dump([
        {"name": "a", "community.general.modprobe": {"name": "nvidia"}},
        {"name": "b", "ansible.builtin.debug": {"msg": "{{ x | ansible.utils.ipaddr }}"}},
        {"name": "c", "ansible.builtin.debug": {"msg": "{{ lookup('community.hashi_vault.hashi_vault', 'x') }}"}},
        {"block": [{"name": "d", "ansible.posix.sysctl": {"name": "x", "value": 1}}]},
        {"name": "e", "ansible.builtin.include_role": {"name": "devsec.hardening.ssh_hardening"}},
        {"name": "f", "inferops.sglang.gpu_facts": {}},
    ]))
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\ncallbacks_enabled = ansible.posix.profile_tasks, inferops.sglang.deploy_summary\n")
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "cb.py").write_text("from ansible_collections.community.docker.plugins.module_utils import x\n")
    assert collections_used([tasks], cfg, plugins) == {
        "community.general", "ansible.utils", "community.hashi_vault", "ansible.posix", "devsec.hardening",
        "community.docker"}


def test_image_tag_is_the_one_awx_configure_names():
    """awx/configure.yml's default image (awx_ee_image) is inferops-sglang-ee:<galaxy.yml version>: the EE tags it so."""
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    assert f"inferops-sglang-ee:{version}" in ee()["options"]["tags"]
    assert "inferops-sglang-ee:" in (REPO / "awx" / "vars" / "main.yml").read_text()


def test_a_limit_read_from_a_file_prints_none_of_it(context, tmp_path):
    """AWX's limit prompt takes `@<file>`; Ansible then reads that file of the EE as host patterns and, by default,
    prints each line that matches no host. The image ignores unmatched patterns, and that hides the file: a real
    ansible-playbook run with the image's setting and a limit read from a file holding a secret prints none of it."""
    containerfile = (context / "Containerfile").read_text()
    final = containerfile[containerfile.rindex("FROM "):]
    env = dict(re.findall(r"^ENV (ANSIBLE_HOST_PATTERN_MISMATCH)=(\S+)$", final, re.M))
    assert env == {"ANSIBLE_HOST_PATTERN_MISMATCH": "ignore"}, final
    secret = tmp_path / "secret"
    secret.write_text("s3cret-value\nh1\n")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"children": {"sglang_servers": {"hosts": {"h1": None}}}}}))

    def list_hosts(**setting) -> str:
        run_env = ansible_env()
        run_env.pop("ANSIBLE_HOST_PATTERN_MISMATCH", None)
        proc = subprocess.run([tool("ansible-playbook"), "-i", str(inventory), "plan.yml", "--list-hosts", "-l", f"@{secret}"],
                              cwd=REPO, env=dict(run_env, **setting), capture_output=True, text=True, timeout=300, check=True)
        return proc.stdout + proc.stderr

    assert "s3cret-value" in list_hosts()  # Ansible's default: the line is printed
    hidden = list_hosts(**env)
    assert "s3cret-value" not in hidden and "h1" in hidden
