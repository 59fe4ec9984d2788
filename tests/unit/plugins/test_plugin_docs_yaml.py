"""Every plugin's DOCUMENTATION, EXAMPLES and RETURN is YAML that loads (ansible-doc and
ansible-test sanity refuse the plugin otherwise: a ': ' inside a plain description is the
usual slip), found here in the unit run, seconds after the edit."""

from __future__ import annotations

import ast

import pytest
import yaml
from sim_helpers import REPO

DOCS = ("DOCUMENTATION", "EXAMPLES", "RETURN")
FILES = sorted(p for p in (REPO / "plugins").rglob("*.py") if "module_utils" not in p.parts and "plugin_utils" not in p.parts)


def _docs(path) -> dict[str, str]:
    found = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            found.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name) and t.id in DOCS})
    return found


def test_the_plugins_have_documentation():
    assert [p.name for p in FILES if "DOCUMENTATION" in _docs(p)], FILES
    assert "DOCUMENTATION" in _docs(REPO / "plugins/modules/sglang_variant.py")


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(REPO)) for p in FILES])
def test_each_documentation_block_is_yaml(path):
    for name, text in _docs(path).items():
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as exc:
            pytest.fail(f"{path.relative_to(REPO)} {name}: {exc}")
