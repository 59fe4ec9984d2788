"""The simulator as a real process: start-up order, HTTP API, faults, flags by version."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error

import pytest
from sim_helpers import BALANCED, DDTREE, LAB, MODEL, NEXTN, NOGRAPH, SHADOW


def test_serves_after_warmup_and_generates_deterministically(launch):
    server = launch([*MODEL, *NEXTN], hw={"time_scale": 0.3})
    server.wait_for(lambda: server.status("/v1/models") == 200, what="/v1/models")
    # /v1/models answers before the warmup generation finished
    assert server.status("/health") == 503
    server.wait_for(lambda: server.status("/health") == 200, what="/health 200")
    assert "The server is fired up and ready to roll!" in server.output()
    models = server.request("GET", "/v1/models")[1]
    assert models["data"][0]["id"] == "Qwen3.6-27B" and models["data"][0]["max_model_len"] == 131072
    a = server.request("POST", "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 7}})[1]
    b = server.request("POST", "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 7}})[1]
    assert a["text"] == b["text"] and len(a["text"].split()) == 7
    assert a["meta_info"]["completion_tokens"] == 7 and a["meta_info"]["spec_accept_length"] > 1
    chat = server.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5})[1]
    assert chat["choices"][0]["message"]["content"] and chat["usage"]["completion_tokens"] == 5
    comp = server.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 3})[1]
    assert comp["object"] == "text_completion" and comp["usage"]["completion_tokens"] == 3


def test_http_binds_only_after_init(launch):
    # at this scale the weights alone load for about a second (10.75 s on the host)
    server = launch([*MODEL, *NEXTN], hw={"time_scale": 0.1})
    server.wait_for(lambda: "Load weight begin" in server.output(), what="weight loading")
    assert server.status("/v1/models") is None  # connection refused while loading
    server.wait_for(lambda: server.status("/v1/models") == 200, what="bind")
    out = server.output()
    assert out.index("KV Cache is allocated") < out.index("Uvicorn running on")


def test_api_key_is_enforced_except_on_health(launch):
    server = launch([*MODEL, *NEXTN, "--api-key", "s3cret-key"])
    server.wait_for(lambda: server.status("/health") == 200, what="health")
    assert server.status("/v1/models") == 401
    assert server.status("/v1/models", headers={"Authorization": "Bearer wrong"}) == 401
    assert server.status("/v1/models", headers={"Authorization": "Bearer s3cret-key"}) == 200
    # real SGLang logs every server argument at INFO, the key in clear (0.5.11 entrypoints/engine.py:679)
    assert "api_key='s3cret-key'" in server.output()


def test_pool_error_kills_the_process_with_sglangs_text(launch):
    server = launch([*MODEL, *SHADOW], ddtree=True)
    assert server.proc.wait(timeout=20) == -signal.SIGKILL
    out = server.output()
    assert "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.88" in out
    assert "Received sigquit from a child process. It usually means the child failed." in out


def test_draft_oom_on_multi_rank_kills_the_tree(launch):
    # Real SGLang: the rank that raised logs "Scheduler hit an exception" and SIGQUITs
    # the parent, which SIGKILLs the tree (0.5.11 managers/scheduler.py:3936-3939,
    # entrypoints/engine.py:1185-1191); the other ranks do not keep it alive.
    server = launch([*MODEL, *NOGRAPH], ddtree=True)
    assert server.proc.wait(timeout=20) == -signal.SIGKILL
    out = server.output()
    assert "Scheduler hit an exception: " in out and "torch.OutOfMemoryError: CUDA out of memory" in out
    assert "Received sigquit from a child process. It usually means the child failed." in out
    assert server.status("/v1/models") is None


def test_draft_oom_on_one_rank_exits(launch):
    one_gpu = {"index": 0, "name": "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "uuid": "GPU-0",
               "pci_bus_id": "00000000:01:00.0", "memory_total_mib": 62000, "compute_cap": "12.0"}
    server = launch([*MODEL[:2], "--tp-size", "1", *DDTREE, "--mem-fraction-static", "0.95", "--max-running-requests", "1",
                     "--context-length", "8192", "--disable-cuda-graph"], ddtree=True, host="ct200", gpus="0",
                    hw={"gpus": [one_gpu]})
    assert server.proc.wait(timeout=20) == -signal.SIGKILL
    assert "torch.OutOfMemoryError" in server.output()


GRAPH_OOM = [*MODEL, "--speculative-algorithm", "NEXTN", "--max-running-requests", "160",
             "--chunked-prefill-size", "1024", "--mem-fraction-static", "0.98", "--disable-radix-cache"]


@pytest.mark.parametrize("version, flag, hint", [
    # CUDA_GRAPH_CAPTURE_FAILED_MSG: 0.5.11 model_executor/cuda_graph_runner.py:1431-1438,
    # 0.5.14+ model_executor/runner_backend_utils/__init__.py:14-21
    ("0.5.11", "--cuda-graph-max-bs", "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)"),
    ("0.5.23", "--cuda-graph-max-bs-decode", "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)"),
])
def test_cuda_graph_oom_kills_the_tree_with_the_release_message(launch, version, flag, hint):
    # 160 running requests x 4 draft tokens of CUDA graphs do not fit the 2 % headroom
    server = launch([*GRAPH_OOM, flag, "160"], host="ct200", gpus="0,1", version=version)
    assert server.proc.wait(timeout=20) == -signal.SIGKILL
    out = server.output()
    assert "Exception: Capture cuda graph failed: CUDA out of memory." in out
    assert hint in out and "Scheduler hit an exception: " in out


def test_missing_library_crashes_on_first_client_request_after_health(launch):
    server = launch([*MODEL, *BALANCED], ddtree=True)
    server.wait_for(lambda: server.status("/health") == 200, what="health")
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        server.request("POST", "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 8}})
    assert server.proc.wait(timeout=10) == -signal.SIGKILL
    out = server.output()
    assert "_lib = ctypes.CDLL(path)" in out
    assert "OSError: libcudart.so.12: cannot open shared object file: No such file or directory" in out


def test_same_variant_serves_where_the_library_exists(launch):
    server = launch([*MODEL, *BALANCED], ddtree=True, host="ct200", gpus="0,1")
    server.wait_for(lambda: server.status("/health") == 200, what="health")
    status, body = server.request("POST", "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 8}})
    assert status == 200 and body["meta_info"]["spec_accept_length"] > 4


def test_lost_gpu_in_visible_devices_crashes_startup(launch):
    server = launch([*MODEL, *NEXTN], gpus="0,1")
    assert server.proc.wait(timeout=20) == -signal.SIGKILL
    assert "CUDA error: CUDA-capable device(s) is/are busy or unavailable" in server.output()


def test_missing_model_path_fails_before_loading(launch, tmp_path):
    server = launch(["--model-path", str(tmp_path / "nope"), *NEXTN])
    assert server.proc.wait(timeout=20) == 1
    assert "HFValidationError: Repo id must be in the form" in server.output()


def hang_up_on_every_connection(taken: socket.socket) -> None:
    """Something else on the port: it accepts each connection and closes it at once."""
    while True:
        try:
            conn, _addr = taken.accept()
        except OSError:  # the test closed the socket
            return
        conn.close()


def test_port_held_by_something_else_lingers_then_kills_itself(launch):
    # uvicorn logs the bind error, then its lifespan shutdown joins the warmup thread,
    # which polls /model_info 120 times (0.5.11 entrypoints/http_server.py:1866-1882)
    # and kills the tree when nothing answers like SGLang. The holder hangs up at once
    # (a holder that never answers costs each poll its 5 s timeout: the same failed
    # poll, 120 times slower); the simulator's time scale doubled keeps the 120 polls'
    # pauses (1 s each, scaled) well over the second the linger is checked for.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        threading.Thread(target=hang_up_on_every_connection, args=(taken,), daemon=True).start()
        server = launch([*MODEL, *NEXTN], port=port, host="ct200", gpus="0,1", hw={"time_scale": 0.02})
        server.wait_for(lambda: "address already in use" in server.output(), what="bind error")
        with pytest.raises(subprocess.TimeoutExpired):
            server.proc.wait(timeout=1)  # lingers while the warmup polls
        assert server.proc.wait(timeout=60) == -signal.SIGKILL
        taken.shutdown(socket.SHUT_RDWR)
    out = server.output()
    assert ("ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', %d): address already in use"
            % port) in out
    assert "Initialization failed. warmup error: Traceback (most recent call last):\nrequests.exceptions.ConnectionError: " in out
    assert "The server is fired up and ready to roll!" not in out


def test_port_held_by_another_sglang_warms_it_up_and_exits_3(launch):
    first = launch([*MODEL, *NEXTN], host="ct200", gpus="0,1")
    first.wait_for(lambda: first.status("/health") == 200, what="first server healthy")
    # the second one on GPUs of its own (the first one holds 0 and 1 in the ledger)
    gpus = json.loads((LAB / "hosts" / "ct200" / "hardware.json").read_text())["gpus"]
    other = [dict(g, index=g["index"] + 2) for g in gpus]
    second = launch([*MODEL, *NEXTN], port=first.port, host="ct200", gpus="2,3", hw={"gpus": other})
    assert second.proc.wait(timeout=30) == 3  # uvicorn's STARTUP_FAILURE
    out = second.output()
    assert "address already in use" in out
    assert "The server is fired up and ready to roll!" in out  # ... about the other server
    assert out.index("address already in use") < out.index("The server is fired up and ready to roll!")
    assert first.proc.poll() is None


def run_cli(sim_install, hardware, version: str, args: list[str], ddtree: bool = False) -> subprocess.CompletedProcess:
    env = hardware()
    env["PYTHONPATH"] = str(sim_install(version, ddtree))
    return subprocess.run([sys.executable, "-m", "sglang.launch_server", *args], env=env, capture_output=True,
                          text=True, timeout=20, check=False)


def test_cuda_graph_max_bs_removed_in_0_5_20(sim_install, hardware):
    result = run_cli(sim_install, hardware, "0.5.23", [*MODEL, "--cuda-graph-max-bs", "8"])
    assert result.returncode == 2
    assert ("error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
            "--cuda-graph-max-bs-prefill") in result.stderr


def test_dflash_unknown_before_0_5_11(sim_install, hardware):
    result = run_cli(sim_install, hardware, "0.5.9", [*MODEL, "--speculative-algorithm", "DFLASH"])
    assert result.returncode == 2 and "argument --speculative-algorithm: invalid choice: 'DFLASH'" in result.stderr


def test_ddtree_needs_the_patched_build(sim_install, hardware):
    result = run_cli(sim_install, hardware, "0.5.11", [*MODEL, *DDTREE])
    assert result.returncode == 2 and "invalid choice: 'DDTREE'" in result.stderr
    result = run_cli(sim_install, hardware, "0.5.11", [*MODEL, "--speculative-ddtree-shadow-linear"])
    assert "unrecognized arguments: --speculative-ddtree-shadow-linear" in result.stderr


def test_ledger_shows_memory_in_fake_nvidia_smi(launch, hardware):
    server = launch([*MODEL, *NEXTN], host="ct200", gpus="0,1")
    server.wait_for(lambda: server.status("/health") == 200, what="health")
    env = hardware("ct200")
    env.update(SGLANG_SIM_STATE=str(server.log.parent / "gpu"), PYTHONPATH=str(LAB / "simulator"))

    def apps() -> list[list[str]]:
        code = "import sys; from sglang_simulator.nvidia_smi import main; sys.exit(main())"
        out = subprocess.run([sys.executable, "-c", code, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             env=env, capture_output=True, text=True, check=True)
        return [line.split(", ") for line in out.stdout.splitlines() if line]

    rows = apps()
    assert {r[0] for r in rows} == {str(server.proc.pid)} and len(rows) == 2
    assert all(int(r[1]) > 80000 for r in rows)  # mem_fraction_static 0.88 of 96 GB
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=10) == 0
    assert apps() == []


NEXTN_RADIX = [a for a in NEXTN if a != "--disable-radix-cache"]


@pytest.mark.parametrize("version, extra, refused", [
    ("0.5.11", [], True),  # 0.5.11 srt/server_args.py:2452-2456
    ("0.5.10", [], True),
    ("0.5.13", [], True),
    ("0.5.11", ["--disable-radix-cache"], False),
    ("0.5.11", ["--mamba-scheduler-strategy", "extra_buffer"], False),
    ("0.5.9", [], False),  # silently disables radix cache (0.5.9 server_args.py:1760-1764)
    ("0.5.14", [], False),  # chooses extra_buffer itself
])
def test_radix_cache_with_speculative_decoding_on_the_hybrid_model(sim_install, hardware, version, extra, refused):
    result = run_cli(sim_install, hardware, version, [*MODEL, *NEXTN_RADIX, *extra, "--port", "1"])
    text = result.stdout + result.stderr
    message = ("ValueError: Speculative decoding for Qwen3_5ForConditionalGeneration is not compatible with radix "
               "cache when using --mamba-scheduler-strategy no_buffer.")
    if refused:
        assert result.returncode == 1 and message in text
    else:
        assert message not in text


def test_health_is_a_one_token_generation_and_vision_warmup_is_a_chat_with_an_image(launch):
    server = launch([*MODEL, *NEXTN], host="ct200", gpus="0,1")
    server.wait_for(lambda: server.status("/health") == 200, what="health")
    out = server.output()
    # Qwen3.6's config has a vision section: warmup is /v1/chat/completions (0.5.11 http_server.py:1886-1925)
    assert '"POST /v1/chat/completions HTTP/1.1" 200 OK' in out
    assert '"POST /generate HTTP/1.1"' not in out
    info = server.request("GET", "/model_info")[1]
    assert info["has_image_understanding"] is True and info["architectures"] == ["Qwen3_5ForConditionalGeneration"]


def test_log_prefixes_are_sglangs(launch):
    server = launch([*MODEL, *NEXTN], host="ct200", gpus="0,1")
    server.wait_for(lambda: server.status("/health") == 200, what="health")
    lines = server.output().splitlines()
    # scheduler lines carry " TP<rank>" with --tp-size > 1 (0.5.11 managers/scheduler.py:3845-3857)
    assert any(re.match(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] Load weight begin", x) for x in lines)
    # the main process has none; uvicorn's lines get SGLang's "[time] " too (0.5.11 utils/common.py:2450-2458;
    # the real 0.5.11 log: "[2026-12-01 17:15:13] INFO:     Uvicorn running on http://127.0.0.1:23111 (Press CTRL+C to quit)")
    assert any(re.match(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] The server is fired up and ready to roll!$", x) for x in lines)
    assert any(re.match(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] INFO:     Uvicorn running on http://127\.0\.0\.1:\d+ \(Press CTRL\+C to quit\)$", x)
               for x in lines)
    assert not any("WARNING: " in x for x in lines)
