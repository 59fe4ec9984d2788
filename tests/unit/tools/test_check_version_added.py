"""tools/check_version_added.py (part of `make lint`): a module, plugin, role entry point or option
that the last release did not offer must say galaxy.yml's (unreleased) version; what was released
keeps its version_added. Run on copies of this collection, read by the real ansible-doc."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from sim_helpers import REPO

TOOL = REPO / "tools" / "check_version_added.py"
spec = importlib.util.spec_from_file_location("check_version_added", TOOL)
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def run(root) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), "--root", str(root)], capture_output=True, text=True, check=False)


@pytest.fixture
def collection(tmp_path):
    """What ansible-doc reads of the collection, copied: galaxy.yml, meta, plugins, the roles' specs, changelogs."""
    root = tmp_path / "sglang"
    root.mkdir()
    for name in ("galaxy.yml", "README.md"):
        shutil.copy(REPO / name, root / name)
    for name in ("meta", "plugins", "changelogs"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for role in sorted(p.parent.parent for p in (REPO / "roles").glob("*/meta/argument_specs.yml")):
        (root / "roles" / role.name / "meta").mkdir(parents=True)
        shutil.copy(role / "meta" / "argument_specs.yml", root / "roles" / role.name / "meta")
    return root


def set_version(root, version: str):
    path = root / "galaxy.yml"
    path.write_text(re.sub(r"\nversion: [0-9.]+\n", f"\nversion: {version}\n", path.read_text(), count=1))


def add_module_option(root, option: str):
    """A new option in sglang_drain's DOCUMENTATION (before its first documented option)."""
    path = root / "plugins" / "modules" / "sglang_drain.py"
    text = path.read_text()
    assert "\noptions:\n" in text
    path.write_text(text.replace("\noptions:\n", "\noptions:\n" + option, 1))


def test_this_collection_agrees_with_its_last_release(collection):
    proc = run(collection)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "version_added agrees" in proc.stdout


def test_a_new_module_option_without_version_added_fails_until_it_says_the_next_version(collection):
    set_version(collection, "0.1.0")
    add_module_option(collection, "  drain_grace:\n    description: A new option.\n    type: int\n")
    proc = run(collection)
    assert proc.returncode == 1
    assert "module sglang_drain option drain_grace: new since 0.1.0, needs version_added: 0.1.0, has None" in proc.stdout
    assert "galaxy.yml's version 0.1.0 is released already: raise it first" in proc.stdout

    set_version(collection, "0.2.0")
    proc = run(collection)
    assert proc.returncode == 1 and "needs version_added: 0.2.0, has None" in proc.stdout

    path = collection / "plugins" / "modules" / "sglang_drain.py"
    path.write_text(path.read_text().replace("    type: int\n", "    type: int\n    version_added: 0.2.0\n", 1))
    proc = run(collection)
    assert proc.returncode == 0, proc.stdout


def test_a_new_role_option_is_checked_like_a_module_option(collection):
    set_version(collection, "0.2.0")
    specs = collection / "roles" / "sglang_prometheus" / "meta" / "argument_specs.yml"
    data = yaml.safe_load(specs.read_text())
    data["argument_specs"]["main"]["options"]["sglang_prometheus_new"] = {"description": "New.", "type": "str"}
    specs.write_text(yaml.safe_dump(data))
    proc = run(collection)
    assert proc.returncode == 1
    assert "role sglang_prometheus:main option sglang_prometheus_new: new since 0.1.0, needs version_added: 0.2.0" in proc.stdout


def entry(version_added="0.1.0", **options):
    return {"version_added": version_added, "options": dict(options)}


RECORD = {"version": "0.1.0", "objects": {"module a": entry(x=None), "role r:main": entry(y=None)}}


@pytest.mark.parametrize(("current", "version", "released", "expected"), [
    # a new module must say the next version, and the next version must be above the last release
    ({**RECORD["objects"], "module b": entry("0.1.0")}, "0.2.0", ["0.1.0"],
     ["module b: new since 0.1.0, needs version_added: 0.2.0, has '0.1.0'"]),
    ({**RECORD["objects"], "module b": entry("0.2.0")}, "0.2.0", ["0.1.0"], []),
    ({**RECORD["objects"], "module b": entry("0.1.0")}, "0.1.0", ["0.1.0"],
     ["module b: new since 0.1.0, needs version_added: 0.1.0, has '0.1.0' (galaxy.yml's version 0.1.0 is released "
      "already: raise it first)"]),
    # a new module's options inherit its version; one that says another is wrong
    ({**RECORD["objects"], "module b": entry("0.2.0", z="0.1.0")}, "0.2.0", ["0.1.0"],
     ["module b option z: new since 0.1.0, version_added '0.1.0' is not 0.2.0"]),
    # what was released keeps its version_added, its options too
    ({"module a": entry("0.2.0", x=None), "role r:main": entry(y=None)}, "0.2.0", ["0.1.0"],
     ["module a: version_added changed from 0.1.0 to 0.2.0"]),
    ({"module a": entry(x="0.2.0"), "role r:main": entry(y=None)}, "0.2.0", ["0.1.0"],
     ["module a option x: version_added changed from None to 0.2.0"]),
    ({"module a": entry("0.9.0", x=None), "role r:main": entry(y=None)}, "0.2.0", ["0.1.0"],
     ["module a: version_added '0.9.0' is neither a release (0.1.0) nor 0.2.0"]),
    # a removed option is not this check's business (the changelog's)
    ({"module a": entry(), "role r:main": entry(y=None)}, "0.2.0", ["0.1.0"], []),
    # after a release, the record must be recorded again
    (RECORD["objects"], "0.2.0", ["0.1.0", "0.2.0"],
     ["changelogs/api.yml is the API of 0.1.0, the last release is 0.2.0: record it after releasing "
      "(python3 tools/check_version_added.py --record)"]),
])
def test_problems(current, version, released, expected):
    assert check.problems(current, RECORD, version, released) == expected
