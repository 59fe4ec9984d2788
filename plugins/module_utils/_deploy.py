# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The decisions of a deploy, pure: its outcomes, whether to switch, the restore plan, the
record and its summary. The states that act on them are _switch.py's (docs/switch-state-machine.md).

A deploy of one host ends in one of these outcomes::

    preflight --refused--> failed_before_switching        (nothing changed)
        |
    decide --same files, service active, gate ready--> unchanged
        |
    marker written, known-good saved, variant stopped, staged files installed, started
        |
    gate --ready--> switched
        |
    restore plan (known-good copy, else the baseline rendered from the table), started
        |
    rollback gate --ready--> rolled_back
                  --else---> rollback_failed                (every file kept, marker kept)

and, blue/green (two slots, the candidate beside the live one): ``refused`` (the candidate
failed before the cut-over; the live slot never stopped serving), ``switched``, or after the
cut-over ``rolled_back`` (the traffic given back to the old slot, still loaded) or
``rollback_failed`` (the gateway did not take it back).

and ``not_reached`` for a host of the rollout that a stopped rollout never got
to. The switch (_switch, run by the sglang_switch module) and the deploy_summary
callback both take the outcomes, the decision, the restore plan, the record and
its summary from here. Pure: no I/O, everything is passed in.
"""

from __future__ import annotations

import re

from ansible_collections.inferops.sglang.plugins.module_utils import _bench
from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_metrics
# url_of: a server's URL from its flags, where every reader of a URL (the gateway's launcher too) finds it
from ansible_collections.inferops.sglang.plugins.module_utils._http import url_of

OUTCOMES = {
    "switched": "switched",
    "unchanged": "unchanged",
    "rolled_back": "rolled back",
    "rollback_failed": "ROLLBACK FAILED",
    "failed_before_switching": "failed before switching",
    "refused": "refused, live untouched",
    "not_reached": "not reached",
}
# Outcomes a deploy record on the host can carry (the last two of OUTCOMES are the
# callback's), as the metrics count them: one list.
RECORDED = _deploy_metrics.OUTCOMES

# The record's keys, in order (history.jsonl, set_stats inferops_deploy).
RECORD_KEYS = ("time", "host", "service", "run_id", "variant", "from", "params", "argv", "sglang_version",
               "ddtree_build", "memory_plan", "gpu_devices", "repaired_interrupted_run", "lock", "outcome", "running",
               "verdict", "plan_check", "restore", "rollback", "attempt", "controller_user", "drain", "rotation", "performance",
               "gateway", "slot")
# What the record keeps of the drain before the stop (sglang_drain) and of the rotation hooks
DRAIN_KEYS = ("drained", "timed_out", "seconds", "timeout", "in_flight_at_start", "in_flight_at_stop",
              "running_at_stop", "waiting_at_stop", "endpoint", "error", "msg")
# What the record keeps of the gateway's part: its URL, the server's worker URL, the answers of taking
# the old server out and putting the new one in (and, after a rollback, the restored one), the
# seconds clients had no server behind the gateway, and the clients' requests it answered meanwhile
# (answered, failed: from its own metrics)
GATEWAY_KEYS = ("url", "worker", "out", "in", "unavailable_s", "requests", "error")
VERDICT_KEYS = ("ready", "phase", "failure", "cause", "cause_line", "evidence", "elapsed", "since_start", "stage",
                "generation", "server", "msg")
PLAN_KEYS = ("fits", "binding", "reason", "mem_fraction_static", "mem_fraction_static_range", "max_total_tokens",
             "full_context_requests", "max_running_requests", "chunked_prefill_size", "cuda_graph_max_bs",
             "context_length", "sglang_version")
# The planner's figures against what the ready server resolved (the gate's /server_info
# figures): (plan key, server key, how far apart they may be). A relative tolerance for
# the counts (the planner rounds its estimates of activations and graphs), an absolute one
# for the fraction, none for what must be equal.
PLAN_TOLERANCE = 0.10
_PLAN_FIGURES = (("max_total_tokens", "max_total_tokens", "relative"),
                 ("max_running_requests", "max_running_requests", "relative"),
                 ("chunked_prefill_size", "chunked_prefill_size", "exact"),
                 ("cuda_graph_max_bs", "cuda_graph_max_bs", "exact"),
                 ("mem_fraction_static", "mem_fraction_static", "absolute"),
                 ("context_length", "context_length", "exact"),
                 ("sglang_version", "version", "exact"))
_MFS_TOLERANCE = 0.01
DDTREE_KEYS = ("state", "build_id", "source", "sglang_version", "applied_at", "applied_by", "reverted_at", "reverted_by")


class DeployStateError(ValueError):
    """Inputs the state machine cannot decide on."""


def differing(names: list[str], staged: list[str | None], installed: list[str | None]) -> list[str]:
    """The staged files that differ from the installed ones (checksums; None: absent)."""
    if not len(names) == len(staged) == len(installed):
        raise DeployStateError("names, staged and installed must have the same length")
    return [name for name, new, old in zip(names, staged, installed) if new is None or new != old]


def switch_reasons(differ: list[str], active: bool, interrupted: bool) -> list[str]:
    """Why the service must be switched; empty: it is already what was asked.
    ``differ``: the files this run renders differently from the installed ones."""
    reasons = []
    if differ:
        reasons.append("differs from what is installed: " + ", ".join(differ))
    if not active:
        reasons.append("the service is not active")
    if interrupted:
        reasons.append("an earlier switch was interrupted (switch.json is there)")
    return reasons


def argument_checks(before: dict, variant: dict, baseline: dict | None, gpus: list) -> list[dict]:
    """The command lines the host's own SGLang argues before a switch (sglang_server_args), each
    once, in this order, with the first label it has: the variant's, then the rollback target's
    (the service running now, the known-good one an earlier deploy saved, or on a host's first
    deploy the baseline variant). ``before``: what sglang_deploy_lock's inspect returns; ``variant`` and
    ``baseline``: the preflight's resolution; ``gpus``: the validated GPU list.

    A command line the active service runs under the SGLang installed now is not argued: that
    SGLang took it when the service started. The variant's is not either when it is that very
    service on the same GPUs, not left half-switched (a re-deploy): on a GPU host that is one
    import of SGLang, 10-20 s, off every deploy that changes nothing. (The unit's extra
    environment is not compared: a change of it alone goes to the gate unargued.)"""
    running = before.get("argv") if before.get("active") else None
    proven = running if running and before.get("sglang_version") == variant.get("sglang_version") else None
    variant_proven = (proven is not None and proven == variant.get("argv") and not before.get("interrupted")
                      and list(before.get("gpu_devices") or []) == list(gpus))
    candidates = [
        (f"variant {variant.get('variant')}", variant.get("argv"), variant_proven),
        (f"rollback target {before.get('variant')} (running now)", running, True),
        (f"rollback target {before.get('known_good_variant')} (known-good)", before.get("known_good_argv"), True),
        (f"rollback target {(baseline or {}).get('variant')} (baseline)",
         None if before.get("known_good") else (baseline or {}).get("argv"), True),
    ]
    checks: list[dict] = []
    for label, argv, skip_when_proven in candidates:
        if not argv or (skip_when_proven and argv == proven) or any(c["argv"] == argv for c in checks):
            continue
        checks.append({"label": label, "argv": argv})
    return checks


def restore_plan(known_good: dict[str, bool], known_good_record: dict | None, saved_this_run: bool,
                 baseline: str, files: list[dict], current_url: str, baseline_gate_timeout: float | None = None) -> dict:
    """What a failed switch restores, and how the restored service is gated.

    ``known_good`` maps each file name of ``files`` (name, src, mode) to whether
    known-good/ holds it; ``saved_this_run``: the running service passed the
    pre-gate and was saved before it was stopped. The known-good copy is
    restored when it holds the unit (saved now, or by an earlier deploy);
    otherwise (a host's first deploy, or a service that was already down with
    nothing saved) the baseline variant is rendered from the table.

    A known-good service is gated as itself: on its own URL (from its recorded
    flags) and with the key of its own --config file, which may both differ
    from the settings of this run (a key or port change with a failing variant), and waited
    for as long as its own record says; a service with no record of it (one the role did not
    install) and the baseline get the baseline's own gate timeout, never the failed variant's."""
    unit = files[0]["name"] if files else None
    if unit and known_good.get(unit):
        restore = [f for f in files if known_good.get(f["name"])
                   and (f["name"] != "current.json" or known_good_record is not None)]
        config = [f["src"] for f in restore if f["src"].endswith((".yaml", ".yml"))]
        variant = (known_good_record or {}).get("variant")
        return {
            "source": "known_good",
            "variant": variant or "the previous (unmanaged) service",
            "saved_this_run": bool(saved_this_run),
            "files": restore,
            "url": url_of((known_good_record or {}).get("argv"), current_url),
            "api_key_file": config[0] if config else None,
            "gate_timeout": ((known_good_record or {}).get("params") or {}).get("gate_timeout") or baseline_gate_timeout,
        }
    return {"source": "baseline", "variant": baseline, "saved_this_run": False, "files": [], "url": current_url,
            "api_key_file": None, "gate_timeout": baseline_gate_timeout}


def outcome(gate_ready: bool, rollback_ready: bool | None) -> str:
    """The outcome of a switch: the variant's gate, then the rollback's."""
    if gate_ready:
        return "switched"
    return "rolled_back" if rollback_ready else "rollback_failed"


def running(outcome_name: str, variant: str, rollback: dict | None, steady_ready: bool = False,
            live: str | None = None) -> str | None:
    """What serves after the deploy: never a variant the last gate did not pass (``live``: the variant a
    refused candidate ran beside, which kept serving)."""
    if outcome_name == "switched":
        return variant
    if outcome_name == "refused":
        return live
    if outcome_name == "unchanged":
        return variant if steady_ready else None
    if outcome_name == "rolled_back" and (rollback or {}).get("ready"):
        return rollback.get("variant")
    return None


def _pick(data: dict | None, keys: tuple[str, ...]) -> dict | None:
    if not data:
        return None
    return {k: data[k] for k in keys if k in data}


def verdict(result: dict | None, outcome_name: str, failed_task: str | None = None) -> dict:
    """The gate's verdict kept in the record; a failure outside the gate (a task
    of the switch) is named with its task."""
    result = dict(result or {})
    out = {k: result.get(k) for k in VERDICT_KEYS}
    out["ready"] = bool(result.get("ready"))
    out["evidence"] = result.get("evidence") or []
    out["msg"] = str(result.get("msg") or "")
    if outcome_name not in ("switched", "unchanged") and not result.get("failure"):
        out["failure"] = "task_failed"
        out["msg"] = f'task "{failed_task or "?"}" failed: {out["msg"]}'
    return out


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def plan_check(plan: dict | None, server: dict | None, tolerance: float = PLAN_TOLERANCE) -> dict | None:
    """The planner's figures beside the server's own, and which differ by more
    than their tolerance; None when either side is missing (no plan, not ready,
    /server_info not answered)."""
    if not plan or not server:
        return None
    server = dict(server)
    graphs = server.get("cuda_graph_bs")
    server["cuda_graph_max_bs"] = max(graphs) if isinstance(graphs, list) and graphs else (0 if graphs == [] else None)
    figures, differs = {}, []
    for plan_key, server_key, kind in _PLAN_FIGURES:
        planned, actual = plan.get(plan_key), server.get(server_key)
        if planned is None or actual is None:
            continue
        if kind == "exact" or not (_number(planned) and _number(actual)):
            off = str(planned) != str(actual)
        elif kind == "absolute":
            off = abs(actual - planned) > _MFS_TOLERANCE
        else:
            off = abs(actual - planned) > tolerance * abs(planned)
        figures[plan_key] = {"planned": planned, "server": actual}
        if off:
            differs.append(plan_key)
    text = "; ".join(f"{k}: planned {figures[k]['planned']}, server {figures[k]['server']}" for k in differs)
    return {"tolerance": tolerance, "figures": figures, "differs": differs,
            "msg": f"the server resolved other figures than planned ({text})" if differs else "the server resolved the planned figures"}


def rotation_of(hooks) -> dict | None:
    """What the record keeps of the rotation hooks' results (out, in): ok and msg each."""
    return {k: {"ok": bool(v.get("ok")), "msg": str(v.get("msg", ""))}
            for k, v in (hooks or {}).items() if k in ("out", "in") and isinstance(v, dict)} or None


