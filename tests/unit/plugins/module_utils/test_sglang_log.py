"""The log reader classifies real SGLang logs by level and context, and knows the start-up stages.

The texts are in data/sglang_log_lines.yml: copied from the real wheels (format strings filled) or captured
from real SGLang 0.5.11/0.5.23 on CPU; each entry names its release and source.
"""

from __future__ import annotations

import pathlib

import pytest
import yaml

from ansible_collections.inferops.sglang.plugins.module_utils import _sglang_log as sglog

DATA = yaml.safe_load((pathlib.Path(__file__).parent / "data" / "sglang_log_lines.yml").read_text(encoding="utf-8"))
HEALTHY = {e["release"]: e["text"].splitlines() for e in DATA if e["source"].startswith("captured from the real 0.5.")
           and "healthy start" in e["source"]}
STAMP = "[2026-12-01 10:00:00 TP0] "
SITE = "/opt/sglang/venv/lib/python3.11/site-packages"
OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.61 GiB. GPU 0 has a total capacity of 79.19 GiB "
       "of which 1.41 GiB is free.")


def _traceback(exception: str, path: str = "sglang/srt/managers/scheduler.py", wrapper: str = STAMP + "Scheduler hit an exception: ") -> list[str]:
    return [wrapper + "Traceback (most recent call last):", f'  File "{SITE}/{path}", line 120, in __init__',
            "    self.init()", exception]


@pytest.mark.parametrize("entry", DATA, ids=[f"{e['release']}:{e['cause']}:{e['source'][:50]}" for e in DATA])
def test_real_texts(entry):
    lines = entry["text"].splitlines()
    found = sglog.classify(lines)
    assert (found["cause"] if found else None) == entry["cause"], (entry["source"], found)
    assert bool(sglog._records(lines)) == entry["fatal"], entry["source"]
    if found:
        assert found["cause"] in sglog.CAUSES
        assert found["line"] in [sglog.strip_stamp(x) for x in lines]
        assert found["line"][:300] in [x[:300] for x in found["evidence"]]  # evidence clips long lines


def test_the_data_covers_every_cause():
    assert {e["cause"] for e in DATA} - {None} == set(sglog.CAUSES) - {"unknown"}


def test_a_healthy_real_start_has_no_cause():
    for release, lines in HEALTHY.items():
        until_ready = lines[:next(i for i, x in enumerate(lines) if "fired up" in x) + 1]
        assert sglog.classify(until_ready) is None, release
        assert sglog.error_tail(until_ready) != [] and not sglog._records(until_ready), release
        assert sglog.last_meaningful(until_ready) == "The server is fired up and ready to roll!"


def test_a_stop_by_sigterm_is_no_death():
    """Real 0.5.11 and 0.5.23 stopped by SIGTERM report their scheduler as "crashed with exit code -15"."""
    for release, lines in HEALTHY.items():
        assert any("crashed with exit code -15" in x for x in lines), release
        assert sglog.classify(lines) is None, release


def test_the_nearest_death_wins_and_the_others_are_listed():
    lines = [STAMP + "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use",
             *_traceback("OSError: libcudart.so.12: cannot open shared object file: No such file or directory"),
             STAMP + "Load weight begin. avail mem=20.98 GB",
             *_traceback(OOM)]
    found = sglog.classify(lines)
    assert found["cause"] == "cuda_oom" and found["line"] == OOM
    assert found["others"] == [
        {"cause": "cuda_library", "line": "OSError: libcudart.so.12: cannot open shared object file: No such file or directory"},
        {"cause": "address_in_use",
         "line": "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use"},
    ]


def test_an_unknown_final_wrapper_keeps_the_known_cause_before_it():
    wrapper = _traceback("RuntimeError: Initialization failed. Please see the error messages above.", "sglang/srt/entrypoints/engine.py", "")
    lines = [*_traceback(OOM), "", *wrapper]
    found = sglog.classify(lines)
    assert found["cause"] == "cuda_oom" and found["others"] == []


def test_a_generic_death_counts_only_without_a_specific_cause():
    died = ("RuntimeError: Rank 0 scheduler died during initialization (exit code: 1). If exit code is -9 (SIGKILL), a "
            "common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.")
    specific = [*_traceback("ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.8."),
                *_traceback(died, "sglang/srt/entrypoints/engine.py", "")]
    found = sglog.classify(specific)
    assert found["cause"] == "kv_pool_too_small"
    assert found["others"] == [{"cause": "subprocess_died", "line": died}]
    assert sglog.classify(_traceback(died, "sglang/srt/entrypoints/engine.py", ""))["cause"] == "subprocess_died"


