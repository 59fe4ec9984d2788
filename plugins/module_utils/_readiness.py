# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The readiness gate: prove an SGLang server serves, or say at once why not.

Ready means, in order: the watched process is alive (``process``); the HTTP
server answers (``http``); ``/v1/models`` lists a model (``models``);
``/health`` is 200 (``health``: SGLang answers /v1/models before its warmup
is done); the real generations return text and tokens (``generation``); the
process is still the same one ``settle`` seconds later (``settled``).

Every poll first looks at the process (a systemd unit's state, main PID and
restart count, or a plain PID: the watchers of ``_process_watch``) and its new
log lines, so a server that dies, restarts, or logs a fatal error and hangs ends
the wait within about one poll interval, with the cause read from the log.

The server answering must be the watched one: before the http phase passes
(and the API key is sent) and again before the verdict, the LISTEN socket
behind the URL must belong to the watched process or a descendant, or to the
unit's cgroup (``_listener.find_listener``); another process there is ``port_taken``.

This file owns the phases, the start-up stages and their stall budgets, the
``/server_info`` figures, the verdict and the operator's message.
"""

from __future__ import annotations

import collections
import json
import math
import time

from ansible_collections.inferops.sglang.plugins.module_utils import _mask
from ansible_collections.inferops.sglang.plugins.module_utils import _sglang_log as sglog
from ansible_collections.inferops.sglang.plugins.module_utils import _state_files as state_files
from ansible_collections.inferops.sglang.plugins.module_utils._http import Client, Response
from ansible_collections.inferops.sglang.plugins.module_utils._listener import Listener, find_listener
from ansible_collections.inferops.sglang.plugins.module_utils._process_watch import GateFailure, Observation

PHASES = ("process", "http", "models", "health", "ready", "generation", "settled")
FAILURES = (
    "unit_missing",
    "unit_failed",
    "unit_inactive",
    "unit_restarted",
    "process_exited",
    "port_taken",
    "stalled",
    "not_listening",
    "not_ready",
    "unauthorized",
    "generation_error",
    "generation_empty",
    "generation_timeout",
    "timeout",
)
ENDPOINTS = {"generate": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}
_KEEP_LINES = 4000


# -- start-up stages and their budgets ----------------------------------------
#
# Real SGLang dies after a fatal error (real-sglang.md); what it does not die of
# is a hang that logs nothing: a torch.distributed / NCCL initialisation that
# never completes, a CUDA graph capture with custom all-reduce that never
# returns (upstream PR #11275), a weight load from a stalled network mount. The
# gate follows the start-up stages from the server's own log lines
# (_sglang_log.stage_of) and fails a start whose current stage has lasted longer
# than its budget as ``stalled``, naming the stage and its last line, long before
# the overall deadline. A stage's clock starts at the line that enters it; any
# later milestone, the same stage entered again included (the draft model's own
# weight load), restarts it.
#
# The defaults, in seconds, and why:
#   starting     300  imports, argument resolution and the tokenizer: tens of seconds on a
#                     GPU host; the rest is a hang before SGLang logs anything.
#   distributed  600  torch.distributed's own default timeout (SGLang's --dist-timeout is
#                     None by default, 0.5.11 srt/server_args.py:403): NCCL gives up then.
#   weights      600  55.56 GB of Qwen3.6-27B weights at 100 MB/s (a slow network mount)
#                     is 556 s; local NVMe or the page cache take seconds (the field's
#                     first variant failed on its pool 33 s after start).
#   memory_pool  120  sizing and allocating the KV and state pools: seconds.
#   engine       600  between milestones (attention backends, kernels compiled just in
#                     time on a first start): minutes at worst.
#   cuda_graph   300  SGLang's own --watchdog-timeout for one forward batch (300 s,
#                     0.5.11 srt/server_args.py:401); a capture of every batch size takes
#                     one to three minutes.
#   http         120  the tokenizer manager and uvicorn coming up: seconds.
#   warmup       600  SGLang's own warmup request limit (SGLANG_WARMUP_TIMEOUT unset:
#                     600 s, 0.5.11 srt/entrypoints/http_server.py:1952-1960).
# 0 turns a stage's budget off. Stall detection needs the server's log: without
# one (no unit, no log_file, an unreadable journal) only the deadline applies.
STALL_BUDGETS = {"starting": 300.0, "distributed": 600.0, "weights": 600.0, "memory_pool": 120.0, "engine": 600.0,
                 "cuda_graph": 300.0, "http": 120.0, "warmup": 600.0}
# How often the progress file is rewritten while nothing new happens.
_HEARTBEAT = 5.0


def stall_budgets(overrides: dict | None) -> dict[str, float]:
    """STALL_BUDGETS with the caller's overrides; ValueError names a bad one."""
    budgets = dict(STALL_BUDGETS)
    for stage, value in (overrides or {}).items():
        if stage not in STALL_BUDGETS:
            raise ValueError(f"stall_budgets: unknown stage {stage!r} (stages: {', '.join(STALL_BUDGETS)})")
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"stall_budgets.{stage} must be a number of seconds, got {value!r}") from None
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"stall_budgets.{stage} must be a finite number of seconds >= 0 (0: no budget), got {value!r}")
        budgets[stage] = seconds
    return budgets