def record(fields: dict) -> dict:
    """The deploy record (history.jsonl and set_stats), every key of
    RECORD_KEYS. ``fields`` holds them raw: ``verdict`` as the gate returned it,
    ``memory_plan`` and ``ddtree_build`` whole; ``outcome`` is checked."""
    name = fields.get("outcome")
    if name not in RECORDED:
        raise DeployStateError(f"outcome must be one of {', '.join(RECORDED)}, got {name!r}")
    rollback = fields.get("rollback")
    if name in ("rolled_back", "rollback_failed") and not rollback:
        raise DeployStateError(f"a {name} record needs the rollback")
    if name == "rolled_back" and not rollback.get("ready"):
        raise DeployStateError("rolled_back with a rollback that is not ready: that is rollback_failed")
    plan = fields.get("memory_plan")
    out = {key: fields.get(key) for key in RECORD_KEYS}
    out["memory_plan"] = None if not plan else dict(_pick(plan, PLAN_KEYS), override=plan.get("fits") is False)
    out["ddtree_build"] = _pick(fields.get("ddtree_build"), DDTREE_KEYS)
    out["drain"] = _pick(fields.get("drain"), DRAIN_KEYS) or None
    out["rotation"] = rotation_of(fields.get("rotation"))
    out["gateway"] = _pick(fields.get("gateway"), GATEWAY_KEYS) or None
    perf = fields.get("performance") or {}
    out["performance"] = _bench.gate_record(perf.get("mode") or "off", perf.get("result"), perf.get("known_good"),
                                            perf.get("why_report")) if isinstance(perf, dict) else None
    out["verdict"] = verdict(fields.get("verdict"), name, fields.get("failed_task"))
    tolerance = fields.get("plan_tolerance")
    out["plan_check"] = plan_check(plan, out["verdict"].get("server"),
                                   PLAN_TOLERANCE if tolerance is None else float(tolerance))
    out["running"] = running(name, fields.get("variant"), rollback, bool((fields.get("verdict") or {}).get("ready")),
                             fields.get("from"))
    out["repaired_interrupted_run"] = bool(fields.get("repaired_interrupted_run"))
    return out


