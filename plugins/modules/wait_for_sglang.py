#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: wait_for_sglang
short_description: Wait until an SGLang server really serves, and fail fast with the cause when it cannot
version_added: 0.1.0
description:
  - 'Proves an SGLang server is ready, in this order (each is a I(phase)):
    C(process) the watched systemd unit or process is alive;
    C(http) the HTTP server answers;
    C(models) C(/v1/models) lists a model;
    C(health) C(/health) is 200 (SGLang answers C(/v1/models) before its warmup is done);
    C(ready) C(/ready) is 200 where SGLang serves it (0.5.20 and later; a 404 from an older release passes this phase);
    C(generation) O(generations) consecutive real generation requests return non-empty text with a positive completion token count;
    C(settled) the process is still the same one (same main PID, no restart) O(settle) seconds after the last generation.'
  - Every poll first looks at the watched process and its new log lines. The moment the unit fails, becomes
    inactive, restarts (C(NRestarts) grows or the main PID changes) or the PID disappears, the wait ends,
    and the cause is classified from the unit's journal (or O(log_file)) since the unit's current start.
    A line counts as fatal by its level and context (a traceback's exception, an ERROR line, SGLang's own messages
    about a dying process), never by a word in a warning; the cause reported is the one nearest the death.
  - 'Real SGLang dies after a fatal error; its real hangs (NCCL, a CUDA graph capture with custom all-reduce, a stalled
    weight load) log nothing. The gate follows the start-up I(stages) from the server''s own log lines (C(starting),
    C(distributed), C(weights), C(memory_pool), C(engine), C(cuda_graph), C(http), C(warmup), C(serving)) and fails a
    start whose current stage lasted longer than its budget (O(stall_budgets)) with C(stalled), naming the stage and
    the last log line, long before O(timeout).'
  - 'Once ready, the gate reads C(/server_info) and returns the figures SGLang resolved (RV(server)): max total tokens,
    max running requests, chunked prefill size, CUDA graph batch sizes, version, the mem fraction used. The arguments
    themselves (which hold the API key) are never returned.'
  - 'HTTP is bounded: each request ends within O(request_timeout) however slowly the server sends (one deadline per
    request, not per read), a response larger than O(max_response_bytes) is refused, and every time option must be a
    finite positive number.'
  - Requests go straight to O(url), never through a proxy from the environment.
  - 'The server answering must be the watched one. Before the C(http) phase passes, before the API key is sent,
    and again before the verdict, the gate finds the TCP LISTEN socket that O(url)''s host and port reach (from
    C(/proc/net/tcp) and C(/proc/net/tcp6)) and the process holding it (the C(socket:[inode]) link in C(/proc/PID/fd)).
    It must be the watched PID or one of its descendants, or, with O(unit), a process of the unit''s control group
    (systemd''s C(ControlGroup), C(cgroup.procs), C(/proc/PID/cgroup)). Otherwise the wait fails at once with
    C(port_taken), naming the other process: real SGLang whose port is taken does not die at once, its warmup
    succeeds against whatever answers there, it logs "The server is fired up and ready to roll!" and only then exits (3, or -9 when its own watchdog wins).
    While nothing listens, requests go without the API key. Where ownership cannot be established (O(url) is not an
    address of this host, no O(unit) or O(pid) is given, C(/proc) cannot be read, or the gate is not root and the
    server runs as another user) RV(listener) says why and the gate goes on as without the check; O(check_listener)
    turns the check off.'
  - 'The verdict is returned as data (see RETURN). I(failure) is one of: C(unit_missing) (the unit is not installed),
    C(unit_failed) (the unit entered the failed state, or stopped with an error result), C(unit_inactive) (stopped or
    never started), C(unit_restarted) (NRestarts grew, the main PID changed, or systemd is about to restart it),
    C(process_exited) (the watched PID is gone), C(port_taken) (another process, named in RV(detail) and
    RV(listener), listens on O(url)''s port; nothing was sent to it), C(stalled) (alive, but the current start-up stage
    outlasted its budget in O(stall_budgets)), C(not_listening) (nothing answered HTTP before O(timeout)), C(not_ready) (HTTP
    answered but C(/v1/models), C(/health) or C(/ready) never became ready), C(unauthorized) (HTTP 401/403: the API key is wrong
    or missing), C(generation_error) (a real generation failed: HTTP error or dropped connection),
    C(generation_empty) (it returned no text or no tokens), C(generation_timeout) (it did not answer within
    O(request_timeout)), C(timeout) (the deadline passed in another phase).'
  - 'I(cause) is one of: C(kv_pool_too_small) (SGLang could not size its KV pool: "Not enough memory. Please try to increase
    --mem-fraction-static", 0.5.14+ "Loaded weights leave no GPU memory for the KV cache"), C(cuda_graph_capture) (a decode,
    prefill, frozen-KV MTP or draft CUDA graph capture failed, 0.5.11 "Piecewise CUDA Graph failed with error"),
    C(cuda_library) ("cannot open shared object file", an undefined symbol, "Could not load any common_ops library"),
    C(attention_backend) (a Triton kernel found no GPU driver, "0 active drivers": the attention backend or device does
    not fit the host), C(gpu_lost) ("CUDA-capable device(s) is/are busy or unavailable", "GPU is lost"), C(gpu_count)
    ("invalid device ordinal"), C(cuda_oom) ("CUDA out of memory"; "while loading the draft model" when a speculative
    frame is in the traceback), C(nccl_error), C(address_in_use) ("[Errno 98]"), C(bad_flag) (argparse rejected a removed,
    renamed or unknown flag), C(model_path) (missing model directory or config.json), C(model_architecture) ("Model
    architectures [...] are not supported"), C(context_length) (longer than the model''s own),
    C(radix_cache_speculative) ("Speculative decoding for ... is not compatible with radix cache", 0.5.10.post1 to
    0.5.13.post1 on hybrid linear-attention models), C(invalid_argument) (a C(ValueError) or C(AssertionError) from
    SGLang''s argument resolution, e.g. "SGLANG_GRPC_PORT (70613) must be between 1 and 65535" for a port above 55535 on
    0.5.11), C(warmup_failed), C(watchdog_timeout) ("Scheduler watchdog timeout"), C(subprocess_died) ("Rank 0 scheduler
    died during initialization (exit code: -9)", "Subprocess scheduler_0 (pid=...) crashed with exit code -9": a
    subprocess killed, typically by the host''s OOM killer; reported only when no more specific cause is in the run), or
    C(unknown) when the log of a failed process names none of these. A stop (SGLang''s own "SIGTERM received") is no cause.'
  - The progress (each phase and stage reached) is written to the target's syslog/journal while the module
    runs (C(journalctl -t ansible-inferops.sglang.wait_for_sglang -f)), to O(progress_file), and returned in RV(timeline)
    and RV(last_log_line). The collection's action plugin of the same name runs the module asynchronously and prints
    the phase, stage and elapsed time every O(progress_interval) seconds in the C(ansible-playbook) and AWX job output.
author:
  - inferops.sglang contributors (@inferops)
extends_documentation_fragment:
  - inferops.sglang.attributes.CHECK_MODE
attributes:
  check_mode:
    details: In check mode nothing is requested from the server; the module reports what it would wait for.
options:
  url:
    description: Base URL of the SGLang server, as seen from the target host.
    type: str
    default: http://127.0.0.1:30000
  api_key:
    description:
      - The server's API key (SGLang C(--api-key)), sent as a bearer token. Never logged or returned.
    type: str
  api_key_file:
    description:
      - The server's SGLang C(--config) YAML file on the host; its C(api-key) (if any) is the key, read on the host,
        never returned. When set, O(api_key) is ignored; a file without C(api-key) means the server has no key.
      - This is how a restored service is gated with its own key when the deploy's key has changed.
    type: path
  validate_certs:
    description: Verify the server's TLS certificate for C(https) URLs.
    type: bool
    default: true
  check_listener:
    description:
      - Check that the process listening on O(url)'s port is the watched server (see the description) before the API
        key is sent and before the verdict, and fail with C(port_taken) when it is another process.
      - Set to V(false) only when O(url) is a local proxy in front of the server, which listens in its own process.
    type: bool
    default: true
  unit:
    description:
      - The systemd unit running the server. Its ActiveState/SubState, main PID and NRestarts are watched,
        and its journal since the unit's current start is read for the cause of a failure.
      - Mutually exclusive with O(pid). With neither, only HTTP is watched and a dead server is only noticed at O(timeout).
    type: str
  pid:
    description: PID of a server not run by systemd. The wait fails as soon as the process is gone.
    type: int
  log_file:
    description:
      - The server's log file when O(pid) is used; read for progress and for the cause of a failure.
      - Read from its end minus 1 MiB when the wait begins; use one log file per server start.
    type: path
  timeout:
    description: Overall deadline in seconds. A model load can take many minutes; a dead server never waits it out.
    type: float
    default: 900
  interval:
    description: Poll period in seconds. A crash is reported within about one interval.
    type: float
    default: 1
  request_timeout:
    description: Timeout of each HTTP request in seconds (the generation requests included), never beyond the deadline.
    type: float
    default: 30
  stall_budgets:
    description:
      - Seconds each start-up stage may last before the wait fails with C(stalled), by stage; the given ones replace
        the defaults, V(0) turns a stage's budget off.
      - 'Defaults: C(starting) 300 (imports, arguments, tokenizer), C(distributed) 600 (torch.distributed''s own
        timeout), C(weights) 600 (55.56 GB from a 100 MB/s mount takes 556 s), C(memory_pool) 120, C(engine) 600
        (between milestones, kernels compiled just in time), C(cuda_graph) 300 (SGLang''s C(--watchdog-timeout)),
        C(http) 120, C(warmup) 600 (SGLang''s own warmup request limit, C(SGLANG_WARMUP_TIMEOUT) unset).'
      - Needs the server's log (O(unit), or O(pid) with O(log_file)); without it, or while not one line of it was read
        (a unit whose output goes to a file), only O(timeout) applies.
      - A server that downloads its model when it starts (a hub id as its model path) does so in C(starting); give
        that stage the time the download takes.
    type: dict
    default: {}
  max_response_bytes:
    description: The largest HTTP response body the gate reads; a larger one fails the request.
    type: int
    default: 8388608
  progress_file:
    description:
      - A file on the target the module rewrites (atomically, mode 0600) at each event and at least every 5 s with
        its progress as JSON (time, elapsed, phase, stage, stage_elapsed, event, last_log_line).
      - Set by the action plugin for its live progress; rarely set by hand.
    type: path
  progress_interval:
    description:
      - Seconds between the live progress lines the action plugin prints while the module runs; V(0) runs the module
        as a plain call, with no progress lines. The module itself ignores it.
    type: float
    default: 15
  model:
    description: Model id for the C(completions) and C(chat) requests. Default is the first id from C(/v1/models).
    type: str
  prompt:
    description: Prompt of the real generation requests.
    type: str
    default: The capital city of France is
  max_tokens:
    description: Tokens to generate in each real generation request.
    type: int
    default: 16
  endpoint:
    description:
      - Which API the real generations use. C(generate) is SGLang's native C(/generate) (it reports the
        speculative accept length); C(completions) and C(chat) are the OpenAI-compatible C(/v1/completions)
        and C(/v1/chat/completions).
    type: str
    choices: [generate, completions, chat]
    default: generate
  generations:
    description: How many consecutive real generations must succeed.
    type: int
    default: 1
  settle:
    description: Seconds the process must stay up (same main PID, no restart) after the last generation.
    type: float
    default: 3
