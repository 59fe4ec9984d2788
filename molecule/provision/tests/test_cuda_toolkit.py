"""The CUDA toolkit on the provisioned lab host (molecule verify, pytest-testinfra).

Converge installed cuda-toolkit-13-0 13.0.1-1 in mirror mode from the lab's
signed apt repository, which also offers 13.0.2-1 and driver packages: the
toolkit must be exactly the pinned version, pinned and held, loadable, and no
driver may have come with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import testinfra
import yaml

HOST = testinfra.get_host("podman://prov-ct129")
HOME = "/usr/local/cuda-13.0"
PINNED = "13.0.1-1"
TOOLKIT = ["cuda-toolkit-13-0", "cuda-cudart-13-0", "cuda-nvcc-13-0", "cuda-toolkit-13-0-config-common",
           "cuda-toolkit-13-config-common", "cuda-toolkit-config-common"]
DRIVERS = ["cuda-drivers", "nvidia-kernel-open-dkms", "cuda-runtime-13-0", "cuda-13-0"]
SCENARIO = Path(__file__).resolve().parent.parent
PREFERENCES = "/etc/apt/preferences.d/inferops-cuda-toolkit.pref"


def installed() -> dict[str, str]:
    out = HOST.check_output("dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n'")
    return {f[0]: f[1] for f in (line.split() for line in out.splitlines()) if len(f) > 2 and f[2][1:2] == "i"}


def playbook(*extra: str) -> subprocess.CompletedProcess:
    """Run the scenario's converge play again with extra variables (-e)."""
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", os.environ["MOLECULE_INVENTORY_FILE"],
            str(SCENARIO / "converge.yml")]
    for item in extra:
        argv += ["-e", item]
    env = {**os.environ, "ANSIBLE_CALLBACK_RESULT_FORMAT": "json", "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, env=env)


def test_toolkit_installed_at_the_pinned_version():
    packages = installed()
    assert packages.get("cuda-toolkit-13-0") == PINNED, packages
    for name in TOOLKIT:
        assert name in packages, f"{name} not installed"


def test_toolkit_packages_held():
    selections = dict(line.split() for line in HOST.check_output("dpkg --get-selections 'cuda-*'").splitlines())
    for name in TOOLKIT:
        assert selections.get(name) == "hold", f"{name}: {selections.get(name)}"


def test_every_toolkit_package_pinned_to_its_installed_version():
    prefs = HOST.file(PREFERENCES).content_string
    packages = installed()
    for name in TOOLKIT:
        assert f"Package: {name}\nPin: version {packages[name]}\nPin-Priority: 1001" in prefs, prefs
    policy = HOST.check_output("apt-cache policy cuda-toolkit-13-0")
    assert f"Candidate: {PINNED}" in policy, policy
    assert "13.0.2-1 500" in policy, f"the newer release must be visible to apt (and refused):\n{policy}"


def test_repository_signed_by_its_key():
    sources = HOST.file("/etc/apt/sources.list.d/inferops-cuda-toolkit.sources").content_string
    assert "URIs: http://127.0.0.1:8081/cuda/debian12/x86_64/" in sources
    assert "Signed-By: /etc/apt/keyrings/cuda-toolkit.asc" in sources
    assert HOST.file("/etc/apt/keyrings/cuda-toolkit.asc").contains("BEGIN PGP PUBLIC KEY BLOCK")
    # apt keeps an InRelease only when its signature verified against the keyring.
    lists = HOST.check_output("ls /var/lib/apt/lists")
    assert "127.0.0.1:8081_cuda_debian12_x86%5f64_InRelease" in lists.split(), lists


def test_version_json_and_nvcc():
    version = json.loads(HOST.file(f"{HOME}/version.json").content_string)
    assert version["cuda"] == {"name": "CUDA SDK", "version": "13.0.1"}
    assert "release 13.0," in HOST.check_output(f"{HOME}/bin/nvcc --version")


def test_libcudart_loads():
    probe = ("import ctypes; lib = ctypes.CDLL('%s/lib64/libcudart.so.13'); v = ctypes.c_int(); "
             "print(lib.cudaRuntimeGetVersion(ctypes.byref(v)), v.value)" % HOME)
    assert HOST.check_output(f'python3 -c "{probe}"').split() == ["0", "13000"]


def test_no_driver_package_installed():
    packages = installed()
    assert not [name for name in packages if name in DRIVERS or name.startswith(("nvidia-", "libnvidia-"))
                or name.endswith("-dkms")], sorted(packages)


def test_apt_upgrade_would_not_move_the_toolkit():
    upgrade = HOST.run("apt-get -s -o Debug::NoLocking=1 upgrade")
    assert upgrade.rc == 0, upgrade.stderr
    moved = [line for line in upgrade.stdout.splitlines() if line.startswith("Inst cuda")]
    assert not moved, upgrade.stdout
    dist = HOST.run("apt-get -s -o Debug::NoLocking=1 dist-upgrade")
    assert not [line for line in dist.stdout.splitlines() if line.startswith("Inst cuda")], dist.stdout


# Each bad-input case: the values an operator could pass with -e, and what the refusal says.
BAD_INPUT = {
    "cuda-13-0": ({"cuda_toolkit_package": "cuda-13-0"}, "is or pulls a kernel driver; this role never installs one"),
    "cuda-drivers": ({"cuda_toolkit_package": "cuda-drivers"},
                     "is or pulls a kernel driver; this role never installs one"),
    "version-of-another-release": ({"cuda_toolkit_package_version": "12.8.1-1"}, "A version change is a change of both"),
    "mirror-without-url": ({"cuda_toolkit_mode": "mirror", "cuda_toolkit_repo_url": ""},
                           "mode mirror needs cuda_toolkit_repo_url"),
    "preinstalled-other-version": ({"cuda_toolkit_mode": "preinstalled", "cuda_toolkit_package_version": "13.0.2-1"},
                                   "says 13.0.1, the package is at 13.0.1-1"),
}


def host_vars(name: str) -> dict:
    """The variables the scenario's inventory gives a host (its connection), in any group."""
    found: dict = {}

    def walk(group: dict) -> None:
        found.update(((group or {}).get("hosts") or {}).get(name) or {})
        for child in ((group or {}).get("children") or {}).values():
            walk(child)

    for group in yaml.safe_load(Path(os.environ["MOLECULE_INVENTORY_FILE"]).read_text()).values():
        walk(group)
    return found


@pytest.fixture(scope="module")
def bad_input(tmp_path_factory):
    """Every bad-input case in ONE run of provision.yml (bad_input.yml): each case is an inventory
    host of its own standing for the provisioned container, in its groups, with the case's values
    over the lab's settings. What the host holds is read before and after the run."""
    tmp = tmp_path_factory.mktemp("bad-input")
    connection = {"ansible_host": "prov-ct129", **host_vars("prov-ct129")}
    hosts = {}
    for case, (values, _message) in BAD_INPUT.items():
        (tmp / f"{case}.json").write_text(json.dumps(values))
        hosts[f"bad-{case}"] = {**connection, "provision_case_vars": str(tmp / f"{case}.json")}
    (tmp / "inventory.yml").write_text(yaml.safe_dump({"all": {"children": {
        "provision_bad_input": {"hosts": hosts},
        "sglang_servers": {"hosts": dict.fromkeys(hosts)},
        "gpu_rtx_a6000": {"hosts": dict.fromkeys(hosts)},
    }}}))
    before = (installed(), HOST.file(PREFERENCES).content_string)
    # the scenario's inventory too, for its group_vars; --limit: the case hosts only
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", os.environ["MOLECULE_INVENTORY_FILE"],
            "-i", str(tmp / "inventory.yml"), "--limit", "provision_bad_input", str(SCENARIO / "bad_input.yml")]
    env = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json", "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_FORCE_COLOR": "0"}
    run = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, env=env)
    after = (installed(), HOST.file(PREFERENCES).content_string)
    return run, before, after


def failure_messages(report: dict, host: str) -> str:
    """Every message of a failed result of the host in the run, loop items included."""
    messages = []

    def collect(result: dict) -> None:
        if result.get("failed"):
            messages.append(str(result.get("msg", "")))
        for item in result.get("results") or []:
            if isinstance(item, dict):
                collect(item)

    for play in report["plays"]:
        for task in play["tasks"]:
            if host in task["hosts"]:
                collect(task["hosts"][host])
    return " ".join(" ".join(messages).split())


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_fails_before_changing_anything(bad_input, case):
    run, before, after = bad_input
    assert run.returncode != 0, (run.stdout + run.stderr)[-4000:]
    assert run.stdout.lstrip().startswith("{"), (run.stdout + run.stderr)[-4000:]
    report = json.loads(run.stdout)
    host = f"bad-{case}"
    assert report["stats"][host]["failures"] > 0, report["stats"]
    message = BAD_INPUT[case][1]
    output = failure_messages(report, host)
    assert message in output, output[-4000:]
    assert after == before
