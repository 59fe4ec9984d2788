"""An explicit version change is the only way to move the toolkit (runs after test_cuda_toolkit.py).

The operator changes cuda_toolkit_package_version: the holds are released, the
new version installed, pinned and held again. That a second run after a version
change changes nothing, the host manifest byte for byte included, is proven once,
after the move back (test_zz_cuda_toolkit_downgrade.py: one whole provision fewer).
"""

from __future__ import annotations

import json

import testinfra
from test_cuda_toolkit import installed, playbook

HOST = testinfra.get_host("podman://prov-ct129")


def test_version_change_moves_the_toolkit_and_holds_it_again():
    first = playbook("cuda_toolkit_package_version=13.0.2-1")
    assert first.returncode == 0, first.stdout[-4000:]
    assert installed()["cuda-toolkit-13-0"] == "13.0.2-1"
    assert json.loads(HOST.file("/usr/local/cuda-13.0/version.json").content_string)["cuda"]["version"] == "13.0.2"
    assert "Package: cuda-toolkit-13-0\nPin: version 13.0.2-1" in HOST.file(
        "/etc/apt/preferences.d/inferops-cuda-toolkit.pref").content_string
    assert HOST.check_output("dpkg --get-selections cuda-toolkit-13-0").split() == ["cuda-toolkit-13-0", "hold"]
