"""sglang_watchdog: the watchdog's code is the closure of _watchdog.py's imports of the
collection, installed in one step, idempotent, and importable on its own from the tree it
installs (as the watchdog unit imports it: PYTHONPATH=root, python -s); the same call writes
the settings and the units and leaves the timer enabled and running (systemctl faked: the
module's run_command), and state=absent removes the timer, units and settings."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

from sim_helpers import REPO, FakeSystemctl, run_module, write_executable

from ansible_collections.inferops.sglang.plugins.modules import sglang_watchdog as mod

CODE = os.path.join(*mod.PACKAGE.split("."))
UNIT = "sglang-qwen-watchdog"
TIMER = f"{UNIT}.timer"
SETTINGS = '{\n    "action": "restart",\n    "unit": "sglang-qwen.service"\n}\n'
SERVICE = "[Service]\nType=oneshot\nExecStart=/usr/bin/python3 -s -m watchdog\n"
TIMER_TEXT = "[Timer]\nOnActiveSec=30\nOnUnitActiveSec=30\n\n[Install]\nWantedBy=timers.target\n"


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def params(tmp_path, **overrides) -> dict:
    (tmp_path / "etc").mkdir(exist_ok=True)
    (tmp_path / "units").mkdir(exist_ok=True)
    return dict(dict(state="present", root=str(tmp_path / "watchdog"), unit=UNIT, unit_dir=str(tmp_path / "units"),
                     settings_path=str(tmp_path / "etc" / "sglang-qwen.watchdog.json"), settings=SETTINGS,
                     service=SERVICE, timer=TIMER_TEXT), **overrides)


def paths(p: dict) -> tuple[str, str, str]:
    """(settings, service, timer) paths."""
    return p["settings_path"], os.path.join(p["unit_dir"], f"{UNIT}.service"), os.path.join(p["unit_dir"], TIMER)


def code_written(result: dict) -> list[str]:
    """The code's files among the written ones (by name; the settings and units are paths)."""
    return [name for name in result["written"] if "/" not in name]


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


