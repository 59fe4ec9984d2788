# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A service's deploy state as Prometheus metrics, for node_exporter's textfile collector.

The figures come from the host's own records, nothing else: the deploy history
(``<state>/<service>/history.jsonl``, one line per deploy, written by the
sglang_switch module) and the watchdog's (``watchdog/history.jsonl``). The file is
rewritten from them whenever either gains a line, so every figure is what the records
say, a deploy killed before it recorded changes nothing, and the counts only grow.

node_exporter reads ``*.prom`` files from its ``--collector.textfile.directory`` at each
scrape and adds ``node_textfile_mtime_seconds`` per file; a file is replaced in one step
(a temporary name, then a rename), so a scrape never reads half of one.
The text format: https://prometheus.io/docs/instrumenting/exposition_formats/ (label values
escape backslash, double quote and newline; a HELP text escapes backslash and newline).

Standard library only: the watchdog runs it on the host from a copy of module_utils.
"""

from __future__ import annotations

import calendar
import os
import re
import time

try:
    from ansible_collections.inferops.sglang.plugins.module_utils import _state_files as files
except ImportError:  # the watchdog's copy on the host, or a test loading the file alone
    import _state_files as files  # type: ignore[no-redef]

PREFIX = "inferops_sglang_"
OUTCOMES = ("switched", "unchanged", "rolled_back", "rollback_failed", "refused")
HEALTHY = ("switched", "unchanged", "rolled_back", "refused")
WATCHDOG_EVENTS = ("restarted", "held_back", "report", "restart_failed", "interrupted_switch", "recovered",
                   "gateway_routed", "gateway_unrouted", "gpu_needs_reset")
PERF_FIGURES = ("output_tokens_per_s", "ttft_p50", "ttft_p95", "tpot_p50", "itl_p50", "accept_length")
CAUSE_LIMIT = 160
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")

# name -> (type, help)
FAMILIES = {
    "deploy_info": ("gauge", "The service's last recorded deploy (always 1): the variant asked for, the outcome and "
                             "the variant serving after it (running; empty when nothing serves) and, with two slots, the slot it "
                             "installed (slot; empty without)."),
    "deploy_timestamp_seconds": ("gauge", "When the last deploy was recorded, in seconds since the epoch."),
    "deploy_healthy": ("gauge", "1 when the last deploy left the service serving (switched, unchanged and serving, "
                                "rolled back to the known-good service, a candidate refused beside the live slot); 0 when it did not "
                                "(rollback failed)."),
    "deploy_gate_ready": ("gauge", "1 when the readiness gate passed the variant the last deploy asked for; 0 when it "
                                   "failed it (the deploy then rolled back)."),
    "deploy_verdict_info": ("gauge", "The readiness gate's verdict on the last deploy's variant (always 1): the "
                                     "failure and its cause, empty when ready."),
    "deploys_total": ("counter", "Deploys recorded in the host's history, by outcome."),
    "rollbacks_total": ("counter", "Deploys whose variant failed and was rolled back (outcomes rolled_back and "
                                   "rollback_failed)."),
    "perf_figure": ("gauge", "The newest performance gate measurement of the service: one series per figure "
                             "(output_tokens_per_s, ttft_p50 and ttft_p95 in seconds, tpot_p50, itl_p50, accept_length)."),
    "perf_timestamp_seconds": ("gauge", "When the newest performance measurement was recorded, in seconds since the epoch."),
    "deploy_gateway_requests": ("gauge", "Behind the host's gateway: the clients' requests the gateway answered while "
                                         "the last deploy that counted them switched, by result (answered, failed: "
                                         "a server error or no server to route to)."),
    "deploy_unavailable_seconds": ("gauge", "Behind the host's gateway: how long the last deploy that took the server "
                                            "out of it left clients without a server (from the removal to the gateway "
                                            "routing to the variant or the restored service)."),
    "unavailable_seconds_total": ("counter", "Behind the host's gateway: the seconds clients had no server, summed over "
                                             "the recorded deploys."),
    "watchdog_events_total": ("counter", "The watchdog's recorded actions on the service, by event (restarted, held_back, "
                                         "report, restart_failed, interrupted_switch, recovered; behind the gateway "
                                         "gateway_routed, gateway_unrouted; gpu_needs_reset: not restarted, its GPU "
                                         "needs a reset or a reboot)."),
    "gpu_ecc_uncorrected_errors": ("gauge", "The newest uncorrectable ECC error counts the watchdog read of the "
                                            "service's GPUs, by GPU and count (aggregate: the card's life; volatile: "
                                            "since the driver loaded)."),
    "gpu_row_remap_pending": ("gauge", "1 when the GPU has a row remap pending (it needs a reset), as the watchdog "
                                       "last read it; 0 when not."),
    "gpu_xid_events_total": ("counter", "Xid events the watchdog saw in the kernel log on the service's GPUs, by GPU, "
                                        "Xid and NVIDIA's action (ignore, restart_app, reset_gpu, reboot, "
                                        "contact_support; docs/gpu-health.md)."),
    "watchdog_last_event_timestamp_seconds": ("gauge", "When the watchdog last recorded an action, in seconds since the epoch."),
}


def _escape(value: object) -> str:
    return str("" if value is None else value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def epoch(text: object) -> float | None:
    """'2026-12-03T03:08:20Z' -> seconds since the epoch; None for anything else."""
    try:
        return float(calendar.timegm(time.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError):
        return None


def _cause(verdict: dict) -> str:
    text = " ".join(str(verdict.get("cause") or "").split())
    return text if len(text) <= CAUSE_LIMIT else text[:CAUSE_LIMIT - 3] + "..."


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.seen: set[str] = set()

    def sample(self, family: str, labels: dict, value: float) -> None:
        name = PREFIX + family
        if family not in self.seen:
            kind, text = FAMILIES[family]
            self.lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
            self.seen.add(family)
        pairs = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        self.lines.append(f"{name}{{{pairs}}} {_number(value)}")


def textfile(service: str, deploys: list[dict], watchdog: list[dict] | None = None) -> str:
    """The text for one service from its records (oldest first); empty when there are none."""
    out = _Text()
    svc = {"service": service}
    deploys = [r for r in deploys if r.get("outcome") in OUTCOMES]
    if deploys:
        last = deploys[-1]
        verdict = last.get("verdict") or {}
        out.sample("deploy_info", dict(svc, variant=last.get("variant"), outcome=last.get("outcome"),
                                       running=last.get("running"), sglang_version=last.get("sglang_version"),
                                       run_id=last.get("run_id"), slot=(last.get("slot") or {}).get("slot") or ""), 1)
        stamp = epoch(last.get("time"))
        if stamp is not None:
            out.sample("deploy_timestamp_seconds", svc, stamp)
        healthy = last.get("outcome") in HEALTHY and bool(last.get("running"))
        out.sample("deploy_healthy", svc, healthy)
        out.sample("deploy_gate_ready", svc, bool(verdict.get("ready")))
        out.sample("deploy_verdict_info", dict(svc, variant=last.get("variant"),
                                               failure="" if verdict.get("ready") else verdict.get("failure"),
                                               cause="" if verdict.get("ready") else _cause(verdict)), 1)
        for outcome in OUTCOMES:
            out.sample("deploys_total", dict(svc, outcome=outcome), sum(r.get("outcome") == outcome for r in deploys))
        out.sample("rollbacks_total", svc, sum(r.get("outcome") in ("rolled_back", "rollback_failed") for r in deploys))
        measured = [r for r in deploys if (r.get("performance") or {}).get("measured_ok")
                    and isinstance(r["performance"].get("figures"), dict)]
        if measured:
            newest = measured[-1]
            figures = newest["performance"]["figures"]
            for figure in PERF_FIGURES:
                value = figures.get(figure)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    out.sample("perf_figure", dict(svc, variant=newest.get("variant"), figure=figure), value)
            stamp = epoch(newest.get("time"))
            if stamp is not None:
                out.sample("perf_timestamp_seconds", dict(svc, variant=newest.get("variant")), stamp)
    counted = [r["gateway"]["requests"] for r in deploys if isinstance(r.get("gateway"), dict)
               and isinstance(r["gateway"].get("requests"), dict)]
    if counted:
        for result in ("answered", "failed"):
            if isinstance(counted[-1].get(result), int):
                out.sample("deploy_gateway_requests", dict(svc, result=result), counted[-1][result])
    outages = [r["gateway"]["unavailable_s"] for r in deploys if isinstance(r.get("gateway"), dict)
               and isinstance(r["gateway"].get("unavailable_s"), (int, float))]
    if outages:
        out.sample("deploy_unavailable_seconds", svc, outages[-1])
        out.sample("unavailable_seconds_total", svc, round(sum(outages), 2))
    events = [r for r in (watchdog or []) if r.get("event") in WATCHDOG_EVENTS]
    if events or deploys:
        for event in WATCHDOG_EVENTS:
            out.sample("watchdog_events_total", dict(svc, event=event), sum(r.get("event") == event for r in events))
    xids: dict[tuple, int] = {}
    for record in watchdog or []:
        xid = record.get("xid") if record.get("event") == "gpu_xid" else None
        if isinstance(xid, dict):
            key = (xid.get("gpu"), xid.get("bus_id"), xid.get("xid"), xid.get("action"))
            xids[key] = xids.get(key, 0) + 1
    for (gpu, bus, number, action), count in sorted(xids.items(), key=lambda kv: tuple(str(k) for k in kv[0])):
        out.sample("gpu_xid_events_total", dict(svc, gpu=gpu, bus_id=bus, xid=number, action=action), count)
    newest: dict = {}
    for record in watchdog or []:
        memory = record.get("memory") if record.get("event") == "gpu_memory" else None
        if isinstance(memory, dict) and isinstance(memory.get("counters"), dict):
            newest[(memory.get("gpu"), memory.get("bus_id"))] = memory["counters"]
    for (gpu, bus), counters in sorted(newest.items(), key=lambda kv: str(kv[0])):
        labels = dict(svc, gpu=gpu, bus_id=bus)
        for count in ("aggregate", "volatile"):
            value = counters.get(f"{count}_uncorrected")
            if isinstance(value, int) and not isinstance(value, bool):
                out.sample("gpu_ecc_uncorrected_errors", dict(labels, count=count), value)
        if isinstance(counters.get("remap_pending"), bool):
            out.sample("gpu_row_remap_pending", labels, counters["remap_pending"])
    if events:
        stamp = epoch(events[-1].get("time"))
        if stamp is not None:
            out.sample("watchdog_last_event_timestamp_seconds", svc, stamp)
    return "\n".join(out.lines) + "\n" if out.lines else ""


def file_name(service: str) -> str:
    """The textfile's name for a unit: node_exporter reads only names ending in .prom."""
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", service)
    return f"inferops_sglang_{stem}.prom"