def test_a_scary_warning_long_before_a_real_failure_gives_the_real_cause():
    warning = (f"{SITE}/torchvision/io/image.py:14: UserWarning: Failed to load image Python extension: "
               f"'{SITE}/torch/lib/libc10_cuda.so: cannot open shared object file: No such file or directory'")
    lines = [warning, "  warn(", *[STAMP + f"Load weight begin. avail mem={x}.00 GB" for x in range(300)],
             *_traceback("ValueError: Model architectures ['FooForCausalLM'] are not supported for now. Supported architectures: "
                         "dict_keys(['LlamaForCausalLM'])", "sglang/srt/models/registry.py")]
    found = sglog.classify(lines)
    assert found["cause"] == "model_architecture" and found["others"] == []
    assert sglog.classify(lines[:302]) is None


def test_a_warning_never_counts_whatever_words_it_holds():
    lines = ["W1201 17:15:01.483000 24042 torch/utils/cpp_extension.py:140] CUDA out of memory. NCCL error in: x",
             f"{SITE}/x.py:12: UserWarning: undefined symbol: cudaFoo",
             STAMP + "\x1b[1;33m'--disable-cuda-graph' is deprecated and will be removed in a future release.\x1b[0m"]
    assert sglog.classify(lines) is None and sglog._records(lines) == []
    assert sglog.strip_stamp(lines[2]) == "'--disable-cuda-graph' is deprecated and will be removed in a future release."


def test_explicit_levels_are_fatal_records():
    lines = ["ERROR:root:NCCL error: unhandled system error", "[rank0]:[E1201 17:15:01.483283917 ProcessGroupNCCL.cpp:632] x",
             "F1201 17:15:01.483000 24042 torch/csrc/x.cpp:1] fatal", "INFO:     Started server process [24042]"]
    assert [r.index for r in sglog._records(lines)] == [0, 1, 2]
    assert sglog.classify(lines)["cause"] == "nccl_error"


def test_graph_capture_wins_over_the_oom_inside_it():
    lines = _traceback("Exception: Capture cuda graph failed: " + OOM.split(": ", 1)[1]) + ["Possible solutions:"]
    assert sglog.classify(lines)["cause"] == "cuda_graph_capture"


def test_draft_model_oom_is_said_so():
    """0.5.11 runs speculative workers v2 by default (SGLANG_ENABLE_SPEC_V2): eagle_worker_v2.py."""
    found = sglog.classify(_traceback(OOM, "sglang/srt/speculative/eagle_worker_v2.py"))
    assert found["cause"] == "cuda_oom" and found["what"].endswith("while loading the draft model")
    assert not sglog.classify(_traceback(OOM))["what"].endswith("draft model")


def test_an_exception_line_whose_traceback_head_was_cut_still_counts():
    assert sglog.classify(["    raise RuntimeError(msg)", "RuntimeError: Not enough memory. Please try to increase "
                           "--mem-fraction-static."])["cause"] == "kv_pool_too_small"
    assert sglog.classify([STAMP + "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."]) is None


def test_a_value_error_outside_argument_resolution_is_not_invalid_argument():
    """The generic ValueError/AssertionError rule needs a frame of SGLang's argument resolution."""
    lines = _traceback("ValueError: The input (1100 tokens) is longer than the model's context length (1024 tokens).",
                       "sglang/srt/managers/tokenizer_manager.py")
    assert sglog.classify(lines) is None
    assert sglog.classify(_traceback("AssertionError", "sglang/srt/server_args.py"))["cause"] == "invalid_argument"


def test_interleaved_lines_of_other_processes_do_not_break_a_traceback():
    lines = _traceback(OOM)
    lines.insert(2, "[2026-12-01 10:00:00] INFO:     127.0.0.1:1 - \"GET /health HTTP/1.1\" 503")
    assert sglog.classify(lines)["line"] == OOM


def test_evidence_skips_frames_and_access_logs():
    lines = ['INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 200', "Scheduler hit an exception: Traceback (most recent call last):",
             '  File "sglang/srt/speculative/ddtree_utils.py", line 58, in _load_tree_kernels',
             "OSError: libcudart.so.12: cannot open shared object file: No such file or directory",
             "Received sigquit from a child process. It usually means the child failed."]
    assert sglog.classify(lines)["evidence"] == [
        "Scheduler hit an exception: Traceback (most recent call last):",
        "OSError: libcudart.so.12: cannot open shared object file: No such file or directory",
        "Received sigquit from a child process. It usually means the child failed.",
    ]


def test_unknown_failure_shows_the_fatal_records_first():
    lines = ["starting", STAMP + "Ignore import error when loading sglang.srt.models.x: Error y",
             *_traceback("KeyError: 'layers.0.weight'"), STAMP + "SIGQUIT received. signum=None, frame=None. It usually means one child failed."]
    assert sglog.classify(lines) is None
    assert sglog.error_tail(lines) == ["KeyError: 'layers.0.weight'", "SIGQUIT received. signum=None, frame=None. It usually means one child failed."]
    assert sglog.error_tail(["starting", "Fatal Python error: Segmentation fault", "x"]) == ["Fatal Python error: Segmentation fault"]