# -- what the server says it runs (/server_info) ---------------------------------
#
# /server_info returns the resolved server arguments at its top level (the API
# key among them: only the figures below are kept) and one dict per DP rank in
# internal_states (0.5.11 and 0.5.23 srt/entrypoints/http_server.py get_server_info,
# scheduler get_internal_state). Where each figure is, by release (both checked
# against the real 0.5.11 and 0.5.23 servers on CPU):
#   max_total_tokens       top max_total_num_tokens (internal memory_usage.token_capacity)
#   max_running_requests   internal effective_max_running_requests_per_dp (x dp_size);
#                          the top-level max_running_requests is the flag as given
#   chunked_prefill_size, mem_fraction_static, context_length, version: top level
#   cuda_graph_bs          0.5.9-0.5.13 top cuda_graph_bs (listed even with graphs off);
#                          0.5.14-0.5.20 top cuda_graph_config.decode.bs (backend "disabled"
#                          when off); 0.5.21+ internal decode_cuda_graph_bs (the captured
#                          sizes); [] when disable_cuda_graph is true


def server_figures(info: object) -> dict | None:
    """The resolved figures of a /server_info answer, or None when it is not one."""
    if not isinstance(info, dict):
        return None
    states = info.get("internal_states")
    state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
    usage = state.get("memory_usage") if isinstance(state.get("memory_usage"), dict) else {}
    dp = info.get("dp_size") if isinstance(info.get("dp_size"), int) and info.get("dp_size") > 0 else 1
    per_dp = state.get("effective_max_running_requests_per_dp")
    running = per_dp * dp if isinstance(per_dp, int) else info.get("max_running_requests")
    graphs = info.get("cuda_graph_bs")
    if graphs is None:
        graphs = state.get("decode_cuda_graph_bs")
    config = info.get("cuda_graph_config")
    decode = config.get("decode") if isinstance(config, dict) and isinstance(config.get("decode"), dict) else {}
    if graphs is None:
        graphs = decode.get("bs")
    if info.get("disable_cuda_graph") is True or decode.get("backend") == "disabled":
        graphs = []
    return {
        "version": info.get("version"),
        "max_total_tokens": info.get("max_total_num_tokens") or usage.get("token_capacity"),
        "max_running_requests": running,
        "chunked_prefill_size": info.get("chunked_prefill_size"),
        "mem_fraction_static": info.get("mem_fraction_static"),
        "context_length": info.get("context_length"),
        "cuda_graph_bs": graphs,
    }


# -- the gate -------------------------------------------------------------------