def test_install_writes_what_differs_removes_what_is_gone_and_runs_on_its_own(tmp_path, capsys, monkeypatch):
    systemctl = FakeSystemctl()
    monkeypatch.setattr(mod.AnsibleModule, "run_command", lambda _module, argv, **kw: systemctl(argv, **kw))
    args = params(tmp_path)
    del args["state"]  # the default
    root = tmp_path / "watchdog"
    rc, result, _out = run_module(mod.main, capsys, args, check_mode=True)
    assert rc == 0 and result["changed"] and code_written(result) == sorted(result["files"])
    assert not root.exists()
    rc, first, _out = run_module(mod.main, capsys, args)
    assert rc == 0 and first["changed"] and code_written(first) == sorted(first["files"]) and first["removed"] == []
    code = root / CODE
    assert sorted(p.name for p in code.iterdir()) == sorted(first["files"])
    assert {_mode(code / name) for name in first["files"]} == {0o644}
    assert _mode(root) == 0o755 and _mode(code) == 0o755
    rc, again, _out = run_module(mod.main, capsys, args)
    assert rc == 0 and not again["changed"] and again["written"] == [] and again["removed"] == []
    # a file changed on the host, a mode loosened, a file of an earlier version left behind
    (code / "_http.py").write_text("# changed\n")
    os.chmod(code / "_readiness.py", 0o666)
    (code / "_gone.py").write_text("")
    rc, check, _out = run_module(mod.main, capsys, args, check_mode=True)
    assert check["written"] == ["_http.py", "_readiness.py"] and check["removed"] == ["_gone.py"]
    assert (code / "_gone.py").exists()
    rc, fixed, _out = run_module(mod.main, capsys, args)
    assert rc == 0 and fixed["changed"] and fixed["written"] == ["_http.py", "_readiness.py"]
    assert not (code / "_gone.py").exists() and _mode(code / "_readiness.py") == 0o644
    assert (code / "_http.py").read_text() == (REPO / "plugins/module_utils/_http.py").read_text()
    # the code alone changed: systemd is not reloaded, the running timer not restarted
    assert systemctl.changing() == ["daemon-reload", f"enable -- {TIMER}", f"start -- {TIMER}"]
    # the tree imports on its own, as the watchdog unit runs it
    proc = subprocess.run([sys.executable, "-s", "-c", f"import {mod.PACKAGE}._watchdog as w; print(w.__file__)"],
                          env={"PYTHONPATH": str(root), "PATH": os.environ["PATH"]}, cwd=tmp_path,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(code / "_watchdog.py")


def test_the_module_carries_its_code_through_ansible(tmp_path):
    """Run by Ansible (the module's payload, not this checkout, is where the sources come from),
    with a stand-in systemctl first on the PATH that logs its arguments."""
    root = tmp_path / "watchdog"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "systemctl.log"
    write_executable(bin_dir / "systemctl", f'#!/bin/sh\necho "$*" >> {log}\ncase "$1" in is-*) exit 1;; esac\n')
    p = params(tmp_path)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_STDOUT_CALLBACK="json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_NOCOLOR="1",
               PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible"), "localhost", "-c", "local",
                           "-e", f"ansible_python_interpreter={sys.executable}", "-m", "inferops.sglang.sglang_watchdog",
                           "-a", json.dumps(p)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert result["changed"] and sorted(result["files"]) == sorted(mod.code())
    for name in result["files"]:
        assert (root / CODE / name).read_text() == (REPO / "plugins" / "module_utils" / name).read_text()
    settings, service, timer = paths(p)
    assert result["written"][-3:] == [settings, service, timer]
    assert (tmp_path / "units" / TIMER).read_text() == TIMER_TEXT
    assert log.read_text().splitlines() == ["daemon-reload", f"is-enabled --quiet -- {TIMER}",
                                            f"is-active --quiet -- {TIMER}", f"enable -- {TIMER}",
                                            f"start -- {TIMER}"]


def test_a_first_install_writes_everything_then_reloads_enables_and_starts_the_timer(tmp_path):
    p = params(tmp_path)
    systemctl = FakeSystemctl()
    result = mod.present(p, False, systemctl)
    settings, service, timer = paths(p)
    assert result["changed"] and code_written(result) == sorted(result["files"])
    assert result["written"][-3:] == [settings, service, timer]
    assert result["timer"] == {"enabled": True, "active": True, "action": "started"}
    assert systemctl.changing() == ["daemon-reload", f"enable -- {TIMER}", f"start -- {TIMER}"]
    assert systemctl.enabled and systemctl.active
    for path, text, mode in ((settings, SETTINGS, 0o600), (service, SERVICE, 0o644), (timer, TIMER_TEXT, 0o644)):
        with open(path, "rb") as handle:
            assert handle.read() == text.encode(), path
        assert _mode(path) == mode, path
    # the settings text is written, never returned
    assert SETTINGS not in json.dumps(result)
    # nothing but the three files in their directories (no temporary file left)
    assert sorted(os.listdir(tmp_path / "units")) == [f"{UNIT}.service", TIMER]
    assert os.listdir(tmp_path / "etc") == ["sglang-qwen.watchdog.json"]


def test_a_second_run_changes_nothing_and_only_asks_systemd(tmp_path):
    p = params(tmp_path)
    mod.present(p, False, FakeSystemctl())
    systemctl = FakeSystemctl(enabled=True, active=True)
    result = mod.present(p, False, systemctl)
    assert not result["changed"] and result["written"] == [] and result["removed"] == []
    assert result["timer"] == {"enabled": True, "active": True, "action": "none"}
    assert systemctl.changing() == []
    assert systemctl.calls == [f"is-enabled --quiet -- {TIMER}", f"is-active --quiet -- {TIMER}"]


def test_a_timer_found_stopped_or_disabled_is_enabled_and_started_without_a_reload(tmp_path):
    p = params(tmp_path)
    mod.present(p, False, FakeSystemctl())
    systemctl = FakeSystemctl(enabled=False, active=False)
    result = mod.present(p, False, systemctl)
    assert result["changed"] and result["written"] == []
    assert result["timer"]["action"] == "started"
    assert systemctl.changing() == [f"enable -- {TIMER}", f"start -- {TIMER}"]


def test_a_changed_unit_reloads_systemd_then_restarts_the_running_timer(tmp_path):
    p = params(tmp_path)
    mod.present(p, False, FakeSystemctl())
    _settings, service, timer = paths(p)
    systemctl = FakeSystemctl(enabled=True, active=True)
    result = mod.present(dict(p, timer=TIMER_TEXT.replace("30", "10")), False, systemctl)
    assert result["changed"] and result["written"] == [timer]
    assert result["timer"] == {"enabled": True, "active": True, "action": "restarted"}
    assert systemctl.changing() == ["daemon-reload", f"restart -- {TIMER}"]
    assert "OnActiveSec=10" in open(timer, encoding="utf-8").read()
    # the service unit alone, its mode loosened on the host: rewritten, and the same again
    os.chmod(service, 0o666)
    systemctl = FakeSystemctl(enabled=True, active=True)
    result = mod.present(dict(p, timer=TIMER_TEXT.replace("30", "10")), False, systemctl)
    assert result["written"] == [service] and _mode(service) == 0o644
    assert systemctl.changing() == ["daemon-reload", f"restart -- {TIMER}"]


def test_changed_settings_alone_are_written_without_a_reload_or_a_restart(tmp_path):
    """Each run of the watchdog reads its settings: nothing of systemd's needs to change."""
    p = params(tmp_path)
    mod.present(p, False, FakeSystemctl())
    settings, _service, _timer = paths(p)
    systemctl = FakeSystemctl(enabled=True, active=True)
    result = mod.present(dict(p, settings=SETTINGS.replace("restart", "report")), False, systemctl)
    assert result["changed"] and result["written"] == [settings]
    assert result["timer"]["action"] == "none" and systemctl.changing() == []
    assert '"report"' in open(settings, encoding="utf-8").read()
    # a loosened mode alone is mended
    os.chmod(settings, 0o644)
    result = mod.present(dict(p, settings=SETTINGS.replace("restart", "report")), False, systemctl)
    assert result["written"] == [settings] and _mode(settings) == 0o600 and systemctl.changing() == []


def test_check_mode_on_a_bare_host_changes_nothing_and_says_what_would_be_done(tmp_path):
    p = params(tmp_path)
    systemctl = FakeSystemctl()
    result = mod.present(p, True, systemctl)
    assert result["changed"] and code_written(result) == sorted(result["files"])
    assert result["written"][-3:] == list(paths(p))
    assert result["timer"] == {"enabled": True, "active": True, "action": "started"}
    # systemd is not asked about a timer not installed yet, and nothing is written
    assert systemctl.calls == []
    assert not (tmp_path / "watchdog").exists()
    assert os.listdir(tmp_path / "units") == [] and os.listdir(tmp_path / "etc") == []


def test_check_mode_on_an_installed_host_only_asks_systemd(tmp_path):
    p = params(tmp_path)
    mod.present(p, False, FakeSystemctl())
    _settings, _service, timer = paths(p)
    systemctl = FakeSystemctl(enabled=True, active=True)
    result = mod.present(dict(p, timer=TIMER_TEXT.replace("30", "10")), True, systemctl)
    assert result["changed"] and result["written"] == [timer]
    assert result["timer"]["action"] == "restarted"
    assert systemctl.changing() == []
    assert open(timer, encoding="utf-8").read() == TIMER_TEXT


def test_absent_stops_and_disables_the_timer_removes_its_files_and_reloads(tmp_path):
    p = params(tmp_path)
    mod.present(p, False, FakeSystemctl())
    settings, service, timer = paths(p)
    absent = dict(p, state="absent", settings=None, service=None, timer=None)
    systemctl = FakeSystemctl(enabled=True, active=True)
    check = mod.absent(absent, True, systemctl)
    assert check["changed"] and check["removed"] == [timer, service, settings] and systemctl.calls == []
    assert os.path.exists(timer) and os.path.exists(settings)
    result = mod.absent(absent, False, systemctl)
    assert result["changed"] and result["removed"] == [timer, service, settings]
    assert result["timer"] == {"enabled": False, "active": False, "action": "stopped"}
    assert systemctl.changing() == [f"disable --now -- {TIMER}", "daemon-reload"]
    assert not systemctl.enabled and not systemctl.active
    assert not any(os.path.exists(path) for path in (settings, service, timer))
    # the code stays, as it did before
    assert (tmp_path / "watchdog" / CODE / "_watchdog.py").exists()
    again = FakeSystemctl()
    result = mod.absent(absent, False, again)
    assert not result["changed"] and result["removed"] == [] and again.calls == []


def test_absent_on_a_bare_host_changes_nothing(tmp_path):
    p = dict(params(tmp_path), state="absent", settings=None, service=None, timer=None)
    systemctl = FakeSystemctl()
    result = mod.absent(p, False, systemctl)
    assert result == {"changed": False, "files": [], "written": [], "removed": [],
                      "timer": {"enabled": False, "active": False, "action": "none"}}
    assert systemctl.calls == []


def test_absent_removes_leftover_settings_without_a_timer_and_without_systemd(tmp_path):
    p = dict(params(tmp_path), state="absent", settings=None, service=None, timer=None)
    (tmp_path / "etc" / "sglang-qwen.watchdog.json").write_text(SETTINGS)
    systemctl = FakeSystemctl()
    result = mod.absent(p, False, systemctl)
    assert result["changed"] and result["removed"] == [p["settings_path"]] and systemctl.calls == []
    assert result["timer"]["action"] == "none"


def test_a_failed_systemctl_fails_the_module_naming_the_command_and_its_error(tmp_path, capsys, monkeypatch):
    systemctl = FakeSystemctl(fail="enable")
    monkeypatch.setattr(mod.AnsibleModule, "run_command", lambda _module, argv, **kw: systemctl(argv, **kw))
    rc, result, _out = run_module(mod.main, capsys, params(tmp_path))
    assert rc == 1 and result["failed"]
    assert result["msg"] == (f"systemctl enable -- {TIMER} failed (exit 1): Failed to enable unit: Access denied")
    assert "start" not in " ".join(systemctl.calls)


def test_a_settings_file_that_cannot_be_written_fails_naming_its_path(tmp_path, capsys, monkeypatch):
    systemctl = FakeSystemctl()
    monkeypatch.setattr(mod.AnsibleModule, "run_command", lambda _module, argv, **kw: systemctl(argv, **kw))
    missing = str(tmp_path / "no-such-dir" / "sglang-qwen.watchdog.json")
    rc, result, _out = run_module(mod.main, capsys, params(tmp_path, settings_path=missing))
    assert rc == 1 and result["msg"].startswith(f"cannot write {missing}: ")
    assert systemctl.calls == []


def test_present_needs_the_rendered_files_and_a_unit_name_without_a_path(tmp_path, capsys):
    rc, result, _out = run_module(mod.main, capsys, dict(params(tmp_path), timer=None))
    assert rc == 1 and result["msg"] == "state is present but these are missing: timer"
    without = params(tmp_path)
    del without["settings"], without["service"]
    rc, result, _out = run_module(mod.main, capsys, without)
    assert rc == 1 and result["msg"] == "state is present but these are missing: settings, service"
    assert os.listdir(tmp_path / "units") == [] and not (tmp_path / "watchdog").exists()
    rc, result, _out = run_module(mod.main, capsys, params(tmp_path, unit="../x"))
    assert rc == 1 and result["msg"] == "unit must be a unit name without its suffix, not '../x'"
