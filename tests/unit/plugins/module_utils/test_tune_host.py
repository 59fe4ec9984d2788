"""The tune's trial units on systemd (_tune_host.SystemTrials) through a fake host: the role's
rendering installed, each candidate's command line in a drop-in that resets ExecStart and turns
restarts off, trials started without being enabled, a dead trial stopped with its verdict, and
everything removed at the end; and the sglang_tune module's run of a whole tune on them."""

from __future__ import annotations

import json

import pytest
from sim_helpers import run_module

from ansible_collections.inferops.sglang.plugins.module_utils import _bench, _tune_host, _variants
from ansible_collections.inferops.sglang.plugins.modules import sglang_tune

SERVER = {"model_path": "/srv/models/q", "served_model_name": "q", "host": "127.0.0.1", "tp_size": 2}
BASE = {"speculative_algorithm": "NEXTN", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4, "context_length": 32768, "max_running_requests": 4,
        "mem_fraction_static": 0.85, "cuda_graph": False, "disable_radix_cache": True}


def trial(role: str, port: int) -> dict:
    server = dict(SERVER, port=port)
    args = _variants.quote(_variants.argv(BASE, server, (0, 5, 11)))
    unit = f"sglang-qwen-tune-{role}.service"
    text = (f"[Unit]\nDescription=trial\n[Service]\nUser=sglang\nExecStart=/opt/sglang/bin/python -m sglang.launch_server "
            f"{args} --config %d/sglang-qwen.yaml\nRestart=on-failure\nSyslogIdentifier=sglang-qwen-tune-{role}\n")
    return {"role": role, "unit": unit, "port": port, "url": f"http://127.0.0.1:{port}", "gpus": [3, 4],
            "unit_text": text, "render": {"exec_args": args, "server": server, "sglang_version": "0.5.11",
                                          "gpu_memory_mib": []}}


def rate(argv: list[str]) -> float:
    """The fake's tokens/s: a server that runs 8 requests at once is 1.5 times one that runs fewer."""
    flag = "--max-running-requests"
    return 150.0 if flag in argv and argv[argv.index(flag) + 1] == "8" else 100.0


class FakeHost:
    """SystemHost's surface the trials use: systemctl calls kept, the gate and the benchmark scripted."""

    def __init__(self, dies=lambda argv: False) -> None:
        self.calls: list[list[str]] = []
        self.dies = dies
        self.running: dict[str, list[str]] = {}
        self.unit_dir = None

    def systemctl(self, *args):
        self.calls.append(["systemctl", *args])
        if args[0] == "start":
            unit = args[-1]
            dropin = self.unit_dir / f"{unit}.d" / _tune_host.DROPIN
            line = [x for x in dropin.read_text().splitlines() if x.startswith("ExecStart=/")][0]
            self.running[unit] = line.split()
        return ""

    def run_command(self, argv):
        self.calls.append(list(argv))
        if argv[1] == "stop":
            self.running.pop(argv[-1], None)
        return 0, "", ""

    def gate(self, url, api_key_file, timeout, settle, unit=None):
        if self.dies(self.running.get(unit, [])):
            return {"ready": False, "failure": "process_exited", "cause": "cuda_oom",
                    "cause_summary": "CUDA out of memory while capturing CUDA graphs"}
        argv = self.running.get(unit, [])
        running = int(argv[argv.index("--max-running-requests") + 1]) if "--max-running-requests" in argv else 48
        return {"ready": True, "server": {"max_total_tokens": 5120, "max_running_requests": running}}

    def bench_pair(self, reference, candidate, load, thresholds):
        ref, cand = self.running[reference["unit"]], self.running[candidate["unit"]]
        pairs = max(2, load["rounds"])
        r = [rate(ref) * (1 + 0.01 * (i % 2)) for i in range(pairs)]
        c = [rate(cand) * (1 - 0.01 * (i % 2)) for i in range(pairs)]
        from ansible_collections.inferops.sglang.plugins.module_utils import _stats  # pylint: disable=import-outside-toplevel
        interval = _stats.ratio_interval(r, c)
        check = dict(interval, figure="output_tokens_per_s", verdict=_stats.verdict(interval, True))
        return {"ok": True, "figures": {"output_tokens_per_s": c[0], "ttft_p95": 0.1},
                "reference": {"figures": {"output_tokens_per_s": r[0], "ttft_p95": 0.1}},
                "comparison": {"checks": [check]}, "seconds": 1.0}


