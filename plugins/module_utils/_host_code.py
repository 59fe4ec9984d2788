# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's own code installed on a host for a unit of its own to run (the watchdog,
the gateway's launcher), and the unit files and systemctl calls that go with it.

A unit runs ``python -s -m ansible_collections.inferops.sglang.plugins.module_utils.<entry>`` with
``PYTHONPATH`` at a root of its own. The code is the closure of ``<entry>``'s imports of the
collection's module_utils, read from what the module's process loaded (Ansible ships a module's
module_utils with it; a test reads the tree), so a file an entry starts to import is installed
without a list to keep. Files are written as root, each replaced in one step through a temporary
file created exclusively (_state_files).

Standard library and _state_files only: no Ansible import.
"""

from __future__ import annotations

import ast
import importlib.util
import os

from ansible_collections.inferops.sglang.plugins.module_utils import _state_files

PACKAGE = "ansible_collections.inferops.sglang.plugins.module_utils"
UNIT_MODE = 0o644
CODE_MODE = 0o644


class Failure(Exception):
    """A step of an install or a removal failed; the message names the path or the command."""


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


def code(entry: str) -> dict[str, str]:
    """File name -> source: ``entry`` and every module_utils it imports, transitively."""
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
    written = [name for name, text in sorted(files.items())
               if _state_files.differs(os.path.join(directory, name), text, CODE_MODE)]
    removed = sorted(name for name in (os.listdir(directory) if os.path.isdir(directory) else [])
                     if name.endswith(".py") and name not in files)
    if check:
        return written, removed
    os.makedirs(root, mode=0o755, exist_ok=True)
    path = root
    for part in PACKAGE.split("."):
        path = os.path.join(path, part)
        _state_files.ensure_directory(path, 0o755)
    for name in written:
        _state_files.write_atomic(os.path.join(directory, name), files[name], mode=CODE_MODE)
    for name in removed:
        os.unlink(os.path.join(directory, name))
    return written, removed


def systemctl(run_command, *args: str, query: bool = False) -> bool:
    """Run ``systemctl ARGS`` with ``run_command`` (AnsibleModule.run_command in a module).
    A query (is-enabled, is-active) answers whether it exited 0; any other command that fails
    raises Failure with the command and its stderr."""
    argv = ["systemctl", *args]
    rc, out, err = run_command(argv)
    if query:
        return rc == 0
    if rc != 0:
        raise Failure(f"{' '.join(argv)} failed (exit {rc}): {' '.join((err or out or '').split())[:500]}")
    return True


def write(path: str, text: str, mode: int, check: bool) -> bool:
    """Write ``text`` to ``path`` with ``mode`` when it differs (in check mode: whether it would)."""
    try:
        return _state_files.differs(path, text, mode) if check else _state_files.replace(path, text, mode)
    except OSError as exc:
        raise Failure(f"cannot write {path}: {exc}") from exc
