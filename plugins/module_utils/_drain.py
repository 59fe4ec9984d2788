# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Drain a serving SGLang server before it is stopped: wait until it holds no
running or queued request, or until a timeout.

SGLang on SIGTERM drains what is in flight but goes on accepting new requests
while it does, with no limit of its own, until systemd's TimeoutStopSec kills
it (real-sglang.md, Readiness). So the role takes the host out of rotation
first (an operator's hook), then waits here, then stops the unit.

The count comes from ``GET /v1/loads?include=core``: one entry per DP rank in
``loads``, each with ``num_running_reqs`` and ``num_waiting_reqs``. Checked in
every release from 0.5.9 to 0.5.23: 0.5.9 srt/entrypoints/v1_loads.py:130
(``"loads": loads`` :173), 0.5.11 :134 (:177), 0.5.23 :96 (:149, the fields
from managers/load_snapshot.py:201-202). The older ``/get_load`` is gone from
0.5.21. The endpoint needs the API key when one is set (it is not one of the
exempt health paths).

With ``--enable-metrics``, SGLang 0.5.9 to 0.5.15 answer ``/v1/loads`` with 500
(their metrics middleware, _sglang_releases ``metrics_keep_v1_loads``): the count
is then read from ``GET /metrics``, the scheduler's gauges ``sglang:num_running_reqs``
and ``sglang:num_queue_reqs`` (0.5.11 srt/observability/metrics_collector.py:201,207).
They rise with a request's prefill and fall late: measured on real 0.5.11, the last
of two requests ended 16.7 s into the run and the gauge read 0 at 46.2 s (the
scheduler publishes idle figures after 30 s idle). A drain from them waits up to
about 30 s longer; it never stops early.

``drain(client, timeout, interval)`` returns what the record keeps: whether the
server drained, how long it took, how many requests were in flight at the
start and still at the stop. A load it cannot read (the server stopped
answering) ends the wait at once: the stop goes ahead and the record says why.
"""

from __future__ import annotations

import time

from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_metrics

ENDPOINT = "/v1/loads?include=core"
METRICS = "/metrics"
GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs")


class LoadError(Exception):
    """The server's answer is not a /v1/loads body."""


def in_flight(body: object) -> tuple[int, int]:
    """(running, waiting) summed over the DP ranks of a /v1/loads body."""
    loads = body.get("loads") if isinstance(body, dict) else None
    if not isinstance(loads, list) or not loads:
        raise LoadError(f"no per-rank loads in the answer: {str(body)[:200]}")
    running = waiting = 0
    for rank in loads:
        values = [rank.get(key) if isinstance(rank, dict) else None for key in ("num_running_reqs", "num_waiting_reqs")]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise LoadError(f"a rank without request counts: {str(rank)[:200]}")
        running += values[0]
        waiting += values[1]
    return running, waiting


def from_metrics(text: object) -> tuple[int, int]:
    """(running, waiting) from SGLang's /metrics text: its two scheduler gauges, summed over ranks."""
    try:
        families = _deploy_metrics.parse(text if isinstance(text, str) else "")
    except ValueError as exc:
        raise LoadError(f"not Prometheus text: {exc}") from None
    counts = []
    for name in GAUGES:
        samples = (families.get(name) or {}).get("samples") or []
        if not samples:
            raise LoadError(f"no {name} in the answer")
        counts.append(int(round(sum(value for _n, _labels, value in samples))))
    return counts[0], counts[1]


def read(client) -> tuple[tuple[int, int] | None, str | None, str]:
    """One read of the load: ((running, waiting), None, endpoint) or (None, why not, endpoint)."""
    response = client.call("GET", ENDPOINT)
    if response.kind == "http" and response.status == 500:
        # 0.5.9-0.5.15 with --enable-metrics: /v1/loads fails in the metrics middleware
        metrics = client.call("GET", METRICS, text=True)
        if metrics.kind == "ok":
            try:
                return from_metrics(metrics.body), None, METRICS
            except LoadError as exc:
                return None, f"GET /v1/loads: {response.describe()}; GET /metrics: {exc}", METRICS
    if response.kind != "ok":
        return None, f"GET /v1/loads: {response.describe()}", "/v1/loads"
    try:
        return in_flight(response.body), None, "/v1/loads"
    except LoadError as exc:
        return None, f"GET /v1/loads: {exc}", "/v1/loads"


def drain(client, timeout: float, interval: float, clock=time.monotonic, sleep=time.sleep) -> dict:
    """Wait until the server holds no running or queued request, or ``timeout`` seconds."""
    started = clock()
    counts, error, endpoint = read(client)
    first = None if counts is None else sum(counts)
    polls = 1
    while counts is not None and sum(counts) > 0 and clock() - started < timeout:
        sleep(min(interval, max(0.0, timeout - (clock() - started))))
        counts, error, endpoint = read(client)
        polls += 1
    seconds = round(clock() - started, 2)
    result = {"endpoint": endpoint, "timeout": timeout, "seconds": seconds, "polls": polls,
              "in_flight_at_start": first, "in_flight_at_stop": None if counts is None else sum(counts),
              "running_at_stop": None if counts is None else counts[0],
              "waiting_at_stop": None if counts is None else counts[1], "error": error}
    if counts is None:
        result.update(drained=False, timed_out=False,
                      msg=f"the server's load could not be read ({error}): stopped without waiting further")
    elif sum(counts) == 0:
        via = (" (read from /metrics: this SGLang answers /v1/loads with 500 under --enable-metrics; its gauges "
               "fall up to about 30 s after the last request ends)") if endpoint == METRICS else ""
        result.update(drained=True, timed_out=False,
                      msg=f"drained in {seconds:g} s ({first} request(s) in flight at the start){via}")
    else:
        result.update(drained=False, timed_out=True,
                      msg=f"still {counts[0]} running and {counts[1]} queued after the drain timeout of {timeout:g} s: "
                          "stopped anyway (SGLang finishes them on SIGTERM within the unit's TimeoutStopSec)")
    return result