@pytest.fixture
def trials(tmp_path):
    host = FakeHost()
    host.unit_dir = tmp_path
    made = _tune_host.SystemTrials(host, [trial("reference", 30020), trial("candidate", 30021)],
                                   {"timeout": 60, "settle": 1}, unit_dir=str(tmp_path))
    return made, host, tmp_path


def test_install_writes_both_rendered_units_and_reloads(trials):
    made, host, unit_dir = trials
    made.install()
    for role in ("reference", "candidate"):
        path = unit_dir / f"sglang-qwen-tune-{role}.service"
        assert path.read_text() == made.trials[role]["unit_text"] and (path.stat().st_mode & 0o777) == 0o644
    assert host.calls == [["systemctl", "daemon-reload"]]


def test_a_candidate_runs_its_own_arguments_from_a_drop_in_without_restarts_or_enable(trials):
    made, host, unit_dir = trials
    made.install()
    started = made.start("candidate", dict(BASE, max_running_requests=8, cuda_graph=True, cuda_graph_max_bs=8))
    assert started["ready"]
    dropin = (unit_dir / "sglang-qwen-tune-candidate.service.d" / _tune_host.DROPIN).read_text()
    assert dropin.startswith("[Service]\nRestart=no\nExecStart=\nExecStart=/opt/sglang/bin/python -m sglang.launch_server ")
    assert "--max-running-requests 8" in dropin and "--cuda-graph-max-bs 8" in dropin and "--disable-cuda-graph" not in dropin
    # the rest of the rendered line stays: the port, the credential
    assert "--port 30021" in dropin and dropin.rstrip().endswith("--config %d/sglang-qwen.yaml")
    assert not any(c[:2] == ["systemctl", "enable"] for c in host.calls)
    assert ["systemctl", "start", "--", "sglang-qwen-tune-candidate.service"] in host.calls


def test_a_trial_that_dies_is_stopped_with_its_gates_verdict(tmp_path):
    host = FakeHost(dies=lambda argv: "--cuda-graph-max-bs" in argv)
    host.unit_dir = tmp_path
    made = _tune_host.SystemTrials(host, [trial("reference", 30020), trial("candidate", 30021)], {"timeout": 60},
                                   unit_dir=str(tmp_path))
    made.install()
    died = made.start("candidate", dict(BASE, cuda_graph=True, cuda_graph_max_bs=8))
    assert not died["ready"] and died["verdict"] == "process_exited" and "CUDA out of memory" in died["cause"]
    assert host.calls[-1] == ["systemctl", "stop", "--", "sglang-qwen-tune-candidate.service"]


def test_remove_leaves_no_trial_file_and_a_rendering_that_disagrees_is_refused(trials):
    made, host, unit_dir = trials
    made.install()
    made.start("reference", BASE)
    made.remove()
    assert list(unit_dir.iterdir()) == []
    assert ["systemctl", "stop", "--", "sglang-qwen-tune-reference.service"] in host.calls
    with pytest.raises(_tune_host.TrialError, match="no single ExecStart line"):
        _tune_host.exec_start("[Service]\nExecStart=/bin/true\n", "--model-path /m", "--model-path /n")


