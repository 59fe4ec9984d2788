"""The cause classifier reads SGLang's, PyTorch's, NCCL's and argparse's real texts."""

from __future__ import annotations

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _sglang_log as sglog

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.61 GiB. GPU 2 has a total capacity of "
       "47.99 GiB of which 1440.02 MiB is free.")


@pytest.mark.parametrize("text, cause", [
    ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.88",
     "kv_pool_too_small"),
    ("ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.8. Raise "
     "--mem-fraction-static above 0.83 (minimum viable = 1 - available/pre = 0.83).", "kv_pool_too_small"),
    ("Capture cuda graph failed: " + OOM, "cuda_graph_capture"),
    (OOM, "cuda_oom"),
    ("OSError: libcudart.so.12: cannot open shared object file: No such file or directory", "cuda_library"),
    ("ImportError: Could not load any common_ops library!", "cuda_library"),
    ("OSError: /opt/sglang/venv/lib/python3.11/site-packages/sgl_kernel/common_ops.abi3.so: undefined symbol: "
     "_ZN3c104cuda9SetDeviceEi", "cuda_library"),
    ("RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable", "gpu_lost"),
    ("Unable to determine the device handle for GPU0000:21:00.0: GPU is lost.  Reboot the system to recover this GPU",
     "gpu_lost"),
    ("torch.AcceleratorError: CUDA error: invalid device ordinal", "gpu_count"),
    ("RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, unhandled cuda error, "
     "NCCL version 2.27.3 ncclUnhandledCudaError: Call to CUDA function failed.", "nccl_error"),
    ("ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use",
     "address_in_use"),
    ("launch_server.py: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
     "--cuda-graph-max-bs-prefill", "bad_flag"),
    ("launch_server.py: error: unrecognized arguments: --speculative-ddtree-shadow-linear", "bad_flag"),
    ("launch_server.py: error: argument --speculative-algorithm: invalid choice: 'DDTREE' (choose from 'EAGLE', "
     "'EAGLE3', 'NEXTN', 'STANDALONE', 'NGRAM')", "bad_flag"),
    ("huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
     "'/srv/models/absent'. Use `repo_type` argument if needed.", "model_path"),
    ("ValueError: User-specified context_length (300000) is greater than the derived context_length (262144).",
     "context_length"),
    ("Initialization failed. warmup error: 502 Bad Gateway", "warmup_failed"),
])
def test_causes(text, cause):
    found = sglog.classify(["[2026-11-29 08:00:00 TP0] Load weight begin. avail mem=47.50 GB", f"[2026-11-29 08:00:01 TP1] {text}"])
    assert found["cause"] == cause
    assert found["line"] == text  # the timestamp is removed
    assert cause in sglog.CAUSES


def test_a_healthy_start_has_no_cause_and_no_fatal_line():
    lines = [
        "[2026-11-29 08:00:00] server_args=ServerArgs(model_path='/srv/models/Qwen3.6-27B', api_key=***)",
        "[2026-11-29 08:00:02 TP0] Init torch distributed ends. elapsed=2.00 s, mem usage=0.49 GB",
        "[2026-11-29 08:00:30 TP0] KV Cache is allocated. #tokens: 197762, K size: 3.02 GB, V size: 3.02 GB",
        "[2026-11-29 08:00:40 TP0] Capture cuda graph end. Time elapsed: 6.00 s. mem usage=0.50 GB. avail mem=2.10 GB.",
        '[2026-11-29 08:00:41] INFO:     127.0.0.1:53412 - "GET /health HTTP/1.1" 200',
        "[2026-11-29 08:00:44] The server is fired up and ready to roll!",
    ]
    assert sglog.classify(lines) is None
    assert sglog.fatal_line(lines) is None
    assert sglog.last_meaningful(lines) == "The server is fired up and ready to roll!"


