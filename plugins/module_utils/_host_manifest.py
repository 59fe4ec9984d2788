# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The host manifest: what provisioning proved about a host, for the deploy to trust.

``provision.yml`` writes it at its end (module sglang_host_manifest,
``/etc/inferops-sglang/host.json``, root 0644, no secrets): the usable GPUs and
the unusable ones with the reason, the TP sizes that work and the chosen one
with its devices, the CUDA toolkit, the venv, the installed versions, the exact
environment the runtime probe ran with, and the probe's verdict per build (the
plain SGLang runtime, and the DDTree build when one is installed, named by its
build id). ``deploy.yml`` (role sglang_service, preflight) reads it before
anything on the host changes: TP size, GPUs, python and the unit's environment
come from it unless the inventory or ``-e`` sets them, and a variant whose
build has no passing verdict is refused.

Pure functions (no processes); the only file operations are ``read`` and
``write`` (atomic: a temporary file in the same directory, created exclusively, fsync,
rename).
A second provision run that finds the same host leaves the file untouched:
``same`` compares everything but the provenance and the verdict times.
"""

from __future__ import annotations

import json
import os

from ansible_collections.inferops.sglang.plugins.module_utils import _state_files as state_files

SCHEMA = 1
DEFAULT_PATH = "/etc/inferops-sglang/host.json"
DDTREE_MANIFEST = "/var/lib/inferops-sglang/ddtree/manifest.json"
# The unit sets these itself (its GPUs, its home and cache, its logging): the
# manifest's environment never replaces them.
UNIT_OWNED = ("CUDA_DEVICE_ORDER", "CUDA_VISIBLE_DEVICES", "NO_PROXY", "no_proxy", "HOME", "XDG_CACHE_HOME",
              "PYTHONUNBUFFERED", "SGLANG_LOGGING_CONFIG_PATH")
# The python a deploy uses when there is no manifest and none is set.
FALLBACK_PYTHON = "/opt/sglang/venv/bin/python"
# Variant parameters that need the DDTree build (plugins/module_utils/_variants.py:
# speculative_algorithm DDTREE; ddtree_shadow_linear and ddtree_budget only exist there).
DDTREE_ALGORITHMS = ("DDTREE",)
_VOLATILE = ("written",)


class ManifestError(Exception):
    """The manifest cannot be used; the message says why and what to do."""


class ManifestMissing(ManifestError):
    """There is no manifest on the host."""


# -- building it (provision) ---------------------------------------------------

def _gpu_entry(gpu: dict) -> dict:
    entry = {"index": gpu.get("index"), "uuid": gpu.get("uuid"), "name": gpu.get("name"),
             "memory_mib": gpu.get("memory_total_mib"), "pci_bus_id": gpu.get("pci_bus_id"),
             "compute_capability": gpu.get("compute_capability"), "device_minor": gpu.get("device_minor")}
    if gpu.get("health") is not None:
        # the counters and Xid events a deploy's check compares with (_gpu_health.judge)
        entry["health"] = gpu["health"]
    return entry


def gpus_section(facts: dict | None) -> dict:
    """The GPU part from gpu_facts' ``inferops_gpus``: usable ones, unusable ones with the reason, TP."""
    facts = facts or {}
    gpus = facts.get("gpus") or []
    tp = facts.get("tp") or {}
    return {
        "driver_version": facts.get("driver_version"),
        "driver_cuda_version": facts.get("cuda_version"),
        "count": len(gpus),
        "usable": [_gpu_entry(g) for g in gpus if g.get("usable")],
        "unusable": [dict(_gpu_entry(g), state=g.get("state"), reason=g.get("problem")) for g in gpus if not g.get("usable")],
        "selected": list(facts.get("selected") or []),
        "cuda_visible_devices": facts.get("cuda_visible_devices") or "",
        "tp": {"valid": list(tp.get("valid") or []), "chosen": tp.get("chosen"), "devices": list(tp.get("devices") or []),
               "cuda_visible_devices": tp.get("cuda_visible_devices") or ""},
        # where the kernel log was read up to (_gpu_health.cursor): a deploy judges the Xid events after it
        "kernel_log": facts.get("kernel_log"),
    }


