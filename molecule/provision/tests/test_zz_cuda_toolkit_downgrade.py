"""An explicit move back to an older release works (runs last: after test_cuda_toolkit_version_change.py).

test_cuda_toolkit_version_change.py left the toolkit at 13.0.2-1, pinned and
held with the packages it brought. The operator sets cuda_toolkit_package_version
back to 13.0.1-1 (the scenario's default): the older release is installed, and
it alone is pinned and held again; a second run changes nothing.
"""

from __future__ import annotations

import json

import testinfra
from test_cuda_toolkit import installed, playbook

HOST = testinfra.get_host("podman://prov-ct129")
OLDER = "13.0.1-1"
PREFERENCES = "/etc/apt/preferences.d/inferops-cuda-toolkit.pref"
DRIVERS = ["cuda-drivers", "nvidia-kernel-open-dkms", "cuda-runtime-13-0", "cuda-13-0"]


def test_explicit_move_back_to_the_older_release():
    assert installed()["cuda-toolkit-13-0"] != OLDER, "the version change test should have left the newer release"

    first = playbook(f"cuda_toolkit_package_version={OLDER}")
    assert first.returncode == 0, first.stdout[-4000:]
    packages = installed()
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

    again = playbook(f"cuda_toolkit_package_version={OLDER}")
    assert again.returncode == 0, again.stdout[-4000:]
    assert "changed=0" in again.stdout, again.stdout[-4000:]
    assert installed() == packages