def test_graph_capture_wins_over_the_oom_inside_it():
    lines = ["Capture cuda graph begin.", "Capture cuda graph failed: " + OOM, "Possible solutions:"]
    assert sglog.classify(lines)["cause"] == "cuda_graph_capture"


def test_draft_model_oom_is_said_so():
    lines = ["Scheduler hit an exception: Traceback (most recent call last):",
             '  File "sglang/srt/speculative/dflash_worker.py", in __init__', OOM]
    found = sglog.classify(lines)
    assert found["cause"] == "cuda_oom" and found["what"].endswith("while loading the draft model")
    assert sglog.fatal_line(lines) == 0


def test_evidence_skips_frames_and_access_logs():
    lines = ['INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200', "Scheduler hit an exception: Traceback (most recent call last):",
             '  File "sglang/srt/speculative/ddtree_utils.py", line 58, in _load_tree_kernels',
             "OSError: libcudart.so.12: cannot open shared object file: No such file or directory",
             "Received sigquit from a child process. It usually means the child failed."]
    found = sglog.classify(lines)
    assert found["evidence"] == [
        "Scheduler hit an exception: Traceback (most recent call last):",
        "OSError: libcudart.so.12: cannot open shared object file: No such file or directory",
        "Received sigquit from a child process. It usually means the child failed.",
    ]


def test_unknown_failure_shows_the_error_tail():
    lines = ["starting", "Fatal Python error: Segmentation fault", "Current thread 0x00007f (most recent call first):"]
    assert sglog.classify(lines) is None
    assert sglog.error_tail(lines) == ["Fatal Python error: Segmentation fault"]


# -- real SGLang's texts, copied from the wheels or captured from a real server on CPU -----

SITE = "/opt/sglang/venv/lib/python3.11/site-packages/sglang"

