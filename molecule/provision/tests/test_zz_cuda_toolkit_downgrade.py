"""The way back, in one run (runs last: after test_cuda_toolkit_version_change.py
and test_runtime_and_ddtree.py): the rejected DDTree build reverted, and an
explicit move back to the older toolkit release.

test_cuda_toolkit_version_change.py left the toolkit at 13.0.2-1, pinned and
held with the packages it brought; test_runtime_and_ddtree.py left the rejected
build's failed verdict in the host manifest. The operator names the build with
ddtree_build_state=absent and sets cuda_toolkit_package_version back to
13.0.1-1 (the scenario's default): the run provisions cleanly, no build is left
and the host manifest holds SGLang's own verdict only; the older release is
installed, and it alone is pinned and held again. A second run changes nothing,
the host manifest included: it finds the same host and leaves the manifest byte
for byte as it was (the one idempotence check after a version change).
"""

from __future__ import annotations

import json

import pytest
import testinfra
from test_cuda_toolkit import installed, playbook
from test_runtime_and_ddtree import BUILD, DDTREE_FILE, HOST_MANIFEST, MANIFEST

HOST = testinfra.get_host("podman://prov-ct129")
OLDER = "13.0.1-1"
PREFERENCES = "/etc/apt/preferences.d/inferops-cuda-toolkit.pref"
DRIVERS = ["cuda-drivers", "nvidia-kernel-open-dkms", "cuda-runtime-13-0", "cuda-13-0"]
WAY_BACK = [*BUILD, "ddtree_build_state=absent", f"cuda_toolkit_package_version={OLDER}"]


@pytest.fixture(scope="module")
def first():
    """The run back, and the toolkit packages it left."""
    assert installed()["cuda-toolkit-13-0"] != OLDER, "the version change test should have left the newer release"
    run = playbook(*WAY_BACK)
    return run, installed()


def test_reverting_the_build_provisions_cleanly_again(first):
    run, _packages = first
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    assert not HOST.file(DDTREE_FILE).exists and not HOST.file(MANIFEST).exists  # the rollback left no build
    host = json.loads(HOST.file(HOST_MANIFEST).content_string)
    assert host["ddtree"] is None and set(host["builds"]) == {"sglang"} and host["builds"]["sglang"]["ok"] is True


def test_explicit_move_back_to_the_older_release(first):
    run, packages = first
    assert run.returncode == 0, run.stdout[-4000:]
    assert packages["cuda-toolkit-13-0"] == OLDER, packages
    assert json.loads(HOST.file("/usr/local/cuda-13.0/version.json").content_string)["cuda"]["version"] == "13.0.1"
    assert not [name for name in packages if name in DRIVERS or name.startswith(("nvidia-", "libnvidia-"))
                or name.endswith("-dkms")], sorted(packages)

    prefs = HOST.file(PREFERENCES).content_string
    toolkit = sorted(name for name in packages if name.startswith("cuda-") and name not in DRIVERS)
    selections = dict(line.split() for line in HOST.check_output("dpkg --get-selections 'cuda-*'").splitlines())
    for name in toolkit:
        assert f"Package: {name}\nPin: version {packages[name]}\nPin-Priority: 1001" in prefs, prefs
        assert selections.get(name) == "hold", f"{name}: {selections.get(name)}"
    policy = HOST.check_output("apt-cache policy cuda-toolkit-13-0")
    assert f"Candidate: {OLDER}" in policy, policy


def test_a_second_run_changes_nothing(first):
    _run, packages = first
    manifest = HOST.file(HOST_MANIFEST)
    checksum, mtime = manifest.sha256sum, manifest.mtime
    again = playbook(*WAY_BACK)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert "changed=0" in again.stdout, again.stdout[-4000:]
    assert installed() == packages
    manifest = HOST.file(HOST_MANIFEST)
    assert (manifest.sha256sum, manifest.mtime) == (checksum, mtime)