class Gate:
    def __init__(self, client: Client, watcher, timeout: float, interval: float = 1.0, model: str | None = None,
                 prompt: str = "The capital city of France is", max_tokens: int = 16, endpoint: str = "generate",
                 generations: int = 1, settle: float = 3.0, progress=None, check_listener: bool = True,
                 budgets: dict | None = None, progress_file: str | None = None, clock=time.monotonic,
                 sleep=time.sleep) -> None:
        self.client, self.watcher = client, watcher
        # the gate's own time: its deadline, stage budgets, settle and waits (tests inject their own)
        self.clock, self.sleep = clock, sleep
        self.check_listener = check_listener
        self.listener: Listener | None = None
        self.timeout, self.interval = timeout, interval
        self.model, self.prompt, self.max_tokens, self.endpoint = model, prompt, max_tokens, endpoint
        self.generations_wanted, self.settle = generations, settle
        self.budgets = stall_budgets(budgets)
        self.progress = progress or (lambda message: None)
        self.progress_file = progress_file
        self.lines: collections.deque[str] = collections.deque(maxlen=_KEEP_LINES)
        self.phase = "process"
        self.phases: dict[str, float] = {}
        self.timeline: list[dict] = []
        self.models: list[str] = []
        self.generations: list[dict] = []
        self.server: dict | None = None
        self.last: Response | None = None
        self.stage: str | None = None
        self.stage_since = 0.0
        self.stage_line: str | None = None
        self.stages: list[dict] = []
        self.started = 0.0
        self.settle_from = 0.0
        self.written = 0.0

    # -- bookkeeping --
    def elapsed(self) -> float:
        return round(self.clock() - self.started, 3)

    def _event(self, text: str) -> None:
        self.timeline.append({"elapsed": self.elapsed(), "phase": self.phase, "event": text})
        self.progress(f"[{self.elapsed():.1f}s {self.phase}] {text}")
        self._write_progress()

    def status(self) -> dict:
        """Where the gate is now: what the progress file holds."""
        return {
            "time": time.time(),
            "elapsed": self.elapsed(),
            "phase": self.phase,
            "stage": self.stage,
            "stage_elapsed": round(self.clock() - self.stage_since, 1) if self.stage else None,
            "event": self.timeline[-1]["event"] if self.timeline else None,
            "last_log_line": self._masked(sglog.last_meaningful(list(self.lines)[-50:])),
        }

    def _masked(self, text: str | None) -> str | None:
        """A log line without secrets: SGLang logs every server argument at INFO,
        the API key in clear (0.5.11 srt/entrypoints/engine.py:679), and the
        progress file is outside Ansible's no_log masking."""
        if not text:
            return text
        return _mask.mask(text, (self.client.api_key,))

    def _write_progress(self) -> None:
        """Rewrite the progress file (atomically, 0600: it can hold log lines);
        best effort, a progress file that cannot be written never fails a gate."""
        if not self.progress_file:
            return
        self.written = self.clock()
        try:
            # rewritten at every event: not synced, a crash of the host loses nothing that matters
            state_files.write_atomic(self.progress_file, json.dumps(self.status()), 0o600, sync=False)
        except OSError:
            return

    def _pass(self, phase: str, text: str) -> None:
        self.phases[phase] = self.elapsed()
        self._event(text)
        index = PHASES.index(phase)
        self.phase = PHASES[min(index + 1, len(PHASES) - 1)]
        self._write_progress()  # the phase now being checked

    def _enter(self, stage: str, line: str | None, at: float | None = None) -> None:
        self.stage, self.stage_line = stage, line
        self.stage_since = self.clock() if at is None else at
        self.stages.append({"stage": stage, "elapsed": round(self.stage_since - self.started, 3)})
        self._event(f"stage {stage} ({sglog.STAGE_DESCRIPTIONS.get(stage, stage)})" + (f": {_clip(line)}" if line else ""))

    def _begin_stages(self) -> None:
        """The implicit first stage, from the process's start: only for a
        server that can still be starting (one up longer than that budget, whose
        earlier log may be gone, is not judged by it)."""
        if not self.watcher.has_log:
            return
        age = self.watcher.since_start() or 0.0
        budget = self.budgets["starting"]
        if not budget or age < budget:
            self._enter("starting", None, self.clock() - age)

    def _read_log(self) -> None:
        new = self.watcher.new_lines()
        if not new:
            return
        self.lines.extend(new)
        for line in new:
            stage = sglog.stage_of(line)
            if stage:
                self._enter(stage, sglog.strip_stamp(line))

    def _check_stall(self) -> None:
        if not self.stage or self.stage == "serving" or getattr(self.watcher, "journal_error", None):
            return
        if self.stage == "starting" and not self.lines:
            # Not one line read: the server logs somewhere the gate does not read (a unit
            # whose output goes to a file), not a hang (real SGLang logs its arguments and
            # library warnings in its first seconds). Only the deadline applies.
            return
        budget = self.budgets.get(self.stage) or 0.0
        spent = self.clock() - self.stage_since
        if budget and spent > budget:
            last = sglog.last_meaningful(list(self.lines)) or self.stage_line
            raise GateFailure("stalled", f"no progress in stage {self.stage} "
                              f"({sglog.STAGE_DESCRIPTIONS.get(self.stage, self.stage)}) for {spent:.0f} s "
                              f"(budget {budget:.0f} s)" + (f"; last log line: {_clip(last)}" if last else ""))

    # -- the loop --
    def run(self) -> dict:
        self.started = self.clock()
        deadline = self.started + self.timeout
        try:
            self._check(self.watcher.begin())
            self._begin_stages()
            while True:
                self._read_log()
                self._check(self.watcher.poll())
                if self.phase == "process":
                    self._pass("process", f"process alive ({self.watcher.kind}, pid {self.watcher.pid})")
                    continue
                if self.phase in ("http", "models", "health", "ready"):
                    self._check_stall()
                if self._step(deadline):
                    return self._verdict(None)
                now = self.clock()
                if now >= deadline:
                    raise GateFailure(self._timeout_failure(), f"no verdict within {self.timeout:.0f} s")
                if now - self.written >= _HEARTBEAT:
                    self._write_progress()
                self.sleep(min(self.interval, max(0.0, deadline - now)))
        except GateFailure as exc:
            return self._verdict(exc)

    def _timeout_failure(self) -> str:
        if self.phase == "http":
            return "not_listening"
        if self.phase in ("models", "health", "ready"):
            return "not_ready"
        return "timeout"

    def _check(self, obs: Observation) -> None:
        if obs.failure:
            raise GateFailure(obs.failure, obs.detail)

    def _remaining(self, deadline: float) -> float:
        return max(0.1, deadline - self.clock())

    def _whose_port(self) -> Listener:
        """Who listens on the URL's host:port; port_taken when it is not the
        watched server. Said once in the timeline when it cannot be checked."""
        if not self.check_listener:
            seen = Listener("unverified", "check_listener is off")
        else:
            seen = find_listener(self.client.url, self.watcher)
        if seen.state == "unverified" and (self.listener is None or self.listener.state != "unverified"):
            self._event(f"who listens is not checked: {seen.detail}")
        self.listener = seen
        if seen.state == "foreign":
            raise GateFailure("port_taken", f"another process answers on {seen.address}: {seen.detail}")
        return seen

    def _step(self, deadline: float) -> bool:
        """One poll of the current phase; True when the server is proven ready."""
        if self.phase in ("http", "models"):
            # The API key goes only to a listener proven to be the server's own
            # (or, where that cannot be checked, as before): the check comes first.
            seen = self._whose_port() if self.phase == "http" else self.listener
            owned = seen is None or seen.state in ("owned", "unverified")
            resp = self.last = self.client.call("GET", "/v1/models", timeout=self._remaining(deadline), auth=owned)
            if resp.kind in ("refused", "timeout", "dropped", "error"):
                return False
            if not owned:
                return False  # it began listening just now: whose it is, is checked on the next poll
            if self.phase == "http":
                self._pass("http", f"HTTP answers ({resp.describe() if resp.kind != 'ok' else resp.status})")
            self._auth(resp, "/v1/models")
            ids = _model_ids(resp.body) if resp.kind == "ok" else []
            if ids:
                self.models = ids
                self._pass("models", f"/v1/models lists {', '.join(ids)}")
            else:
                return False
        if self.phase == "health":
            resp = self.last = self.client.call("GET", "/health", timeout=self._remaining(deadline))
            self._auth(resp, "/health")
            if resp.status != 200:
                return False
            self._pass("health", "/health 200 (warmup done)")
        if self.phase == "ready":
            # /ready (0.5.20+, 0.5.23 srt/entrypoints/http_server.py:714-718): 200 when the
            # tokenizer manager takes new requests, 503 otherwise; older releases answer 404.
            resp = self.last = self.client.call("GET", "/ready", timeout=self._remaining(deadline))
            self._auth(resp, "/ready")
            if resp.status == 404:
                self._pass("ready", "/ready is not served (SGLang before 0.5.20)")
            elif resp.status == 200:
                self._pass("ready", "/ready 200 (takes new requests)")
            else:
                return False
        if self.phase == "generation":
            while len(self.generations) < self.generations_wanted:
                self.generations.append(self._generate(deadline))
            self._pass("generation", f"{len(self.generations)} real generation(s) returned tokens")
            self._read_server_info(deadline)
            self.settle_from = self.clock()
        if self.phase == "settled":
            if self.clock() - self.settle_from < self.settle:
                return False
            self.phases["settled"] = self.elapsed()
            self._event(f"same process after {self.settle:g} s")
            self._whose_port()  # still the server's own socket behind the URL
            return True
        return False

    def _read_server_info(self, deadline: float) -> None:
        """What the server resolved (its figures, never the arguments whole: they
        hold the API key); a server that does not answer it still passes."""
        resp = self.client.call("GET", "/server_info", timeout=self._remaining(deadline))
        self.server = server_figures(resp.body) if resp.kind == "ok" else None
        if self.server:
            shown = ", ".join(f"{k}={v}" for k, v in self.server.items() if k != "cuda_graph_bs" and v is not None)
            self._event(f"/server_info: {shown}")
        else:
            self._event(f"/server_info not read ({resp.describe()})")

    def _auth(self, resp: Response, path: str) -> None:
        if resp.status in (401, 403):
            raise GateFailure("unauthorized", f"{path} answered HTTP {resp.status}")

    def _generate(self, deadline: float) -> dict:
        path = ENDPOINTS[self.endpoint]
        model = self.model or (self.models[0] if self.models else None)
        if self.endpoint == "generate":
            body = {"text": self.prompt, "sampling_params": {"max_new_tokens": self.max_tokens, "temperature": 0}}
        elif self.endpoint == "completions":
            body = {"model": model, "prompt": self.prompt, "max_tokens": self.max_tokens, "temperature": 0}
        else:
            body = {"model": model, "messages": [{"role": "user", "content": self.prompt}],
                    "max_tokens": self.max_tokens, "temperature": 0}
        resp = self.last = self.client.call("POST", path, body, timeout=self._remaining(deadline))
        if resp.kind != "ok":
            self._after_request_failure()
            self._auth(resp, path)
            if resp.kind == "timeout":
                raise GateFailure("generation_timeout", f"POST {path}: {resp.describe()}")
            raise GateFailure("generation_error", f"POST {path}: {resp.describe()}" + _body_hint(resp.body))
        text, tokens, accept = _parse_generation(self.endpoint, resp.body)
        record = {
            "endpoint": path,
            "model": model,
            "text": (text or "")[:200],
            "completion_tokens": tokens,
            "latency": round(resp.latency, 3),
            "tokens_per_second": round(tokens / resp.latency, 1) if tokens and resp.latency > 0 else None,
            "spec_accept_length": accept,
        }
        if not (text or "").strip() or not tokens or tokens <= 0:
            self._after_request_failure()
            raise GateFailure("generation_empty", f"POST {path} returned text {text!r} with completion_tokens={tokens}")
        self._event(f"generation: {tokens} tokens in {resp.latency:.2f} s")
        return record

    def _after_request_failure(self) -> None:
        """A request failed: give the process manager a moment to notice a dead
        server, so the verdict names the crash rather than the dropped request."""
        until = self.clock() + max(1.0, 2 * self.interval)
        while True:
            obs = self.watcher.poll()
            self._read_log()
            if obs.failure:
                raise GateFailure(obs.failure, obs.detail)
            if self.clock() >= until:
                return
            self.sleep(0.1)

    # -- the verdict --
    def _verdict(self, failure: GateFailure | None) -> dict:
        if failure is not None and failure.failure != "unauthorized" and self.watcher.has_log:
            # A crash's last lines can reach the journal a moment after systemd
            # saw the process die (journald reads service output from a stream):
            # sync the journal, then, when the process is gone, read again for up
            # to the watcher's cause_wait (6 s for a journal, 0.5 s for a log file)
            # until a cause shows; failing that, read this run's whole log.
            self.watcher.sync()
            until = self.clock() + (self.watcher.cause_wait if failure.failure in _DEAD_PROCESS else 0.0)
            self._read_log()
            found = sglog.classify(list(self.lines))
            while not found and self.clock() < until:
                self.sleep(0.2)
                self._read_log()
                found = sglog.classify(list(self.lines))
            if not found:
                extra = self.watcher.all_lines()
                if sglog.classify(extra):
                    self.lines.extend(extra)
        lines = list(self.lines)
        found = sglog.classify(lines) if failure is not None else None
        since_start = self.watcher.since_start()
        delay = self.watcher.detection_delay() if failure is not None else None
        result = {
            "ready": failure is None,
            "phase": self.phase,
            "failure": failure.failure if failure else None,
            "cause": found["cause"] if found else ("unknown" if failure and failure.failure in _PROCESS_FAILURES else None),
            "cause_summary": found["what"] if found else None,
            "cause_line": found["line"] if found else None,
            "advice": found["advice"] if found else None,
            "other_causes": found.get("others", []) if found else [],
            "evidence": found["evidence"] if found else (sglog.error_tail(lines) if failure and lines else []),
            "elapsed": self.elapsed(),
            "since_start": round(since_start, 1) if since_start is not None else None,
            "detection_delay": round(delay, 3) if delay is not None else None,
            "phases": self.phases,
            "stage": self.stage,
            "stages": self.stages,
            "timeline": self.timeline,
            "server": self.server,
            "models": self.models,
            "generation": self.generations[-1] if self.generations else None,
            "generations": self.generations,
            "process": self.watcher.describe(),
            "listener": self.listener.describe() if self.listener else None,
            "last_log_line": sglog.last_meaningful(lines),
            "last_response": self.last.describe() if self.last else None,
            "detail": failure.detail if failure else None,
        }
        result["msg"] = message(result, self.client.url, self.timeout)
        return result