def _sentence(text: str) -> str:
    text = " ".join(str(text or "").split())
    return text if not text or text.endswith((".", "!", "?")) else text + "."


def _rotation_note(rec: dict) -> str:
    """The drain and the rotation hooks, when they ran: a sentence to add to the summary, or ''."""
    notes = []
    drain = rec.get("drain") or {}
    perf = rec.get("performance") or {}
    if perf.get("msg") and rec.get("outcome") == "switched":
        notes.append(f"Performance gate ({perf.get('mode')}): {_sentence(perf['msg'])}")
    if drain.get("msg"):
        notes.append(f"Before the stop: {_sentence(drain['msg'])}")
    gateway, slot = rec.get("gateway") or {}, rec.get("slot") or {}
    if slot.get("mode") == "blue_green" and rec.get("outcome") != "refused":
        live = slot.get("live") or {}
        soak = slot.get("soak") or {}
        notes.append(f"Blue/green: slot {slot.get('slot')} took the traffic from slot {live.get('slot')} "
                     f"({live.get('variant')}) behind the gateway at {gateway.get('url')}, which always had a ready "
                     f"server" + (f"; soaked {soak.get('elapsed'):g} s" if soak.get("elapsed") is not None else "")
                     + ".")
    elif gateway.get("unavailable_s") is not None:
        notes.append(f"Clients of the gateway at {gateway.get('url')} had no server for {gateway['unavailable_s']:g} s "
                     f"(the switch was in place{': ' + _sentence(slot['why']) if slot.get('why') else ''}).")
    requests = gateway.get("requests") or {}
    if requests:
        notes.append(f"Through the gateway during the switch: {requests.get('answered')} client requests answered, "
                     f"{requests.get('failed')} failed (a server error, or no server to route to).")
    if gateway.get("error"):
        notes.append(_sentence(gateway["error"]))
    rotation = rec.get("rotation") or {}
    if rotation.get("out", {}).get("ok") and not rotation.get("in", {}).get("ok"):
        why = rotation.get("in", {}).get("msg") or "the in hook did not run"
        notes.append(f"The host is OUT of rotation ({why}).")
    return " ".join(notes)