def probe_environment(probe: dict | None, extra: dict | None = None) -> tuple[dict, str]:
    """(environment, source): the probe's own ``environment`` (every variable it ran with), or,
    from a probe that does not report it, its LD_LIBRARY_PATH and the extra variables it was given."""
    probe = probe or {}
    if isinstance(probe.get("environment"), dict):
        return {str(k): str(v) for k, v in probe["environment"].items()}, "probe"
    env = {str(k): str(v) for k, v in (extra or {}).items()}
    if probe.get("ld_library_path"):
        env["LD_LIBRARY_PATH"] = str(probe["ld_library_path"])
    return env, ("reconstructed" if probe else "none")


def ddtree_installed(ddtree_manifest: dict | None) -> dict | None:
    """The DDTree build in place, from the ddtree_build role's manifest: None when none is applied."""
    if not ddtree_manifest or ddtree_manifest.get("state") != "applied" or not ddtree_manifest.get("build_id"):
        return None
    site = ddtree_manifest.get("site_packages") or ""
    files = [os.path.join(site, f["path"]) for f in ddtree_manifest.get("files") or [] if f.get("path")]
    return {"build_id": ddtree_manifest["build_id"], "source": ddtree_manifest.get("source"),
            "sglang_version": ddtree_manifest.get("sglang_version"), "applied_at": ddtree_manifest.get("applied_at"),
            "files": files}


def _probe_errors(probe: dict) -> list[str]:
    errors = [str(e) for e in probe.get("errors") or []]
    if not errors and probe.get("failed"):
        errors = [str(probe.get("msg") or "the runtime probe failed")]
    return errors


def attribute(errors: list[str], build_files: list[str], unresolved: list[dict] | None = None) -> tuple[list[str], list[str]]:
    """(errors of SGLang itself, errors of the DDTree build alone). An error is the build's when it
    names one of its files (or says it is the DDTree build's); every other error breaks SGLang
    itself, and so the build too. A library that does not resolve (the probe's
    ``dependencies.unresolved``, one error per name: "<name> needed by ...") is the build's only
    when every file that needs it is the build's."""
    markers = [f for f in build_files if f] + ["DDTree build"]
    markers += [os.path.basename(f) for f in build_files if f and "." in os.path.basename(f)]
    by_name: dict[str, set] = {}
    for entry in unresolved or []:
        if isinstance(entry, dict) and entry.get("name"):
            by_name.setdefault(entry["name"], set()).add(entry.get("build") == "ddtree" or entry.get("needed_by") in build_files)
    own = []
    for error in errors:
        name = error.split(" needed by ", 1)[0] if " needed by " in error else None
        if name in by_name:
            if by_name[name] == {True}:
                own.append(error)
        elif any(m in error for m in markers):
            own.append(error)
    return [e for e in errors if e not in own], own


def verdicts(probe: dict | None, sglang_version: str | None, ddtree: dict | None, now: str,
             checks: list[str] | None = None) -> dict:
    """The probe's verdict per build: ``sglang`` (the plain runtime) and, with a DDTree build in
    place, ``ddtree``: each {name, ok, errors, checks, proved_at}. ok is None when no probe ran."""
    name = f"sglang {sglang_version}" if sglang_version else "sglang"
    if not probe or probe.get("skipped"):
        reason = "the runtime probe did not run (provision.yml --check, or sglang_runtime_probe false)"
        out = {"sglang": {"name": name, "ok": None, "errors": [reason], "checks": [], "proved_at": now}}
        if ddtree:
            out["ddtree"] = {"name": f"ddtree {ddtree['build_id'][:12]}", "build_id": ddtree["build_id"], "ok": None,
                             "errors": [reason], "checks": [], "proved_at": now}
        return out
    errors = _probe_errors(probe)
    checks = list(checks or probe.get("checks") or probe.get("invocation", {}).get("module_args", {}).get("checks")
                  or ["all"])
    deps = probe.get("dependencies") or {}
    files = list((ddtree or {}).get("files") or []) + list(deps.get("build_files") or [])
    own_sglang, own_ddtree = attribute(errors, files if ddtree else [], deps.get("unresolved") if ddtree else None)
    out = {"sglang": {"name": name, "ok": not own_sglang, "errors": own_sglang, "checks": checks, "proved_at": now}}
    if ddtree:
        verdict = {"name": f"ddtree {ddtree['build_id'][:12]}", "build_id": ddtree["build_id"],
                   "ok": not errors, "errors": own_sglang + own_ddtree, "checks": checks, "proved_at": now}
        probed = (probe.get("ddtree_build") or {}).get("build_id")
        if probed and probed != ddtree["build_id"]:
            verdict.update(ok=None, errors=[f"the probe ran with the DDTree build {probed[:12]}, not the one in place"])
        out["ddtree"] = verdict
    return out


