# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading an SGLang server's log: why did it fail, and where is it now.

A line is fatal by its level and context, never by a word in it: real healthy
servers log warnings with scary words (torch's UserWarning "... cannot open
shared object file", SGLang's "Ignore import error when loading
sglang.srt.models.X: ...", 0.5.20+ "Kimi-K3 ViT CUDA graph capture failed for
key=...; using eager fallback"). SGLang's own format carries no level
(0.5.11 srt/utils/common.py:1217-1218, 0.5.23 :2629-2630:
``[%(asctime)s{.msecs}{prefix}] %(message)s``), so for its own lines the
context decides. The fatal records are:

- the exception line of a Python traceback (and the lines of its message),
  also a traceback embedded in an SGLang message ("Scheduler hit an exception:
  Traceback ...", "Initialization failed. warmup error: Traceback ...");
- a line with an explicit ERROR/CRITICAL level: uvicorn's ``ERROR:    ...``,
  Python logging's default ``ERROR:name:...``, glog/c10 ``E1201 ...``/``F1201 ...``;
- argparse's ``<prog>: error: ...`` (exit 2);
- SGLang's own messages that announce the death by themselves (_DEATH).

The patterns of a cause are matched against the fatal records only (the
exception's text, its traceback frames for a context). The causes are SGLang's,
PyTorch's, CUDA's, NCCL's, transformers', uvicorn's and argparse's own texts
(sglang 0.5.9 to 0.5.23), each cited where it is defined.
"""

from __future__ import annotations

import re

# A traceback frame of SGLang's argument resolution (ServerArgs, 0.5.20+ arg groups,
# the ModelConfig built from them): the context of a refusal before any process starts.
_SERVER_ARGS_FRAME = r'File "[^"]*sglang/srt/(server_args\.py|arg_groups/\w+\.py|configs/model_config\.py)"'
# argparse's error line: "sglang serve: error: ..." or "launch_server.py: error: ..."
# (Python 3.11 argparse.py ArgumentParser.error: '%(prog)s: error: %(message)s\n').
_ARGPARSE = r"^[\w.-]+(?: [\w.-]+)?: error: "

# cause id -> (patterns, what happened, what to try). A pattern is a regular
# expression matched against a fatal record's text, or (expression, frames): the
# record's traceback frames must match the second one too. Within a record the
# first cause that matches wins, so the specific ones (a CUDA graph capture that
# ran out of memory) come before the general ones (CUDA out of memory).
_CAUSES = (
    (
        # 0.5.11 srt/model_executor/pool_configurator.py:40-44 (0.5.9 model_runner_kv_cache_mixin.py:417,
        # 0.5.23 pool_configurator.py:96) RuntimeError; 0.5.14+ 0.5.23 mem_cache/kv_cache_configurator.py:3050-3056
        # ValueError.
        "kv_pool_too_small",
        (
            r"Not enough memory\. Please try to increase --mem-fraction-static",
            r"Loaded weights leave no GPU memory for the KV cache",
        ),
        "SGLang could not size its KV pool",
        "Lower context_length/max_running_requests or raise mem_fraction_static",
    ),
    (
        # Exceptions raised around a failed capture: 0.5.11 model_executor/cuda_graph_runner.py:717 and
        # speculative/eagle_draft*_cuda_graph_runner.py ("Capture cuda graph failed: {e}"), cpu_graph_runner.py:584
        # ("Capture CPU graph failed:"), 0.5.23 runner/prefill_cuda_graph_runner.py:521 ("Capture prefill CUDA graph
        # failed:"), speculative/frozen_kv_mtp_cuda_graph_runner.py:198, multi_layer_eagle_draft_extend_cuda_graph_
        # runner.py:1034 ("Capture single-CG draft extend failed:"); 0.5.11 compilation/piecewise_context_manager.py:48-53
        # logs "Piecewise CUDA Graph failed with error: ..." and re-raises.
        "cuda_graph_capture",
        (
            r"Capture (?:\w+ )?(?:cuda|CUDA|CPU|NPU|XPU) graph failed: ",
            r"Capture frozen-KV MTP cuda graph failed: ",
            r"Capture single-CG draft extend failed: ",
            r"Piecewise CUDA Graph failed with error: ",
        ),
        "capturing CUDA graphs failed",
        "Lower mem_fraction_static to leave headroom for the graphs, lower the CUDA graph batch size, or disable CUDA graphs "
        "(on 0.5.11 a piecewise graph failure: --disable-piecewise-cuda-graph)",
    ),
    (
        # The dynamic loader's own text (dlerror: "libX.so.N: cannot open shared object file: No such file or
        # directory", "undefined symbol: NAME") inside an OSError/ImportError, and sgl_kernel's ImportError when
        # every variant failed (sglang-kernel 0.4.2 sgl_kernel/load_utils.py:178-197: "[sgl_kernel] CRITICAL:
        # Could not load any common_ops library!").
        "cuda_library",
        (
            r"cannot open shared object file",
            r"undefined symbol: ",
            r"Could not load any common_ops library",
        ),
        "a CUDA library failed to load (missing library or ABI mismatch between SGLang's kernels and the host's CUDA)",
        "Install the CUDA runtime the build was compiled for, or rebuild the kernels against the host's CUDA; this is not a memory problem",
    ),
    (
        # Triton's driver lookup with no GPU driver usable (triton/runtime/driver.py:9, torch 2.11's triton):
        # "RuntimeError: 0 active drivers ([]). There should only be one." Captured from real 0.5.11 on CPU with
        # --attention-backend triton (the first prefill runs a Triton kernel).
        "attention_backend",
        (r"\b0 active drivers \(",),
        "a Triton GPU kernel found no GPU driver to run on: the attention backend (or device) does not fit this host",
        "Choose an attention backend the device supports (on CPU torch_native or intel_amx), or make the GPU driver "
        "visible to the service (libcuda.so.1, /dev/nvidia*)",
    ),
    (
        # CUDA runtime error strings (libcudart.so.13: cudaErrorDevicesUnavailable, cudaErrorLaunchFailure) as torch
        # reports them ("CUDA error: ..."), and NVML's (pynvml NVML_ERROR_GPU_IS_LOST: "GPU is lost").
        "gpu_lost",
        (
            r"CUDA-capable device\(s\) is/are busy or unavailable",
            r"unspecified launch failure",
            r"\bGPU is lost\b",
        ),
        "a GPU it was given is lost or unavailable",
        "Remove the failed GPU from CUDA_VISIBLE_DEVICES (check nvidia-smi) or repair the GPU",
    ),
    (
        # libcudart.so.13: cudaErrorInvalidDevice "invalid device ordinal", cudaErrorNoDevice "no CUDA-capable device is
        # detected"; torch 2.11 libc10_cuda.so "GPU device may be out of range, do you have enough GPUs?".
        "gpu_count",
        (r"invalid device ordinal", r"do you have enough GPUs", r"no CUDA-capable device is detected"),
        "fewer GPUs are visible than its tensor-parallel size needs",
        "Make tp_size match the GPUs in CUDA_VISIBLE_DEVICES",
    ),
    (
        # torch 2.11 libc10_cuda.so "CUDA out of memory. Tried to allocate ", torch.OutOfMemoryError; the CUDA
        # runtime's cudaErrorMemoryAllocation "out of memory" as torch's "CUDA error: out of memory".
        "cuda_oom",
        (r"CUDA out of memory", r"OutOfMemoryError", r"CUDA error: out of memory"),
        "a GPU ran out of memory outside the static pool",
        "Lower mem_fraction_static to leave more room for the draft model, CUDA graphs and activations, or shrink the envelope",
    ),
    (
        # torch 2.11 libtorch_cuda.so "NCCL error in: ", "NCCL Error ", and NCCL's result names with their texts
        # ("ncclUnhandledCudaError: Call to CUDA function failed.", "ncclSystemError: ...", "ncclInternalError: ...").
        "nccl_error",
        (r"NCCL [Ee]rror", r"ncclInternalError", r"ncclSystemError", r"ncclUnhandledCudaError", r"ncclRemoteError"),
        "NCCL (the GPUs' communication library) failed",
        "Check the GPUs' peer-to-peer access and NCCL settings (NCCL_P2P_DISABLE, NCCL_DEBUG=INFO)",
    ),
    (
        # uvicorn's "ERROR:    [Errno 98] error while attempting to bind on address (...): address already in use"
        # (uvicorn/server.py), an OSError/ZMQError "Address already in use" (strerror EADDRINUSE).
        "address_in_use",
        (r"\[Errno 98\]", r"[Aa]ddress already in use"),
        "its port is already in use by another process",
        "Stop whatever listens on the port (another SGLang unit?) or change the port",
    ),
    (
        # argparse (Python 3.11 argparse.py) and 0.5.11 srt/speculative/spec_info.py:32 (0.5.23 :65)
        # "ValueError: Unknown speculative algorithm name: {name}" (free text from 0.5.12).
        "bad_flag",
        (
            _ARGPARSE + r"unrecognized arguments: ",
            _ARGPARSE + r"ambiguous option: ",
            _ARGPARSE + r"argument \S+: invalid choice: ",
            _ARGPARSE + r"the following arguments are required: ",
            r"Unknown speculative algorithm name: ",
        ),
        "SGLang rejected its command line (a removed, renamed or unknown flag)",
        "Render the command line for the SGLang version installed on the host",
    ),
    (
        # huggingface_hub utils/_validators.py:134-140 (HFValidationError "Repo id must be ..."), transformers 5.6.0
        # configuration_utils.py:751 ("Can't load the configuration of '...'"), modeling_utils.py:680-730
        # ("... does not appear to have a file named ...").
        "model_path",
        (
            r"HFValidationError",
            r"Repo id must (?:be in the form|use alphanumeric)",
            r"does not appear to have a file named",
            r"Can't load the configuration of",
        ),
        "the model path is missing or not a model directory",
        "Check model_path (and the draft model path) on the host",
    ),
    (
        # 0.5.11 srt/models/registry.py:43-51 (0.5.9 :49, 0.5.23 :64) "Model architectures [...] are not supported for
        # now. Supported architectures: ..." / "... failed to be inspected. Please check the logs for more details.";
        # transformers 5.6.0 models/auto/configuration_auto.py:407-409 "The checkpoint you are trying to load has model
        # type `...` but Transformers does not recognize this architecture."
        "model_architecture",
        (
            r"Model architectures \[.*\] are not supported for now",
            r"Model architectures \[.*\] failed to be inspected",
            r"but Transformers does not recognize this architecture",
        ),
        "this SGLang release (or its transformers) does not support the model's architecture, or its model code failed to import",
        "Install an SGLang release that supports the model; for 'failed to be inspected' look for the import error above it",
    ),
    (
        # 0.5.11 srt/configs/model_config.py:459-477 (0.5.9 :367, 0.5.23 :1299): the ValueError only; the same text
        # logged as a warning (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1) is no fatal record.
        "context_length",
        (r"is greater than the derived context_length",),
        "context_length is longer than the model supports",
        "Lower context_length to the model's max_position_embeddings",
    ),
    (
        # 0.5.10.post1-0.5.13.post1 refuse speculative decoding on hybrid linear-attention
        # models with radix cache on: 0.5.11 srt/server_args.py:2452-2456
        # ("ValueError: Speculative decoding for {model_arch} is not compatible with radix
        # cache when using --mamba-scheduler-strategy no_buffer.To use radix cache ...").
        "radix_cache_speculative",
        (r"is not compatible with radix cache when using --mamba-scheduler-strategy",),
        "SGLang refuses speculative decoding on this hybrid linear-attention model while radix cache is on",
        "Add --disable-radix-cache, or on 0.5.10-0.5.19 --mamba-scheduler-strategy extra_buffer "
        "(--mamba-radix-cache-strategy from 0.5.14)",
    ),
    (
        "invalid_argument",
        (
            # 0.5.11 srt/server_args.py:3332 (0.5.23 arg_groups/speculative_hook.py:326), also outside a frame of its own.
            r"requires setting --speculative-draft-model-path",
            # Any ValueError or AssertionError raised while SGLang resolves its arguments,
            # before a process starts: ServerArgs.__post_init__ and check_server_args
            # (0.5.11 srt/server_args.py, e.g. :1042-1050 "SGLANG_GRPC_PORT (70613) must be
            # between 1 and 65535", :6805-6809 "served_model_name cannot contain a colon"),
            # 0.5.20+ srt/arg_groups/*.py (0.5.23 serving_hook.py:382-386,
            # validation_hook.py:216), or ModelConfig built from them (configs/model_config.py).
            (r"^(ValueError|AssertionError)(: \S|$)", _SERVER_ARGS_FRAME),
            # Every other argparse refusal ("argument --port: invalid int value: 'x'", "expected one argument").
            _ARGPARSE,
        ),
        "SGLang rejected a parameter value",
        "Fix the parameter named in the evidence",
    ),
    (
        # 0.5.11 srt/entrypoints/http_server.py:1880 and :2007 (0.5.9 :1687/:1811, 0.5.23 :2384/:2533)
        # logger.error(f"Initialization failed. warmup error: {last_traceback}"), then the tree is killed.
        "warmup_failed",
        (r"Initialization failed\. warmup error",),
        "its own warmup request failed",
        "Check NO_PROXY for the local warmup request and the evidence lines",
    ),
    (
        # 0.5.11/0.5.23 srt/utils/watchdog.py:153-163, f"{self.debug_name} watchdog timeout
        # ({self.watchdog_timeout=}, {self.soft=})"; debug_name "Scheduler"
        # (0.5.11 managers/scheduler_runtime_checker_mixin.py:581). Then SIGQUIT to the parent,
        # unless soft (--soft-watchdog-timeout only dumps debug information).
        "watchdog_timeout",
        (r"\w+ watchdog timeout \(self\.watchdog_timeout=\S+, self\.soft=False\)",),
        "a forward batch ran longer than --watchdog-timeout and SGLang killed itself (a stuck kernel or collective)",
        "Look for a GPU or NCCL fault on the host (dmesg, nvidia-smi); raise --watchdog-timeout only for a known slow batch",
    ),
    (
        # A subprocess that died without raising (SIGKILL: the host's OOM killer, an operator):
        # during start-up, 0.5.11 srt/entrypoints/engine.py:1216-1224 (0.5.23 :2002-2010)
        # "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). ...",
        # 0.5.9 engine.py:896-901 "Rank 0 scheduler is dead. Please check if there are relevant logs.";
        # after it, the parent's SubprocessWatchdog, 0.5.11/0.5.23 srt/utils/watchdog.py:215-220
        # "Subprocess scheduler_0 (pid=12483) crashed with exit code -9. Triggering SIGQUIT for
        # cleanup...", then the parent kills the whole tree.
        "subprocess_died",
        (
            r"Rank \d+ scheduler died during initialization \(exit code: ",
            r"Rank \d+ scheduler is dead\. ",
            r"Subprocess \S+ \(pid=\d+\) crashed with exit code ",
        ),
        "an SGLang subprocess (scheduler or detokenizer) died without an error of its own, "
        "and SGLang stopped its whole process tree",
        "Exit code -9 is SIGKILL: check the host's OOM killer (dmesg -T | grep -i oom) and its memory, or who killed it; "
        "-15 is SIGTERM (a stop sent to every process of the server); another code points at a crash in the lines before",
    ),
)

CAUSES = tuple(c[0] for c in _CAUSES) + ("unknown",)

# Causes that only say that a process died, not why: they count only when the run
# holds no specific cause (a scheduler that raised makes the parent report "Rank 0
# scheduler died during initialization" after the scheduler's own traceback).
_GENERIC = frozenset({"subprocess_died"})
_OTHERS = 5


def _compile(pattern) -> tuple:
    if isinstance(pattern, tuple):
        return re.compile(pattern[0], re.M), re.compile(pattern[1])
    return re.compile(pattern, re.M), None


_COMPILED = tuple((cid, tuple(_compile(x) for x in p), what, advice) for cid, p, what, advice in _CAUSES)
# A frame of a speculative worker (0.5.11 defaults to spec v2: speculative/eagle_worker_v2.py) or draft code.
_DRAFT_FRAME = re.compile(r'File "[^"]*/speculative/\w+\.py"|draft_model|DraftModel')

# SGLang's own messages that announce a death by themselves (they carry no level):
# (expression, cause or None, whether it announces the exception it re-raises next).
_DEATH = tuple((re.compile(x), c, a) for x, c, a in (
    # 0.5.11 managers/scheduler.py:3938, detokenizer_manager.py:432, tokenizer_manager.py:2681,
    # data_parallel_controller.py:668: f"{Name} hit an exception: {traceback}" (the traceback is parsed on its own).
    (r"^\w+ hit an exception: ", None, False),
    # 0.5.11 entrypoints/engine.py:1187 (0.5.9 :870, 0.5.23 :1978), tokenizer_manager.py:2739 (0.5.23 :4074).
    (r"^Received sigquit from a child process\.", None, False),
    (r"^SIGQUIT received\. signum=", None, False),
    (r"Rank \d+ scheduler is dead\. ", "subprocess_died", False),
    (r"^Subprocess \S+ \(pid=\d+\) crashed with exit code ", "subprocess_died", False),
    (r"\w+ watchdog timeout \(self\.watchdog_timeout=\S+, self\.soft=False\)", "watchdog_timeout", False),
    (r"^Initialization failed\. warmup error", "warmup_failed", False),
    (r"^Piecewise CUDA Graph failed with error: ", "cuda_graph_capture", True),
))
# A stop asked for: 0.5.11 managers/tokenizer_manager.py:2733 (0.5.23 likewise) f"SIGTERM received. {signum=} {frame=}.
# Draining requests and shutting down...". After it the SubprocessWatchdog reports the scheduler's own SIGTERM as
# "crashed with exit code -15" and SIGQUITs (captured from real 0.5.11 and 0.5.23 stopped by SIGTERM): no death.
_STOP = re.compile(r"^SIGTERM received\. signum=")
_STOPPED = re.compile(r"crashed with exit code -15\.|^SIGQUIT received\. |^Received sigquit from a child process")
# An announcement covers the exception that is raised within this many lines after it.
_ANNOUNCE_SPAN = 80

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STAMP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{3})?(?: [A-Za-z_]+\d+)*\]\s?")
_TRACEBACK = re.compile(r"Traceback \(most recent call last\):\s*$")
_CHAINED = re.compile(r"^(During handling of the above exception|The above exception was the direct cause)")
# The exception line: a (dotted) class name, then ": message" or nothing.
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?::(?: |$)|$)")
# An exception line without its traceback (the head fell out of the kept lines): a strict class name, unstamped.
_ORPHAN = re.compile(r"^(?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?::(?: |$)|$)")
# SGLang's logger.exception messages that say the error is handled: the traceback logged under them is none of
# the server's death (0.5.23 srt/multimodal/kimi_k3_vit_cuda_graph_runner.py:206-210 "Kimi-K3 ViT CUDA graph
# capture failed for key=%s; using eager fallback", disaggregation/encoder/server.py:1375 "falling back to ViT").
_HANDLED = re.compile(r"fall(?:ing)? back|fallback|; skipping|; retrying")
_TRACEBACK_SPAN = 400
_MESSAGE_SPAN = 30
_LEVEL = re.compile(r"^(?:ERROR|CRITICAL):|^(?:\[rank\d+\]:)?\[?[EF]\d{4} \d\d:\d\d:\d\d\.\d+ ")
_ARGPARSE_LINE = re.compile(_ARGPARSE)
# Warnings are never fatal, whatever words they hold: Python warnings ("path:N: XxxWarning: ..."),
# glog/c10 W and I lines, logging's WARNING.
_WARNING = re.compile(r"^\S+:\d+: \w*Warning: |^(?:\[rank\d+\]:)?\[?[WI]\d{4} \d\d:\d\d:\d\d|^WARNING\b")

_ACCESS_LOG = re.compile(r'INFO:\s+\S+ - "(GET|POST) ')
_NOISE = re.compile(r"^\s*(File \"|Traceback \(most recent call last\)|\^+$|~+$)")

STAGES = ("starting", "distributed", "weights", "memory_pool", "engine", "cuda_graph", "http", "warmup", "serving")
STAGE_DESCRIPTIONS = {
    "starting": "importing SGLang, resolving its arguments and loading the tokenizer",
    "distributed": "initialising torch.distributed (NCCL) between the ranks",
    "weights": "loading weights",
    "memory_pool": "sizing and allocating the KV cache and state pools",
    "engine": "setting up attention backends and kernels",
    "cuda_graph": "capturing CUDA graphs",
    "http": "starting the tokenizer manager and the HTTP server",
    "warmup": "running its own warmup request",
    "serving": "ready",
}
# (expression on the stamp-stripped line, stage it enters). Sources, every release 0.5.9-0.5.23 unless named:
_STAGE_LINES = tuple((re.compile(x), s) for x, s in (
    # 0.5.9 model_executor/model_runner.py:731/:850 ... 0.5.20 distributed/bootstrap.py:81/:164;
    # 0.5.21+ "Init parallel begin." / "Init parallel ends." (0.5.23 distributed/bootstrap.py:115/:190).
    (r"^Init (?:torch distributed|parallel) begin\.", "distributed"),
    (r"^Init (?:torch distributed|parallel) ends\.", "engine"),
    # 0.5.11 model_runner.py:1290/:1468 (0.5.23 :1274/:1373); the draft model's own load re-enters weights.
    (r"^Load weight begin\.", "weights"),
    # 0.5.20+ model_runner_components/startup_weight_load.py:538 commits weights after the graphs are captured.
    (r"^Load weight end\. Committed real weights after CUDA graph capture", "engine"),
    (r"^Load weight end\.", "memory_pool"),
    # 0.5.11 model_executor/model_runner_kv_cache_mixin.py:769 (0.5.23 mem_cache/kv_cache_configurator.py:499).
    (r"^Memory pool end\.", "engine"),
    # 0.5.11 model_runner.py:2779/:2797 "Capture cuda graph begin." / "... end.", :2907/:2919 piecewise, speculative/
    # eagle_worker_v2.py:277-324 draft; 0.5.23 model_runner_components/cuda_graph_setup.py:685-696 "Capture target
    # prefill CUDA graph begin.", :759-788 "Capture target decode CUDA graph begin.", speculative/*: draft decode,
    # draft extend, UNO tree draft, Frozen-KV MTP draft, "Capture single-CG draft extend begin.".
    (r"^Capture \S.* begin[. ]", "cuda_graph"),
    (r"^Capture \S.* end\.", "engine"),
    # The tqdm bar of a capture: 0.5.11 model_executor/cuda_graph_runner.py:870 (0.5.23 runner/decode_cuda_graph_runner.py:1343).
    (r"^Capturing batches \(bs=", "cuda_graph"),
    # The scheduler's summary once ready: 0.5.11 managers/scheduler.py:764 (0.5.9 :623, 0.5.23 :1269).
    (r"^max_total_num_tokens=\d+, chunked_prefill_size=", "http"),
    # uvicorn 0.x uvicorn/server.py:232 "Uvicorn running on {addr} (Press CTRL+C to quit)".
    (r"^INFO:\s+Uvicorn running on ", "warmup"),
    # 0.5.11 entrypoints/http_server.py:2032 (0.5.9 :1836, 0.5.23 :2600).
    (r"^The server is fired up and ready to roll!", "serving"),
))


def strip_stamp(line: str) -> str:
    """The message without SGLang's ``[date time{.ms}{ DPn TPn ...}]`` stamp and colour codes."""
    return _STAMP.sub("", _ANSI.sub("", line)).rstrip()


def _stamped(line: str) -> bool:
    return bool(_STAMP.match(_ANSI.sub("", line)))


def stage_of(line: str) -> str | None:
    """The start-up stage a log line enters, or None (``starting`` is implicit:
    it is where every start begins)."""
    text = strip_stamp(line)
    for pattern, stage in _STAGE_LINES:
        if pattern.search(text):
            return stage
    return None


class _Record:
    """One fatal record: where it is reported (index), the text its causes are
    matched against, the traceback frames above it, and the cause its context
    gives when its text names none."""

    def __init__(self, index: int, text: str, frames: str = "", fallback: str | None = None, announces: bool = False):
        self.index = index
        self.order = index
        self.text = text
        self.frames = frames
        self.announces = announces
        self.cause = _cause_of(text, frames) or fallback


def _cause_of(text: str, frames: str) -> str | None:
    for cid, patterns, _what, _advice in _COMPILED:
        for pattern, context in patterns:
            if pattern.search(text) and (context is None or context.search(frames)):
                return cid
    return None


def _end_of_message(lines: list[str], start: int) -> int:
    """The index after the last line of an exception's message (a message may
    span lines: sgl_kernel's ImportError starts with a newline)."""
    end = start + 1
    while end < min(len(lines), start + 1 + _MESSAGE_SPAN):
        raw = lines[end]
        text = raw.rstrip()
        if _stamped(raw) or _TRACEBACK.search(text) or _CHAINED.match(text) or _WARNING.match(text) or _LEVEL.match(text):
            break
        end += 1
    return end


def _traceback(lines: list[str], start: int) -> tuple[int, list[str]] | None:
    """The index of the exception line of the traceback whose header is at
    ``start``, and its frames; lines of other processes (stamped) in between are
    skipped unless they read as a frame or a strict exception line."""
    frames = []
    for index in range(start + 1, min(len(lines), start + 1 + _TRACEBACK_SPAN)):
        raw = lines[index]
        text = raw.rstrip()
        if _stamped(raw):
            # Another process's line, or a traceback stamped line by line (the lab simulator's log does so).
            text = _STAMP.sub("", _ANSI.sub("", raw)).rstrip()
            if text[:1].isspace():
                frames.append(text)
            elif _ORPHAN.match(text):
                return index, frames
            continue
        if not text.strip():
            continue
        if text[0].isspace():
            frames.append(text)
        elif _TRACEBACK.search(text):
            return None
        elif _EXCEPTION.match(text):
            return index, frames
    return None


def _frames_above(lines: list[str], index: int) -> str:
    """The indented frame lines right above an exception line whose traceback header is gone."""
    start = index
    while start > max(0, index - _TRACEBACK_SPAN) and lines[start - 1][:1].isspace():
        start -= 1
    return "\n".join(lines[start:index])


def _records(lines: list[str]) -> list[_Record]:
    """The fatal records of the lines, in order."""
    records, taken, stopping = [], set(), False
    for index, line in enumerate(lines):
        text = strip_stamp(line)
        stopping = stopping or bool(_STOP.match(text))
        header = _TRACEBACK.search(text)
        if header:
            found = _traceback(lines, index)
            if found:
                where, frames = found
                end = _end_of_message(lines, where)
                taken.update(range(where, end))
                if not _handled(lines, index, text[:header.start()]):
                    message = "\n".join(strip_stamp(x) for x in lines[where:end])
                    records.append(_Record(where, message, "\n".join(frames), fallback=_cause_of(text[:header.start()], "")))
            continue
        if index in taken or _WARNING.match(text) or (stopping and _STOPPED.search(text)):
            continue
        if not _stamped(line) and _ORPHAN.match(text):
            end = _end_of_message(lines, index)
            taken.update(range(index, end))
            records.append(_Record(index, "\n".join(strip_stamp(x) for x in lines[index:end]), _frames_above(lines, index)))
            continue
        for pattern, cause, announces in _DEATH:
            if pattern.search(text):
                records.append(_Record(index, text, fallback=cause, announces=announces))
                break
        else:
            if _LEVEL.match(text) or _ARGPARSE_LINE.match(text):
                records.append(_Record(index, text))
    return _merge_announced(sorted(records, key=lambda r: r.index))


def _handled(lines: list[str], header: int, wrapper: str) -> bool:
    """Whether the traceback at ``header`` was logged under a message that says it is handled."""
    if wrapper.strip():
        return bool(_HANDLED.search(wrapper))
    return header > 0 and _stamped(lines[header - 1]) and bool(_HANDLED.search(strip_stamp(lines[header - 1])))


def _merge_announced(records: list[_Record]) -> list[_Record]:
    """An SGLang message that announces the exception it re-raises (0.5.11
    "Piecewise CUDA Graph failed with error: {e}") and that exception are one
    failure: the announcement names it, at the exception's place."""
    merged = []
    for record in records:
        last = merged[-1] if merged else None
        if last and last.announces and last.order == last.index and record.frames and record.index - last.index <= _ANNOUNCE_SPAN:
            last.order = record.index
            continue
        merged.append(record)
    return sorted(merged, key=lambda r: r.order)


def classify(lines: list[str]) -> dict | None:
    """The known cause of the failure nearest the end of the lines (the death),
    with its evidence and the other known causes found in the run, or None.

    Rules: only fatal records count; the nearest record with a specific cause
    wins, so an unknown final wrapper (a RuntimeError after a real OOM) does not
    hide the known cause before it; a generic cause (a subprocess that died)
    counts only when the run holds no specific one."""
    known = [r for r in _records(lines) if r.cause]
    if not known:
        return None
    chosen = ([r for r in known if r.cause not in _GENERIC] or known)[-1]
    cid, _patterns, what, advice = next(c for c in _COMPILED if c[0] == chosen.cause)
    if cid == "cuda_oom" and _DRAFT_FRAME.search(chosen.frames):
        what += " while loading the draft model"
    others, seen = [], {cid}
    for record in reversed(known):
        if record.cause not in seen and len(others) < _OTHERS:
            seen.add(record.cause)
            others.append({"cause": record.cause, "line": strip_stamp(lines[record.index])})
    return {
        "cause": cid,
        "what": what,
        "advice": advice,
        "line": strip_stamp(lines[chosen.index]),
        "evidence": evidence(lines, chosen.index),
        "others": others,
    }


def evidence(lines: list[str], index: int, before: int = 3, after: int = 1, limit: int = 300) -> list[str]:
    """The matched line with a little context, stamps removed, traceback frames
    skipped so the lines that name the error remain."""
    picked = []
    start = max(0, index - 12)
    context = [strip_stamp(x) for x in lines[start:index]
               if x.strip() and not _NOISE.match(strip_stamp(x)) and not _ACCESS_LOG.search(x)]
    picked.extend(context[-before:])
    picked.append(strip_stamp(lines[index]))
    for line in lines[index + 1:index + 1 + after]:
        text = strip_stamp(line)
        if text and not _NOISE.match(text) and not _ACCESS_LOG.search(text):
            picked.append(text)
    return [x if len(x) <= limit else x[:limit] + " ..." for x in picked]


def last_meaningful(lines: list[str]) -> str | None:
    """The last line that tells where the server is (access logs and traceback
    frames are left out)."""
    for line in reversed(lines):
        text = strip_stamp(line)
        if text and not _ACCESS_LOG.search(text) and not _NOISE.match(text):
            return text if len(text) <= 300 else text[:300] + " ..."
    return None


_ERROR_WORDS = re.compile(r"Error|Exception|error:|Traceback|FAILED|Killed|Fatal")


def error_tail(lines: list[str], count: int = 4) -> list[str]:
    """For an unknown cause: the last fatal records, or failing those the last
    lines that look like an error (warnings left out), or the last lines."""
    records = [strip_stamp(lines[r.index]) for r in _records(lines)]
    if records:
        return records[-count:]
    hits = [strip_stamp(x) for x in lines if _ERROR_WORDS.search(x) and not _WARNING.match(strip_stamp(x))]
    return hits[-count:] if hits else [strip_stamp(x) for x in lines[-count:]]


# -- what a serving server says about its memory and its load (SGLang's tuning signals) ---------------------
#
# SGLang's hyperparameter tuning guide reads three things from the log: the memory left for activations once
# the KV pool is sized (available_gpu_mem in the scheduler's summary, 0.5.11 managers/scheduler.py:763-770;
# available_cpu_mem on CPU), how full the pool is and how many requests wait while it serves (the "Decode
# batch" line every decode_log_interval, default 40, decode steps: #running-req, #token, token usage,
# #queue-req; 0.5.11 observability/scheduler_metrics_mixin.py:512-566 and
# managers/scheduler_runtime_checker_mixin.py:113-116), and retractions (a full pool sends running requests
# back to the queue: "KV cache pool is full. Retract requests. #retracted_reqs: N, ...", 0.5.11
# managers/scheduler.py:2858-2870).
_SUMMARY = re.compile(r"^max_total_num_tokens=(?P<tokens>\d+), chunked_prefill_size=(?P<chunk>-?\d+|None), "
                      r".*?max_running_requests=(?P<running>\d+), context_len=(?P<context>\d+), "
                      r"available_(?P<device>gpu|cpu)_mem=(?P<mem>[0-9.]+) GB")
# The pool's part is "#token: N, token usage: X" (0.5.11), "token usage: X" alone (0.5.9
# managers/scheduler_metrics_mixin.py:208), or for a hybrid model such as Qwen3.6's "full token usage: X, mamba
# usage: Y" (0.5.9 :203-204; 0.5.11 managers/scheduler_runtime_checker_mixin.py) - the full-attention pool's
# usage is read; a line with none of them still gives its running requests and queue.
_DECODE = re.compile(r"^Decode batch(?: \[\d+\])?, #running-req: (?P<running>\d+), "
                     r"(?:(?:#token: (?P<tokens>\d+), )?(?:full )?token usage: (?P<usage>[0-9.]+), )?.*#queue-req: (?P<queue>\d+)")
_RETRACT = re.compile(r"^KV cache pool is full\. Retract requests\. #retracted_reqs: (?P<reqs>\d+)")
# The guide's reading of them: 5-8 GB left for activations is right, 10-20 GB means the static pool could be
# larger; a pool used above 0.9 with requests queued is well used; a retraction means it was too small.
AVAILABLE_GB = (5.0, 8.0)
FULL_USAGE = 0.9
# What the scheduler's summary line gives, once per start.
SUMMARY_KEYS = ("available_mem_gb", "device", "max_total_num_tokens", "max_running_requests", "context_len")


def signals(lines: list[str]) -> dict:
    """SGLang's own tuning signals in a server's log (the lines since its start): ``available_mem_gb`` (and
    ``device``), ``max_total_num_tokens``, ``max_running_requests``, ``context_len`` from its summary;
    ``decode_lines``, ``token_usage_max``, ``running_max``, ``queue_max`` over its "Decode batch" lines;
    ``retractions`` and ``retracted_reqs``; and ``reading``, what SGLang's guide makes of them (empty when
    they say nothing)."""
    out: dict = {"available_mem_gb": None, "device": None, "max_total_num_tokens": None, "max_running_requests": None,
                 "context_len": None, "decode_lines": 0, "token_usage_max": None, "running_max": None, "queue_max": None,
                 "retractions": 0, "retracted_reqs": 0}
    for line in lines:
        text = strip_stamp(line)
        found = _DECODE.match(text)
        if found:
            out["decode_lines"] += 1
            for key, group, kind in (("token_usage_max", "usage", float), ("running_max", "running", int),
                                     ("queue_max", "queue", int)):
                if found.group(group) is not None:
                    value = kind(found.group(group))
                    out[key] = value if out[key] is None else max(out[key], value)
            continue
        found = _RETRACT.match(text)
        if found:
            out["retractions"] += 1
            out["retracted_reqs"] += int(found.group("reqs"))
            continue
        found = _SUMMARY.match(text)
        if found:
            out.update(available_mem_gb=float(found.group("mem")), device=found.group("device"),
                       max_total_num_tokens=int(found.group("tokens")), max_running_requests=int(found.group("running")),
                       context_len=int(found.group("context")))
    out["reading"] = reading(out)
    return out


def _readings(found: dict) -> list[tuple[str, bool]]:
    """What SGLang's tuning guide makes of the signals, a phrase each, and whether it speaks against the
    configuration (retractions; on a GPU, less memory left for activations than advised) rather than
    describing its load."""
    said = []
    if found.get("retractions"):
        said.append((f"the KV pool filled and {found['retracted_reqs']} running request(s) were retracted "
                     f"({found['retractions']} time(s)): fewer running requests or a larger pool", True))
    usage, queue = found.get("token_usage_max"), found.get("queue_max")
    if usage is not None and usage >= FULL_USAGE and queue:
        said.append((f"the KV pool was full (token usage {usage:.2f}) with {queue} request(s) queued: it binds", False))
    elif usage is not None and queue and usage < FULL_USAGE:
        said.append((f"requests queued ({queue}) with the pool at {usage:.2f}: the running-request limit binds", False))
    mem = found.get("available_mem_gb")
    if mem is not None and found.get("device") == "gpu":
        low, high = AVAILABLE_GB
        if mem < low:
            said.append((f"{mem:.2f} GB left for activations, under the {low:g}-{high:g} GB SGLang advises: "
                         "a long prefill may run out of memory", True))
        elif mem > 10:
            said.append((f"{mem:.2f} GB left for activations, above the {low:g}-{high:g} GB SGLang advises: "
                         "mem_fraction_static could be larger", False))
    return said


def reading(found: dict) -> list[str]:
    """What SGLang's tuning guide makes of the signals, a phrase each."""
    return [text for text, _against in _readings(found)]


def trouble(found: dict) -> list[str]:
    """The part of ``reading`` that speaks against a configuration rather than describing its load:
    retractions (its pool was too small for what it admitted) and, on a GPU, less memory left for
    activations than SGLang advises."""
    return [text for text, against in _readings(found) if against]