# (release, file:line, the lines as real SGLang logs them, cause, the cause line)
REAL = [
    ("0.5.11", "srt/server_args.py:2452-2456 (source text; needs a hybrid linear-attention model and a GPU)",
     [f'  File "{SITE}/srt/server_args.py", line 2453, in _handle_mamba_radix_cache',
      "    raise ValueError(",
      "ValueError: Speculative decoding for Qwen3_5ForConditionalGeneration is not compatible with radix cache when "
      "using --mamba-scheduler-strategy no_buffer.To use radix cache with speculative decoding, please use "
      "--mamba-scheduler-strategy extra_buffer and set SGLANG_ENABLE_SPEC_V2=1."],
     "radix_cache_speculative", "ValueError: Speculative decoding for Qwen3_5ForConditionalGeneration is not compatible"),
    ("0.5.11", "srt/server_args.py:1042-1050, captured (--port 60613)",
     [f'  File "{SITE}/srt/server_args.py", line 805, in __post_init__',
      "    self._handle_deprecated_args()",
      f'  File "{SITE}/srt/server_args.py", line 1048, in _handle_deprecated_args',
      "    raise ValueError(",
      "ValueError: SGLANG_GRPC_PORT (70613) must be between 1 and 65535"],
     "invalid_argument", "ValueError: SGLANG_GRPC_PORT (70613) must be between 1 and 65535"),
    ("0.5.11", "srt/server_args.py:6804-6809 via engine.py:673, captured (--served-model-name tiny:v1)",
     [f'  File "{SITE}/srt/entrypoints/engine.py", line 673, in _launch_subprocesses',
      "    server_args.check_server_args()",
      f'  File "{SITE}/srt/server_args.py", line 6805, in check_server_args',
      '    assert ":" not in self.served_model_name, (',
      "           ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
      "AssertionError: served_model_name cannot contain a colon (':') character. The colon is reserved for the "
      "'model:adapter' syntax used in LoRA adapter specification. Invalid value: 'tiny:v1'"],
     "invalid_argument", "AssertionError: served_model_name cannot contain a colon (':') character."),
    ("0.5.23", "srt/arg_groups/serving_hook.py:382-386 (source text)",
     [f'  File "{SITE}/srt/arg_groups/serving_hook.py", line 383, in handle_deprecated_args',
      "    raise ValueError(",
      "ValueError: --grpc-port / SGLANG_GRPC_PORT (70613) must be between 1 and 65535"],
     "invalid_argument", "ValueError: --grpc-port / SGLANG_GRPC_PORT (70613) must be between 1 and 65535"),
    ("0.5.11", "srt/configs/model_config.py:452-477, captured (--context-length 4096, max_position_embeddings 2048)",
     [f'  File "{SITE}/srt/configs/model_config.py", line 475, in _derive_context_length',
      "    raise ValueError(",
      "ValueError: Warning: User-specified context_length (4096) is greater than the derived context_length (2048). "
      "This may lead to incorrect model outputs or CUDA errors. Note that the derived context_length may differ from "
      "max_position_embeddings in the model's config. To allow overriding this maximum, set the env var "
      "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"],
     "context_length", "ValueError: Warning: User-specified context_length (4096) is greater than the derived"),
    ("0.5.11", "srt/entrypoints/engine.py:1216-1224 (0.5.23 :2002-2010), captured (scheduler SIGKILLed while loading)",
     [f'  File "{SITE}/srt/entrypoints/engine.py", line 1243, in _wait_for_scheduler_ready',
      "    raise _scheduler_died_error(i, scheduler_procs[i])",
      "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 (SIGKILL), a "
      "common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check."],
     "subprocess_died", "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9)."),
    ("0.5.11", "srt/utils/watchdog.py:215-220 (0.5.23 the same), captured (scheduler SIGKILLed after ready)",
     ["[2026-12-01 10:21:03] The server is fired up and ready to roll!",
      "[2026-12-01 10:21:03] Subprocess scheduler_0 (pid=12483) crashed with exit code -9. Triggering SIGQUIT for cleanup...",
      "[2026-12-01 10:21:03] SIGQUIT received. signum=None, frame=None. It usually means one child failed."],
     "subprocess_died", "Subprocess scheduler_0 (pid=12483) crashed with exit code -9. Triggering SIGQUIT for cleanup..."),
    ("0.5.11", "srt/utils/watchdog.py:153-156, debug_name from managers/scheduler_runtime_checker_mixin.py:581 (source text)",
     ["[2026-12-01 10:30:00] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)"],
     "watchdog_timeout", "Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)"),
]


@pytest.mark.parametrize("release, where, lines, cause, line", REAL, ids=[f"{c}:{w.split()[0]}" for _r, w, _l, c, _x in REAL])
def test_real_sglang_messages(release, where, lines, cause, line):
    found = sglog.classify(["[2026-12-01 10:00:00] Load weight begin. avail mem=20.98 GB", *lines])
    assert found is not None, (release, where)
    assert found["cause"] == cause, (release, where, found)
    assert found["line"].startswith(line)
    assert cause in sglog.CAUSES


def test_a_value_error_outside_argument_resolution_is_not_invalid_argument():
    """The generic ValueError/AssertionError rule needs a frame of SGLang's argument
    resolution above it: a ValueError in a request handler is not a refused parameter."""
    lines = [f'  File "{SITE}/srt/managers/tokenizer_manager.py", line 800, in _tokenize_one_request',
             "    raise ValueError(",
             "ValueError: The input (1100 tokens) is longer than the model's context length (1024 tokens)."]
    assert sglog.classify(lines) is None


def test_the_draft_frame_hint_knows_the_v2_workers():
    """0.5.11 runs speculative workers v2 by default (SGLANG_ENABLE_SPEC_V2): eagle_worker_v2.py."""
    lines = ["Scheduler hit an exception: Traceback (most recent call last):",
             f'  File "{SITE}/srt/speculative/eagle_worker_v2.py", line 120, in __init__', OOM]
    assert sglog.classify(lines)["what"].endswith("while loading the draft model")
