#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_watchdog_code
short_description: Install the watchdog's code on the host, in one step
version_added: 0.8.0
description:
  - The watchdog timer of the C(sglang_service) role runs the collection's own gate on the host
    (C(plugins/module_utils/_watchdog.py) and the module_utils it imports), from a package tree of its own under
    O(root). This module carries that code with it (Ansible ships a module's module_utils to the host) and writes
    each file there that differs from what it carries, with one transfer for all of them.
  - The files are the closure of C(_watchdog.py)'s imports of the collection, so a module_utils file the watchdog
    starts to import is installed without a list to keep. A C(.py) file left in the tree by an earlier version that
    the watchdog no longer imports is removed.
  - Files are written as root, mode C(0644), each replaced in one step through a temporary file created exclusively;
    the directories are C(0755).
author:
  - inferops.sglang contributors (@inferops)
attributes:
  check_mode:
    description: Can run in check mode and return the changed status prediction without modifying the target.
    support: full
    details: In check mode nothing is written; RV(written) and RV(removed) say what would change.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode), when in diff mode.
    support: none
options:
  root:
    description: The package tree's root (the watchdog unit's C(PYTHONPATH)).
    type: path
    required: true
"""

EXAMPLES = r"""
- name: The watchdog's code
  inferops.sglang.sglang_watchdog_code:
    root: /usr/local/lib/inferops-sglang/watchdog
"""

RETURN = r"""
files:
  description: The files of the watchdog's code, relative to the module_utils directory under O(root).
  returned: always
  type: list
  elements: str
  sample: [_watchdog.py, _readiness.py]
written:
  description: The files written (or that would be, in check mode).
  returned: always
  type: list
  elements: str
removed:
  description: The C(.py) files removed from the tree (or that would be), no longer part of the watchdog's code.
  returned: always
  type: list
  elements: str
"""

import ast
import importlib.util
import os

from ansible.module_utils.basic import AnsibleModule

# The watchdog's entry point: importing it here makes Ansible carry it, and everything it
# imports from the collection, to the host with this module.
from ansible_collections.inferops.sglang.plugins.module_utils import _watchdog  # noqa: F401 pylint: disable=unused-import
from ansible_collections.inferops.sglang.plugins.module_utils import _state_files

PACKAGE = "ansible_collections.inferops.sglang.plugins.module_utils"
ENTRY = "_watchdog"


def _imports(source: str) -> set[str]:
    """The collection's module_utils a module's source imports (``from PACKAGE import _x`` and
    ``from PACKAGE._x import y``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PACKAGE:
                found.update(alias.name for alias in node.names)
            elif node.module.startswith(PACKAGE + "."):
                found.add(node.module[len(PACKAGE) + 1:].split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(alias.name[len(PACKAGE) + 1:].split(".")[0] for alias in node.names
                         if alias.name.startswith(PACKAGE + "."))
    return found


def source_of(name: str) -> str:
    """A module_utils file's source as this process loaded it (from Ansible's payload on the
    host, from the collection's tree in a test)."""
    full = f"{PACKAGE}.{name}"
    spec = importlib.util.find_spec(full)
    if spec is None or spec.loader is None:
        raise ImportError(f"{full} is not importable")
    source = spec.loader.get_source(full)  # type: ignore[attr-defined]
    if source is None:
        raise ImportError(f"{full} has no source")
    return source


def code(entry: str = ENTRY) -> dict[str, str]:
    """File name -> source of the watchdog's code: ``entry`` and every module_utils it imports,
    transitively."""
    files: dict[str, str] = {}
    todo = [entry]
    while todo:
        name = todo.pop()
        if f"{name}.py" in files:
            continue
        text = source_of(name)
        files[f"{name}.py"] = text
        todo.extend(sorted(_imports(text)))
    return files


def install(root: str, files: dict[str, str], check: bool) -> tuple[list[str], list[str]]:
    """Write each of ``files`` under ROOT/<package path> that differs, remove the .py files there
    that are not in ``files``; return (written, removed)."""
    directory = os.path.join(root, *PACKAGE.split("."))
    written = []
    for name, text in sorted(files.items()):
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as handle:
                same = handle.read() == text
            same = same and (os.stat(path).st_mode & 0o7777) == 0o644
        except (FileNotFoundError, UnicodeDecodeError):
            same = False
        if not same:
            written.append(name)
    removed = sorted(name for name in (os.listdir(directory) if os.path.isdir(directory) else [])
                     if name.endswith(".py") and name not in files)
    if check:
        return written, removed
    os.makedirs(root, mode=0o755, exist_ok=True)
    path = root
    for part in PACKAGE.split("."):
        path = os.path.join(path, part)
        os.makedirs(path, mode=0o755, exist_ok=True)
        os.chmod(path, 0o755)
    for name in written:
        _state_files.write_atomic(os.path.join(directory, name), files[name], mode=0o644)
    for name in removed:
        os.unlink(os.path.join(directory, name))
    return written, removed


def main() -> None:
    module = AnsibleModule(argument_spec=dict(root=dict(type="path", required=True)), supports_check_mode=True)
    try:
        files = code()
    except (ImportError, SyntaxError) as exc:
        module.fail_json(msg=f"the watchdog's code cannot be read: {exc}")
    try:
        written, removed = install(module.params["root"], files, module.check_mode)
    except OSError as exc:
        module.fail_json(msg=f"the watchdog's code cannot be installed under {module.params['root']}: {exc}")
    module.exit_json(changed=bool(written or removed), files=sorted(files), written=written, removed=removed)


if __name__ == "__main__":
    main()
