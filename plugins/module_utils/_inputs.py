# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deploy's input, checked before anything on the host changes.

Every value that reaches the unit file, the ``--config`` file, the logging
file or ``current.json``, every name that becomes part of a path, the API key
and every setting the switch and the rollback will use later (the gate, the
GPU release wait, the lock, the record). Pure functions: each returns the
problems it finds as sentences that name the role variable and never quote the
API key. ``check`` runs them all (module ``sglang_inputs``, first task of the
deploy's preflight).

Why each rule:

- Control characters (below 0x20, 0x7f, U+0085 and the Unicode line and
  paragraph separators): systemd reads a unit file line by line
  (systemd.syntax(7), "Description": a line ends at a newline; no quoting
  continues it), so a newline in a value starts a line of the attacker's
  choosing (``ExecStartPre=+...``, ``User=root``). None of these characters
  has a use in a path, a name, a description or an environment value of the
  server; they are refused rather than escaped.
- Names that become paths (the service name in ``/etc/systemd/system/``,
  ``/etc/sglang/`` and the state tree; variant keys in ``attempts/``) are
  ``[a-z0-9][a-z0-9._-]*`` without ``..``; user and group names follow
  useradd's default NAME_REGEX (``[a-z_][a-z0-9_-]*``, 32 bytes at most).
- Environment variable names: ``[A-Za-z_][A-Za-z0-9_]*`` (systemd.exec(5),
  "Environment=": a name that is not a valid shell variable name is ignored
  with a warning, so the variable would silently not be set).
- The API key reaches SGLang through the ``--config`` YAML file as a JSON
  string (a YAML double-quoted scalar): any printable ASCII character survives
  it byte for byte. SGLang turns the file's keys into ``--api-key VALUE``
  arguments before argparse (0.5.11 srt/server_args_config_parser.py:140-184,
  ``_add_scalar_arg``; srt/server_args.py:7280-7288), and argparse takes a
  value that starts with ``-`` (other than a negative number) for an option:
  such a key would stop the server at start. It compares the key with the
  ``Authorization: Bearer`` header (srt/utils/auth.py:103-112), whose value an
  HTTP server strips of surrounding whitespace (RFC 9110 5.5), and whose bytes
  clients encode differently outside ASCII. So: printable ASCII (0x20-0x7e),
  no space first or last, not ``-`` first.
"""

from __future__ import annotations

import math
import re

try:
    from ansible_collections.inferops.sglang.plugins.module_utils import _bench as bench
    from ansible_collections.inferops.sglang.plugins.module_utils import _readiness as readiness
    from ansible_collections.inferops.sglang.plugins.module_utils import _variants as variants_mod
except ImportError:  # loaded from the tree (tests, tools/)
    import _bench as bench  # type: ignore[no-redef]
    import _readiness as readiness  # type: ignore[no-redef]
    import _variants as variants_mod  # type: ignore[no-redef]

# C0 controls, DEL, C1's NEL, and Unicode's line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f\x85\u2028\u2029]")
NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
SERVICE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*\.service")
ACCOUNT = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# systemd's own limit on a unit name (UNIT_NAME_MAX, 256 with the terminating NUL)
UNIT_NAME_MAX = 255

# The settings the switch and the rollback use after the service is stopped:
# role variable -> (kind, lowest, lowest allowed?, highest or None, what it is).
# kind "number" is int or float, "int" an integer; strings holding a number
# (-e name=VALUE gives one) are read as the number.
SETTINGS: dict[str, tuple[str, float, bool, float | None, str]] = {
    "sglang_service_gate_interval": ("number", 0, False, 60, "seconds between the gate's probes (the pre-gate waits 60 s)"),
    "sglang_service_gate_generations": ("int", 1, True, None, "generations the gate asks for"),
    "sglang_service_gate_settle": ("number", 0, True, None, "seconds the gate watches a ready server"),
    "sglang_service_gate_progress_interval": ("number", 0, True, None, "seconds between progress lines (0: none)"),
    "sglang_service_plan_tolerance": ("number", 0, True, 1, "share the record lets the plan differ by"),
    "sglang_service_release_timeout": ("int", 1, True, None, "seconds to wait for the GPUs' memory"),
    "sglang_service_release_threshold_mib": ("int", 0, True, None, "MiB a released GPU may still hold"),
    "sglang_service_lock_timeout": ("int", 0, True, None, "seconds to wait for the deploy lock (0: fail at once)"),
    "sglang_service_lock_lease": ("int", 1, True, None, "seconds a deploy lock lives without renewal"),
    "sglang_service_keep_attempts": ("int", 1, True, None, "attempt directories kept"),
    "sglang_service_args_timeout": ("int", 1, True, None, "seconds of each SGLang argument check"),
    "sglang_service_drain_timeout": ("number", 0, True, None,
                                     "seconds to wait for requests in flight before a stop (0: read once, no wait)"),
    "sglang_service_drain_interval": ("number", 0, False, 60, "seconds between two reads of the server's load"),
}

# The rotation hooks (sglang_service_rotation_out, sglang_service_rotation_in): {} for
# none, or a command (an argv list, no shell) or an HTTP call, run on the controller
# (the default) or on the host.
ROTATION_HOOKS = ("sglang_service_rotation_out", "sglang_service_rotation_in")
HOOK_KEYS = {"command", "url", "method", "headers", "body", "status_code", "timeout", "where"}
HOOK_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def control_characters(value: str) -> list[str]:
    """The control characters in ``value``, each as U+XXXX (in order, once each)."""
    seen: list[str] = []
    for char in _CONTROL.findall(value):
        name = f"U+{ord(char):04X}"
        if name not in seen:
            seen.append(name)
    return seen


def _label(key: object) -> str:
    """A key as it can be shown in a message: itself, or escaped when it holds a control character."""
    text = str(key)
    return ascii(text) if control_characters(text) else text


def check_text(what: str, value: object) -> list[str]:
    """A value that reaches a unit, --config or record file: no control characters."""
    if value is None:
        return []
    found = control_characters(str(value))
    if found:
        return [f"{what} must not contain control characters (a newline would start a line of its own in the "
                f"unit file), found {', '.join(found)}"]
    return []


def check_tree(what: str, value: object) -> list[str]:
    """check_text on every string in a nested dict/list, keys included, each named by its path."""
    errors: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            errors.extend(check_text(f"{what} key", key))
            errors.extend(check_tree(f"{what}.{_label(key)}", item))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            errors.extend(check_tree(f"{what}[{index}]", item))
    elif isinstance(value, str):
        errors.extend(check_text(what, value))
    return errors


def check_name(what: str, value: object) -> list[str]:
    """A name that becomes part of a path: ``[a-z0-9][a-z0-9._-]*``, no ``..``."""
    text = value if isinstance(value, str) else ""
    if not NAME.fullmatch(text) or ".." in text or len(text) > UNIT_NAME_MAX:
        return [f"{what} must match [a-z0-9][a-z0-9._-]* without '..' (it names a file or directory), got {value!r}"]
    return []


def check_service_name(value: object) -> list[str]:
    """sglang_service_name: a unit name ending in .service, usable as a file name."""
    text = value if isinstance(value, str) else ""
    if (not SERVICE_NAME.fullmatch(text) or ".." in text or len(text) > UNIT_NAME_MAX
            or text == ".service"):
        return ["sglang_service_name must be [a-z0-9][a-z0-9._-]*.service without '..' (it names the unit file, "
                f"/etc/sglang/ files and the state directory), got {value!r}"]
    return []


def check_account(what: str, value: object) -> list[str]:
    """A user or group name (useradd's default NAME_REGEX, 32 bytes at most)."""
    text = value if isinstance(value, str) else ""
    if not ACCOUNT.fullmatch(text):
        return [f"{what} must be a user or group name, [a-z_][a-z0-9_-]* (32 characters at most), got {value!r}"]
    return []


# A variable whose name says it holds a secret (HF_TOKEN, AWS_SECRET_ACCESS_KEY, ...): the
# unit file is world-readable (0644), and the server loads its model from the host's
# staged directory, so a hub token has no use there either.
SECRET_ENV_NAME = re.compile(r"(?:^|_)(?:TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY)(?:_|$)", re.IGNORECASE)


def check_environment(environment: object) -> list[str]:
    """The unit's environment: valid variable names, values free of control characters, no
    variable whose name says it holds a secret (the unit file is 0644)."""
    if environment is None:
        return []
    if not isinstance(environment, dict):
        return [f"sglang_service_environment must be a dict of NAME: value, got {type(environment).__name__}"]
    errors: list[str] = []
    for name, value in environment.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            errors.append(f"environment variable name {name!r} must match [A-Za-z_][A-Za-z0-9_]*")
            continue
        if isinstance(value, (dict, list)):
            errors.append(f"environment variable {name} must be a string or a number, got a {type(value).__name__}")
            continue
        if SECRET_ENV_NAME.search(name):
            errors.append(f"environment variable {name} looks like a secret, and the unit file that would hold it is "
                          "world-readable: the server loads its model from the host (sglang_service_model_path, staged "
                          "by sglang_model) and needs no hub token; its keys go through sglang_service_api_key and "
                          "sglang_service_admin_api_key")
            continue
        errors.extend(check_text(f"environment variable {name}", value))
    return errors


def check_paths(what: str, paths: object) -> list[str]:
    """Absolute paths without control characters, whitespace, quotes or backslashes
    (ReadWritePaths= is a space-separated list, systemd.exec(5)); a path may carry
    systemd's "-" prefix (ignored when it does not exist, systemd.exec(5) SANDBOXING)."""
    if paths is None:
        return []
    if isinstance(paths, str) or not isinstance(paths, (list, tuple)):
        return [f"{what} must be a list of absolute paths, got {paths!r}"]
    errors: list[str] = []
    for index, path in enumerate(paths):
        label = f"{what}[{index}]"
        if not isinstance(path, str) or not path.removeprefix("-").startswith("/"):
            errors.append(f"{label} must be an absolute path, got {path!r}")
            continue
        found = check_text(label, path)
        if found:
            errors.extend(found)
        elif re.search(r"[\s\"'\\]", path):
            errors.append(f"{label} must not contain whitespace, quotes or backslashes (ReadWritePaths= splits on "
                          f"whitespace), got {path!r}")
    return errors


def check_api_key(key: object, what: str = "sglang_service_api_key") -> list[str]:
    """An API key (``what``: the variable): printable ASCII that reaches SGLang byte for byte.
    The messages never quote it."""
    if key is None or key == "":
        return []
    if not isinstance(key, str):
        return [f"{what} must be a string"]
    errors: list[str] = []
    bad = sorted({f"position {i + 1}" for i, c in enumerate(key) if not 0x20 <= ord(c) <= 0x7E},
                 key=lambda s: int(s.split()[1]))
    if bad:
        shown = ", ".join(bad[:5]) + (" ..." if len(bad) > 5 else "")
        errors.append(f"{what} must be printable ASCII (0x20-0x7e): an HTTP header cannot carry a "
                      f"control character and clients encode other characters differently (at {shown})")
    if key != key.strip(" "):
        errors.append(f"{what} must not begin or end with a space (HTTP strips it from the header)")
    if key.startswith("-"):
        errors.append(f"{what} must not begin with '-': SGLang passes it to argparse as "
                      "--api-key VALUE, which takes it for an option")
    return errors


def _number(value: object, kind: str) -> float | int | None:
    """The number a setting holds (a string from -e included), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number: float | int = value
    elif isinstance(value, str):
        try:
            number = int(value.strip()) if kind == "int" else float(value.strip())
        except ValueError:
            try:
                number = float(value.strip())
            except ValueError:
                return None
    else:
        return None
    if not math.isfinite(number):
        return None
    if kind == "int":
        if number != int(number):
            return None
        return int(number)
    return number


def check_setting(name: str, value: object) -> list[str]:
    """One of SETTINGS, by its role variable name."""
    kind, low, low_ok, high, what = SETTINGS[name]
    number = _number(value, kind)
    article = "an integer" if kind == "int" else "a number"
    if number is None:
        return [f"{name} ({what}) must be {article}, got {value!r}"]
    if number < low or (number == low and not low_ok) or (high is not None and number > high):
        bounds = f"{'>=' if low_ok else '>'} {low:g}" + (f" and <= {high:g}" if high is not None else "")
        return [f"{name} ({what}) must be {bounds}, got {value!r}"]
    return []


def check_hook(name: str, hook: object) -> list[str]:
    """A rotation hook: {} (none), {command: [argv...]} or {url: http(s)://..., method, headers, body,
    status_code, timeout}, each with where: controller (the default) or host."""
    if hook is None or hook == {}:
        return []
    if not isinstance(hook, dict):
        return [f"{name} must be a dict (command: [argv...] or url: ...), or {{}} for none, got {hook!r}"]
    errors = [f"{name} has an unknown key {_label(key)!r} (known: {', '.join(sorted(HOOK_KEYS))})"
              for key in hook if key not in HOOK_KEYS]
    if ("command" in hook) == ("url" in hook):
        errors.append(f"{name} must have exactly one of command (an argv list) and url")
    if "command" in hook:
        argv = hook["command"]
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a for a in argv):
            errors.append(f"{name}.command must be a list of non-empty strings (an argv, run without a shell), "
                          f"got {argv!r}")
        else:
            errors.extend(check_tree(f"{name}.command", argv))
        extra = sorted(HOOK_KEYS & set(hook) - {"command", "url", "where"})
        if extra and "url" not in hook:
            errors.append(f"{name}: only a url hook takes {', '.join(extra)}")
    if "url" in hook:
        url = hook["url"]
        if not isinstance(url, str) or not re.match(r"https?://[^\s/]+", url) or control_characters(url):
            errors.append(f"{name}.url must be an http:// or https:// URL without spaces or control characters")
        method = hook.get("method", "POST")
        if method not in HOOK_METHODS:
            errors.append(f"{name}.method must be one of {', '.join(HOOK_METHODS)}, got {method!r}")
        headers = hook.get("headers", {})
        if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
            errors.append(f"{name}.headers must map header names to strings")
        else:
            errors.extend(check_tree(f"{name}.headers", headers))
        codes = hook.get("status_code", [200])
        codes = codes if isinstance(codes, list) else [codes]
        if not codes or not all(_number(c, "int") is not None and 100 <= _number(c, "int") <= 599 for c in codes):
            errors.append(f"{name}.status_code must be an HTTP status or a list of them, got {hook.get('status_code')!r}")
        # whole seconds: the uri module's timeout is an int (0.5 would become 0, a socket that never waits)
        timeout = _number(hook.get("timeout", 30), "int")
        if timeout is None or timeout <= 0:
            errors.append(f"{name}.timeout must be a whole number of seconds > 0, got {hook.get('timeout')!r}")
    if hook.get("where", "controller") not in ("controller", "host"):
        errors.append(f"{name}.where must be controller or host, got {hook.get('where')!r}")
    return errors


def check_settings(settings: dict) -> list[str]:
    """Every known setting given in ``settings`` (role variable -> value)."""
    errors: list[str] = []
    for name, value in settings.items():
        if name in ROTATION_HOOKS:
            errors.extend(check_hook(name, value))
        elif name == "sglang_service_gate_stall_budgets":
            if not isinstance(value, dict):
                errors.append(f"{name} must be a dict of stage: seconds, got {value!r}")
                continue
            try:
                readiness.stall_budgets(value)
            except ValueError as exc:
                errors.append(f"sglang_service_gate_{exc}")
        elif name == "sglang_service_perf_gate":
            if value not in bench.MODES:
                hint = " (quote off in YAML: unquoted it reads as false)" if value is False else ""
                errors.append(f"{name} must be one of {', '.join(bench.MODES)}, got {value!r}{hint}")
        elif name == "sglang_service_perf_load":
            errors.extend(bench.check_load(value, name))
        elif name == "sglang_service_perf_thresholds":
            errors.extend(bench.check_thresholds(value, name))
        elif name in SETTINGS:
            errors.extend(check_setting(name, value))
        else:
            errors.append(f"unknown setting {name}")
    return errors


def check_table(variants: object, aliases: object, overrides: object, common: object) -> list[str]:
    """The variant table: names used in paths, and no control characters in any value."""
    errors: list[str] = []
    for what, table in (("sglang_service_variants", variants), ("sglang_service_variant_aliases", aliases),
                        ("sglang_service_variant_overrides", overrides)):
        if not isinstance(table, dict):
            if table is not None:
                errors.append(f"{what} must be a dict, got {type(table).__name__}")
            continue
        for key in table:
            errors.extend(check_name(f"{what} key", key))
    if isinstance(aliases, dict):
        for key, target in aliases.items():
            errors.extend(check_name(f"sglang_service_variant_aliases.{key}", target))
    for what, table in (("sglang_service_variants", variants), ("sglang_service_variant_overrides", overrides),
                        ("sglang_service_overrides", common)):
        errors.extend(check_tree(what, table))
    return errors


def check_interval_fits(values: dict) -> list[str]:
    """The gate's interval within the gate timeout of the variant and of the baseline (the gate refuses
    an interval longer than its timeout, and would only say so after the service was stopped)."""
    settings = values.get("settings") or {}
    name = "sglang_service_gate_interval"
    if name not in settings or check_setting(name, settings[name]):
        return []
    interval = _number(settings[name], "number")
    errors: list[str] = []
    for label, asked in (("variant", values.get("variant")), ("baseline variant", values.get("baseline_variant"))):
        if not asked or not isinstance(values.get("variants"), dict):
            continue
        try:
            canonical, params = variants_mod.resolve(asked, values["variants"], values.get("aliases"),
                                                     values.get("overrides"), values.get("common"))
        except (variants_mod.VariantError, AttributeError, TypeError):
            continue  # sglang_variant, next in the preflight, says why
        timeout = params.get("gate_timeout")
        if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and interval is not None and interval > timeout:
            errors.append(f"{name} {settings[name]!r} exceeds the gate_timeout {timeout:g} of the {label} {canonical}")
    return errors


# The sglang_inputs module's options: its module runs with them, and its action plugin, which
# makes the whole check on the controller, validates a task's arguments against them.
ARGUMENT_SPEC = dict(
    service_name=dict(type="str"),
    user=dict(type="str"),
    group=dict(type="str"),
    variant=dict(type="str"),
    baseline_variant=dict(type="str"),
    variants=dict(type="dict", default={}),
    aliases=dict(type="dict", default={}),
    overrides=dict(type="dict", default={}),
    common=dict(type="dict", default={}),
    served_model_name=dict(type="str"),
    model_path=dict(type="str"),
    draft_model_path=dict(type="str"),
    bind_host=dict(type="str"),
    python=dict(type="str"),
    state_dir=dict(type="str"),
    environment=dict(type="raw"),
    read_write_paths=dict(type="raw"),
    api_key=dict(type="str", no_log=True),
    settings=dict(type="dict", default={}),
)


def refusal(errors: list[str]) -> str:
    """The message of a refused input: every problem, and that nothing changed."""
    return "bad input, nothing was changed: " + "; ".join(errors)


def check(values: dict) -> list[str]:
    """Every problem of the deploy's input (the sglang_inputs module's options)."""
    errors: list[str] = []
    if values.get("service_name") is not None:
        errors.extend(check_service_name(values["service_name"]))
    for option, label in (("user", "sglang_service_user"), ("group", "sglang_service_group")):
        if values.get(option) is not None:
            errors.extend(check_account(label, values[option]))
    for option, label in (("variant", "the variant asked for"), ("baseline_variant", "sglang_service_baseline_variant")):
        errors.extend(check_text(label, values.get(option)))
    errors.extend(check_table(values.get("variants"), values.get("aliases"), values.get("overrides"),
                              values.get("common")))
    for option, label in (("served_model_name", "sglang_service_served_model_name"),
                          ("model_path", "sglang_service_model_path"),
                          ("draft_model_path", "sglang_service_draft_model_path"),
                          ("bind_host", "sglang_service_bind_host"),
                          ("python", "sglang_service_python"),
                          ("state_dir", "sglang_service_state_dir"),
                          ("watchdog_python", "sglang_service_watchdog_python")):
        errors.extend(check_text(label, values.get(option)))
    watchdog_python = values.get("watchdog_python")
    if watchdog_python is not None and not str(watchdog_python).startswith("/"):
        # root runs it from the watchdog's unit: a PATH lookup would take whatever PATH finds first
        errors.append(f"sglang_service_watchdog_python must be an absolute path, got {_label(watchdog_python)}")
    errors.extend(check_environment(values.get("environment")))
    errors.extend(check_paths("sglang_service_read_write_paths", values.get("read_write_paths")))
    errors.extend(check_api_key(values.get("api_key")))
    errors.extend(check_api_key(values.get("admin_api_key"), "sglang_service_admin_api_key"))
    errors.extend(check_settings(values.get("settings") or {}))
    errors.extend(check_interval_fits(values))
    return errors