notes:
  - Run it on the host that runs the server (the unit and its journal are read there). Reading another user's
    journal needs root or the systemd-journal group; without it the verdict has no cause.
  - The module never changes anything; it always returns C(changed=false).
seealso:
  - module: ansible.builtin.uri
  - module: ansible.builtin.wait_for
"""

EXAMPLES = r"""
- name: Gate the freshly started SGLang unit
  inferops.sglang.wait_for_sglang:
    unit: sglang-qwen.service
    url: http://127.0.0.1:30000
    api_key: "{{ inferops_sglang_api_key }}"
    timeout: 900
  register: gate

- name: Prove it with three chat completions and a 10 s settle
  inferops.sglang.wait_for_sglang:
    unit: sglang-qwen.service
    endpoint: chat
    generations: 3
    settle: 10

- name: A server started by hand (nohup ... > /var/log/sglang.log)
  inferops.sglang.wait_for_sglang:
    pid: "{{ server_pid }}"
    log_file: /var/log/sglang.log
    timeout: 600
"""

RETURN = r"""
ready:
  description: Whether the server passed every phase. C(null) in check mode.
  returned: always
  type: bool
  sample: false
phase:
  description: The last phase the gate reached (C(settled) when ready).
  returned: always
  type: str
  sample: generation
failure:
  description: Why the gate failed (see the description for the set); C(null) when ready.
  returned: always
  type: str
  sample: unit_failed
