"""The simulator's decode speed per host and variant (the hardware file's
performance section, lab/simulator/sglang_simulator/hardware.py), measured the
way the deploy's performance gate measures (_bench): on ct200 the balanced
DDTree variant (no CUDA graphs) is faster than NEXTN, as in the field, and
NEXTN without CUDA graphs is slower. A test double's speed: what the
performance gate's verdicts in molecule/deploy rest on."""

from __future__ import annotations

import json

import pytest
from sim_helpers import BALANCED, LAB, MODEL, NEXTN
from sglang_simulator import server

from ansible_collections.inferops.sglang.plugins.module_utils import _bench
from ansible_collections.inferops.sglang.plugins.module_utils._http import Client


# ct200's own performance section, its generations' time scale included (the fixture drops that)
PERFORMANCE = json.loads((LAB / "hosts" / "ct200" / "hardware.json").read_text())["performance"]


def measure(launch, args: list[str], load: dict, ddtree: bool = False) -> dict:
    server = launch([*MODEL, *args], version="0.5.11", host="ct200", gpus="0,1", ddtree=ddtree,
                    hw={"performance": PERFORMANCE})
    server.wait_for(lambda: server.status("/health") == 200, timeout=120, what="health")
    result = _bench.benchmark(Client(f"http://127.0.0.1:{server.port}", None, True, 30), load["requests"],
                              load["concurrency"], load["max_tokens"], load["rounds"], True, 30)
    server.proc.kill()
    server.proc.wait()
    assert result["ok"], result
    return result["figures"]


def test_ct200s_balanced_variant_is_faster_than_nextn_and_nextn_without_graphs_slower(launch):
    # the load of the balanced variant (max_running_requests 4), as the gate measures both
    load = _bench.plan_load(4, 32768)
    nextn = measure(launch, NEXTN, load)
    balanced = measure(launch, BALANCED, load, ddtree=True)
    eager = measure(launch, [*NEXTN, "--disable-cuda-graph"], load)
    print({"nextn": nextn, "balanced": balanced, "eager": eager})
    faster = _bench.compare(balanced, nextn)
    slower = _bench.compare(eager, nextn)
    # tokens/s and accept length pass; the first token's latency is the same in the file for both, and a
    # busy machine's scheduling moves a short load's p95 (the gate allows it 50 ms whatever its ratio)
    assert all(c["ok"] for c in faster["checks"] if c["figure"] != "ttft_p95"), faster["msg"]
    assert balanced["output_tokens_per_s"] > 1.05 * nextn["output_tokens_per_s"], faster["msg"]
    assert balanced["accept_length"] == 5.41 and nextn["accept_length"] == 2.71
    assert not slower["passed"] and "output_tokens_per_s" in [c["figure"] for c in slower["checks"] if not c["ok"]], slower
    assert eager["output_tokens_per_s"] < 0.75 * nextn["output_tokens_per_s"], slower["msg"]


class LateClock:
    """A monotonic clock whose sleeps wake ``late`` seconds past their due time (or, with
    ``lateness``, each sleep by the next of those in turn, then on time) and whose every emit costs
    ``emit_cost`` seconds: a loaded machine."""

    def __init__(self, late: float, emit_cost: float, lateness: tuple[float, ...] = ()) -> None:
        self.now, self.late, self.emit_cost, self.lateness = 100.0, late, emit_cost, list(lateness)

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds + (self.lateness.pop(0) if self.lateness else self.late)

    def emit(self) -> None:
        self.now += self.emit_cost


def stream(clock: LateClock, count: int, accept: float, per_token: float, prefill: float) -> tuple[list[int], float, list[float]]:
    """The simulator's streaming loop on ``clock``: what each emit carried, the whole time, the emit times."""
    started, emitted, times = clock(), [], []
    for done in server.paced(server.stream_schedule(count, accept, per_token, prefill), started, 1.0, clock, clock.sleep):
        times.append(clock())
        clock.emit()
        emitted.append(done)
    return emitted, clock() - started, times


def test_a_streamed_generation_emits_its_accept_length_per_step_after_the_first_token():
    emitted, seconds, _times = stream(LateClock(0.0, 0.0), 12, 5.41, 0.0065, 0.4)
    assert emitted == [1, 6, 11, 12]
    assert seconds == pytest.approx(0.4 + 11 * 0.0065)


@pytest.mark.parametrize("accept,per_token", [(2.71, 0.0081), (5.41, 0.0065)])
def test_the_decode_speed_holds_when_each_step_wakes_late(accept, per_token):
    """Each wake-up 3 ms late and each emit 1 ms of work: a sleep per step would add 4 ms a step
    (+0.17 s to NEXTN's 128 tokens in 43 steps, +0.10 s to balanced's 26), and how late a wake-up
    is follows the machine's load of the moment, which the gate's two measurements, a minute
    apart, do not share (one CI run read the 1.24x as 1.048x). Paced against the deadline, only
    the last step's lateness shows."""
    _emitted, seconds, _times = stream(LateClock(0.003, 0.001), 128, accept, per_token, 0.4)
    assert 0.4 + 127 * per_token <= seconds <= 0.4 + 127 * per_token + 0.003 + 0.001 + 1e-9


