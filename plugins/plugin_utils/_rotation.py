# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rotation hooks, run by sglang_switch's action plugin around the switch's job.

A hook (the sglang_service role's sglang_service_rotation_out or _in, checked by
the preflight: ``_inputs.check_hook``) is a command (an argv, run without a shell,
its arguments not expanded) or an HTTP call (``url``, ``method`` (POST),
``headers``, a JSON ``body``, ``status_code`` (200, or a list), ``timeout`` (30 s);
redirects are not followed), on the controller (``where: controller``, the
default: in this process) or on the host (``where: host``: ansible.legacy.command
or ansible.legacy.uri through the task's connection, with no_log, so the host's
log never gets its arguments).

A hook never raises: its result is ``{ok, msg}``, the exit code or the HTTP
status, with the last of the command's standard error or the client's reason,
every secret masked (the hook's header values, and whatever looks like a
credential). A hook's arguments may hold the load balancer's credentials, so
they go into no result and no message.
"""

from __future__ import annotations

import json
import subprocess
from urllib.error import HTTPError

from ansible.module_utils.common.text.converters import to_text
from ansible.module_utils.urls import open_url

from ansible_collections.inferops.sglang.plugins.module_utils import _mask
from ansible_collections.inferops.sglang.plugins.plugin_utils._async_job import task_setting

# The sglang_switch options that hold the hooks: never sent to the host's module.
OPTIONS = {"rotation_out": "out", "rotation_in": "in"}
# The switch's outcomes after which the host goes back in rotation: the known-good service
# serves (switched, or rolled back), or nothing was changed.
BACK_IN = ("switched", "rolled_back", "failed_before_switching")
STDERR_TAIL = 300
REASON_MAX = 200
DEFAULT_TIMEOUT = 30


def secrets_of(hook: dict) -> tuple[str, ...]:
    return tuple(str(v) for v in (hook.get("headers") or {}).values() if v)


def codes_of(hook: dict) -> list[int]:
    codes = hook.get("status_code", [200])
    return [int(c) for c in (codes if isinstance(codes, list) else [codes])]


def command_result(rc: int, stderr: str, secrets: tuple[str, ...]) -> dict:
    tail = _mask.mask(to_text(stderr or "").strip(), secrets)[-STDERR_TAIL:]
    return {"ok": rc == 0, "msg": f"command exit {rc}" + (f": {tail}" if tail else "")}


def url_result(status: int, codes: list[int], reason: str, secrets: tuple[str, ...]) -> dict:
    if status in codes:
        return {"ok": True, "msg": f"HTTP {status}"}
    why = _mask.mask(to_text(reason or ""), secrets)[:REASON_MAX]
    return {"ok": False, "msg": f"HTTP {status} (expected {', '.join(map(str, codes))}): {why}"}


def run_hook(action, task_vars: dict, hook: dict) -> dict:
    """One hook's ``{ok, msg}``; ``action`` is the calling action plugin (its connection runs a
    ``where: host`` hook)."""
    on_host = hook.get("where", "controller") == "host"
    secrets = secrets_of(hook)
    if "command" in hook:
        argv = [str(a) for a in hook["command"]]
        if on_host:
            with task_setting(action._task, "no_log", True):  # pylint: disable=protected-access
                res = action._execute_module(module_name="ansible.legacy.command",  # pylint: disable=protected-access
                                             module_args={"argv": argv, "expand_argument_vars": False}, task_vars=task_vars)
            rc = res.get("rc")
            return command_result(-1 if rc is None else int(rc), res.get("stderr") or ("" if rc is not None else res.get("msg")),
                                  secrets)
        try:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, check=False)
        except OSError as exc:
            return command_result(127, f"{argv[0]}: {exc.strerror or exc}", secrets)
        return command_result(proc.returncode, proc.stderr.decode("utf-8", "replace"), secrets)
    codes, method = codes_of(hook), hook.get("method", "POST")
    timeout = int(hook.get("timeout", DEFAULT_TIMEOUT))
    headers = dict(hook.get("headers") or {})
    if on_host:
        args = {"url": hook["url"], "method": method, "headers": headers, "status_code": codes, "timeout": timeout,
                "follow_redirects": "none"}
        if "body" in hook:
            args.update(body=hook["body"], body_format="json")
        with task_setting(action._task, "no_log", True):  # pylint: disable=protected-access
            res = action._execute_module(module_name="ansible.legacy.uri", module_args=args,  # pylint: disable=protected-access
                                         task_vars=task_vars)
        return url_result(int(res.get("status", -1)), codes, str(res.get("msg", "")), secrets)
    data = None
    if "body" in hook:
        data = json.dumps(hook["body"]).encode("utf-8")
        headers.setdefault("Content-Type", "application/json")
    try:
        with open_url(hook["url"], data=data, headers=headers, method=method, timeout=timeout,
                      follow_redirects="none") as response:
            status, reason = response.status, ""
    except HTTPError as exc:
        status, reason = exc.code, f"Status code was {exc.code} and not {codes}: {exc}"
    # any client failure (a refused connection, a timeout, a bad certificate) is the hook's result
    except Exception as exc:  # pylint: disable=broad-exception-caught
        status, reason = -1, f"Status code was -1 and not {codes}: Request failed: {exc}"
    return url_result(status, codes, reason, secrets)


def out_failed_message(host: str, rotation: dict, running: str | None) -> str:
    """The deploy's failure when the out hook failed: nothing of the switch started."""
    msg = (f"{host}: the rotation out hook failed ({rotation['out']['msg']}); nothing was changed, "
           f"{running or 'the service'} still runs")
    if "in" in rotation:
        msg += f"; rotation in hook: {rotation['in']['msg']}"
    return msg


def deploy_failure(host: str, variant: str, result: dict, rotation: dict, service_dir: str) -> str | None:
    """What fails the deploy after the switch's job, or None: an outcome other than switched or
    unchanged (the summary, with the rotation's words), a job that ended without one, or a
    host the in hook did not put back."""
    outcome = result.get("outcome")
    out_ok = rotation.get("out", {}).get("ok", False)
    if outcome is None:
        return (f"{host}: the switch job on the host ended without an outcome ({str(result.get('msg') or 'no result')[:300]}); "
                f"{service_dir}/switch.json says where it stopped, and the next deploy repairs the switch"
                + ("; the host is OUT of rotation" if out_ok else ""))
    if outcome not in ("switched", "unchanged"):
        msg = str(result.get("summary") or result.get("msg") or outcome)
        if "in" in rotation and outcome == "failed_before_switching":
            msg += f"; rotation in hook: {rotation['in']['msg']}"
        return msg
    if not rotation.get("in", {}).get("ok", True):
        return (f"{host}: {variant} serves, but the host is NOT back in rotation: the rotation in hook failed "
                f"({rotation['in']['msg']}). Put it back by hand.")
    return None
