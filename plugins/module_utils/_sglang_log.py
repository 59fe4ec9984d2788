# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading an SGLang server's log: why did it fail, and where is it now.

The patterns are SGLang's, PyTorch's, NCCL's, uvicorn's and argparse's own
texts (sglang 0.5.9 to 0.5.23). Order matters: the first matching cause wins,
so the specific ones (a CUDA graph capture that ran out of memory) come before
the general ones (CUDA out of memory).
"""

from __future__ import annotations

import re

# A traceback frame of SGLang's argument resolution (ServerArgs, 0.5.20+ arg groups,
# the ModelConfig built from them): the context of a refusal before any process starts.
_SERVER_ARGS_FRAME = r'File "[^"]*sglang/srt/(server_args\.py|arg_groups/\w+\.py|configs/model_config\.py)"'

# cause id -> (patterns, what happened, what to try). A pattern is a regular
# expression, or (expression, context): the line must match the expression and
# one of the 15 lines before it the context.
_CAUSES = (
    (
        "kv_pool_too_small",
        (
            r"Not enough memory\. Please try to increase --mem-fraction-static",
            r"Loaded weights leave no GPU memory for the KV cache",
        ),
        "SGLang could not size its KV pool",
        "Lower context_length/max_running_requests or raise mem_fraction_static",
    ),
    (
        "cuda_graph_capture",
        (r"Capture cuda graph failed", r"CUDA graph capture failed"),
        "capturing CUDA graphs failed",
        "Lower mem_fraction_static to leave headroom for the graphs, lower the CUDA graph batch size, or disable CUDA graphs",
    ),
    (
        "cuda_library",
        (
            r"cannot open shared object file",
            r"ctypes\.CDLL",
            r"Could not load any common_ops library",
            r"undefined symbol: ",
            r"libcuda\.so\.1: cannot open",
        ),
        "a CUDA library failed to load (missing library or ABI mismatch between SGLang's kernels and the host's CUDA)",
        "Install the CUDA runtime the build was compiled for, or rebuild the kernels against the host's CUDA; this is not a memory problem",
    ),
    (
        "gpu_lost",
        (
            r"CUDA-capable device\(s\) is/are busy or unavailable",
            r"GPU is lost",
            r"Unable to determine the device handle for GPU",
            r"unspecified launch failure",
        ),
        "a GPU it was given is lost or unavailable",
        "Remove the failed GPU from CUDA_VISIBLE_DEVICES (check nvidia-smi) or repair the GPU",
    ),
    (
        "gpu_count",
        (r"invalid device ordinal", r"do you have enough GPUs"),
        "fewer GPUs are visible than its tensor-parallel size needs",
        "Make tp_size match the GPUs in CUDA_VISIBLE_DEVICES",
    ),
    (
        "cuda_oom",
        (r"CUDA out of memory", r"OutOfMemoryError", r"CUDA error: out of memory"),
        "a GPU ran out of memory outside the static pool",
        "Lower mem_fraction_static to leave more room for the draft model, CUDA graphs and activations, or shrink the envelope",
    ),
    (
        "nccl_error",
        (r"NCCL error", r"ncclInternalError", r"ncclSystemError", r"ncclUnhandledCudaError"),
        "NCCL (the GPUs' communication library) failed",
        "Check the GPUs' peer-to-peer access and NCCL settings (NCCL_P2P_DISABLE, NCCL_DEBUG=INFO)",
    ),
    (
        "address_in_use",
        (r"\[Errno 98\]", r"[Aa]ddress already in use"),
        "its port is already in use by another process",
        "Stop whatever listens on the port (another SGLang unit?) or change the port",
    ),
    (
        "bad_flag",
        (
            r"error: unrecognized arguments:",
            r"error: ambiguous option:",
            r"error: argument [^\s]+: invalid choice:",
            r"error: the following arguments are required:",
            r"Unknown speculative algorithm",
        ),
        "SGLang rejected its command line (a removed, renamed or unknown flag)",
        "Render the command line for the SGLang version installed on the host",
    ),
    (
        "model_path",
        (
            r"HFValidationError",
            r"does not appear to have a file named config\.json",
            r"Can't load the configuration of",
        ),
        "the model path is missing or not a model directory",
        "Check model_path (and the draft model path) on the host",
    ),
    (
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
            r"ValueError: mem_fraction_static must be",
            r"requires setting --speculative-draft-model-path",
            # Any ValueError or AssertionError raised while SGLang resolves its arguments,
            # before a process starts: ServerArgs.__post_init__ and check_server_args
            # (0.5.11 srt/server_args.py, e.g. :1042-1050 "SGLANG_GRPC_PORT (70613) must be
            # between 1 and 65535", :6805-6809 "served_model_name cannot contain a colon"),
            # 0.5.20+ srt/arg_groups/*.py (0.5.23 serving_hook.py:382-386,
            # validation_hook.py:216), or ModelConfig built from them (configs/model_config.py).
            (r"^(ValueError|AssertionError): \S", _SERVER_ARGS_FRAME),
        ),
        "SGLang rejected a parameter value",
        "Fix the parameter named in the evidence",
    ),
    (
        "warmup_failed",
        (r"Initialization failed\. warmup error", r"warmup error"),
        "its own warmup request failed",
        "Check NO_PROXY for the local warmup request and the evidence lines",
    ),
    (
        # 0.5.11/0.5.23 srt/utils/watchdog.py:153-156, f"{self.debug_name} watchdog timeout
        # ({self.watchdog_timeout=}, {self.soft=})"; debug_name "Scheduler"
        # (0.5.11 managers/scheduler_runtime_checker_mixin.py:581). Then SIGQUIT to the parent.
        "watchdog_timeout",
        (r"\w+ watchdog timeout \(self\.watchdog_timeout=",),
        "a forward batch ran longer than --watchdog-timeout and SGLang killed itself (a stuck kernel or collective)",
        "Look for a GPU or NCCL fault on the host (dmesg, nvidia-smi); raise --watchdog-timeout only for a known slow batch",
    ),
    (
        # A subprocess that died without raising (SIGKILL: the host's OOM killer, an operator):
        # during start-up, 0.5.11 srt/entrypoints/engine.py:1216-1224 (0.5.23 :2002-2010)
        # "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). ...";
        # after it, the parent's SubprocessWatchdog, 0.5.11/0.5.23 srt/utils/watchdog.py:215-220
        # "Subprocess scheduler_0 (pid=12483) crashed with exit code -9. Triggering SIGQUIT for
        # cleanup...", then the parent kills the whole tree.
        "subprocess_died",
        (
            r"Rank \d+ scheduler died during initialization \(exit code: ",
            r"Subprocess \S+ \(pid=\d+\) crashed with exit code ",
        ),
        "an SGLang subprocess (scheduler or detokenizer) died without an error of its own, "
        "and SGLang stopped its whole process tree",
        "Exit code -9 is SIGKILL: check the host's OOM killer (dmesg -T | grep -i oom) and its memory, or who killed it; "
        "-15 is SIGTERM (a stop sent to every process of the server); another code points at a crash in the lines before",
    ),
)

CAUSES = tuple(c[0] for c in _CAUSES) + ("unknown",)
_CONTEXT_LINES = 15


def _compile(pattern) -> tuple:
    if isinstance(pattern, tuple):
        return re.compile(pattern[0]), re.compile(pattern[1])
    return re.compile(pattern), None


_COMPILED = tuple((cid, tuple(_compile(x) for x in p), what, advice) for cid, p, what, advice in _CAUSES)
_DRAFT_FRAME = re.compile(r"speculative/\w+_worker(_v2)?\.py|draft_model|DraftModel")

# Lines that mean a server that is still starting will not get further by
# itself; with several ranks the others may wait for the failed one forever.
FATAL_WHILE_STARTING = ("kv_pool_too_small", "cuda_graph_capture", "cuda_oom", "nccl_error", "gpu_lost", "cuda_library")
_FATAL_GENERIC = re.compile(r"Scheduler hit an exception|Received sigquit from a child process")

_ACCESS_LOG = re.compile(r'INFO:\s+\S+ - "(GET|POST) ')
_STAMP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: TP\d+)?\]\s*")
_NOISE = re.compile(r"^\s*(File \"|Traceback \(most recent call last\)|\^+$|~+$)")


def strip_stamp(line: str) -> str:
    return _STAMP.sub("", line).rstrip()


def classify(lines: list[str]) -> dict | None:
    """The first known cause in the log lines, with its evidence, or None.
    Within a cause the first pattern is the most telling line (the OSError
    that names the library, not the ctypes frame above it)."""
    for cid, patterns, what, advice in _COMPILED:
        for pattern, context in patterns:
            for index, line in enumerate(lines):
                if pattern.search(strip_stamp(line) if context else line) and (
                        context is None or any(context.search(x) for x in lines[max(0, index - _CONTEXT_LINES):index])):
                    if cid == "cuda_oom" and any(_DRAFT_FRAME.search(x) for x in lines[max(0, index - 12):index]):
                        what += " while loading the draft model"
                    return {
                        "cause": cid,
                        "what": what,
                        "advice": advice,
                        "line": strip_stamp(line),
                        "evidence": evidence(lines, index),
                    }
    return None


def fatal_line(lines: list[str]) -> int | None:
    """Index of the first line showing that start-up cannot complete, or None."""
    fatal = [p for c in _COMPILED if c[0] in FATAL_WHILE_STARTING for p, _context in c[1]]
    for index, line in enumerate(lines):
        if _FATAL_GENERIC.search(line) or any(p.search(line) for p in fatal):
            return index
    return None


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


def error_tail(lines: list[str], count: int = 4) -> list[str]:
    """For an unknown cause: the last lines that look like an error."""
    hits = [strip_stamp(x) for x in lines if re.search(r"Error|Exception|error:|Traceback|FAILED|Killed", x)]
    return hits[-count:] if hits else [strip_stamp(x) for x in lines[-count:]]