# The process is gone: its last lines may reach the journal after systemd saw it die.
_DEAD_PROCESS = ("unit_failed", "unit_restarted", "unit_inactive", "process_exited")
_PROCESS_FAILURES = ("unit_failed", "unit_restarted", "unit_inactive", "process_exited",
                     "not_listening", "not_ready", "timeout")


def _model_ids(body: object) -> list[str]:
    if isinstance(body, dict) and isinstance(body.get("data"), list):
        return [str(m.get("id")) for m in body["data"] if isinstance(m, dict) and m.get("id")]
    return []


def _body_hint(body: object) -> str:
    if body in (None, ""):
        return ""
    text = body if isinstance(body, str) else json.dumps(body)
    return f": {text[:300]}"


def _parse_generation(endpoint: str, body: object) -> tuple[str | None, int | None, float | None]:
    if not isinstance(body, dict):
        return None, None, None
    if endpoint == "generate":
        meta = body.get("meta_info") or {}
        accept = meta.get("spec_accept_length")
        return body.get("text"), meta.get("completion_tokens"), accept
    choices = body.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    if endpoint == "completions":
        text = choice.get("text")
    else:
        message_ = choice.get("message") or {}
        # reasoning models may spend a short budget entirely on reasoning_content
        text = message_.get("content") or message_.get("reasoning_content")
    usage = body.get("usage") or {}
    return text, usage.get("completion_tokens"), None