def test_steps_after_a_late_wake_up_catch_up_apart_not_at_once():
    """The first decode step wakes ten steps late (a busy machine for 0.24 s): the steps behind it
    follow half a step apart until they are back on time, never together (a burst would read as an
    inter-token latency of zero: one CI run's bench read ITL p50 0.0 ms), and the generation still
    ends on time."""
    accept, per_token = 2.71, 0.0081
    step = 3 * per_token
    _emitted, seconds, times = stream(LateClock(0.0, 0.0, lateness=(0.0, 10 * step)), 128, accept, per_token, 0.4)
    gaps = [b - a for a, b in zip(times[1:-1], times[2:-1])]  # the whole steps' (the last adds one token)
    assert min(gaps) == pytest.approx(step / 2)
    assert gaps.count(pytest.approx(step / 2)) == 20  # ten steps' lateness, repaid half a step at a time
    assert seconds == pytest.approx(0.4 + 127 * per_token)


# -- the settings a tune searches (hardware.py's model) ---------------------------------------------------------

from sglang_simulator import hardware  # noqa: E402  pylint: disable=wrong-import-position


def test_the_accept_length_follows_the_speculative_curve_through_the_measured_point():
    measured = 2.71
    at = {k: hardware.accept_for_steps(measured, 3, k) for k in range(1, 9)}
    assert at[3] == measured
    # a draft token accepted with probability a: 1 + a + a^2 + a^3 = 2.71 gives a ~ 0.744
    rate = at[1] - 1
    assert rate == pytest.approx(0.744, abs=0.001)
    assert at[5] == pytest.approx(sum(rate ** i for i in range(6)), rel=1e-6)
    values = [at[k] for k in sorted(at)]
    assert all(b > a for a, b in zip(values, values[1:]))                       # more steps, more tokens
    assert all(b - a < a - z for z, a, b in zip(values, values[1:], values[2:]))  # each step adds less
    assert all(at[k] < k + 1 for k in at)


PERF = hardware.Performance(step_seconds=0.02, eager_factor=2.0, batch_cost=0.05, draft_cost=0.1,
                            speculative=(("NEXTN", 2.71, 1.1, 3),))


def test_a_larger_batch_slows_each_request_and_graphs_end_at_their_largest_batch():
    one, eight = PERF.token_seconds(None, True, 1), PERF.token_seconds(None, True, 8)
    assert eight == pytest.approx(one * (1 + 0.05 * 7))
    # a batch of 16 past cuda_graph_max_bs 8 runs eager; within it, graphed
    assert PERF.token_seconds(None, True, 16, graph_max_bs=8) == pytest.approx(2.0 * PERF.token_seconds(None, True, 16))
    assert PERF.token_seconds(None, True, 8, graph_max_bs=8) == eight
    # the whole batch's tokens/s still grows with the batch (decode is bound by memory reads)
    assert 8 / eight > 4 / PERF.token_seconds(None, True, 4) > 1 / one


def test_the_best_step_count_falls_as_the_batch_grows():
    """The trade-off a tune has to find (one report: 7 steps best at batch 1, 3 at batch 64)."""
    def best(batch):
        return min(range(1, 9), key=lambda k: PERF.token_seconds("NEXTN", True, batch, k))
    assert best(1) > best(64) >= 1
    # the table's own point is unchanged at its steps and a batch of one
    assert PERF.token_seconds("NEXTN", True, 1, 3) == pytest.approx(0.02 * 1.1 / 2.71)


def test_a_file_without_the_new_coefficients_keeps_the_plain_model():
    plain = hardware._performance({"step_seconds": 0.02, "speculative": {"NEXTN": {"accept_length": 2.71}}})
    assert plain.token_seconds("NEXTN", True, 1, 5) == plain.token_seconds("NEXTN", True, 32, 1) == pytest.approx(0.02 / 2.71)


def test_requests_past_max_running_requests_wait_in_the_queue(launch):
    """Four streams at once on a server that runs one at a time: three wait for their first token
    (what a tune reads as TTFT against max_running_requests), and the whole takes four times one."""
    perf = dict(PERFORMANCE, time_scale=1.0, prefill_seconds=0.05, step_seconds=0.01, batch_cost=0.0)
    figures = {}
    for limit in (1, 4):
        server = launch([*MODEL, "--max-running-requests", str(limit)], host="ct200", gpus="0,1",
                        hw={"performance": perf})
        server.wait_for(lambda s=server: s.status("/health") == 200, timeout=120, what="health")
        result = _bench.benchmark(Client(f"http://127.0.0.1:{server.port}", None, True, 30), 4, 4, 20, 1, False, 30)
        server.proc.kill()
        server.proc.wait()
        assert result["ok"], result
        figures[limit] = result["figures"]
    # one at a time: the last first token after three whole requests (3 x (0.05 + 19 x 0.01) = 0.72 s)
    assert figures[1]["ttft_p95"] > 0.6 > 0.2 > figures[4]["ttft_p95"]
    assert figures[4]["output_tokens_per_s"] > 2.5 * figures[1]["output_tokens_per_s"]