cause:
  description: The cause classified from the log (see the description for the set); C(null) when none applies.
  returned: always
  type: str
  sample: kv_pool_too_small
cause_summary:
  description: The cause in words.
  returned: always
  type: str
  sample: SGLang could not size its KV pool
cause_line:
  description: The log line that names the cause.
  returned: always
  type: str
  sample: "OSError: libcudart.so.12: cannot open shared object file: No such file or directory"
advice:
  description: What to try for this cause.
  returned: always
  type: str
  sample: Lower context_length/max_running_requests or raise mem_fraction_static
other_causes:
  description: Other known causes the failing run's log shows, before the one nearest the death (cause and line each), nearest first.
  returned: always
  type: list
  elements: dict
  sample: [{"cause": "cuda_library", "line": "OSError: libcudart.so.12: cannot open shared object file: No such file or directory"}]
evidence:
  description: The few log lines that show the cause (timestamps removed).
  returned: always
  type: list
  elements: str
  sample: ["RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.88"]
elapsed:
  description: Seconds the gate waited.
  returned: always
  type: float
  sample: 34.2
since_start:
  description: Seconds from the unit's (or process's) start to its exit, or to the verdict while it runs.
  returned: always
  type: float
  sample: 33.8
detection_delay:
  description:
    - With O(unit), for a server that exited, the seconds from the main process's exit (as systemd recorded it)
      to the verdict; C(null) otherwise.
  returned: always
  type: float
  sample: 0.41