def refresh(service_dir: str, service: str, directory: str) -> bool:
    """Rewrite the service's textfile in ``directory`` from its records (0644: node_exporter
    runs as its own user). Returns whether it changed. A missing ``directory`` is made. The
    directory is usually node_exporter's user's (Debian's package gives it
    /var/lib/prometheus/node-exporter and its parent): it is opened without following a link
    that user could plant, and written relative to that (_state_files.open_directory)."""
    text = textfile(service, files.read_jsonl(os.path.join(service_dir, "history.jsonl")),
                    files.read_jsonl(os.path.join(service_dir, "watchdog", "history.jsonl")))
    name = file_name(service)
    fd = files.open_directory(directory, create_mode=0o755)
    try:
        if text:
            return files.replace_at(fd, name, text, 0o644)
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            return False
        return True
    finally:
        os.close(fd)


# The gateway's own response counter (smg 1.13.0 /metrics: by path, status_code and error_code, counted once
# a response has gone out in full) and what in it is a client that got no answer: a server error, or no
# worker to route to (smg answers 404 model_not_found and counts router error no_workers, read off it here
# with no worker registered). Its own endpoints (health, the worker API) are not clients' requests.
GATEWAY_RESPONSES = "smg_http_responses_total"
GATEWAY_OWN = ("/readiness", "/liveness", "/health", "/metrics", "/workers")
GATEWAY_NO_SERVER = ("model_not_found", "no_workers")


