"""sglang_watchdog_code: the watchdog's code is the closure of _watchdog.py's imports of the
collection, installed in one step, idempotent, and importable on its own from the tree it
installs (as the watchdog unit imports it: PYTHONPATH=root, python -s)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

from sim_helpers import REPO, run_module

from ansible_collections.inferops.sglang.plugins.modules import sglang_watchdog_code as mod

CODE = os.path.join(*mod.PACKAGE.split("."))


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_the_code_is_the_closure_of_the_watchdogs_imports_and_needs_no_ansible():
    files = mod.code()
    assert {"_watchdog.py", "_readiness.py", "_process_watch.py", "_listener.py", "_credentials.py", "_http.py",
            "_state_files.py", "_deploy_lock.py"} <= set(files)
    for name, text in files.items():
        assert text == (REPO / "plugins" / "module_utils" / name).read_text(), name
        # the watchdog runs on the host's own python, without Ansible installed
        assert "import ansible\n" not in text and "from ansible." not in text, name
        for imported in mod._imports(text):
            assert f"{imported}.py" in files, (name, imported)


def test_install_writes_what_differs_removes_what_is_gone_and_runs_on_its_own(tmp_path, capsys):
    root = tmp_path / "watchdog"
    rc, result, _out = run_module(mod.main, capsys, {"root": str(root)}, check_mode=True)
    assert rc == 0 and result["changed"] and result["written"] == sorted(result["files"])
    assert not root.exists()
    rc, first, _out = run_module(mod.main, capsys, {"root": str(root)})
    assert rc == 0 and first["changed"] and first["written"] == sorted(first["files"]) and first["removed"] == []
    code = root / CODE
    assert sorted(p.name for p in code.iterdir()) == sorted(first["files"])
    assert {_mode(code / name) for name in first["files"]} == {0o644}
    assert _mode(root) == 0o755 and _mode(code) == 0o755
    rc, again, _out = run_module(mod.main, capsys, {"root": str(root)})
    assert rc == 0 and not again["changed"] and again["written"] == [] and again["removed"] == []
    # a file changed on the host, a mode loosened, a file of an earlier version left behind
    (code / "_http.py").write_text("# changed\n")
    os.chmod(code / "_readiness.py", 0o666)
    (code / "_gone.py").write_text("")
    rc, check, _out = run_module(mod.main, capsys, {"root": str(root)}, check_mode=True)
    assert check["written"] == ["_http.py", "_readiness.py"] and check["removed"] == ["_gone.py"]
    assert (code / "_gone.py").exists()
    rc, fixed, _out = run_module(mod.main, capsys, {"root": str(root)})
    assert rc == 0 and fixed["changed"] and fixed["written"] == ["_http.py", "_readiness.py"]
    assert not (code / "_gone.py").exists() and _mode(code / "_readiness.py") == 0o644
    assert (code / "_http.py").read_text() == (REPO / "plugins/module_utils/_http.py").read_text()
    # the tree imports on its own, as the watchdog unit runs it
    proc = subprocess.run([sys.executable, "-s", "-c", f"import {mod.PACKAGE}._watchdog as w; print(w.__file__)"],
                          env={"PYTHONPATH": str(root), "PATH": os.environ["PATH"]}, cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(code / "_watchdog.py")


def test_the_module_carries_its_code_through_ansible(tmp_path):
    """Run by Ansible (the module's payload, not this checkout, is where the sources come from)."""
    root = tmp_path / "watchdog"
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_STDOUT_CALLBACK="json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible"), "localhost", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}", "-m", "inferops.sglang.sglang_watchdog_code",
                           "-a", f"root={root}"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert result["changed"] and sorted(result["files"]) == sorted(mod.code())
    for name in result["files"]:
        assert (root / CODE / name).read_text() == (REPO / "plugins" / "module_utils" / name).read_text()