def rejected_build(rejected: dict | None) -> dict | None:
    """The DDTree build the ddtree_build role rejected and rolled back (its ``ddtree_build_facts``
    with verdict ``rejected``): {build_id, errors, checks, restored}, or None."""
    if not rejected or rejected.get("verdict", "rejected") != "rejected" or not rejected.get("build_id"):
        return None
    return {"build_id": str(rejected["build_id"]),
            "errors": [str(e) for e in rejected.get("errors") or []] or ["rejected by the runtime probe"],
            "checks": [str(c) for c in rejected.get("checks") or []],
            "restored": rejected.get("restored") or None}


def build(gpus: dict | None, cuda: dict, runtime: dict, probe: dict | None, ddtree_manifest: dict | None,
          provenance: dict, now: str, extra_environment: dict | None = None, checks: list[str] | None = None,
          rejected: dict | None = None) -> dict:
    """The manifest of a host from what provisioning found (see the module's documentation).

    ``rejected``: the ddtree_build role's facts on a build it rejected and rolled back. With no
    build in place after the rollback, the DDTree build's verdict is that build's failure (its id
    and errors); with the previous build restored, the verdict is the probe's on the restored one.
    Either way ``ddtree_rejected`` names the rejected build and why."""
    runtime = runtime or {}
    installed = dict(runtime.get("installed") or (probe or {}).get("installed") or {})
    environment, source = probe_environment(probe, extra_environment)
    ddtree = ddtree_installed(ddtree_manifest)
    venv = runtime.get("venv") or os.path.dirname(os.path.dirname(runtime.get("python") or FALLBACK_PYTHON))
    builds = verdicts(probe, installed.get("sglang"), ddtree, now, checks)
    refused = rejected_build(rejected)
    if refused and ddtree is None:
        builds["ddtree"] = {"name": f"ddtree {refused['build_id'][:12]}", "build_id": refused["build_id"], "ok": False,
                            "errors": refused["errors"], "checks": refused["checks"], "proved_at": now}
    manifest = {
        "schema": SCHEMA,
        "written": {"at": now, **{k: v for k, v in (provenance or {}).items() if v not in (None, "")}},
        "gpus": gpus_section(gpus) if gpus is not None else None,
        "cuda": {"version": (cuda or {}).get("version"), "home": (cuda or {}).get("home")},
        "venv": {"path": venv, "python": runtime.get("python") or os.path.join(venv, "bin", "python")},
        "installed": installed,
        "environment": environment,
        "environment_source": source,
        "ddtree": {k: v for k, v in ddtree.items() if k != "files"} if ddtree else None,
        "builds": builds,
    }
    if refused:
        manifest["ddtree_rejected"] = refused
    return manifest


def _stable(manifest: dict) -> dict:
    data = {k: v for k, v in manifest.items() if k not in _VOLATILE}
    data["builds"] = {name: {k: v for k, v in (verdict or {}).items() if k != "proved_at"}
                      for name, verdict in (manifest.get("builds") or {}).items()}
    return data


def same(old: dict | None, new: dict) -> bool:
    """Whether two manifests say the same about the host (provenance and verdict times aside)."""
    return old is not None and _stable(old) == _stable(new)


def dumps(manifest: dict) -> str:
    return json.dumps(manifest, indent=2, sort_keys=True) + "\n"


# -- validating, reading and writing it ------------------------------------------