def gateway_responses(text: str) -> dict:
    """The clients' responses a gateway's /metrics has counted so far: answered, and failed (5xx, or no
    server to route to). ValueError on text that is not an exposition."""
    answered = failed = 0.0
    for family in parse(text).values():
        for name, labels, value in family["samples"]:
            path = labels.get("path") or ""
            if name != GATEWAY_RESPONSES or path.startswith(GATEWAY_OWN):
                continue
            answered += value
            status = labels.get("status_code") or ""
            if (status.isdigit() and int(status) >= 500) or labels.get("error_code") in GATEWAY_NO_SERVER:
                failed += value
    return {"answered": int(answered), "failed": int(failed)}


def parse(text: str) -> dict[str, dict]:
    """The families of a text exposition: name -> {type, help, samples: [(name, labels, value)]}.
    Enough of the format for the collection's own files and SGLang's /metrics (the tests and
    the lab read both with it); raises ValueError on a line it cannot read."""
    families: dict[str, dict] = {}
    sample_re = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$')
    label_re = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("TYPE", "HELP"):
                family = families.setdefault(parts[2], {"type": "untyped", "help": "", "samples": []})
                family["type" if parts[1] == "TYPE" else "help"] = parts[3] if len(parts) > 3 else ""
            continue
        match = sample_re.match(line)
        if not match:
            raise ValueError(f"line {number}: not a sample: {line[:200]!r}")
        name, raw, value = match.groups()
        labels, rest = {}, raw or ""
        while rest.strip():
            pair = label_re.match(rest)
            if not pair:
                raise ValueError(f"line {number}: bad labels: {raw[:200]!r}")
            labels[pair.group(1)] = pair.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            rest = rest[pair.end():]
        owner = _family_of(name, families)
        families.setdefault(owner, {"type": "untyped", "help": "", "samples": []})["samples"].append(
            (name, labels, float(value)))
    for name in families:
        if not _NAME.match(name):
            raise ValueError(f"bad metric name {name!r}")
    return families


def _family_of(sample: str, families: dict) -> str:
    """The family a sample belongs to: itself, or a histogram/summary's _bucket/_sum/_count."""
    if sample in families:
        return sample
    for suffix in ("_bucket", "_sum", "_count", "_created"):
        if sample.endswith(suffix) and sample[: -len(suffix)] in families:
            return sample[: -len(suffix)]
    return sample