def test_the_module_runs_a_tune_on_the_trials_and_removes_them(capsys, tmp_path, monkeypatch):
    host = FakeHost()
    host.unit_dir = tmp_path / "units"
    host.unit_dir.mkdir()
    monkeypatch.setattr(sglang_tune._switch, "SystemHost", lambda *a, **kw: host)
    monkeypatch.setattr(sglang_tune._tune_host, "UNIT_DIR", str(host.unit_dir))
    args = {"service": "sglang-qwen.service", "run_id": "r1", "base_name": "nextn-small", "base": BASE,
            "trials": [trial("reference", 30020), trial("candidate", 30021)],
            "objective": {"concurrency": 8, "max_tokens": 32},
            "space": {"max_running_requests": [4, 8], "mem_fraction_static": [0.85, 0.88]},
            "budget": {"trials": 6}, "store_dir": str(tmp_path / "store"), "identity": {"host": "ct129", "model": "q"},
            "model_path": str(tmp_path), "check_gpus": False, "api_key": "tune-secret-key"}
    rc, result, _out = run_module(sglang_tune.main, capsys, args)
    assert rc == 0, result
    assert result["verdict"] == "better" and "max_running_requests 8" in result["msg"]
    entry = result["variant"]["nextn-small-tuned"]
    assert entry["inherits"] == "nextn-small" and entry["max_running_requests"] == 8
    assert entry["provenance"]["run"] == "r1" and entry["provenance"]["sglang_version"] == "0.5.11"
    assert "| rung |" in result["report"] and result["plot"].startswith("<svg")
    assert "- Trials: the base and each candidate serving at once, in interleaved pairs" in result["report"]
    # what each started server resolved is its evidence: the winner runs the 8 it was given
    assert "| - / 5120 | - / 8 |" in result["report"], result["report"]
    assert list(host.unit_dir.iterdir()) == []  # the trial units are gone
    stored = json.loads((tmp_path / "store").joinpath(result["store"].rsplit("/", 1)[1]).read_text())
    assert stored and "tune-secret-key" not in json.dumps(result) + json.dumps(stored)
    # the second run measures nothing again
    rc, again, _out = run_module(sglang_tune.main, capsys, args)
    assert rc == 0 and again["result"]["launches"] == 0 and again["result"]["reused"] == result["result"]["launches"]


def test_the_module_refuses_a_bad_objective_before_anything_changes(capsys, tmp_path):
    args = {"service": "s.service", "run_id": "r1", "base_name": "b", "base": BASE,
            "trials": [trial("reference", 30020), trial("candidate", 30021)], "objective": {"concurrency": 0},
            "store_dir": str(tmp_path / "store"), "model_path": str(tmp_path)}
    rc, result, _out = run_module(sglang_tune.main, capsys, args)
    assert rc == 1 and result["msg"].startswith("nothing was changed: objective.concurrency")
    assert not (tmp_path / "store").exists()


# -- one slot, and in place ------------------------------------------------------------------------------------

LIVE = {"unit": "sglang-qwen.service", "url": "http://127.0.0.1:30010", "gpus": [0, 2], "variant": "nextn-small"}


class OneSlotHost(FakeHost):
    """Also one server measured alone (SystemHost.bench), the live unit's own state, and systemd-run."""

    def __init__(self, live_comes_back: bool = True, **kw) -> None:
        super().__init__(**kw)
        self.live_comes_back = live_comes_back
        self.live_active = True
        self.bench_fails = False

    def systemctl(self, *args):
        if args[-1] == LIVE["unit"]:
            self.calls.append(["systemctl", *args])
            self.live_active = args[0] == "start"
            return ""
        return super().systemctl(*args)

    def gate(self, url, api_key_file, timeout, settle, unit=None):
        if unit == LIVE["unit"]:
            if self.live_comes_back and self.live_active:
                return {"ready": True, "msg": "ready"}
            return {"ready": False, "failure": "process_exited", "cause": "cuda_oom", "cause_summary": "CUDA out of memory"}
        return super().gate(url, api_key_file, timeout, settle, unit=unit)

    def bench(self, url, api_key_file, load, baseline, thresholds, unit=None):
        # what SystemHost.bench reads (_bench.measure): every load setting
        assert set(_bench.LOAD_SETTINGS) <= set(load), sorted(set(_bench.LOAD_SETTINGS) - set(load))
        if self.bench_fails:
            raise KeyError("a bug in the measurement")
        assert len(self.running) == 1 and unit in self.running, f"measured {unit} with {sorted(self.running)} running"
        assert not self.live_active or not self.in_place, "a trial measured while the live service runs on its GPUs"
        speed = rate(self.running[unit])
        rounds = [{"output_tokens_per_s": speed * (1 + 0.01 * (i % 3 - 1)), "ttft_p95": 0.1, "ttft_p50": None,
                   "tpot_p50": None, "itl_p50": None, "accept_length": None} for i in range(load["rounds"])]
        self.calls.append(["bench", unit, str(load["rounds"])])
        return {"ok": True, "rounds": rounds, "figures": {"output_tokens_per_s": speed, "ttft_p95": 0.1}, "seconds": 1.0}

    def bench_pair(self, reference, candidate, load, thresholds):
        raise AssertionError("one slot: the two never serve at once")