def validate(data) -> list[str]:
    """Every problem of a manifest's shape (an empty list: usable)."""
    if not isinstance(data, dict):
        return [f"the manifest is not a JSON object (it holds a {type(data).__name__})"]
    problems = []
    if data.get("schema") != SCHEMA:
        problems.append(f"schema {data.get('schema')!r} is not {SCHEMA} (written by another version of the collection: "
                        "run provision.yml again)")
        return problems
    for key, kind in (("written", dict), ("cuda", dict), ("venv", dict), ("installed", dict), ("environment", dict),
                      ("builds", dict)):
        if not isinstance(data.get(key), kind):
            problems.append(f"{key} is missing or not a {kind.__name__}")
    gpus = data.get("gpus")
    if gpus is not None:
        if not isinstance(gpus, dict) or not isinstance(gpus.get("usable"), list) or not isinstance(gpus.get("tp"), dict):
            problems.append("gpus must hold usable (a list) and tp (a dict)")
        else:
            usable = {g.get("index") for g in gpus["usable"] if isinstance(g, dict)}
            devices = gpus["tp"].get("devices") or []
            if any(d not in usable for d in devices):
                problems.append(f"gpus.tp.devices {devices} are not all usable ({sorted(i for i in usable if i is not None)})")
            chosen = gpus["tp"].get("chosen")
            if chosen is not None and chosen != len(devices):
                problems.append(f"gpus.tp.chosen {chosen} does not match the {len(devices)} device(s) {devices}")
    if isinstance(data.get("venv"), dict) and not str(data["venv"].get("python") or "").startswith("/"):
        problems.append("venv.python is not an absolute path")
    if isinstance(data.get("environment"), dict) and not all(isinstance(v, str) for v in data["environment"].values()):
        problems.append("environment values must be strings")
    for name, verdict in (data.get("builds") or {}).items() if isinstance(data.get("builds"), dict) else ():
        if not isinstance(verdict, dict) or "ok" not in verdict or not isinstance(verdict.get("errors", []), list):
            problems.append(f"builds.{name} must hold ok and errors")
    return problems


def parse(text: str, path: str = DEFAULT_PATH) -> dict:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ManifestError(f"the host manifest {path} is not valid JSON ({exc}): run provision.yml again") from exc
    problems = validate(data)
    if problems:
        raise ManifestError(f"the host manifest {path} is not usable: {'; '.join(problems)}")
    return data


