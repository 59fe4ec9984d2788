# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The deploy's checks on the host, before anything on it changes: read-only.

Three checks, each also a module of its own for ad-hoc use, and all of them in
one call for the ``sglang_service`` role (module ``sglang_preflight``: one
round trip to the host instead of four, the input check of ``_inputs`` first):

- ``manifest_read``: what provisioning proved (the host manifest, ``_host_manifest``):
  the TP size, GPUs, python and the unit's environment unless the caller set
  them, each GPU's device node, and the refusal of a variant whose build has no
  passing probe verdict (module ``sglang_host_manifest``, ``state: read``).
- ``variant``: the variant and the rollback baseline resolved with the same
  options and checked against the host (the model's ``config.json`` and the
  sandbox's view of it, the GPUs, the installed SGLang and its ``--help``, the
  unit's credentials, the memory plan) (module ``sglang_variant``).
- ``model_verified``: the model's files against its manifest and safetensors
  headers (module ``sglang_model_stage``, ``state: verified``).

Each refuses by raising ``Refused`` with the message and the result fields the
module fails with; ``run_command`` is AnsibleModule's (the seam tests replace).
``input_values`` maps the module's options to the input check's values, for the
module and for its action plugin (which checks the input on the controller first).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re

from ansible_collections.inferops.sglang.plugins.module_utils import _credentials
from ansible_collections.inferops.sglang.plugins.module_utils import _deploy
from ansible_collections.inferops.sglang.plugins.module_utils import _gpu as gpu_mod
from ansible_collections.inferops.sglang.plugins.module_utils import _gpu_health
from ansible_collections.inferops.sglang.plugins.module_utils import _host_manifest as hm
from ansible_collections.inferops.sglang.plugins.module_utils import _inputs
from ansible_collections.inferops.sglang.plugins.module_utils import _memplan
from ansible_collections.inferops.sglang.plugins.module_utils import _model_config
from ansible_collections.inferops.sglang.plugins.module_utils import _model_stage as ms
from ansible_collections.inferops.sglang.plugins.module_utils import _process_watch
from ansible_collections.inferops.sglang.plugins.module_utils import _prom_targets
from ansible_collections.inferops.sglang.plugins.module_utils import _slots
from ansible_collections.inferops.sglang.plugins.module_utils import _state_files
from ansible_collections.inferops.sglang.plugins.module_utils import _variants as variants_mod


def input_values(options: dict) -> dict:
    """The values ``_inputs.check`` takes, from sglang_preflight's options (as given, unconverted)."""
    names = ("service_name", "user", "group", "variants", "aliases", "overrides", "common", "served_model_name",
             "model_path", "draft_model_path", "bind_host", "python", "state_dir", "environment", "read_write_paths",
             "api_key", "admin_api_key", "settings", "watchdog_python")
    return dict({name: options.get(name) for name in names}, variant=options.get("name"),
                baseline_variant=options.get("baseline"))


LOGIN_DEFS = "/etc/login.defs"
# The service account the role makes: a system account without a login, its home where
# it has nothing (the server's state is root's, under the service's state directory).
ACCOUNT_HOME = "/var/lib/sglang"
ACCOUNT_SHELL = "/usr/sbin/nologin"


def uid_min(path: str = LOGIN_DEFS) -> int:
    """The first UID of a login account (login.defs(5) UID_MIN; 1000 when it is not set)."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) >= 2 and fields[0] == "UID_MIN" and fields[1].isdigit():
                    return int(fields[1])
    except OSError:
        pass
    return 1000


def account_problem(user: str, group: str, login_defs: str = LOGIN_DEFS) -> str | None:
    """The service's account on this host, where it exists: not root's (UID or GID 0: the
    server would run with root's files), and not a login account (UID_MIN and above, nobody
    included): the role sets the account's shell to nologin and its home, and would rewrite a
    person's. An account that does not exist yet is made a system account by the role."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        entry = None
    if entry is not None and entry.pw_uid == 0:
        return f"sglang_service_user {user} is root (UID 0): the server would run with every file of root's"
    if entry is not None and entry.pw_uid >= uid_min(login_defs):
        return (f"sglang_service_user {user} is a login account here (UID {entry.pw_uid}): the role would set its shell "
                f"to nologin and its home to {ACCOUNT_HOME}; name an account for the service alone")
    try:
        gid = grp.getgrnam(group).gr_gid
    except KeyError:
        return None
    if gid == 0:
        return f"sglang_service_group {group} is root's group (GID 0): the server would read every file of that group"
    return None


def ensure_account(user: str, group: str, run_command, check_mode: bool = False,
                   getpwnam=pwd.getpwnam, getgrnam=grp.getgrnam) -> list[str]:
    """The service's group and account as system ones: made when missing (groupadd, useradd:
    no home directory made), mended when the account's primary group, shell or home differ
    (usermod). What account_problem refuses never reaches here. Returns what was done (or would
    be, in check mode); raises OSError with the command's words when one fails."""
    done = []
    try:
        gid = getgrnam(group).gr_gid
    except KeyError:
        gid = None
    if gid is None:
        done.append(["groupadd", "--system", group])
    try:
        entry = getpwnam(user)
    except KeyError:
        entry = None
    if entry is None:
        done.append(["useradd", "--system", "--gid", group, "--shell", ACCOUNT_SHELL, "--home-dir", ACCOUNT_HOME,
                     "--no-create-home", user])
    elif (entry.pw_gid, entry.pw_shell, entry.pw_dir) != (gid, ACCOUNT_SHELL, ACCOUNT_HOME):
        done.append(["usermod", "--gid", group, "--shell", ACCOUNT_SHELL, "--home", ACCOUNT_HOME, user])
    if not check_mode:
        for argv in done:
            rc, out, err = run_command(argv)
            if rc != 0:
                raise OSError(f"{' '.join(argv)} failed (exit {rc}): {(err or out).strip()[-500:]}")
    return [" ".join(argv) for argv in done]


def exposure_warning(bind_host: str | None, api_key: str | None) -> str | None:
    """A server that listens beyond loopback without an API key serves anyone who can reach it."""
    if _prom_targets.loopback(bind_host or "127.0.0.1") or api_key:
        return None
    return (f"the server listens on {bind_host} without an API key: anyone who can reach its port can generate, "
            "and read /server_info; set sglang_service_api_key, or bind it to 127.0.0.1 behind a proxy")


class Refused(Exception):
    """A check refuses the deploy: ``msg`` and the fields of the module's failed result."""

    def __init__(self, msg: str, **result) -> None:
        super().__init__(msg)
        self.msg = msg
        self.result = result


# -- the host manifest -------------------------------------------------------------------

def ddtree_manifest(path: str) -> dict | None:
    """The DDTree build's manifest (ddtree_build), or None when there is none or it is unreadable."""
    try:
        with open(path, "r", encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def probed_minors(run_command, proc_dir: str, missing: list[int]) -> dict[int, int | None]:
    """GPU index -> device minor read on the host now, for the GPUs in ``missing``: nvidia-smi gives
    each GPU's bus id, the driver's procfs its minor. Nothing is run without that procfs directory."""
    if not missing or not os.path.isdir(os.path.join(proc_dir, "gpus")):
        return {}
    found = gpu_mod.read_inventory(run_command)
    return {gpu["index"]: gpu_mod.device_minor(proc_dir, gpu) for gpu in found["gpus"] if gpu.get("index") in missing}


def manifest_read(p: dict, run_command) -> tuple[dict, list[str]]:
    """The host manifest at ``p["path"]`` read for a deploy: (result, warnings). ``p``: path,
    ddtree_manifest, required, tp_size, gpu_devices, python, environment, use_environment,
    driver_proc_dir, and the variant ``name`` with its table (variants, aliases, overrides, common)."""
    path = p["path"]
    try:
        manifest = hm.read(path)
    except hm.ManifestMissing as exc:
        if p["required"]:
            msg = (f"no host manifest: {exc}. To deploy without one set sglang_service_host_manifest_required: false "
                   "and give sglang_service_tp_size and sglang_service_gpu_devices")
            raise Refused(msg, errors=[msg], path=path, exists=False) from exc
        manifest = None
    except hm.ManifestError as exc:
        raise Refused(str(exc), errors=[str(exc)], path=path, exists=True) from exc

    settings, sources, errors, warnings = hm.settings(manifest, p["tp_size"], p["gpu_devices"], p["python"],
                                                      p["environment"], p["use_environment"])
    # what the manifest gives reaches the unit and root's probes as the inventory's would: the same rules
    if sources.get("python") == "manifest":
        errors += [f"the host manifest's {e}" for e in _inputs.check_text("python", settings["python"])]
    if sources.get("environment") == "manifest":
        errors += [f"the host manifest's {e}" for e in _inputs.check_environment(settings["environment"])]
    known = hm.device_minors(manifest)
    missing = [d for d in settings["gpu_devices"] if d not in known]
    settings["gpu_nodes"], sources["gpu_nodes"] = hm.gpu_nodes(
        settings["gpu_devices"], known, probed_minors(run_command, p["driver_proc_dir"], missing))
    result = dict(path=path, exists=manifest is not None, settings=settings, sources=sources)
    if manifest is not None:
        result["manifest"] = manifest
    if p["name"]:
        try:
            name, params = variants_mod.resolve(p["name"], p["variants"], p["aliases"], p["overrides"], p["common"])
        except variants_mod.VariantError:
            pass  # not this check's to say: the variant's check names what is wrong
        else:
            result["variant"] = name
            if manifest is None:
                warnings.append(f"no host manifest: variant {name}'s build is not checked against a probe verdict")
            else:
                needed = hm.build_needed(params)
                result["build"] = dict(needed=needed, verdict=(manifest.get("builds") or {}).get(needed))
                problem = hm.refusal(name, params, manifest, hm.ddtree_installed(ddtree_manifest(p["ddtree_manifest"])))
                if problem:
                    errors.append(problem)
    if errors:
        raise Refused("the host manifest refuses this deploy: " + "; ".join(errors), errors=errors, **result)
    return result, warnings


# -- the variant -----------------------------------------------------------------------

def memory_refusal(name: str, plan: dict) -> str:
    """Why the deploy refuses a variant the planner says cannot fit, and what would."""
    fixes = "; or ".join(plan.get("suggestions") or [])
    return (f"variant {name} does not fit in GPU memory ({plan['binding'].replace('_', ' ')}, SGLang "
            f"{plan['sglang_version']}, tp_size {plan['tp_size']}, {plan['gpu_memory_gib']} GiB GPUs): {plan['reason']}. "
            + (f"It would fit with: {fixes}. " if fixes else "")
            + "To deploy it anyway: -e memory_override=true (deploy.yml) or sglang_service_memory_override: true")


def _model(path: str, what: str, errors: list[str]) -> dict | None:
    """The model directory (_model_config.read, without the weights), or None with the problem in errors."""
    hidden = _model_config.sandbox_problem(path, what)
    if hidden:
        errors.append(hidden)
    try:
        model = _model_config.read(path, weights=False, what=what)
    except _model_config.ModelConfigError as exc:
        errors.append(str(exc))
        return None
    return None if hidden else model


def resolve(p: dict, name_asked: str, host: dict) -> dict:
    """One variant of the table resolved with the options ``p`` and checked against what
    ``host`` found (the model, the GPUs' memory, the installed version and its --help):
    variant, params, argv, exec_args, memory_plan, memory_warnings, errors."""
    out = dict(variant=name_asked, params={}, argv=[], exec_args="", memory_plan=None, memory_warnings=[], errors=[])
    try:
        name, params = variants_mod.resolve(name_asked, p["variants"], p["aliases"], p["overrides"], p["common"])
    except variants_mod.VariantError as exc:
        out["errors"].append(str(exc))
        return out
    out.update(variant=name, params=params)
    errors = out["errors"]
    errors.extend(variants_mod.check(params))
    max_len = host["max_position_embeddings"]
    ctx = params.get("context_length")
    if max_len and isinstance(ctx, int) and ctx > max_len:
        errors.append(f"context_length {ctx} exceeds the model's max_position_embeddings {max_len}")
    if params.get("draft_model"):
        if not p["draft_model_path"]:
            errors.append(f"variant {name} needs a draft model but draft_model_path is not set")
        else:
            errors.extend(host["draft_errors"])
    if host["errors"]:
        return out
    if host["version"] is not None and not errors:
        out["argv"] = args = variants_mod.argv(params, host["server"], host["version"])
        out["exec_args"] = variants_mod.quote(args)
        if p["check_help"]:
            errors.extend(variants_mod.unsupported(args, host["help"]))
    warnings = out["memory_warnings"]
    if p["memory_plan"] and not p["check_gpus"]:
        warnings.append("the memory plan is skipped: it needs the GPUs' memory, and check_gpus is false")
    elif p["memory_plan"] and not errors:
        try:
            plan = _memplan.plan_resolved(params, p["model_path"], p["draft_model_path"], host["memory"], p["tp_size"],
                                          host["version_text"], p["memory_assumptions"])
        except _memplan.PlanError as exc:
            errors.append(f"memory plan: {exc}")
        else:
            out["memory_plan"] = plan
            if not plan["fits"] and not p["memory_override"]:
                errors.append(memory_refusal(name, plan))
            elif not plan["fits"]:
                warnings.append(f"variant {name} does not fit this host's GPU memory and runs because memory_override "
                                f"is set: {plan['reason']}")
    return out


UNPRIVILEGED_PORT_START = "/proc/sys/net/ipv4/ip_unprivileged_port_start"


def unprivileged_port_start() -> int:
    """The lowest port any local user may bind (the sysctl net.ipv4.ip_unprivileged_port_start;
    1024, the kernel's default, where it cannot be read)."""
    try:
        with open(UNPRIVILEGED_PORT_START, encoding="ascii") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return 1024


def server_address(p: dict) -> tuple[str, int]:
    """Where the server listens: the service's address, or behind the host's gateway (``p["gateway"]``,
    which then takes the service's address) loopback on a port of its own."""
    gateway, slot = p.get("gateway"), p.get("slot")
    if p.get("trial"):
        return "127.0.0.1", int(p["trial"]["port"])
    if gateway and slot:
        return "127.0.0.1", int(slot["port"])
    return ("127.0.0.1", int(gateway["server_port"])) if gateway else (p["bind_host"], p["port"])


def gateway_problems(p: dict) -> list[str]:
    """The gateway's ports: each a port, none the same as another; a fleet's gateway on another host
    (``p["gateway_url"]``): a URL, its control key, a server it can reach, and not beside the host's own."""
    gateway, fleet = p.get("gateway"), p.get("gateway_url")
    if fleet:
        errors = []
        if gateway:
            errors.append("a host's own gateway (sglang_service_gateway) and a fleet's (sglang_service_gateway_url) "
                          "exclude each other")
        if not re.match(r"https?://[^\s/]+", str(fleet)):
            errors.append(f"gateway_url must be an http:// or https:// URL, got {fleet!r}")
        if not p.get("gateway_control_key"):
            errors.append("a fleet's gateway (gateway_url) needs its control key (sglang_service_gateway_control_key)")
        if _prom_targets.loopback(p["bind_host"] or "127.0.0.1"):
            errors.append(f"a gateway on another host cannot reach a server that listens on {p['bind_host']} "
                          f"(sglang_service_bind_host)")
        return errors
    if not gateway:
        return []
    ports = {"port": p["port"], "gateway.server_port": gateway.get("server_port"),
             "gateway.metrics_port": gateway.get("metrics_port")}
    errors = [f"{name} must be in [1, 65535], got {value!r}" for name, value in ports.items()
              if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535]
    if not errors and len(set(ports.values())) < len(ports):
        errors.append(f"the service's port, the server's behind the gateway and the gateway's metrics port must "
                      f"differ, got {ports}")
    return errors


def slot_problems(p: dict) -> list[str]:
    """Two slots (``p["slots"]``) need the host's own gateway and a green port of their own."""
    slots, gateway = p.get("slots"), p.get("gateway")
    if not slots:
        return []
    if not gateway:
        return ["two server slots (sglang_service_slots) need the host's own gateway (sglang_service_gateway: true): "
                "it is what moves the traffic from one slot to the other"]
    port = slots.get("green_port")
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return [f"slots.green_port must be in [1, 65535], got {port!r}"]
    taken = {"port": p["port"], "gateway.server_port": gateway.get("server_port"),
             "gateway.metrics_port": gateway.get("metrics_port")}
    same = [name for name, value in taken.items() if value == port]
    return [f"the green slot's port {port} is also {', '.join(same)}"] if same else []


def memory_used(gpus: list[dict]) -> dict[int, int]:
    """MiB in use now per GPU index, from nvidia-smi's inventory (a GPU it cannot read: 0)."""
    return {g["index"]: g.get("memory_used_mib") or 0 for g in gpus if g.get("index") is not None}


def trial_problems(p: dict) -> list[str]:
    """A tune's two trial ports (``p["trials"]``): ports, different, none the service's, its gateway's or a slot's."""
    trials = p.get("trials")
    if not trials:
        return []
    ports = trials.get("ports")
    if not isinstance(ports, list) or len(ports) != 2 or any(
            isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= 65535 for x in ports):
        return [f"trials.ports must be two ports in [1, 65535] (the reference's, the candidate's), got {ports!r}"]
    if ports[0] == ports[1]:
        return [f"trials.ports must differ, got {ports}"]
    gateway, slots = p.get("gateway") or {}, p.get("slots") or {}
    taken = {"port": p["port"], "gateway.server_port": gateway.get("server_port"),
             "gateway.metrics_port": gateway.get("metrics_port"), "slots.green_port": slots.get("green_port")}
    return [f"the trial port {port} is also {', '.join(n for n, v in taken.items() if v == port)}"
            for port in ports if port in taken.values()]


def trial_decision(p: dict, host: dict, run_command) -> list[dict]:
    """Where a tune's reference and candidate run (``_slots.trial_groups``, its ``mode``): beside the live
    slot that current.json names, on the host manifest's usable GPUs (or the inventory's) that hold less
    than the release threshold now, or, allowed by ``trials.in_place``, in place of the live slot.
    Refused when the service was never deployed (the trial units use its installed --config and logging
    files) or when there is no room. Read-only."""
    service = p["service_name"] if p["service_name"].endswith(".service") else f"{p['service_name']}.service"
    current = _state_files.read_json(os.path.join(p["state_dir"], _slots.base_of(service), "current.json"))
    if not isinstance(current, dict) or not current.get("variant"):
        msg = (f"{service} was never deployed on this host: a tune runs beside the deployed service and its trial "
               "units use its installed --config and logging files; deploy a variant first. Nothing was changed")
        raise Refused(msg, errors=[msg])
    unit = current.get("unit") or service
    live = _slots.live_of(current, service, _process_watch.unit_state(run_command, unit)["active"])
    settings = host["settings"]
    busy: dict[int, int] = {}
    pool = hm.usable_gpus(host.get("manifest"))
    if p["check_gpus"]:
        found = gpu_mod.read_inventory(run_command)
        busy = memory_used(found["gpus"])
        # without a host manifest: the GPUs nvidia-smi can open now
        pool = pool or [g["index"] for g in found["gpus"] if g.get("usable", True) and g.get("index") is not None]
    threshold = int((p.get("settings") or {}).get("sglang_service_release_threshold_mib") or 1024)
    # the inventory's GPUs (sglang_service_gpu_devices) are the live service's: trials go beside them
    found_groups = _slots.trial_groups(live, int(settings["tp_size"] or 0), pool, busy, threshold,
                                       bool(p["check_gpus"]), list(settings["gpu_devices"]),
                                       in_place=bool(p["trials"].get("in_place")))
    if found_groups["groups"] is None:
        msg = f"no room for a tune beside {live['variant'] if live else 'the service'}: {found_groups['why']}. Nothing was changed"
        raise Refused(msg, errors=[msg])
    return [{"role": role, "unit": _slots.trial_unit(service, role), "port": port, "gpus": gpus,
             "why": found_groups["why"], "live": live, "mode": found_groups["mode"]}
            for role, port, gpus in zip(_slots.TRIAL_ROLES, p["trials"]["ports"], found_groups["groups"])]


def slot_decision(p: dict, host: dict, run_command) -> dict | None:
    """Where the candidate runs (``_slots.decide``) when the service has two slots: the live slot read
    from current.json and its unit, the GPUs from the host manifest (or the inventory's) and
    nvidia-smi's memory.used now. None without slots. Read-only; the switch checks it again under
    the deploy lock."""
    slots = p.get("slots")
    service = p["service_name"] if p["service_name"].endswith(".service") else f"{p['service_name']}.service"
    base = _slots.base_of(service)
    current = _state_files.read_json(os.path.join(p["state_dir"], base, "current.json"))
    unit = (current or {}).get("unit") or service
    if not slots or not p.get("gateway"):
        if unit != service:
            msg = (f"the live slot of this service is {current.get('slot')} ({unit}, its current.json), and this deploy "
                   f"has no slots: it would install {service} beside it; keep sglang_service_slots: true (and the "
                   "gateway) on this host. Nothing was changed")
            raise Refused(msg, errors=[msg])
        return None
    live = _slots.live_of(current, service, _process_watch.unit_state(run_command, unit)["active"])
    settings, sources = host["settings"], host.get("sources") or {}
    given = list(settings["gpu_devices"]) if sources.get("gpu_devices") == "override" else None
    busy: dict[int, int] = {}
    if p["check_gpus"] and live is not None and live["active"]:
        busy = memory_used(gpu_mod.read_inventory(run_command)["gpus"])
    ports = {"blue": p["gateway"]["server_port"], "green": slots["green_port"]}
    threshold = int((p.get("settings") or {}).get("sglang_service_release_threshold_mib") or 1024)
    try:
        _name, params = variants_mod.resolve(p["name"], p["variants"], p["aliases"], p["overrides"], p["common"])
    except variants_mod.VariantError:
        params = None  # the variant's own check says what is wrong
    marker = _state_files.read_json(os.path.join(p["state_dir"], base, "switch.json"))
    return _slots.decide(live, params, int(settings["tp_size"] or 0), hm.usable_gpus(host.get("manifest")), given, busy,
                         threshold, bool(p["check_gpus"]), service, ports, marker)


def gateway_key_warning(p: dict) -> str | None:
    """Behind the gateway with an API key, on a server port any local user may bind: the gateway sends
    the key to whoever listens there (its health checks, every few seconds, also while a restart
    leaves the port free); a port below the host's unprivileged range closes that (the unit then
    gets the one capability that binds it)."""
    gateway = p.get("gateway")
    if not gateway or not p.get("api_key"):
        return None
    start = unprivileged_port_start()
    if int(gateway["server_port"]) < start:
        return None
    return (f"the server behind the gateway listens on 127.0.0.1:{gateway['server_port']}, which any local user may "
            f"bind while the server is down (a restart, a switch): the gateway would send it the API key with its "
            f"health checks. A port below {start} (sglang_service_server_port) is one only the server's unit may bind.")


def host_facts(p: dict, run_command) -> dict:
    """What every variant is checked against, read once: the model and draft model directories,
    the unit's paths, the credentials, the GPUs, the installed SGLang and its --help. ``errors``:
    the host's own problems (every variant fails on them)."""
    errors: list[str] = []
    devices = p["gpu_devices"]
    if len(set(devices)) != len(devices) or any(d < 0 for d in devices):
        errors.append(f"gpu_devices must be distinct GPU indexes, got {devices}")
    if p["tp_size"] != len(devices):
        errors.append(f"tp_size {p['tp_size']} does not match the {len(devices)} GPU(s) in gpu_devices {devices}")
    if not 1 <= p["port"] <= 65535:
        errors.append(f"port must be in [1, 65535], got {p['port']}")
    errors.extend(gateway_problems(p))
    errors.extend(slot_problems(p))
    errors.extend(trial_problems(p))
    errors.extend(variants_mod.read_write_path_problems(p["read_write_paths"]))
    model = _model(p["model_path"], "model_path", errors)
    draft_errors: list[str] = []
    if p["draft_model_path"]:
        _model(p["draft_model_path"], "draft_model_path", draft_errors)
    if p["credentials"]:
        refused = _credentials.problem(run_command)
        if refused:
            errors.append(refused)
    memory: list[int] = []
    if p["check_gpus"]:
        memory, problems = gpu_mod.device_memory(run_command, devices)
        errors.extend(problems)
        if not problems and p.get("check_health", True):
            # each GPU against what provisioning recorded (docs/gpu-health.md): a sick one refuses the variant
            errors.extend(_gpu_health.deploy_problems(run_command, devices, p.get("health_baseline")))
    version_text, problem = variants_mod.installed_version(run_command, p["python"])
    if problem:
        errors.append(problem)
    version, help_text = None, ""
    if version_text and not errors:
        try:
            version = variants_mod.parse_version(version_text)
        except variants_mod.VariantError as exc:
            errors.append(str(exc))
        else:
            if p["check_help"]:
                rc, out, err = run_command([p["python"], "-m", "sglang.launch_server", "--help"])
                if rc != 0:
                    errors.append(f"python -m sglang.launch_server --help failed (exit {rc}): {(err or out).strip()[-300:]}")
                    version = None
                help_text = out + err
    server_host, server_port = server_address(p)
    server = dict(model_path=p["model_path"], served_model_name=p["served_model_name"], host=server_host,
                  port=server_port, tp_size=p["tp_size"], draft_model_path=p["draft_model_path"],
                  enable_metrics=p["metrics"])
    return dict(errors=errors, draft_errors=draft_errors, memory=memory, version_text=version_text, version=version,
                help=help_text, server=server,
                max_position_embeddings=model["max_position_embeddings"] if model is not None else None)


def variant(p: dict, run_command) -> dict:
    """``p["name"]`` and, when ``p["baseline"]`` is set, the baseline resolved and checked with the
    same options: sglang_variant's result (the variant's fields, sglang_version, max_position_embeddings,
    url, baseline). The baseline's problems are in its ``errors`` and refuse nothing here."""
    try:
        variants_mod.resolve(p["name"], p["variants"], p["aliases"], p["overrides"], p["common"])
    except variants_mod.VariantError as exc:
        raise Refused(str(exc), errors=[str(exc)]) from exc
    host = host_facts(p, run_command)
    result = resolve(p, p["name"], host)
    name, errors = result["variant"], host["errors"] + result.pop("errors")
    if errors:
        raise Refused(f"variant {name} cannot run on this host: " + "; ".join(errors), errors=errors, variant=name,
                      sglang_version=host["version_text"], memory_plan=result["memory_plan"])
    baseline = None
    if p["baseline"]:
        baseline = dict(resolve(p, p["baseline"], host), sglang_version=host["version_text"],
                        max_position_embeddings=host["max_position_embeddings"])
    server_host, server_port = server_address(p)
    url = _deploy.url_of(["--host", server_host, "--port", str(server_port)])
    # A port below the host's unprivileged range is one no other local user can bind, before the
    # server or while it is down (the API key goes to whoever answers there); the unit then gets
    # the one capability that binds it (templates/sglang.service.j2).
    start = unprivileged_port_start()
    privileged = server_port < start
    if baseline is not None:
        baseline["privileged_port"] = privileged
    gateway = None
    if p.get("gateway"):
        gateway = dict(url=_deploy.url_of(["--host", p["bind_host"], "--port", str(p["port"])]),
                       bind_host=p["bind_host"], port=p["port"], metrics_port=p["gateway"]["metrics_port"],
                       metrics_url=f"http://127.0.0.1:{p['gateway']['metrics_port']}/metrics",
                       server_port=server_port, privileged_port=p["port"] < start)
    out = dict(result, sglang_version=host["version_text"], max_position_embeddings=host["max_position_embeddings"],
               url=url, baseline=baseline, privileged_port=privileged, gateway=gateway, slot=p.get("slot"))
    if p.get("trial"):
        # what a tune renders each candidate's command line with, and plans it against
        out.update(server=host["server"], gpu_memory_mib=host["memory"])
    return out


# -- the model's files -----------------------------------------------------------------

def model_verified(directory: str, verify: str, revision: str | None = None) -> dict:
    """The model directory checked (``verify``: quick or full) against its manifest, or without one
    its safetensors index and headers: path, revision, problems, files, bytes, msg."""
    try:
        manifest = ms.local_manifest(directory) if os.path.isdir(directory) else None
    except ms.StageError as exc:
        raise Refused(f"model {directory}: {exc}", path=directory, problems=[str(exc)]) from exc
    problems = ms.check(directory, manifest, full=verify == "full")
    marker = ms.current(directory)["marker"] or {}
    result = dict(path=directory, revision=marker.get("revision"), problems=problems,
                  files=len(manifest["files"]) if manifest else None,
                  bytes=sum(e["size"] for e in manifest["files"].values()) if manifest else None)
    if revision and marker.get("revision") != revision:
        problems.append(f"it is revision {marker.get('revision') or '(none recorded)'}, not {revision}")
    if problems:
        raise Refused(f"model {directory} fails the {verify} check: " + "; ".join(problems), **result)
    return dict(result, msg=f"model {directory} passes the {verify} check"
                + (f" ({result['files']} files, {result['bytes']} bytes)" if manifest else
                   " (no manifest: the safetensors index and headers)"))
