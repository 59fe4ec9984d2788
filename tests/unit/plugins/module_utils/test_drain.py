"""_drain: the wait for a serving SGLang server to hold no request, on the
/v1/loads bodies real SGLang answers (0.5.11 srt/entrypoints/v1_loads.py:170-180,
0.5.23 :145-151: per-rank num_running_reqs and num_waiting_reqs), with a
scripted client and clock."""

from __future__ import annotations

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _drain
from ansible_collections.inferops.sglang.plugins.module_utils._http import Response


def loads(*ranks: tuple[int, int]) -> dict:
    """A /v1/loads body as 0.5.23 answers it (include=core), one entry per DP rank."""
    return {"timestamp": "2026-12-02T09:00:00+00:00", "version": "0.5.23", "accelerator": None, "num_accelerators": 1,
            "loads": [{"dp_rank": i, "num_running_reqs": r, "num_waiting_reqs": w, "num_used_tokens": 0,
                       "num_total_tokens": 4096, "token_usage": 0.0, "gen_throughput": 0.0, "cache_hit_rate": 0.0,
                       "utilization": 0.0} for i, (r, w) in enumerate(ranks)]}


class Scripted:
    """A client answering GET /v1/loads with the next response of a script, and a clock that only the sleeps move."""

    def __init__(self, *answers: Response) -> None:
        self.answers, self.calls, self.now = list(answers), [], 0.0

    def call(self, method: str, path: str, text: bool = False) -> Response:
        self.calls.append((method, path))
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def ok(body) -> Response:
    return Response(200, body, None, "ok")


def test_the_counts_are_summed_over_the_ranks():
    assert _drain.in_flight(loads((2, 1), (0, 3))) == (2, 4)


@pytest.mark.parametrize("body", [{}, {"loads": []}, {"loads": [{"dp_rank": 0}]}, [],
                                  {"loads": [{"num_running_reqs": -1, "num_waiting_reqs": 0}]},
                                  {"loads": [{"num_running_reqs": True, "num_waiting_reqs": 0}]}])
def test_a_body_without_counts_is_not_read_as_zero(body):
    with pytest.raises(_drain.LoadError):
        _drain.in_flight(body)


def test_an_idle_server_is_drained_at_the_first_read():
    client = Scripted(ok(loads((0, 0))))
    result = _drain.drain(client, 60, 1, client.clock, client.sleep)
    assert result["drained"] is True and result["timed_out"] is False
    assert result["polls"] == 1 and result["seconds"] == 0 and result["in_flight_at_start"] == 0
    assert client.calls == [("GET", "/v1/loads?include=core")]


def test_the_drain_waits_for_running_and_queued_requests():
    client = Scripted(ok(loads((2, 1))), ok(loads((2, 0))), ok(loads((1, 0))), ok(loads((0, 0))))
    result = _drain.drain(client, 60, 1, client.clock, client.sleep)
    assert result["drained"] is True and result["in_flight_at_start"] == 3 and result["in_flight_at_stop"] == 0
    assert result["polls"] == 4 and result["seconds"] == 3
    assert result["msg"] == "drained in 3 s (3 request(s) in flight at the start)"


def test_the_drain_ends_at_its_timeout_with_what_is_still_in_flight():
    client = Scripted(ok(loads((4, 2))))
    result = _drain.drain(client, 5, 2, client.clock, client.sleep)
    assert result["drained"] is False and result["timed_out"] is True
    assert result["seconds"] == 5  # the last sleep is cut to the timeout
    assert (result["running_at_stop"], result["waiting_at_stop"], result["in_flight_at_stop"]) == (4, 2, 6)
    assert result["msg"].startswith("still 4 running and 2 queued after the drain timeout of 5 s")


def test_a_timeout_of_zero_reads_once():
    client = Scripted(ok(loads((1, 0))))
    result = _drain.drain(client, 0, 1, client.clock, client.sleep)
    assert result["polls"] == 1 and result["timed_out"] is True and result["in_flight_at_stop"] == 1


@pytest.mark.parametrize("answer, error", [
    (Response(401, {"error": "Unauthorized"}, "HTTP 401 Unauthorized", "http"), "GET /v1/loads: HTTP 401"),
    (Response(None, None, "connection refused", "refused"), "GET /v1/loads: connection refused"),
    (ok({"detail": "Not Found"}), "GET /v1/loads: no per-rank loads in the answer"),
])
def test_a_load_that_cannot_be_read_ends_the_wait_with_the_reason(answer, error):
    client = Scripted(answer)
    result = _drain.drain(client, 60, 1, client.clock, client.sleep)
    assert result["drained"] is False and result["timed_out"] is False and result["polls"] == 1
    assert result["in_flight_at_start"] is None and result["error"].startswith(error)
    assert "stopped without waiting further" in result["msg"]


def test_a_server_that_dies_mid_drain_ends_the_wait():
    client = Scripted(ok(loads((1, 0))), Response(None, None, "connection refused", "refused"))
    result = _drain.drain(client, 60, 1, client.clock, client.sleep)
    assert result["polls"] == 2 and result["in_flight_at_start"] == 1 and result["in_flight_at_stop"] is None
    assert result["error"] == "GET /v1/loads: connection refused"


METRICS_0_5_11 = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} %s
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"} %s
"""
LOADS_500 = Response(500, "Internal Server Error", "HTTP 500 Internal Server Error", "http")


def test_a_v1_loads_broken_by_the_metrics_middleware_is_read_from_metrics():
    """Real 0.5.9-0.5.15 with --enable-metrics answer /v1/loads with 500 (measured on 0.5.11; see
    tests/conformance/test_real_gate.py): the drain reads the scheduler's gauges from /metrics, and says so."""
    answers = iter([LOADS_500, ok(METRICS_0_5_11 % ("2.0", "1.0")), LOADS_500, ok(METRICS_0_5_11 % ("0.0", "0.0"))])

    class Broken(Scripted):
        def call(self, method, path, text=False):
            self.calls.append((method, path, text))
            return next(answers)

    client = Broken(LOADS_500)
    result = _drain.drain(client, 60, 1, client.clock, client.sleep)
    assert result["drained"] is True and result["in_flight_at_start"] == 3 and result["endpoint"] == "/metrics"
    assert "read from /metrics" in result["msg"]
    assert client.calls[:2] == [("GET", "/v1/loads?include=core", False), ("GET", "/metrics", True)]


@pytest.mark.parametrize("metrics, error", [
    (Response(404, {"detail": "Not Found"}, "HTTP 404 Not Found", "http"), "GET /v1/loads: HTTP 500"),
    (ok("# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 1.0\n"), "no sglang:num_queue_reqs"),
])
def test_a_500_without_usable_metrics_ends_the_wait(metrics, error):
    answers = iter([LOADS_500, metrics])

    class Broken(Scripted):
        def call(self, method, path, text=False):
            return next(answers)

    client = Broken(LOADS_500)
    result = _drain.drain(client, 60, 1, client.clock, client.sleep)
    assert result["drained"] is False and error in result["error"], result
