#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_gateway
short_description: Run SGLang's gateway in front of a service, as a hardened unit of its own
version_added: 0.1.0
description:
  - Installs and runs SGLang's model gateway (C(smg), the version the collection pins, from the venv the
    sglang_runtime role installs with C(sglang_runtime_gateway)) as C(<unit>.service), listening on the service's
    client address. Clients keep the address they use; the servers behind it listen on loopback and are added and
    removed through the gateway's worker API by M(inferops.sglang.sglang_switch).
  - The unit runs the collection's launcher (C(plugins/module_utils/_gateway_launch.py) and the module_utils it
    imports, installed under O(root) as the watchdog's code is), which gives smg its keys in-process, so that no
    key is ever on a command line. systemd hands the keys to the unit alone (C(LoadCredential=)); the unit runs as
    a system account of its own (O(user), made when missing, no login, no home) with no devices, no capabilities
    (but C(CAP_NET_BIND_SERVICE) for a port below 1024), a read-only system and Prometheus on loopback. Not
    C(DynamicUser=), which needs a mount namespace that systemd cannot set up in an unprivileged container (the
    lab's podman hosts, LXC), where the unit fails with C(226/NAMESPACE), "Failed to set up mount namespacing".
  - The control-plane key (the worker API) is made once, at random, in O(control_key_file) (root only, created
    exclusively), and never returned. The servers' API key, when given, is written to O(api_key_file) (root only);
    the gateway requires it of clients and sends it to the servers.
  - O(workers_file) (root only) lists the live servers; the switch rewrites it. Created empty when missing; the unit
    is handed it, and the launcher registers its servers once smg answers, so a restarted gateway routes again.
  - The unit is restarted when its file, its code or the API key changed, then the module waits until the gateway
    answers C(/liveness). A restart drops the connections in flight through the gateway.
  - With O(state=absent) the unit is stopped and disabled and its file removed; the keys and the code stay.
author:
  - inferops.sglang contributors (@inferops)
extends_documentation_fragment:
  - inferops.sglang.attributes.CHECK_MODE
attributes:
  check_mode:
    details:
      - In check mode nothing is written, started or removed; RV(written) and RV(action) say what would be done.
options:
  state:
    description: V(present) installs and runs the gateway; V(absent) stops it and removes its unit.
    type: str
    choices: [present, absent]
    default: present
  unit:
    description: The gateway's unit name without its suffix.
    type: str
    required: true
  unit_dir:
    description: The directory of the unit files.
    type: path
    default: /etc/systemd/system
  root:
    description: The launcher's code tree (the unit's C(PYTHONPATH)).
    type: path
    default: /usr/local/lib/inferops-sglang/gateway
  python:
    description: The Python of the gateway's venv (smg installed in it).
    type: path
    default: /opt/sglang/gateway/bin/python
  bind_host:
    description: The address clients reach the service on.
    type: str
    default: 127.0.0.1
  port:
    description: The service's client port, the gateway's now.
    type: int
    required: true
  metrics_port:
    description: The gateway's Prometheus port, on loopback only.
    type: int
    required: true
  control_key_file:
    description: The control-plane key's file (made when missing).
    type: path
    required: true
  api_key:
    description: The servers' API key; unset, the gateway's serving routes are open (as the servers' are).
    type: str
  api_key_file:
    description: Where the API key is written for the unit (removed when O(api_key) is unset).
    type: path
    required: true
  workers_file:
    description: The live servers' file (created empty when missing).
    type: path
    required: true
  description:
    description: The unit's C(Description=).
    type: str
    default: SGLang gateway
  privileged_port:
    description: Whether O(port) is below the host's unprivileged range (the unit then may bind it).
    type: bool
    default: false
  wait_timeout:
    description: Seconds to wait for the gateway's C(/liveness) after a start or restart.
    type: float
    default: 60
  user:
    description: The gateway's system account (made with its group O(group) when missing).
    type: str
    default: sglang-gateway
  group:
    description: The gateway account's group.
    type: str
    default: sglang-gateway
"""

EXAMPLES = r"""
- name: The gateway of sglang-qwen on the service's port
  inferops.sglang.sglang_gateway:
    unit: sglang-qwen-gateway
    port: 30000
    metrics_port: 29000
    control_key_file: /etc/sglang/sglang-qwen.gateway-key
    api_key: "{{ vault_sglang_api_key }}"
    api_key_file: /etc/sglang/sglang-qwen.gateway-api-key
    workers_file: /var/lib/inferops-sglang/sglang-qwen/gateway-workers.json
"""

RETURN = r"""
url:
  description: The gateway's URL on this host.
  returned: always
  type: str
  sample: http://127.0.0.1:30000
written:
  description: The files written (or that would be), the code's by name, the others by path; never a key.
  returned: always
  type: list
  elements: str
account:
  description: The commands that made or mended the gateway's account (groupadd, useradd, usermod), or would.
  returned: with O(state=present)
  type: list
  elements: str
action:
  description: What was done to the unit (V(started), V(restarted), V(stopped), V(none)).
  returned: always
  type: str
liveness_s:
  description: Seconds the gateway took to answer C(/liveness) after its start; null when it was not waited for.
  returned: always
  type: float
port_held_by:
  description:
    - What answered on O(port) before the gateway's first start (the server that listened there before the
      gateway), else null. The start is not waited for then; the unit binds the port once the switch stops that
      server, and the switch waits for it before it routes the variant.
  returned: always
  type: str