def _who(process: dict) -> str:
    if process.get("kind") == "unit":
        return f"unit {process['unit']}"
    if process.get("kind") == "pid":
        return f"process {process['pid']}"
    return "the server"


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"


def _clip(text: str, limit: int = 180) -> str:
    return text if len(text) <= limit else text[:limit].rstrip() + " ..."


def message(r: dict, url: str, timeout: float) -> str:
    """What an operator reads: what happened, why, and what to try."""
    process = r["process"]
    who = _who(process)
    after = f" {_seconds(r['since_start'])} after start" if r.get("since_start") is not None else ""
    if r["ready"]:
        gen = r["generation"] or {}
        rate = f", {gen['tokens_per_second']} tok/s" if gen.get("tokens_per_second") else ""
        accept = f", accept length {gen['spec_accept_length']}" if gen.get("spec_accept_length") else ""
        return (f"{url} is ready after {r['elapsed']:.1f} s: {', '.join(r['models'])} answered "
                f"{len(r['generations'])} real generation(s) ({gen.get('completion_tokens')} tokens{rate}{accept}) "
                f"and {who} stayed up")
    failure = r["failure"]
    why = ""
    if r["cause_summary"]:
        why = f": {r['cause_summary']} ({_clip(r['cause_line'])}). {r['advice']}."
    elif r["last_log_line"]:
        why = f"; last log line: {r['last_log_line']}"
    state = f" ({r['detail']})" if r.get("detail") else ""
    if failure == "unit_missing":
        return f"{r['detail']}; nothing to wait for"
    if failure == "unit_failed":
        return f"{who} failed{after}{state}{why}"
    if failure == "unit_restarted":
        return f"{who} restarted{after}{state}: the server crashed and systemd started it again{why}"
    if failure == "unit_inactive":
        if r["cause_summary"]:
            last = f"; the log of its last run shows{why}"
        else:
            last = why
        return f"{who} is not running{state}: it was stopped or never started{last}"
    if failure == "process_exited":
        return f"{who} exited{after} while {r['phase']} was being checked{state}{why}"
    if failure == "port_taken":
        listener = r.get("listener") or {}
        return (f"{url} is answered by another process, not by {who}: {listener.get('detail') or r['detail']}; "
                "nothing was sent to it with the API key. Stop that process (an old server still running?) or "
                "give this server another port")
    if failure == "stalled":
        return (f"{who} is alive but stuck{after}: {r['detail']}. SGLang logs nothing when it hangs (NCCL, a CUDA graph "
                "capture with custom all-reduce, a stalled weight load): check the GPUs (nvidia-smi), the interconnect and "
                "the model's storage, or raise the stage's budget in stall_budgets if it is only slow")
    if failure == "not_listening":
        return f"nothing answered at {url} within {timeout:.0f} s although {who} is alive ({r['last_response']}){why}"
    if failure == "not_ready":
        return (f"{url} answers but did not become ready within {timeout:.0f} s (stuck at {r['phase']}, "
                f"last answer {r['last_response']}){why}")
    if failure == "unauthorized":
        return (f"{url} refused the request ({r['detail']}): the API key is wrong or missing; "
                "pass the server's key as api_key")
    if failure in ("generation_error", "generation_timeout", "generation_empty"):
        kind = {"generation_error": "failed", "generation_timeout": "timed out",
                "generation_empty": "returned no tokens"}[failure]
        return (f"{url} passed its health check but a real generation {kind} ({r['detail']}); "
                f"{who} is still running{why}")
    return f"{url}: no verdict within {timeout:.0f} s (stuck at {r['phase']}){why}"