def one_slot(tmp_path, mode: str, **host_kw):
    host = OneSlotHost(**host_kw)
    host.in_place = mode == "in_place"
    host.unit_dir = tmp_path
    roles = (("reference", 30020), ("candidate", 30021))
    made = [dict(trial(role, port), gpus=[0, 2], mode=mode, live=LIVE) for role, port in roles]
    return _tune_host.SystemTrials(host, made, {"timeout": 60, "settle": 1}, unit_dir=str(tmp_path),
                                   restore_after=5000 if mode == "in_place" else None), host


def test_in_place_arms_the_restore_timer_before_it_stops_the_live_unit_and_restores_and_proves_it(tmp_path):
    made, host = one_slot(tmp_path, "in_place")
    assert not made.together
    made.install()
    made.start("reference", BASE)
    timer = "sglang-qwen-tune-restore"
    arm = next(i for i, c in enumerate(host.calls) if c[0] == "systemd-run")
    stop_live = host.calls.index(["systemctl", "stop", "--", "sglang-qwen.service"])
    assert arm < stop_live < host.calls.index(["systemctl", "start", "--", "sglang-qwen-tune-reference.service"])
    assert host.calls[arm][:5] == ["systemd-run", "--quiet", f"--unit={timer}", "--on-active=5000s",
                                   "--timer-property=AccuracySec=1s"]
    assert host.calls[arm][-4:][1:] == ["start", "--", "sglang-qwen.service"]
    # the trial conflicts with the live unit: whichever systemd starts stops the other
    dropin = (tmp_path / "sglang-qwen-tune-reference.service.d" / _tune_host.DROPIN).read_text()
    assert dropin.startswith("[Unit]\nConflicts=sglang-qwen.service\n[Service]\nRestart=no\n")
    measured = made.measure("reference", {"requests": 4, "concurrency": 2, "max_tokens": 8, "rounds": 3, "warmup": True,
                                          "timeout": 60})
    assert measured["ok"] and len(measured["rounds"]) == 3
    made.stop("reference")
    made.remove()
    assert host.calls[-3:] == [["systemctl", "reset-failed", "--", "sglang-qwen.service"],
                               ["systemctl", "start", "--", "sglang-qwen.service"],
                               ["systemctl", "stop", "--", f"{timer}.timer"]]
    assert made.restored["ready"] and host.live_active and list(tmp_path.iterdir()) == []


def test_in_place_a_live_unit_that_does_not_come_back_is_an_error_and_the_timer_stays_armed(tmp_path):
    made, host = one_slot(tmp_path, "in_place", live_comes_back=False)
    made.install()
    made.start("reference", BASE)
    with pytest.raises(_tune_host.TrialError, match="the live service sglang-qwen.service did not come back.*cuda_oom"):
        made.remove()
    assert ["systemctl", "stop", "--", "sglang-qwen-tune-restore.timer"] not in host.calls[-2:]
    assert made.live_stopped


def test_in_place_is_refused_without_the_live_unit_or_the_timer(tmp_path):
    host = OneSlotHost()
    made = [dict(trial(role, port), mode="in_place", live=None) for role, port in (("reference", 1), ("candidate", 2))]
    with pytest.raises(_tune_host.TrialError, match="needs the live service's unit and URL"):
        _tune_host.SystemTrials(host, made, {}, unit_dir=str(tmp_path), restore_after=60)
    made = [dict(m, live=LIVE) for m in made]
    with pytest.raises(_tune_host.TrialError, match="needs restore_after"):
        _tune_host.SystemTrials(host, made, {}, unit_dir=str(tmp_path))
    with pytest.raises(_tune_host.TrialError, match="the same for both"):
        _tune_host.SystemTrials(host, [made[0], dict(made[1], mode="two")], {}, unit_dir=str(tmp_path), restore_after=60)


