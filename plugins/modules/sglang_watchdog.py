#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_watchdog
short_description: Install or remove the watchdog of an SGLang service, in one step
version_added: 0.1.0
description:
  - The watchdog timer of the C(sglang_service) role runs the collection's own gate on the host
    (C(plugins/module_utils/_watchdog.py) and the module_utils it imports), from a package tree of its own under
    O(root). This module installs the whole watchdog in one call, or removes it.
  - With O(state=present) it installs the code (Ansible ships a module's module_utils to the host, so the module
    carries it), then writes the settings file O(settings_path) and the units C(<unit>.service) and
    C(<unit>.timer) in O(unit_dir), each only when its content or mode differs, and leaves the timer enabled and
    running. When a unit file changed systemd is reloaded and the timer restarted; a change of the settings alone
    restarts nothing (each run of the watchdog reads them).
  - The code is the closure of C(_watchdog.py)'s imports of the collection, so a module_utils file the watchdog
    starts to import is installed without a list to keep. A C(.py) file left in the tree by an earlier version that
    the watchdog no longer imports is removed.
  - Files are written as root, each replaced in one step through a temporary file created exclusively; the code
    and the units with mode C(0644), the settings with mode C(0600), the code's directories C(0755).
  - With O(state=absent), when the timer's unit file exists the timer is stopped and disabled, the units and the
    settings file are removed and systemd is reloaded. The code's tree is left in place.
author:
  - inferops.sglang contributors (@inferops)
extends_documentation_fragment:
  - inferops.sglang.attributes.CHECK_MODE
attributes:
  check_mode:
    details:
      - In check mode nothing is written or removed and no systemctl command that changes anything runs;
        RV(written), RV(removed) and RV(timer) say what would be done.
      - A timer whose unit file does not exist yet is not asked about; it would be enabled and started.
options:
  state:
    description:
      - V(present) installs the code, the settings and the units and leaves the timer enabled and running;
        V(absent) stops and disables the timer and removes the units and the settings.
    type: str
    choices: [present, absent]
    default: present
  root:
    description: The code's package tree root (the watchdog unit's C(PYTHONPATH)); left as it is with O(state=absent).
    type: path
    required: true
  unit:
    description: The watchdog's unit name without its suffix; its units are C(<unit>.service) and C(<unit>.timer).
    type: str
    required: true
  unit_dir:
    description: The directory of the unit files.
    type: path
    default: /etc/systemd/system
  settings_path:
    description: The watchdog's settings file (written with mode C(0600)).
    type: path
    required: true
  settings:
    description:
      - The settings file's text, as rendered. It holds no key, and it is not returned.
      - Required with O(state=present).
    type: str
  service:
    description:
      - The text of C(<unit>.service), as rendered (written with mode C(0644)).
      - Required with O(state=present).
    type: str
  timer:
    description:
      - The text of C(<unit>.timer), as rendered (written with mode C(0644)).
      - Required with O(state=present).
    type: str
"""

EXAMPLES = r"""
- name: The watchdog (its code, settings, service and timer)
  inferops.sglang.sglang_watchdog:
    root: /usr/local/lib/inferops-sglang/watchdog
    unit: sglang-qwen-watchdog
    settings_path: /etc/sglang/sglang-qwen.watchdog.json
    settings: "{{ lookup('ansible.builtin.template', 'sglang-watchdog.json.j2') }}"
    service: "{{ lookup('ansible.builtin.template', 'sglang-watchdog.service.j2') }}"
    timer: "{{ lookup('ansible.builtin.template', 'sglang-watchdog.timer.j2') }}"

- name: The watchdog removed
  inferops.sglang.sglang_watchdog:
    state: absent
    root: /usr/local/lib/inferops-sglang/watchdog
    unit: sglang-qwen-watchdog
    settings_path: /etc/sglang/sglang-qwen.watchdog.json
"""

RETURN = r"""
files:
  description:
    - The files of the watchdog's code, relative to the module_utils directory under O(root).
    - Empty with O(state=absent).
  returned: always
  type: list
  elements: str
  sample: [_watchdog.py, _readiness.py]
written:
  description:
    - The files written (or that would be, in check mode) with O(state=present); the code's files by their names
      as in RV(files), then the settings file and the unit files by their paths.
  returned: always
  type: list
  elements: str
  sample: [_http.py, /etc/systemd/system/sglang-qwen-watchdog.timer]
removed:
  description:
    - The files removed (or that would be, in check mode). With O(state=present), the C(.py) files of the code's
      tree that are no longer part of the watchdog's code, by name; with O(state=absent), the unit files and the
      settings file that existed, by path.
  returned: always
  type: list
  elements: str
timer:
  description: The timer C(<unit>.timer) after this run (in check mode, as it would be).
  returned: always
  type: dict
  contains:
    enabled:
      description: Whether the timer is enabled.
      type: bool
    active:
      description: Whether the timer is running.
      type: bool
    action:
      description:
        - What this run did to the timer (or would do, in check mode), besides enabling it.
        - V(started) (it was not running), V(restarted) (a unit file changed while it ran), V(stopped) (stopped and
          disabled by O(state=absent)), V(none).
      type: str
      choices: [none, started, restarted, stopped]
  sample: {enabled: true, active: true, action: none}
