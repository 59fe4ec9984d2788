"""The gateway's pin is one version everywhere: the sglang_runtime role's default
(sglang_runtime_gateway_version, in defaults/main.yml and in both entry points of
meta/argument_specs.yml), the collection's _gateway.PINNED (which the Makefile
reads with sed for the tests' gateway venv) and the lock the role ships for it,
which pins every distribution it installs. Read from the files, so none can drift."""

from __future__ import annotations

import re

import yaml
from sim_helpers import REPO

from ansible_collections.inferops.sglang.plugins.module_utils import _gateway

ROLE = REPO / "roles" / "sglang_runtime"


def test_the_roles_default_gateway_version_is_the_collections_pin():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["sglang_runtime_gateway_version"] == _gateway.PINNED
    assert defaults["sglang_runtime_gateway"] is False
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    for entry in ("main", "gateway"):
        assert specs[entry]["options"]["sglang_runtime_gateway_version"]["default"] == _gateway.PINNED, entry


def test_the_makefile_reads_the_same_pin():
    text = (REPO / "plugins" / "module_utils" / "_gateway.py").read_text()
    assert re.findall(r'^PINNED = "(.*)"$', text, re.M) == [_gateway.PINNED]
    makefile = (REPO / "Makefile").read_text()
    assert "GATEWAY_LOCK := roles/sglang_runtime/files/constraints/smg-$(GATEWAY_VERSION).txt" in makefile


def test_the_shipped_lock_pins_the_release_and_every_dependency():
    lines = [line.strip() for line in (ROLE / "files" / "constraints" / f"smg-{_gateway.PINNED}.txt").read_text()
             .splitlines() if line.strip() and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==[^\s=]+", line) for line in lines), lines
    assert [line for line in lines if line.startswith("smg==")] == [f"smg=={_gateway.PINNED}"]