def module_args(tmp_path, mode: str) -> dict:
    return {"service": "sglang-qwen.service", "run_id": "r1", "base_name": "nextn-small", "base": BASE,
            "trials": [dict(trial(role, port), mode=mode, live=LIVE)
                       for role, port in (("reference", 30020), ("candidate", 30021))],
            "objective": {"concurrency": 8, "max_tokens": 32}, "space": {"max_running_requests": [4, 8]},
            "budget": {"trials": 3, "minutes": 10}, "store_dir": str(tmp_path / "store"), "model_path": str(tmp_path),
            "check_gpus": False, "gate_timeout": 100}


@pytest.mark.parametrize("mode", ["one", "in_place"])
def test_the_module_tunes_in_one_slot_and_in_place_restores_the_live_service(capsys, tmp_path, monkeypatch, mode):
    host = OneSlotHost()
    host.in_place = mode == "in_place"
    host.unit_dir = tmp_path / "units"
    host.unit_dir.mkdir()
    monkeypatch.setattr(sglang_tune._switch, "SystemHost", lambda *a, **kw: host)
    monkeypatch.setattr(sglang_tune._tune_host, "UNIT_DIR", str(host.unit_dir))
    rc, result, _out = run_module(sglang_tune.main, capsys, module_args(tmp_path, mode))
    assert rc == 0, result
    assert result["mode"] == mode and result["verdict"] == "better" and "max_running_requests 8" in result["msg"]
    assert result["result"]["reference_starts"] == 2 and result["result"]["trial_slots"] == 1
    benched = [c[1] for c in host.calls if c[0] == "bench"]
    assert benched[0] == benched[-1] == "sglang-qwen-tune-reference.service" and "sglang-qwen-tune-candidate.service" in benched
    live_calls = [c for c in host.calls if c[-1] == "sglang-qwen.service" and c[0] == "systemctl"]
    assert "- Trials: one slot, taking turns: the base alone before and after the candidates (2 starts)" in result["report"]
    if mode == "one":
        assert result["restored"] is None and live_calls == [] and host.live_active
        assert "in place" not in result["report"]
    else:
        assert result["restored"]["unit"] == "sglang-qwen.service" and result["restored"]["ready"] and host.live_active
        # the timer: the job's limit (10 min, three gates of 100 s, the margin) and a minute
        assert any(c[0] == "systemd-run" and "--on-active=1560s" in c for c in host.calls)
        assert "at most 26 min" in result["result"]["downtime"]["msg"]
        assert "in place: the live service sglang-qwen.service stopped for the tune, serving again" in result["report"]
    assert list(host.unit_dir.iterdir()) == []


def test_the_module_fails_when_the_live_service_does_not_come_back_after_a_tune_in_place(capsys, tmp_path, monkeypatch):
    host = OneSlotHost(live_comes_back=False)
    host.in_place = True
    host.unit_dir = tmp_path / "units"
    host.unit_dir.mkdir()
    monkeypatch.setattr(sglang_tune._switch, "SystemHost", lambda *a, **kw: host)
    monkeypatch.setattr(sglang_tune._tune_host, "UNIT_DIR", str(host.unit_dir))
    rc, result, _out = run_module(sglang_tune.main, capsys, module_args(tmp_path, "in_place"))
    assert rc == 1
    assert "the tune ended (better" in result["msg"] and "did not come back" in result["msg"]
    assert "the restore timer sglang-qwen-tune-restore starts it again" in result["msg"]