phases:
  description: Each phase passed, with the elapsed seconds when it passed.
  returned: always
  type: dict
  sample: {"process": 0.01, "http": 41.2, "models": 41.2, "health": 47.9, "ready": 47.9, "generation": 48.4, "settled": 51.4}
stage:
  description: The last start-up stage the server's log showed (see the description); C(null) without a log.
  returned: always
  type: str
  sample: cuda_graph
stages:
  description: Each start-up stage entered (a stage entered again, such as the draft model's weights, appears again), with the elapsed seconds.
  returned: always
  type: list
  elements: dict
  sample: [{"stage": "starting", "elapsed": -3.2}, {"stage": "weights", "elapsed": 8.1}, {"stage": "cuda_graph", "elapsed": 30.4}]
server:
  description:
    - What the ready server resolved, from C(/server_info) (version, max_total_tokens, max_running_requests,
      chunked_prefill_size, mem_fraction_static, context_length, cuda_graph_bs); C(null) when not ready or not answered.
  returned: always
  type: dict
  sample: {"version": "0.5.11", "max_total_tokens": 197762, "max_running_requests": 16, "chunked_prefill_size": 2048,
           "mem_fraction_static": 0.88, "context_length": 131072, "cuda_graph_bs": [1, 2, 4, 8, 12, 16]}
timeline:
  description: Progress events (elapsed, phase, event), for long waits.
  returned: always
  type: list
  elements: dict
models:
  description: Model ids listed by C(/v1/models).
  returned: always
  type: list
  elements: str
  sample: ["Qwen3.6-27B"]
generation:
  description: The last real generation (endpoint, model, text sample, completion_tokens, latency, tokens_per_second, spec_accept_length).
  returned: always
  type: dict
  sample: {"endpoint": "/generate", "text": " the model answers", "completion_tokens": 16, "latency": 0.118,
           "tokens_per_second": 135.6, "spec_accept_length": 2.71}
generations:
  description: Every real generation made, as in RV(generation).
  returned: always
  type: list
  elements: dict
listener:
  description:
    - Who listens on O(url)'s host and port, as last checked. C(state) is C(owned) (the watched server's process C(pid)),
      C(foreign) (another process, with its C(pid), C(cmdline) and C(uid)), C(absent) (nothing listened) or C(unverified)
      (C(verified) is false and C(detail) says why ownership could not be established).
  returned: always
  type: dict
  sample: {"verified": true, "state": "foreign", "address": "127.0.0.1:30000", "pid": 81234, "uid": 998,
           "cmdline": "/opt/sglang/venv/bin/python -m sglang.launch_server --port 30000 ...",
           "detail": "pid 81234 (/opt/sglang/venv/bin/python -m sglang.launch_server ...) listens on 127.0.0.1:30000"}
process:
  description: What was watched and its last state (unit, active_state, sub_state, result, main_pid, restarts, exit; or pid, state).
  returned: always
  type: dict
  sample: {"kind": "unit", "unit": "sglang-qwen.service", "active_state": "failed", "result": "signal", "exit": "code=killed, signal=KILL"}
last_log_line:
  description: The last meaningful line of the server's log (where it is, or where it stopped).
  returned: always
  type: str
last_response:
  description: The last HTTP outcome (e.g. C(connection refused), C(HTTP 503)).
  returned: always
  type: str
detail:
  description: The failure's own detail (unit state, HTTP status, request error).
  returned: always
  type: str
would_wait_for:
  description: In check mode, what the module would have waited for.
  returned: check mode
  type: dict