def test_stamps_with_ranks_and_milliseconds_are_stripped():
    assert sglog.strip_stamp("[2026-12-01 10:00:00.123 DP0 TP3 EP3] Load weight begin. avail mem=1.00 GB") == \
        "Load weight begin. avail mem=1.00 GB"


# -- start-up stages -----------------------------------------------------------------------

def test_the_real_healthy_starts_walk_the_stages():
    """The two real CPU logs (0.5.11 "Init torch distributed", 0.5.23 "Init parallel"; no graphs on CPU)."""
    for release, lines in HEALTHY.items():
        stages = [s for s in map(sglog.stage_of, lines) if s]
        assert stages == ["distributed", "engine", "weights", "memory_pool", "engine", "http", "warmup", "serving"], release
        assert set(stages) <= set(sglog.STAGES) and "starting" not in stages


@pytest.mark.parametrize("text, stage", [
    # 0.5.9 model_executor/model_runner.py:731, 0.5.20 distributed/bootstrap.py:81, 0.5.23 :115 and :190
    ("Init torch distributed begin.", "distributed"),
    ("Init parallel ends. elapsed=0.03 s", "engine"),
    # the draft model's own load re-enters weights (0.5.11 model_runner.py:1290)
    ("Load weight begin. avail mem=21.98 GB", "weights"),
    ("Load weight end. elapsed=40.12 s, type=Qwen3_5ForConditionalGeneration, avail mem=22.40 GB, mem usage=55.56 GB.", "memory_pool"),
    # 0.5.20+ model_runner_components/startup_weight_load.py:538
    ("Load weight end. Committed real weights after CUDA graph capture in 3.10 s (capture overlap window 2.00 s, "
     "startup overlap total 9.00 s)", "engine"),
    ("Memory pool end. avail mem=8.10 GB", "engine"),
    # 0.5.11 model_runner.py:2779/:2797/:2907, eagle_worker_v2.py:277; 0.5.23 cuda_graph_setup.py:685/:759, eagle_worker_v2.py:515
    ("Capture cuda graph begin. This can take up to several minutes. avail mem=8.10 GB", "cuda_graph"),
    ("Capture cuda graph end. Time elapsed: 6.00 s. mem usage=0.50 GB. avail mem=7.60 GB.", "engine"),
    ("Capture piecewise CUDA graph begin. avail mem=7.60 GB", "cuda_graph"),
    ("Capture draft cuda graph begin. This can take up to several minutes. avail mem=7.00 GB", "cuda_graph"),
    ("Capture draft extend cuda graph begin (step 0). This can take up to several minutes. avail mem=7.00 GB", "cuda_graph"),
    ("Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[512, 1024], avail mem=8.10 GB", "cuda_graph"),
    ("Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=8.10 GB", "cuda_graph"),
    ("Capture target decode CUDA graph end. bs=[1, 2, 4], elapsed=6.00 s, mem usage=0.50 GB, avail mem=7.60 GB.", "engine"),
    ("Capture Frozen-KV MTP draft cuda graph begin.", "cuda_graph"),
    # 0.5.11 cuda_graph_runner.py:870 (the tqdm bar)
    ("Capturing batches (bs=16 avail_mem=7.90 GB):  50%|#####     | 4/8 [00:02<00:02,  1.9it/s]", "cuda_graph"),
    ("max_total_num_tokens=197762, chunked_prefill_size=2048, max_prefill_tokens=16384, max_running_requests=48, "
     "context_len=65536, available_gpu_mem=2.10 GB", "http"),
    ("INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)", "warmup"),
    ("The server is fired up and ready to roll!", "serving"),
    # not stages
    ("Capture cuda graph failed: CUDA out of memory.", None),
    ("[unified-memory-pool]   total_bytes=1, max_total_num_tokens=2, max_mamba_cache_size=3", None),
    ("Disable piecewise CUDA graph because --disable-piecewise-cuda-graph is set", None),
    ("W1201 17:15:01.483000 24042 torch/utils/cpp_extension.py:140] Load weight begin.", None),
])
def test_stage_of(text, stage):
    assert sglog.stage_of("[2026-12-01 10:00:00 TP0] " + text) == stage
    assert sglog.stage_of(text) == stage
    assert stage is None or stage in sglog.STAGE_DESCRIPTIONS


def test_every_stage_is_described():
    assert set(sglog.STAGE_DESCRIPTIONS) == set(sglog.STAGES)


# -- SGLang's tuning signals -------------------------------------------------------------------------------------

