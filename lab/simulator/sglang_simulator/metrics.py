"""GET /metrics of the simulated server (--enable-metrics): a few of real SGLang's families, under
their real names, types, label names and help texts, for the emulated release.

Real SGLang (prometheus_client, multiprocess mode) exposes 54 families on 0.5.11 and 83 on 0.5.23
once requests have been served (lab/real/metrics-facts.md, measured on real CPU servers). The
simulator exposes the ones an operator's dashboards and the lab's Prometheus read: the scheduler's
gauges, the request counters and two latency histograms. tests/conformance/test_real_gate.py checks
every family here against a real server's /metrics of 0.5.11 and of 0.5.23 (name, type, label names).

Sources (0.5.11 / 0.5.23 srt/observability/metrics_collector.py): num_running_reqs :201 / :365,
num_queue_reqs :207 / :371, gen_throughput :219 / :383, cache_hit_rate :225 / :389, token_usage
:241 / :405, max_total_num_tokens :839 / :1290, prompt_tokens_total :1208 / :1856,
generation_tokens_total :1213 / :1861, num_requests_total :1280 / :1941, time_to_first_token_seconds
:1373 / :2041, e2e_request_latency_seconds :1387 / :2068; engine_startup_time :851 (0.5.11) and
startup_time_seconds{phase} :1843 (0.5.23). The histogram buckets are 0.5.11's :1298-1343.
The scheduler gauges follow the requests at once; real 0.5.11's fall late (the scheduler publishes
idle figures after 30 s idle: a drain read from them waits that long, see _drain.py). With
--enable-metrics, 0.5.9-0.5.15 answer GET /v1/loads with 500 (server.py, _sglang_releases
metrics_keep_v1_loads). From 0.5.17 the request counters and histograms carry is_streaming ("true"/"false")
(_sglang_releases: metrics_is_streaming_label).
"""

from __future__ import annotations

import threading

ENGINE_TYPE = "unified"
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = TTFT_BUCKETS + (600, 1200, 1800, 2400)
# name -> (type, help); the scheduler's gauges carry the ranks (S in metrics-facts.md)
GAUGES = {
    "sglang:num_running_reqs": "The number of running requests.",
    "sglang:num_queue_reqs": "The number of requests in the waiting queue.",
    "sglang:gen_throughput": "The generation throughput (token/s).",
    "sglang:cache_hit_rate": "The prefix cache hit rate.",
    "sglang:token_usage": "The token usage.",
    "sglang:max_total_num_tokens": "Maximum total number of tokens in the KV cache pool.",
}
COUNTERS = {
    "sglang:prompt_tokens_total": "Number of prefill tokens processed.",
    "sglang:generation_tokens_total": "Number of generation tokens processed.",
    "sglang:num_requests_total": "Number of requests processed.",
}
HISTOGRAMS = {
    "sglang:time_to_first_token_seconds": ("Histogram of time to first token in seconds.", TTFT_BUCKETS),
    "sglang:e2e_request_latency_seconds": ("Histogram of End-to-end request latency in seconds", E2E_BUCKETS),
}


def _value(number: float) -> str:
    """prometheus_client's float text: 3.0, 0.25, +Inf."""
    if number == float("inf"):
        return "+Inf"
    return repr(float(number))


def _labels(labels: dict) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


class Metrics:
    """The counts of one simulated server; ``observe`` after each generation, ``text`` for GET /metrics."""

    def __init__(self, release, model_name: str) -> None:
        self.streaming_label = release.fact("metrics_is_streaming_label")
        self.startup_by_phase = release.fact("metrics_startup_time_by_phase")
        self.model_name = model_name
        self.lock = threading.Lock()
        self.counts: dict[tuple[str, str], float] = {}
        self.histograms: dict[tuple[str, str], list[float]] = {}

    def observe(self, prompt_tokens: int, completion_tokens: int, ttft: float, e2e: float, streaming: bool) -> None:
        key = "true" if streaming else "false"
        with self.lock:
            for name, amount in (("sglang:prompt_tokens_total", prompt_tokens),
                                 ("sglang:generation_tokens_total", completion_tokens),
                                 ("sglang:num_requests_total", 1)):
                self.counts[(name, key)] = self.counts.get((name, key), 0.0) + amount
            for name, seconds in (("sglang:time_to_first_token_seconds", ttft), ("sglang:e2e_request_latency_seconds", e2e)):
                self.histograms.setdefault((name, key), []).append(max(0.0, float(seconds)))

    def _request_labels(self, streaming: str) -> dict:
        labels = {"engine_type": ENGINE_TYPE, "model_name": self.model_name}
        if self.streaming_label:
            labels["is_streaming"] = streaming
        return labels

    def text(self, gauges: dict[str, float], startup_seconds: float) -> str:
        """The exposition: ``gauges`` by name (those of GAUGES), the start-up's seconds."""
        ranks = {"engine_type": ENGINE_TYPE, "model_name": self.model_name, "moe_ep_rank": "0", "pp_rank": "0",
                 "tp_rank": "0"}
        lines: list[str] = []

        def family(name: str, kind: str, doc: str) -> None:
            lines.extend([f"# HELP {name} {doc}", f"# TYPE {name} {kind}"])

        for name, doc in GAUGES.items():
            family(name, "gauge", doc)
            lines.append(f"{name}{_labels(ranks)} {_value(gauges.get(name, 0.0))}")
        if self.startup_by_phase:
            family("sglang:startup_time_seconds", "gauge", "Engine startup duration by phase in seconds.")
            lines.append(f"sglang:startup_time_seconds{_labels(dict(engine_type=ENGINE_TYPE, model_name=self.model_name, phase='scheduler_e2e'))} "
                         f"{_value(startup_seconds)}")
        else:
            family("sglang:engine_startup_time", "gauge", "The time taken for the engine to start up.")
            lines.append(f"sglang:engine_startup_time{_labels(ranks)} {_value(startup_seconds)}")
        with self.lock:
            counts = dict(self.counts)
            histograms = {k: list(v) for k, v in self.histograms.items()}
        # a labelled family has no sample until it is first observed (as prometheus_client)
        for name, doc in COUNTERS.items():
            seen = sorted(k for (n, k) in counts if n == name)
            if not seen:
                continue
            family(name, "counter", doc)
            merged: dict[str, float] = {}
            for key in seen:
                label_text = _labels(self._request_labels(key))
                merged[label_text] = merged.get(label_text, 0.0) + counts[(name, key)]
            lines.extend(f"{name}{label_text} {_value(v)}" for label_text, v in merged.items())
        for name, (doc, buckets) in HISTOGRAMS.items():
            seen = sorted(k for (n, k) in histograms if n == name)
            if not seen:
                continue
            family(name, "histogram", doc)
            grouped: dict[str, list[float]] = {}
            for key in seen:
                grouped.setdefault(_labels(self._request_labels(key)), []).extend(histograms[(name, key)])
            for label_text, values in grouped.items():
                base = label_text[1:-1]
                for bound in buckets + (float("inf"),):
                    count = sum(1 for v in values if v <= bound)
                    le = "+Inf" if bound == float("inf") else _value(bound)
                    lines.append(f'{name}_bucket{{{base},le="{le}"}} {_value(count)}')
                lines.append(f"{name}_sum{label_text} {_value(sum(values))}")
                lines.append(f"{name}_count{label_text} {_value(len(values))}")
        return "\n".join(lines) + "\n"