"""

import math

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.inferops.sglang.plugins.module_utils import _credentials
from ansible_collections.inferops.sglang.plugins.module_utils import _process_watch as watch
from ansible_collections.inferops.sglang.plugins.module_utils import _readiness as readiness


def _validate(module: AnsibleModule) -> None:
    p = module.params
    if not p["url"].startswith(("http://", "https://")):
        module.fail_json(msg=f"url must start with http:// or https://, got {p['url']!r}")
    for name in ("timeout", "interval", "request_timeout"):
        if not math.isfinite(p[name]) or p[name] <= 0:
            module.fail_json(msg=f"{name} must be a finite number of seconds greater than 0, got {p[name]}")
    for name in ("settle", "progress_interval"):
        if not math.isfinite(p[name]) or p[name] < 0:
            module.fail_json(msg=f"{name} must be a finite number of seconds, 0 or more, got {p[name]}")
    if p["max_response_bytes"] < 1024:
        module.fail_json(msg=f"max_response_bytes must be at least 1024, got {p['max_response_bytes']}")
    try:
        readiness.stall_budgets(p["stall_budgets"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    for name in ("generations", "max_tokens"):
        if p[name] < 1:
            module.fail_json(msg=f"{name} must be at least 1, got {p[name]}")
    if p["interval"] > p["timeout"]:
        module.fail_json(msg=f"interval ({p['interval']}) must not exceed timeout ({p['timeout']})")
    if p["pid"] is not None and p["pid"] <= 0:
        module.fail_json(msg=f"pid must be a positive process id, got {p['pid']}")


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", default="http://127.0.0.1:30000"),
            api_key=dict(type="str", no_log=True),
            api_key_file=dict(type="path"),
            validate_certs=dict(type="bool", default=True),
            check_listener=dict(type="bool", default=True),
            unit=dict(type="str"),
            pid=dict(type="int"),
            log_file=dict(type="path"),
            timeout=dict(type="float", default=900),
            interval=dict(type="float", default=1),
            request_timeout=dict(type="float", default=30),
            stall_budgets=dict(type="dict", default={}),
            max_response_bytes=dict(type="int", default=8388608),
            progress_file=dict(type="path"),
            progress_interval=dict(type="float", default=15),
            model=dict(type="str"),
            prompt=dict(type="str", default="The capital city of France is"),
            max_tokens=dict(type="int", default=16, no_log=False),
            endpoint=dict(type="str", default="generate", choices=list(readiness.ENDPOINTS)),
            generations=dict(type="int", default=1),
            settle=dict(type="float", default=3),
        ),
        mutually_exclusive=[("unit", "pid")],
        required_by={"log_file": "pid"},
        supports_check_mode=True,
    )
    _validate(module)
    p = module.params
    if p["unit"]:
        watcher = watch.UnitWatcher(p["unit"], lambda argv: module.run_command(argv, environ_update={"SYSTEMD_COLORS": "0"}))
    elif p["pid"]:
        watcher = watch.PidWatcher(p["pid"], p["log_file"])
    else:
        watcher = watch.NoWatcher()

    if module.check_mode:
        plan = {
            "url": p["url"],
            "watch": watcher.describe() if not p["unit"] else {"kind": "unit", "unit": p["unit"]},
            "phases": list(readiness.PHASES),
            "endpoint": readiness.ENDPOINTS[p["endpoint"]],
            "generations": p["generations"],
            "timeout": p["timeout"],
        }
        module.exit_json(changed=False, ready=None, phase=None, failure=None, would_wait_for=plan,
                         msg=f"check mode: would wait up to {p['timeout']:g} s for {p['url']} to pass {', '.join(readiness.PHASES)}")

    api_key = _credentials.module_api_key(module, p["api_key"], p["api_key_file"])
    try:
        client = readiness.Client(p["url"], api_key, p["validate_certs"], p["request_timeout"], max_body=p["max_response_bytes"])
    except ValueError as exc:
        module.fail_json(msg=f"cannot gate {p['url']}: {exc}")
    gate = readiness.Gate(
        client, watcher, timeout=p["timeout"], interval=p["interval"], model=p["model"], prompt=p["prompt"],
        max_tokens=p["max_tokens"], endpoint=p["endpoint"], generations=p["generations"], settle=p["settle"],
        progress=module.log, check_listener=p["check_listener"], budgets=p["stall_budgets"],
        progress_file=p["progress_file"],
    )
    result = gate.run()
    if result["ready"]:
        module.exit_json(changed=False, **result)
    module.fail_json(changed=False, **result)


if __name__ == "__main__":
    main()