def test_whatever_ends_a_tune_in_place_the_live_service_comes_back_first(capsys, tmp_path, monkeypatch):
    """Not only the errors the module expects: an exception of any kind removes the trial units and restores the
    live service before it ends the module."""
    host = OneSlotHost()
    host.in_place, host.bench_fails = True, True
    host.unit_dir = tmp_path / "units"
    host.unit_dir.mkdir()
    monkeypatch.setattr(sglang_tune._switch, "SystemHost", lambda *a, **kw: host)
    monkeypatch.setattr(sglang_tune._tune_host, "UNIT_DIR", str(host.unit_dir))
    with pytest.raises(KeyError):
        run_module(sglang_tune.main, capsys, module_args(tmp_path, "in_place"))
    assert host.live_active and ["systemctl", "stop", "--", "sglang-qwen-tune-restore.timer"] == host.calls[-1]
    assert list(host.unit_dir.iterdir()) == []


class JournalHost(FakeHost):
    """systemctl show and journalctl answering as systemd does for a trial that started and served a load."""

    def __init__(self, lines_at_start: list[str], lines_later: list[str]) -> None:
        super().__init__()
        self.journal = list(lines_at_start)
        self.later = lines_later

    def run_command(self, argv):
        if argv[:2] == ["systemctl", "show"]:
            return 0, "LoadState=loaded\nActiveState=active\nSubState=running\nMainPID=4242\n" \
                      "InactiveExitTimestampMonotonic=1000000\nSyslogIdentifier=sglang-qwen-tune-candidate\n", ""
        if argv[0] == "journalctl":
            if "-u" not in argv:
                return 0, "", ""
            entries = [json.dumps({"MESSAGE": line, "__CURSOR": str(i), "__REALTIME_TIMESTAMP": str(2 ** 62),
                                   "_SYSTEMD_UNIT": argv[argv.index("-u") + 1]})
                       for i, line in enumerate(self.journal)]
            return 0, "\n".join(reversed(entries) if "--reverse" in argv else entries), ""
        return super().run_command(argv)


def test_a_trials_signals_come_from_its_own_log_the_summary_read_when_it_became_ready(tmp_path):
    """The start-up summary (available_gpu_mem) is read once the trial is ready; later, under the load, the
    journal's newest entries no longer reach back to it, and the decode lines and retractions come from there."""
    summary = ("[2026-12-05 10:00:00 TP0] max_total_num_tokens=412160, chunked_prefill_size=8192, max_prefill_tokens=16384, "
               "max_running_requests=8, context_len=32768, available_gpu_mem=3.10 GB")
    decode = ("[2026-12-05 10:01:00 TP0] Decode batch, #running-req: 8, #token: 400000, token usage: 0.97, cuda graph: True, "
              "gen throughput (token/s): 900.00, #queue-req: 6")
    host = JournalHost([summary], [decode])
    host.unit_dir = tmp_path
    made = _tune_host.SystemTrials(host, [trial("reference", 30020), trial("candidate", 30021)], {"timeout": 60},
                                   unit_dir=str(tmp_path))
    made.install()
    assert made.start("candidate", dict(BASE, max_running_requests=8))["ready"]
    host.journal = host.later  # the load's lines; the summary is out of the read's window
    found = made.signals("candidate")
    assert (found["available_mem_gb"], found["token_usage_max"], found["queue_max"]) == (3.1, 0.97, 6)
    assert any("under the 5-8 GB SGLang advises" in r for r in found["reading"])
    assert any("the KV pool was full (token usage 0.97) with 6 request(s) queued" in r for r in found["reading"])


def test_each_progress_event_reads_as_a_line_and_an_unknown_one_as_json():
    assert sglang_tune._event_text({"event": "live_stopped", "unit": "sglang-qwen.service", "restore_after": 1560}) == (
        "sglang-qwen.service stopped for the tune (a timer starts it again in 1560 s at the latest)")
    assert sglang_tune._event_text({"event": "more pairs", "pairs": 8, "ratio": 3.2, "low": 1.1, "high": 9.5}) == (
        "last rung: 8 pairs, ratio 3.2 [1.1, 9.5]")
    assert sglang_tune._event_text({"event": "reference", "when": "after", "msg": "780 output tokens/s"}) == (
        "the base alone, after: 780 output tokens/s")
    assert sglang_tune._event_text({"event": "new", "x": 1}) == '{"event": "new", "x": 1}'