def summary_text(rec: dict, service_dir: str) -> str:
    """What the operator reads at the end of a deploy on one host, the drain and rotation added."""
    text = _summary_text(rec, service_dir)
    note = _rotation_note(rec)
    return f"{text}\n{note}" if note else text


def _summary_text(rec: dict, service_dir: str) -> str:
    host, variant, verdict_ = rec.get("host"), rec.get("variant"), rec.get("verdict") or {}
    rollback = rec.get("rollback") or {}
    name = rec.get("outcome")
    if name == "switched":
        return f"{host}: {variant} is serving. {verdict_.get('msg', '')}".strip()
    if name == "unchanged":
        if rec.get("running"):
            return f"{host}: {variant} already serving, unchanged. {verdict_.get('msg', '')}".strip()
        return f"{host}: {variant} is installed but does not serve: {verdict_.get('msg', '')}".strip()
    if name == "refused":
        return "\n".join([
            f"{host}: variant {variant} was REFUSED beside the live service; {rec.get('running')} serves, untouched.",
            f"Why: {_sentence(verdict_.get('msg'))}",
            f"The attempt's files are kept in {service_dir}/attempts/; every attempt is in {service_dir}/history.jsonl.",
        ])
    if name == "rolled_back":
        return "\n".join([
            f"{host}: variant {variant} FAILED and was rolled back.",
            f"Why: {_sentence(verdict_.get('msg'))}",
            f"Now running: {rollback.get('variant')}, healthy ({rollback.get('msg', '')}).",
            f"The failed attempt's files are kept in {service_dir}/attempts/; every attempt is in {service_dir}/history.jsonl.",
        ])
    return "\n".join([
        f"{host}: ROLLBACK FAILED. Variant {variant} failed: {verdict_.get('msg', '')}",
        f"AND the known-good service {rollback.get('variant')} did not come back: {rollback.get('msg', '')}",
        f"Nothing was removed: the failed attempt is in {service_dir}/attempts/, the known-good files in "
        f"{service_dir}/known-good/, the switch marker in {service_dir}/switch.json. Operator action is needed.",
    ])