def read(path: str = DEFAULT_PATH) -> dict:
    """The manifest at ``path``, validated. ManifestMissing when there is none."""
    try:
        with open(path, "r", encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError as exc:
        raise ManifestMissing(f"{path} does not exist: this host was not provisioned (run provision.yml first)") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ManifestError(f"the host manifest {path} is not readable ({exc})") from exc
    return parse(text, path)


def read_optional(path: str) -> dict | None:
    """The manifest, or None when there is none; an unusable one raises."""
    try:
        return read(path)
    except ManifestMissing:
        return None


def write(path: str, manifest: dict, mode: int = 0o644) -> None:
    """Write atomically (``_state_files.write_atomic``): a temporary file beside it, created
    exclusively, fsync, chmod, rename, fsync the directory."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    state_files.write_atomic(path, dumps(manifest), mode, sync_dir=True)


# -- what a deploy takes from it -----------------------------------------------

def _unset(value) -> bool:
    return value is None or value == "" or value == []


def usable_gpus(manifest: dict | None) -> list[int]:
    """Every GPU provisioning found usable, in the manifest's order (a second slot may take any of them)."""
    return [g.get("index") for g in ((manifest or {}).get("gpus") or {}).get("usable") or []]


def gpu_pool(manifest: dict | None) -> list[int]:
    """The GPUs a deploy may take, in order: the manifest's selected ones that are usable, else every usable one."""
    usable = usable_gpus(manifest)
    return [i for i in (((manifest or {}).get("gpus") or {}).get("selected") or usable) if i in usable] or usable


def settings(manifest: dict | None, tp_size=None, gpu_devices=None, python=None, environment: dict | None = None,
             use_environment: bool = True) -> tuple[dict, dict, list[str], list[str]]:
    """(settings, source of each, problems, warnings) for a deploy.

    Precedence, per setting: a value given (the inventory, a play or -e set it) wins; else the
    manifest's. tp_size given alone takes the first tp_size of the manifest's usable (selected)
    GPUs; gpu_devices given alone makes tp_size their count. ``environment`` (the role's extra
    variables) is laid over the manifest's proven environment, variable by variable; the
    variables the unit sets itself (UNIT_OWNED) are left out of the manifest's. An override on a
    GPU provisioning found unusable, or of a TP size it did not find valid, is a warning.
    """
    problems: list[str] = []
    sources: dict[str, str] = {}
    gpus = (manifest or {}).get("gpus") or {}
    tp = gpus.get("tp") or {}
    pool = gpu_pool(manifest)

    if not _unset(gpu_devices):
        if isinstance(gpu_devices, str):  # -e sglang_service_gpu_devices=0,2
            gpu_devices = [part for part in gpu_devices.replace(" ", "").split(",") if part]
        elif isinstance(gpu_devices, int) and not isinstance(gpu_devices, bool):  # -e sglang_service_gpu_devices=10
            gpu_devices = [gpu_devices]
        try:
            devices = [int(d) for d in gpu_devices]
        except (TypeError, ValueError):
            devices = []
            problems.append(f"sglang_service_gpu_devices must be a list of GPU indexes, got {gpu_devices!r}")
        sources["gpu_devices"] = "override"
    else:
        devices = None
    if not _unset(tp_size):
        try:
            size = int(tp_size)
        except (TypeError, ValueError):
            size = None
            problems.append(f"sglang_service_tp_size must be an integer, got {tp_size!r}")
        sources["tp_size"] = "override"
    else:
        size = None

    if size is None and devices is None:
        if manifest is None or tp.get("chosen") is None:
            problems.append("no TP size and GPUs: the host manifest has none (run provision.yml) and "
                            "sglang_service_tp_size / sglang_service_gpu_devices are not set")
        else:
            size, devices = tp["chosen"], list(tp.get("devices") or [])
            sources.update(tp_size="manifest", gpu_devices="manifest")
    elif devices is None and size is not None:
        if manifest is None:
            problems.append(f"sglang_service_tp_size {size} is set but not sglang_service_gpu_devices, and there is "
                            "no host manifest to take the GPUs from")
        elif size > len(pool):
            problems.append(f"sglang_service_tp_size {size} needs {size} GPUs; the host manifest has {len(pool)} usable "
                            f"({pool})")
        else:
            devices = pool[:size]
            sources["gpu_devices"] = "manifest"
    elif size is None and devices is not None:
        size = len(devices)
        sources["tp_size"] = "gpu_devices"

    # An override wins: what provisioning saw then is a warning here (the variant's own
    # check asks nvidia-smi now, and fails a GPU that is still lost, with its words).
    warnings: list[str] = []
    if manifest is not None and devices and sources.get("gpu_devices") == "override":
        unusable = {g.get("index"): g.get("reason") for g in gpus.get("unusable") or []}
        for device in devices:
            if device in unusable:
                warnings.append(f"GPU {device} was unusable when the host was provisioned: {unusable[device]}")
    if manifest is not None and size is not None and "override" in (sources.get("tp_size"), sources.get("gpu_devices")):
        if tp.get("valid") and size not in tp["valid"]:
            warnings.append(f"tp_size {size} is not among the TP sizes provisioning found valid on this host "
                            f"({', '.join(str(v) for v in tp['valid'])})")

    if not _unset(python):
        chosen_python, sources["python"] = str(python), "override"
    elif manifest is not None:
        chosen_python, sources["python"] = manifest["venv"]["python"], "manifest"
    else:
        chosen_python, sources["python"] = FALLBACK_PYTHON, "default"

    proven = dict((manifest or {}).get("environment") or {}) if use_environment else {}
    env = {k: v for k, v in proven.items() if k not in UNIT_OWNED}
    env.update({str(k): str(v) for k, v in (environment or {}).items()})
    sources["environment"] = "manifest" if proven else "none"
    return ({"tp_size": size, "gpu_devices": devices or [], "python": chosen_python, "environment": env},
            sources, problems, warnings)


def device_minors(manifest: dict | None) -> dict[int, int]:
    """GPU index -> device minor (its ``/dev/nvidia<minor>``), for each GPU the manifest
    recorded a minor of (gpu_facts read it from ``/proc/driver/nvidia/gpus/<bus id>/information``)."""
    gpus = (manifest or {}).get("gpus") or {}
    found: dict[int, int] = {}
    for gpu in list(gpus.get("usable") or []) + list(gpus.get("unusable") or []):
        if not isinstance(gpu, dict):
            continue
        index, minor = gpu.get("index"), gpu.get("device_minor")
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (index, minor)) and minor >= 0:
            found[index] = minor
    return found


