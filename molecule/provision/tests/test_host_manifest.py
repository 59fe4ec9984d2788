"""The host manifest provision.yml writes (molecule verify, pytest-testinfra;
after the toolkit tests, before the DDTree ones): root 0644, no secrets. That a
second run that finds the same host leaves it byte for byte as it was is proven
by the second run after the move back (test_zz_cuda_toolkit_downgrade.py), and
the DDTree cases (test_runtime_and_ddtree.py) check its verdict per build."""

from __future__ import annotations

import json

import testinfra

HOST = testinfra.get_host("podman://prov-ct129")
PATH = "/etc/inferops-sglang/host.json"


def manifest() -> dict:
    return json.loads(HOST.file(PATH).content_string)


def test_written_by_root_for_everyone_to_read():
    f = HOST.file(PATH)
    assert (f.user, f.group, f.mode) == ("root", "root", 0o644)
    assert HOST.file("/etc/inferops-sglang").mode == 0o755
    text = f.content_string
    assert "password" not in text.lower() and "api_key" not in text.lower()
    data = manifest()
    assert data["schema"] == 1 and data["builds"]["sglang"]["ok"] is True