# 0.5.11's format strings filled (managers/scheduler.py:763-770; observability/scheduler_metrics_mixin.py:521,
# 546, 562-566 with managers/scheduler_runtime_checker_mixin.py:113-116; managers/scheduler.py:2858-2870)
SUMMARY_GPU = (STAMP + "max_total_num_tokens=412160, chunked_prefill_size=8192, max_prefill_tokens=16384, "
               "max_running_requests=48, context_len=32768, available_gpu_mem=12.41 GB")
DECODE_SPEC = (STAMP + "Decode batch, #running-req: 48, #token: 398112, token usage: 0.97, accept len: 2.81, "
               "accept rate: 0.60, cuda graph: True, gen throughput (token/s): 1523.40, #queue-req: 17")
DECODE_IDLE = STAMP + "Decode batch, #running-req: 3, #token: 812, token usage: 0.00, cuda graph: True, gen throughput (token/s): 88.10, #queue-req: 0"
HYBRID = (STAMP + "Decode batch, #running-req: 2, full token usage: 0.60, mamba usage: 0.40, cuda graph: True, "
          "gen throughput (token/s): 60.00, #queue-req: 3, ")
RETRACT = (STAMP + "KV cache pool is full. Retract requests. #retracted_reqs: 2, #new_tokens_gained: 5120, "
           "#new_token_ratio: 0.4100 -> 0.5300")


def test_signals_read_the_summary_the_decode_lines_and_the_retractions_as_sglangs_guide_reads_them():
    found = sglog.signals([SUMMARY_GPU, DECODE_IDLE, DECODE_SPEC, RETRACT, RETRACT, "[2026-12-01 10:00:01] Decode batch nonsense",
                           # 0.5.9's pool part (managers/scheduler_metrics_mixin.py:208) and a hybrid model's (:203-204)
                           STAMP + "Decode batch, #running-req: 1, token usage: 0.05, cuda graph: True, "
                                   "gen throughput (token/s): 51.23, #queue-req: 0, ",
                           HYBRID])
    assert (found["available_mem_gb"], found["device"], found["max_total_num_tokens"], found["max_running_requests"],
            found["context_len"]) == (12.41, "gpu", 412160, 48, 32768)
    # 0.5.9's form (no #token) and a hybrid model's (the full-attention pool's usage) are read too
    assert (found["decode_lines"], found["token_usage_max"], found["running_max"], found["queue_max"]) == (4, 0.97, 48, 17)
    assert sglog.signals([HYBRID])["token_usage_max"] == 0.6
    assert (found["retractions"], found["retracted_reqs"]) == (2, 4)
    said = " | ".join(found["reading"])
    assert "4 running request(s) were retracted (2 time(s))" in said
    assert "the KV pool was full (token usage 0.97) with 17 request(s) queued" in said
    assert "12.41 GB left for activations, above the 5-8 GB SGLang advises: mem_fraction_static could be larger" in said


def test_signals_of_a_real_cpu_start_and_a_quiet_log_say_nothing_alarming():
    """The real 0.5.11 CPU server's summary (captured): available_cpu_mem, which the GPU advice does not apply to."""
    found = sglog.signals(HEALTHY["0.5.11"])
    assert found["device"] == "cpu" and found["max_total_num_tokens"] == 4096 and found["available_mem_gb"] > 0
    assert found["reading"] == [] and found["decode_lines"] == 0
    low = sglog.signals([SUMMARY_GPU.replace("12.41", "3.20"), DECODE_IDLE.replace("#queue-req: 0", "#queue-req: 5")])
    assert [r.split(":")[0] for r in low["reading"]] == [
        "requests queued (5) with the pool at 0.00", "3.20 GB left for activations, under the 5-8 GB SGLang advises"]


def test_signals_of_a_real_server_whose_pool_filled_under_load():
    """Real sglang 0.5.11 on CPU with a 320-token pool and 12 requests of 96 tokens at once (captured): the pool
    filled, requests queued, and the scheduler retracted running requests twice."""
    lines = (pathlib.Path(__file__).parent / "data" / "sglang_0.5.11_cpu_full_pool.log").read_text().splitlines()
    found = sglog.signals(lines)
    assert (found["device"], found["available_mem_gb"], found["max_total_num_tokens"]) == ("cpu", 20.95, 320)
    assert (found["decode_lines"], found["token_usage_max"], found["running_max"], found["queue_max"]) == (97, 0.98, 3, 10)
    assert (found["retractions"], found["retracted_reqs"]) == (2, 2)
    assert [r.split(":")[0] for r in found["reading"]] == [
        "the KV pool filled and 2 running request(s) were retracted (2 time(s))",
        "the KV pool was full (token usage 0.98) with 10 request(s) queued"]