"""

import json
import os
import secrets

from ansible.module_utils.basic import AnsibleModule

# The launcher: importing it makes Ansible carry it, and what it imports, to the host.
from ansible_collections.inferops.sglang.plugins.module_utils import _gateway_launch
from ansible_collections.inferops.sglang.plugins.module_utils import _gateway
from ansible_collections.inferops.sglang.plugins.module_utils import _host_code
from ansible_collections.inferops.sglang.plugins.module_utils import _http
from ansible_collections.inferops.sglang.plugins.module_utils import _preflight
from ansible_collections.inferops.sglang.plugins.module_utils import _state_files
from ansible_collections.inferops.sglang.plugins.module_utils import _variants

ENTRY = "_gateway_launch"
KEY_MODE = 0o600
# The sandbox: an account of its own with nothing but its network and its credentials
HARDENING = """NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
DevicePolicy=closed
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
ProcSubset=pid
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallErrorNumber=EPERM
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
UMask=0077
"""


def _escape(value: str) -> str:
    """A value for a unit file line: % is a specifier there."""
    return str(value).replace("%", "%%")


def _command(p: dict) -> list[str]:
    return _gateway_launch.command(p["bind_host"], p["port"], p["metrics_port"])


def unit_text(p: dict) -> str:
    """The gateway's unit: the launcher with ``_gateway_launch.command``'s arguments (quoted as systemd reads
    them, _variants.quote), its credentials, the sandbox."""
    execstart = _variants.quote([p["python"], "-s", "-m", f"{_host_code.PACKAGE}.{ENTRY}", *_command(p)])
    credentials = [f"LoadCredential=control-key:{_escape(p['control_key_file'])}"]
    if p["api_key"]:
        credentials.append(f"LoadCredential=api-key:{_escape(p['api_key_file'])}")
    credentials.append(f"LoadCredential=workers:{_escape(p['workers_file'])}")
    caps = ("CapabilityBoundingSet=CAP_NET_BIND_SERVICE\nAmbientCapabilities=CAP_NET_BIND_SERVICE\n"
            if p["privileged_port"] else "CapabilityBoundingSet=\nAmbientCapabilities=\n")
    return (
        "# Managed by inferops.sglang (sglang_gateway): SGLang's gateway (smg) on the service's client port.\n"
        "# Its keys reach smg in-process from its credentials (plugins/module_utils/_gateway_launch.py).\n"
        "[Unit]\n"
        f"Description={_escape(p['description'])}\n"
        "After=network-online.target\nWants=network-online.target\n\n"
        f"[Service]\nType=simple\nUser={p['user']}\nGroup={p['group']}\n"
        f"Environment=PYTHONPATH={_escape(p['root'])}\n"
        "Environment=NO_PROXY=127.0.0.1,localhost,::1\nEnvironment=no_proxy=127.0.0.1,localhost,::1\n"
        + "".join(line + "\n" for line in credentials)
        + f"ExecStart={execstart}\n"
        "Restart=always\nRestartSec=2\n"
        f"SyslogIdentifier={p['unit']}\n"
        + caps + HARDENING
        + "\n[Install]\nWantedBy=multi-user.target\n")


def _ensure_control_key(path: str, check: bool) -> bool:
    """A random control-plane key, made once: created exclusively, root only; never read back here."""
    if os.path.lexists(path):
        return False
    if check:
        return True
    _state_files.ensure_directory(os.path.dirname(path), 0o755)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, KEY_MODE)
    try:
        os.write(fd, (secrets.token_urlsafe(32) + "\n").encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def present(p: dict, check: bool, run_command, files: dict[str, str] | None = None, wait=None,
            holder=None, account=None) -> dict:
    """Install and run the gateway; the module's result. ``wait(url, timeout)`` waits for its /liveness;
    ``holder(url)`` says what else holds its port before a start (then the start is not waited for);
    ``account(user, group, run_command, check)`` makes the unit's account (``_preflight.ensure_account``)."""
    files = _host_code.code(ENTRY) if files is None else files
    try:
        made = (account or _preflight.ensure_account)(p["user"], p["group"], run_command, check)
    except OSError as exc:
        raise _host_code.Failure(f"the gateway's account {p['user']}: {exc}") from exc
    try:
        code_written, removed = _host_code.install(p["root"], files, check)
    except OSError as exc:
        raise _host_code.Failure(f"the gateway's launcher cannot be installed under {p['root']}: {exc}") from exc
    written = list(code_written)
    try:
        if _ensure_control_key(p["control_key_file"], check):
            written.append(p["control_key_file"])
    except OSError as exc:
        raise _host_code.Failure(f"cannot make the control key {p['control_key_file']}: {exc}") from exc
    key_changed = False
    if p["api_key"]:
        key_changed = _host_code.write(p["api_key_file"], p["api_key"] + "\n", KEY_MODE, check)
    elif os.path.lexists(p["api_key_file"]):
        key_changed = True
        if not check:
            os.unlink(p["api_key_file"])
    if key_changed:
        written.append(p["api_key_file"])
    if not os.path.lexists(p["workers_file"]):
        written.append(p["workers_file"])
        if not check:
            _state_files.write_atomic(p["workers_file"], json.dumps({"workers": []}), KEY_MODE)
    unit_path = os.path.join(p["unit_dir"], f"{p['unit']}.service")
    installed = os.path.exists(unit_path)
    unit_changed = _host_code.write(unit_path, unit_text(p), _host_code.UNIT_MODE, check)
    if unit_changed:
        written.append(unit_path)
    service = f"{p['unit']}.service"
    if unit_changed and not check:
        _host_code.systemctl(run_command, "daemon-reload")
    if check and not installed:
        enabled = active = False
    else:
        enabled = _host_code.systemctl(run_command, "is-enabled", "--quiet", "--", service, query=True)
        active = _host_code.systemctl(run_command, "is-active", "--quiet", "--", service, query=True)
    if not enabled and not check:
        _host_code.systemctl(run_command, "enable", "--", service)
    action = "none"
    if not active:
        action = "started"
    elif unit_changed or code_written or removed or key_changed:
        action = "restarted"
    url = _http.url_of(_command(p))
    liveness, held = None, None
    if action != "none" and not check:
        held = (holder or _held_by_another)(url) if action == "started" else None
        _host_code.systemctl(run_command, "restart" if action == "restarted" else "start", "--", service)
        if not held:
            liveness = (wait or _wait_up)(url, p["wait_timeout"])
    return dict(changed=bool(made or written or removed or not enabled or action != "none"), url=url,
                written=written, account=made, action=action, liveness_s=liveness, port_held_by=held)


