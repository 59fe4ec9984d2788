# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prometheus file_sd target groups for the SGLang servers of an inventory and their node_exporters.

Each host gives one entry (the sglang_service role's ``metrics_target`` tasks set it as the fact
``sglang_service_metrics_target``): its inventory name, the address Prometheus reaches it at,
the address the server listens on (``--host``), its port, its unit and whether it runs with
``--enable-metrics``. The file_sd format: a JSON list of ``{"targets": ["host:port"], "labels": {}}``
(https://prometheus.io/docs/prometheus/latest/configuration/configuration/#file_sd_config).

A server that listens on loopback only (the role's default, 127.0.0.1) can be scraped by a
Prometheus on the same host and by no other: for any other Prometheus it is left out and named,
rather than listed as a target that is down forever.
"""

from __future__ import annotations

import ipaddress

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")
WILDCARD = ("0.0.0.0", "::", "")


class TargetError(ValueError):
    """An entry the targets cannot be made from."""


def loopback(address: str) -> bool:
    """Whether a host name or address (IPv6 bracketed or not) is this host's loopback; the
    collection's one rule for it (the targets, the preflight's exposure warning, the model
    stager's plain-http rule)."""
    if address.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def _join(address: str, port: int) -> str:
    address = str(address)
    if ":" in address and not address.startswith("["):
        address = f"[{address}]"
    return f"{address}:{port}"


def _port(value: object, what: str) -> int:
    try:
        port = int(str(value))
    except (TypeError, ValueError):
        raise TargetError(f"{what}: port {value!r} is not a number") from None
    if not 1 <= port <= 65535:
        raise TargetError(f"{what}: port {port} is not in 1-65535")
    return port


def file_sd(entries: list, prometheus_host: str, node_exporter_port: int = 9100) -> dict:
    """{"sglang": [groups], "node": [groups], "skipped": ["host: why"]}: one group per host and
    service, labelled host= and service= (node: host=), in the entries' order."""
    sglang, node, skipped, seen = [], [], [], set()
    node_port = _port(node_exporter_port, "node_exporter")
    for entry in entries or []:
        if not isinstance(entry, dict) or not entry.get("host"):
            raise TargetError(f"each entry needs a host (the sglang_service role's metrics_target sets it), got {entry!r}")
        host = str(entry["host"])
        local = host == prometheus_host
        address = str(entry.get("address") or host)
        service = str(entry.get("service") or "")
        if host not in seen:
            seen.add(host)
            node.append({"targets": [_join("127.0.0.1" if local else address, node_port)], "labels": {"host": host}})
        if not entry.get("metrics", True):
            skipped.append(f"{host}: {service} runs without --enable-metrics (sglang_service_metrics: false)")
            continue
        port = _port(entry.get("port"), host)
        bind = str(entry.get("bind_host") if entry.get("bind_host") is not None else "127.0.0.1")
        if bind in WILDCARD:
            target = _join("127.0.0.1" if local else address, port)
        elif loopback(bind):
            if not local:
                skipped.append(f"{host}: {service} listens on {bind} only (sglang_service_bind_host), which a "
                               f"Prometheus on {prometheus_host} cannot reach")
                continue
            target = _join(bind, port)
        else:
            target = _join(bind, port)
        sglang.append({"targets": [target], "labels": {"host": host, "service": service}})
    return {"sglang": sglang, "node": node, "skipped": skipped}
