"""The lab reproduces the field story under real systemd (molecule verify).

Each case starts one sglang-lab-<case>.service (the SGLang simulator run with
the field's command line) and checks what the field saw. Cases on one host run
one after another: they share the simulated GPUs, as on the real host.
"""

from __future__ import annotations

import json
import time

import pytest
import testinfra

CT129 = testinfra.get_host("podman://ct129")
CT200 = testinfra.get_host("podman://ct200")


def unit(case: str) -> str:
    return f"sglang-lab-{case}.service"


def journal(host, case: str) -> str:
    """This invocation's journal only (earlier runs of the unit are left out)."""
    invocation = prop(host, case, "InvocationID")
    return host.run(f"journalctl _SYSTEMD_INVOCATION_ID={invocation} --no-pager -o cat").stdout


def prop(host, case: str, name: str) -> str:
    return host.check_output(f"systemctl show -p {name} --value {unit(case)}").strip()


def http(host, method: str, path: str, body: dict | None = None) -> tuple[str, str]:
    """(status, body) of a request from inside the host; status 000 = no HTTP answer."""
    data = f"-H 'content-type: application/json' -d '{json.dumps(body)}'" if body else ""
    out = host.run(f"curl -s -m 10 -o /tmp/lab-body -w '%{{http_code}}' -X {method} {data} http://127.0.0.1:30000{path}")
    return out.stdout.strip(), host.run("cat /tmp/lab-body 2>/dev/null").stdout


def wait_until(predicate, timeout: float, what: str, host, case: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    pytest.fail(f"{what} within {timeout} s; journal of {unit(case)}:\n{journal(host, case)}")


@pytest.fixture
def run_case():
    started = []

    def start(host, case: str) -> None:
        host.run(f"systemctl reset-failed {unit(case)}")
        assert host.run(f"systemctl start {unit(case)}").rc == 0
        started.append((host, case))

    yield start
    for host, case in started:
        host.run(f"systemctl stop {unit(case)}")


def test_lab_hosts_boot_systemd():
    for host in (CT129, CT200):
        state = host.run("systemctl is-system-running").stdout.strip()
        assert state in ("running", "degraded"), state
        assert host.file("/etc/inferops-lab/hardware.json").exists


def test_fake_nvidia_smi_reports_the_lost_gpu_on_ct129():
    out = CT129.run("nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader")
    assert out.rc == 15
    assert "Unable to determine the device handle for GPU0000:21:00.0: GPU is lost." in out.stdout
    assert [line.split(",")[0] for line in out.stdout.splitlines()[:7]] == ["0", "2", "3", "4", "5", "6", "7"]
    ok = CT200.run("nvidia-smi --query-gpu=index,compute_cap --format=csv,noheader")
    assert ok.rc == 0 and ok.stdout.split() == ["0,", "12.0", "1,", "12.0"]


def test_nextn_serves_and_holds_gpu_memory(run_case):
    run_case(CT129, "nextn")
    wait_until(lambda: http(CT129, "GET", "/health")[0] == "200", 30, "nextn did not become healthy", CT129, "nextn")
    status, body = http(CT129, "POST", "/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 12}})
    assert status == "200", body
    meta = json.loads(body)["meta_info"]
    assert meta["completion_tokens"] == 12 and meta["spec_accept_length"] > 1
    models = json.loads(http(CT129, "GET", "/v1/models")[1])
    assert models["data"][0]["id"] == "Qwen3.6-27B"
    used = CT129.check_output("nvidia-smi -i 0,2 --query-gpu=memory.used --format=csv,noheader,nounits").split()
    assert all(int(mib) > 40000 for mib in used), used
    assert CT129.service(unit("nextn")).is_running


def test_shadow_dies_on_the_pool_error(run_case):
    run_case(CT129, "shadow")
    wait_until(lambda: prop(CT129, "shadow", "ActiveState") == "failed", 30, "shadow did not fail", CT129, "shadow")
    assert prop(CT129, "shadow", "Result") == "signal"
    log = journal(CT129, "shadow")
    assert "Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static=0.88" in log
    assert "Received sigquit from a child process" in log


@pytest.mark.parametrize("case", ["shadow-small", "shadow-nograph"])
def test_small_variants_die_after_the_draft_oom(run_case, case):
    # The field saw "active, never listening" for 10 minutes; real SGLang logs the
    # draft OOM as "Scheduler hit an exception" and its parent SIGKILLs the tree
    # (0.5.11 managers/scheduler.py:3936-3939, entrypoints/engine.py:1185-1191).
    run_case(CT129, case)
    wait_until(lambda: prop(CT129, case, "ActiveState") == "failed", 30, f"{case} did not die", CT129, case)
    assert prop(CT129, case, "Result") == "signal"
    log = journal(CT129, case)
    assert "torch.OutOfMemoryError: CUDA out of memory" in log and "Scheduler hit an exception: " in log
    assert "dflash_worker.py" in log


def test_balanced_passes_health_then_dies_on_the_first_request(run_case):
    case = "shadow-balanced"
    run_case(CT129, case)
    wait_until(lambda: http(CT129, "GET", "/health")[0] == "200", 30, "balanced did not become healthy", CT129, case)
    assert prop(CT129, case, "ActiveState") == "active"
    status = http(CT129, "POST", "/v1/completions", {"model": "Qwen3.6-27B", "prompt": "Hi", "max_tokens": 16})[0]
    assert status == "000"  # the connection dropped with the process
    wait_until(lambda: prop(CT129, case, "ActiveState") == "failed", 15, "balanced did not die", CT129, case)
    log = journal(CT129, case)
    assert "_lib = ctypes.CDLL(path)" in log
    assert "OSError: libcudart.so.12: cannot open shared object file: No such file or directory" in log


def test_dead_gpu_in_visible_devices_crashes_startup(run_case):
    run_case(CT129, "dead-gpu")
    wait_until(lambda: prop(CT129, "dead-gpu", "ActiveState") == "failed", 30, "dead-gpu did not fail", CT129, "dead-gpu")
    assert "CUDA error: CUDA-capable device(s) is/are busy or unavailable" in journal(CT129, "dead-gpu")


def test_balanced_serves_on_ct200(run_case):
    case = "shadow-balanced"
    run_case(CT200, case)
    wait_until(lambda: http(CT200, "GET", "/health")[0] == "200", 30, "balanced did not become healthy on ct200", CT200, case)
    for attempt in range(3):
        status, body = http(CT200, "POST", "/generate", {"text": f"Hi {attempt}", "sampling_params": {"max_new_tokens": 32}})
        assert status == "200", body
        assert json.loads(body)["meta_info"]["spec_accept_length"] > 4
    assert CT200.service(unit(case)).is_running
