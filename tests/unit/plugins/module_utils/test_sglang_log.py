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