"""

import os

from ansible.module_utils.basic import AnsibleModule

# The watchdog's entry point: importing it here makes Ansible carry it, and everything it
# imports from the collection, to the host with this module.
from ansible_collections.inferops.sglang.plugins.module_utils import _watchdog  # noqa: F401 pylint: disable=unused-import
from ansible_collections.inferops.sglang.plugins.module_utils import _host_code
from ansible_collections.inferops.sglang.plugins.module_utils._host_code import (  # noqa: F401 pylint: disable=unused-import
    PACKAGE, UNIT_MODE, Failure, _imports, install, systemctl)

ENTRY = "_watchdog"
SETTINGS_MODE = 0o600


def code(entry: str = ENTRY) -> dict[str, str]:
    """File name -> source of the watchdog's code: ``entry`` and every module_utils it imports,
    transitively."""
    return _host_code.code(entry)


def unit_paths(unit_dir: str, unit: str) -> tuple[str, str]:
    """The paths of ``<unit>.service`` and ``<unit>.timer`` in ``unit_dir``."""
    return os.path.join(unit_dir, f"{unit}.service"), os.path.join(unit_dir, f"{unit}.timer")


def present(params: dict, check: bool, run_command, files: dict[str, str] | None = None) -> dict:
    """Install the watchdog: the code, the settings and the units, then the timer enabled and
    running (restarted after a change of a unit file). ``files``: the code (``code()`` when None).
    Returns the module's result."""
    files = code() if files is None else files
    root = params["root"]
    try:
        written, removed = install(root, files, check)
    except OSError as exc:
        raise Failure(f"the watchdog's code cannot be installed under {root}: {exc}") from exc
    service_path, timer_path = unit_paths(params["unit_dir"], params["unit"])
    timer_installed = os.path.exists(timer_path)
    if _host_code.write(params["settings_path"], params["settings"], SETTINGS_MODE, check):
        written.append(params["settings_path"])
    units_changed = False
    for path, text in ((service_path, params["service"]), (timer_path, params["timer"])):
        if _host_code.write(path, text, UNIT_MODE, check):
            written.append(path)
            units_changed = True
    timer = f"{params['unit']}.timer"
    if units_changed and not check:
        systemctl(run_command, "daemon-reload")
    if check and not timer_installed:
        # systemd knows nothing of a timer not installed yet: it would be enabled and started
        enabled = active = False
    else:
        enabled = systemctl(run_command, "is-enabled", "--quiet", "--", timer, query=True)
        active = systemctl(run_command, "is-active", "--quiet", "--", timer, query=True)
    if not enabled and not check:
        systemctl(run_command, "enable", "--", timer)
    action = "none"
    if units_changed and active:
        action = "restarted"
    elif not active:
        action = "started"
    if action != "none" and not check:
        systemctl(run_command, "restart" if action == "restarted" else "start", "--", timer)
    return dict(changed=bool(written or removed or not enabled or action != "none"), files=sorted(files),
                written=written, removed=removed, timer=dict(enabled=True, active=True, action=action))


def absent(params: dict, check: bool, run_command) -> dict:
    """Remove the watchdog: the timer stopped and disabled, the units and the settings removed,
    systemd reloaded (only when the timer's unit file existed). The code's tree stays. Returns the
    module's result."""
    service_path, timer_path = unit_paths(params["unit_dir"], params["unit"])
    timer_installed = os.path.exists(timer_path)
    if timer_installed and not check:
        systemctl(run_command, "disable", "--now", "--", f"{params['unit']}.timer")
    removed = []
    for path in (timer_path, service_path, params["settings_path"]):
        if not os.path.lexists(path):
            continue
        removed.append(path)
        if check:
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            removed.pop()
        except OSError as exc:
            raise Failure(f"cannot remove {path}: {exc}") from exc
    if timer_installed and not check:
        systemctl(run_command, "daemon-reload")
    return dict(changed=bool(removed or timer_installed), files=[], written=[], removed=removed,
                timer=dict(enabled=False, active=False, action="stopped" if timer_installed else "none"))


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["present", "absent"], default="present"),
            root=dict(type="path", required=True),
            unit=dict(type="str", required=True),
            unit_dir=dict(type="path", default="/etc/systemd/system"),
            settings_path=dict(type="path", required=True),
            settings=dict(type="str"),
            service=dict(type="str"),
            timer=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    missing = [name for name in ("settings", "service", "timer") if params[name] is None]
    if params["state"] == "present" and missing:
        module.fail_json(msg=f"state is present but these are missing: {', '.join(missing)}")
    if "/" in params["unit"] or not params["unit"].strip():
        module.fail_json(msg=f"unit must be a unit name without its suffix, not {params['unit']!r}")
    try:
        if params["state"] == "absent":
            result = absent(params, module.check_mode, module.run_command)
        else:
            try:
                files = code()
            except (ImportError, SyntaxError) as exc:
                raise Failure(f"the watchdog's code cannot be read: {exc}") from exc
            result = present(params, module.check_mode, module.run_command, files)
    except Failure as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