def perf_cell(rec: dict) -> str:
    """The deploy summary's performance column: output tokens/s against the known-good's, or
    the figure alone when there was nothing to compare with."""
    perf = rec.get("performance") or {}
    if not perf:
        return "-"
    if not perf.get("measured_ok"):
        # a measurement that ran and failed took time; a variant that never got to the gate did not
        return "failed under load" if perf.get("seconds") is not None else "-"
    checks = (perf.get("comparison") or {}).get("checks") or []
    speed = next((c for c in checks if c.get("figure") == "output_tokens_per_s"), None)
    failed = [c["figure"] for c in checks if not c.get("ok")]
    text = f"{speed['ratio']:g}x tok/s" if speed else f"{(perf.get('figures') or {}).get('output_tokens_per_s')} tok/s"
    return f"{text}, {', '.join(failed)} regressed" if failed else text


def summary_row(rec: dict) -> tuple[str, str, str, str, str]:
    """The deploy summary's row for a host with a record: outcome, running now, verdict, performance, cause."""
    verdict_ = rec.get("verdict") or {}
    name = rec.get("outcome")
    label = OUTCOMES.get(name, str(name))
    running_now = str(rec.get("running") or "nothing healthy")
    slot = rec.get("slot") or {}
    if rec.get("running") and slot.get("slot"):
        # two slots: the one that serves now (after a refused or given-back candidate, the live slot it ran beside)
        kept = slot.get("mode") == "blue_green" and name in ("refused", "rolled_back")
        serving = (slot.get("live") or {}).get("slot") if kept else slot["slot"]
        running_now = f"{running_now} (slot {serving})" if serving else running_now
    return (label, running_now,
            "ready" if verdict_.get("ready") else str(verdict_.get("failure") or "-"), perf_cell(rec),
            str(verdict_.get("cause") or "-"))


ATTEMPT_RE = re.compile(r"^\d{8}T\d{6}Z-")


def attempts_to_prune(names: list[str], keep: int) -> list[str]:
    """The attempt directories beyond the newest ``keep`` (names start with
    their UTC time, so they sort by age); names of another form are left alone."""
    if keep < 1:
        raise DeployStateError(f"keep must be at least 1, got {keep}")
    dated = sorted(n for n in names if ATTEMPT_RE.match(n))
    return dated[:-keep] if len(dated) > keep else []