def gpu_nodes(devices: list[int], manifest_minors: dict[int, int],
              probed_minors: dict[int, int | None] | None = None) -> tuple[list[str], list[str]]:
    """(the ``/dev/nvidia<minor>`` node of each GPU index in ``devices``, where each minor came from).

    The minor is the manifest's, else the one read on the host now (``probed_minors``: procfs
    through _gpu.device_minor), else the index (a host whose driver shows no
    ``/proc/driver/nvidia/gpus``, as a lab host; gpu_facts makes the same choice). The index is
    only the ordering nvidia-smi and CUDA_VISIBLE_DEVICES use (PCI bus order): the minor the
    driver gave a GPU can differ, and DeviceAllow= names the node."""
    nodes, sources = [], []
    probed = probed_minors or {}
    for device in devices:
        probed_minor = probed.get(device)
        if device in manifest_minors:
            minor, source = manifest_minors[device], "manifest"
        elif probed_minor is not None:
            minor, source = probed_minor, "procfs"
        else:
            minor, source = device, "index"
        nodes.append(f"/dev/nvidia{minor}")
        sources.append(source)
    return nodes, sources


def build_needed(params: dict) -> str:
    """The build a variant needs: ``ddtree`` (DDTree speculative decoding, a patched build) or ``sglang``."""
    algorithm = str(params.get("speculative_algorithm") or "").upper()
    if algorithm in DDTREE_ALGORITHMS or params.get("ddtree_shadow_linear") or params.get("ddtree_budget"):
        return "ddtree"
    return "sglang"


def refusal(variant: str, params: dict, manifest: dict, installed_ddtree: dict | None = None) -> str | None:
    """Why a variant must not be deployed on this host per its manifest, or None.

    The variant's build needs a passing verdict; for a DDTree variant the build in place now
    (the ddtree_build manifest) must also be the one that verdict is about."""
    needed = build_needed(params)
    verdict = (manifest.get("builds") or {}).get(needed)
    path_hint = "run provision.yml again"
    if needed == "ddtree":
        proved = (manifest.get("ddtree") or {}).get("build_id")
        now_id = (installed_ddtree or {}).get("build_id")
        # a build rejected and rolled back leaves none in place, and its failed verdict
        rolled_back = verdict is not None and verdict.get("ok") is False and not proved
        if verdict is None or (not proved and not rolled_back):
            return (f"variant {variant} needs the DDTree build, and the host manifest records none: "
                    f"provision.yml with ddtree_build_src_dir lays it and probes it")
        if installed_ddtree is not None and now_id != proved:
            probed = proved[:12] if proved else f"none: {verdict.get('build_id', '')[:12]} was rejected and rolled back"
            return (f"variant {variant} needs the DDTree build, and the one in place now ({(now_id or 'none')[:12]}) is not "
                    f"the one provisioning probed ({probed}): {path_hint}")
    if verdict is None:
        return f"variant {variant} needs {needed}, which the host manifest has no verdict for: {path_hint}"
    if verdict.get("ok") is True:
        return None
    why = "; ".join(verdict.get("errors") or []) or "no reason recorded"
    state = "was not probed" if verdict.get("ok") is None else "failed the runtime probe"
    return (f"variant {variant} needs {verdict.get('name') or needed}, which {state} when the host was provisioned "
            f"({verdict.get('proved_at')}): {why}. Fix it and {path_hint}, or deploy a variant whose build passed")