def _held_by_another(url: str) -> str | None:
    """What answers on the gateway's port before its start, when something does (the server that held the
    service's port before the gateway): the gateway's unit binds it once that stops (Restart=always)."""
    resp = _http.Client(url, None, True, 5).call("GET", "/liveness", auth=False)
    if resp.status is None or resp.status == 200:  # nothing answers, or a gateway already does
        return None
    return f"another listener ({resp.describe()} to GET /liveness)"


def _wait_up(url: str, timeout: float) -> float:
    try:
        return _gateway.Gateway(_http.Client(url, None, True, 5)).wait_up(timeout)
    except _gateway.GatewayError as exc:
        raise _host_code.Failure(f"the gateway started but {exc}; see journalctl -u its unit") from exc


def absent(p: dict, check: bool, run_command) -> dict:
    unit_path = os.path.join(p["unit_dir"], f"{p['unit']}.service")
    if not os.path.exists(unit_path):
        return dict(changed=False, url=None, written=[], action="none", liveness_s=None, port_held_by=None)
    if not check:
        _host_code.systemctl(run_command, "disable", "--now", "--", f"{p['unit']}.service")
        os.unlink(unit_path)
        _host_code.systemctl(run_command, "daemon-reload")
    return dict(changed=True, url=None, written=[], action="stopped", liveness_s=None, port_held_by=None)


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["present", "absent"], default="present"),
            unit=dict(type="str", required=True),
            unit_dir=dict(type="path", default="/etc/systemd/system"),
            root=dict(type="path", default="/usr/local/lib/inferops-sglang/gateway"),
            python=dict(type="path", default="/opt/sglang/gateway/bin/python"),
            bind_host=dict(type="str", default="127.0.0.1"),
            port=dict(type="int", required=True),
            metrics_port=dict(type="int", required=True),
            control_key_file=dict(type="path", required=True, no_log=False),
            api_key=dict(type="str", no_log=True),
            api_key_file=dict(type="path", required=True, no_log=False),
            workers_file=dict(type="path", required=True),
            description=dict(type="str", default="SGLang gateway"),
            privileged_port=dict(type="bool", default=False),
            wait_timeout=dict(type="float", default=60),
            user=dict(type="str", default="sglang-gateway"),
            group=dict(type="str", default="sglang-gateway"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if "/" in p["unit"] or not p["unit"].strip():
        module.fail_json(msg=f"unit must be a unit name without its suffix, not {p['unit']!r}")
    errors = [f"{name} must be in [1, 65535], got {p[name]}" for name in ("port", "metrics_port")
              if not 1 <= p[name] <= 65535]
    if p["port"] == p["metrics_port"]:
        errors.append(f"port and metrics_port are both {p['port']}")
    if p["api_key"] and (any(c.isspace() for c in p["api_key"]) or not p["api_key"].isprintable()):
        errors.append("api_key must be printable, without whitespace")
    if errors:
        module.fail_json(msg="; ".join(errors))
    try:
        if p["state"] == "absent":
            result = absent(p, module.check_mode, module.run_command)
        else:
            if not module.check_mode and not os.path.exists(p["python"]):
                raise _host_code.Failure(f"no gateway venv at {p['python']}: provision the host with "
                                         "sglang_runtime_gateway: true")
            result = present(p, module.check_mode, module.run_command)
    except _host_code.Failure as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=f"the gateway cannot be installed: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
