"""_gateway and _gateway_launch: the real gateway (smg, the version _gateway.PINNED, from the venv `make units` builds
at .cache/gateway-venv) in front of the lab's simulated SGLang servers; its waits on a scripted
gateway and an injected clock."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sim_helpers import LAB, MODEL, NEXTN, REPO, GatewayProcess, GatewayTraffic, free_port, through_gateway

from ansible_collections.inferops.sglang.plugins.module_utils import _gateway, _gateway_launch, _host_code
from ansible_collections.inferops.sglang.plugins.module_utils._http import Response

GATEWAY_PYTHON = Path(os.environ.get("INFEROPS_GATEWAY_VENV", REPO / ".cache" / "gateway-venv")) / "bin" / "python"
KEY = "gw-test-key-7f3a"
# ct200's own decode speed (the fixture runs generations 100x faster; ct129's file has none): a stream
# long enough to span a switch
PERFORMANCE = json.loads((LAB / "hosts" / "ct200" / "hardware.json").read_text())["performance"]


@pytest.fixture
def gateway(tmp_path):
    """start(api_key=None, extra=()) -> the real gateway (GatewayProcess) and a Gateway with its control key."""
    started = []

    def start(api_key: str | None = None, extra: tuple[str, ...] = (),
              workers: list[str] | None = None) -> tuple[_gateway.Gateway, GatewayProcess]:
        process = GatewayProcess(GATEWAY_PYTHON, tmp_path / f"gateway-{len(started)}", KEY, api_key, extra, workers)
        started.append(process)
        return _gateway.Gateway(process.client(KEY)), process

    yield start
    for process in started:
        process.stop()


def serving(launch, gpus: str = "0,2", **kwargs):
    """NEXTN on ct129's stand-in (GPU 1 is lost there), on ``gpus``."""
    server = launch([*MODEL, *NEXTN], version="0.5.11", host="ct129", gpus=gpus, **kwargs)
    server.wait_for(lambda: server.status("/health") == 200, timeout=120, what="health")
    return server


def test_a_worker_is_routed_to_once_the_gateway_lists_it_ready(gateway, launch):
    gw, process = gateway()
    port = process.port
    server = serving(launch)
    assert gw.readiness().status == 503 and gw.workers() == []
    url = f"http://127.0.0.1:{server.port}"
    worker_id = gw.add(url + "/")  # sent without the slash: the gateway would take U and U/ as two workers
    ready = gw.wait_ready(url, timeout=30)
    assert ready["worker"] == {"id": worker_id, "url": url, "status": "ready", "healthy": True}
    assert through_gateway(port, 4)["status"] == 200
    # asked again (a switch re-run after its controller was killed): the same worker, not a second one
    assert gw.add(url) == worker_id and [w["id"] for w in gw.workers()] == [worker_id]


def test_new_worker_first_then_the_old_one_out_costs_clients_nothing(gateway, launch):
    """The switch's order through the real gateway: B added and routable before A is removed. Requests
    sent all along succeed, and a stream on A in flight at the cut goes on to its end (the gateway
    does not cut it, nor drain it: A is stopped only once its own count is zero)."""
    gw, process = gateway()
    port = process.port
    old = serving(launch, hw={"performance": PERFORMANCE})
    new = serving(launch, gpus="3,4")  # beside the old one, on GPUs it does not use
    old_id = gw.add(f"http://127.0.0.1:{old.port}")
    gw.wait_ready(f"http://127.0.0.1:{old.port}", timeout=30)
    traffic = GatewayTraffic(port, 1000)
    try:
        gw.add(f"http://127.0.0.1:{new.port}")
        gw.wait_ready(f"http://127.0.0.1:{new.port}", timeout=30)
        assert gw.remove(old_id) is True
        cut = time.monotonic()
        gone = gw.wait_gone(old_id, timeout=30)
    finally:
        traffic.stop()
    old.proc.kill()
    old.proc.wait()
    assert traffic.stream_ended > cut  # in flight on the old server at the cut
    assert gone >= 1.0  # listed as draining for the gateway's settle time (5 s in 1.13.0) first
    assert traffic.stream == {"status": 200, "tokens": 1000}
    assert len(traffic.answers) > 10 and set(traffic.answers) == {200}, traffic.answers
    assert through_gateway(port, 2)["status"] == 200  # the new server serves alone
    assert gw.remove(old_id) is False  # already gone


def test_a_worker_that_does_not_answer_is_never_routed_to(gateway):
    gw, _process = gateway()
    dead = f"http://127.0.0.1:{free_port()}"
    gw.add(dead)
    with pytest.raises(_gateway.GatewayError, match=rf"did not route to {dead} within 4 s"):
        gw.wait_ready(dead, timeout=4)
    assert gw.readiness().status == 503


def test_the_worker_api_needs_the_key_and_no_message_shows_it(gateway):
    _gw, process = gateway()
    for key, said in ((None, "Missing or invalid Authorization header"), ("wrong-" + KEY, "Invalid authentication token")):
        gw = _gateway.Gateway(process.client(key))
        with pytest.raises(_gateway.GatewayError, match="HTTP 401") as failed:
            gw.add("http://127.0.0.1:1")
        assert said in str(failed.value) and KEY not in str(failed.value)
        assert gw.readiness().status == 503  # the probes need no key


def listeners(port: int) -> list[str]:
    """The IPv4 addresses listening on ``port`` (/proc/net/tcp: state 0A is LISTEN)."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:
            found.append(".".join(str(b) for b in reversed(bytes.fromhex(address))))
    return found


def test_the_launcher_keeps_the_keys_off_the_command_line_and_out_of_the_log(gateway, launch):
    """The gateway as the unit runs it: ``command``'s arguments (SGLang's health settings, Prometheus
    on loopback), its keys from the credentials directory. Neither key is in the process's command
    line or in anything it logs (at debug), the worker API needs the control key, the serving routes
    the API key, which the gateway also sends to the workers (a server that requires it serves)."""
    api = "api-Wd40-secret"
    gw, process = gateway(api_key=api, extra=("--log-level", "debug"))
    server = launch([*MODEL, *NEXTN, "--api-key", api], version="0.5.11", host="ct129", gpus="0,2")
    server.wait_for(lambda: server.status("/health") == 200, timeout=120, what="health")
    cmdline = Path(f"/proc/{process.proc.pid}/cmdline").read_bytes().decode()
    assert KEY not in cmdline and api not in cmdline
    gw.add(f"http://127.0.0.1:{server.port}", api)
    ready = gw.wait_ready(f"http://127.0.0.1:{server.port}", timeout=30)
    assert ready["seconds"] < 5  # routed at registration, not after the interval's checks
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 4}}
    assert process.client(api).call("POST", "/generate", body).status == 200
    assert process.client(None).call("POST", "/generate", body).status == 401
    with pytest.raises(_gateway.GatewayError, match="HTTP 401"):
        _gateway.Gateway(process.client(api)).workers()  # the API key is not the control key
    listening = listeners(process.metrics)
    process.stop()
    output = process.output()
    assert "DEBUG" in output and KEY not in output and api not in output
    # command()'s settings in effect: SGLang's health timeout, Prometheus on loopback only
    assert "Workflow engines initialized (health check timeout: 25s)" in output
    assert listening == ["127.0.0.1"]


def test_a_restarted_gateway_routes_again_to_the_workers_of_its_workers_file(gateway, launch):
    """smg keeps its workers in memory: the unit hands the launcher the live workers (the switch's
    file), which it registers, with the servers' key, once smg answers: no deploy needed after a
    reboot. A URL already listed is not added twice."""
    api = "api-restart-key"
    server = launch([*MODEL, *NEXTN, "--api-key", api], version="0.5.11", host="ct129", gpus="0,2")
    server.wait_for(lambda: server.status("/health") == 200, timeout=120, what="health")
    url = f"http://127.0.0.1:{server.port}"
    gw, process = gateway(api_key=api, workers=[url + "/"])
    ready = gw.wait_ready(url, timeout=30)
    assert [w["url"] for w in gw.workers()] == [url]
    assert through_gateway(process.port, 4, key=api)["status"] == 200
    assert _gateway_launch.register(gw, [url], api, timeout=5) == [ready["worker"]["id"]]
    assert f"registered 1 worker(s): {url}" in process.output() and api not in process.output()


def test_a_server_restarted_on_its_url_is_routed_to_again_without_being_added_again(gateway, launch):
    """What the watchdog's restart (or an in-place switch's) leaves behind: the gateway keeps the worker
    listed while it is down (--no-remove-unhealthy-workers) and routes to it once its checks pass again."""
    gw, process = gateway(extra=("--health-check-interval-secs", "1", "--health-failure-threshold", "1",
                                 "--health-success-threshold", "1"))
    server = serving(launch)
    url = f"http://127.0.0.1:{server.port}"
    worker_id = gw.add(url)
    gw.wait_ready(url, timeout=30)
    server.proc.kill()
    server.proc.wait()
    deadline = time.monotonic() + 30
    while gw.find(url)["healthy"]:
        assert time.monotonic() < deadline, "the gateway never saw the server go"
        time.sleep(0.2)
    assert through_gateway(process.port, 4)["status"] != 200
    again = serving(launch, port=server.port)
    assert gw.wait_ready(url, timeout=60)["worker"]["id"] == worker_id and again.port == server.port
    assert through_gateway(process.port, 4)["status"] == 200


def test_the_launcher_hands_smg_the_keys_and_registers_the_workers_beside_it(tmp_path):
    (tmp_path / "control-key").write_text("ctl\n")
    (tmp_path / "api-key").write_text("k1\n")
    (tmp_path / "workers").write_text('{"workers": ["http://127.0.0.1:31010/"]}')
    ran, threads = [], []
    argv = _gateway_launch.command("0.0.0.0", 30000, 30090)
    _gateway_launch.launch(argv, {"CREDENTIALS_DIRECTORY": str(tmp_path)}, ran.append,
                           lambda target, args: threads.append(args))
    assert ran == [[*argv, "--control-plane-api-keys", "inferops:inferops:admin:ctl", "--api-key", "k1"]]
    assert threads == [("http://127.0.0.1:30000", "ctl", ["http://127.0.0.1:31010"], "k1")]


@pytest.mark.parametrize("files, error", [
    ({}, "No such file"),
    ({"control-key": ""}, "control-key is empty or holds whitespace or ':'"),
    ({"control-key": "a:b"}, "control-key is empty or holds whitespace or ':'"),
    ({"control-key": "ok", "api-key": "two words"}, "api-key is empty or holds whitespace$"),
    ({"control-key": "ok", "workers": "[]"}, "the credential workers must be"),
    ({"control-key": "ok", "workers": '{"workers": ["127.0.0.1:1"]}'}, "the credential workers must be"),
    ({"control-key": "ok", "workers": "{"}, "the credential workers is not JSON"),
])
def test_the_launcher_refuses_a_missing_or_unusable_key_before_smg_starts(tmp_path, files, error):
    for name, value in files.items():
        (tmp_path / name).write_text(value)
    started = []
    with pytest.raises((_gateway_launch.LaunchError, FileNotFoundError), match=error):
        _gateway_launch.launch(["launch"], {"CREDENTIALS_DIRECTORY": str(tmp_path)}, started.append)
    with pytest.raises(_gateway_launch.LaunchError, match="no \\$CREDENTIALS_DIRECTORY"):
        _gateway_launch.launch(["launch"], {}, started.append)
    assert started == []


def test_the_units_entry_exits_1_with_the_cause_when_a_key_is_missing(tmp_path):
    done = subprocess.run([str(GATEWAY_PYTHON), "-m", GatewayProcess.MODULE, *_gateway_launch.command("127.0.0.1", free_port(), free_port())],
                          env=dict(os.environ, CREDENTIALS_DIRECTORY=str(tmp_path), PYTHONPATH=str(REPO / "collections")),
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and done.stderr.startswith("inferops gateway launcher: [Errno 2] No such file or directory")
    assert "control-key" in done.stderr and "smg" not in done.stdout


class Scripted:
    """A gateway's answers in turn, for the waits' logic on an injected clock."""

    def __init__(self, answers: list[Response]) -> None:
        self.answers, self.calls = list(answers), []

    def call(self, method, path, body=None, timeout=None, auth=True, text=False):
        self.calls.append((method, path))
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def listed(*workers) -> Response:
    return Response(200, {"workers": [dict(id=i, url=u, status=s, is_healthy=h) for i, u, s, h in workers]})


def test_ready_needs_the_worker_healthy_and_the_gateways_own_readiness():
    clock = Clock()
    url = "http://127.0.0.1:9"
    script = Scripted([listed(), listed(("w1", url, "pending", False)), listed(("w1", url, "ready", True)),
                       Response(503, {"status": "not ready"}, kind="http"), listed(("w1", url, "ready", True)),
                       Response(200, {"status": "ready"})])
    got = _gateway.Gateway(script, clock, clock.sleep).wait_ready(url, timeout=10, interval=0.5)
    assert got == {"worker": {"id": "w1", "url": url, "status": "ready", "healthy": True}, "seconds": 1.5}


def test_a_wait_that_times_out_says_what_the_gateway_last_said():
    clock = Clock()
    url = "http://127.0.0.1:9"
    gw = _gateway.Gateway(Scripted([listed(("w1", url, "draining", False))]), clock, clock.sleep)
    with pytest.raises(_gateway.GatewayError, match="within 2 s: listed as draining, not healthy"):
        gw.wait_ready(url, timeout=2, interval=0.5)
    assert clock.now == 2.0
    with pytest.raises(_gateway.GatewayError, match="still lists worker w1 after 3 s"):
        gw.wait_gone("w1", timeout=3)


@pytest.mark.parametrize("answer, error", [
    (Response(None, None, "connection refused", "refused"), "GET /workers failed: connection refused"),
    (Response(200, {"workers": [{"url": "x"}]}), "a worker without an id and a URL"),
    (Response(500, {"error": "boom"}, kind="http"), "GET /workers failed: HTTP 500: boom"),
])
def test_a_listing_that_is_not_one_fails_with_its_cause(answer, error):
    with pytest.raises(_gateway.GatewayError, match=error):
        _gateway.Gateway(Scripted([answer])).workers()


def test_the_pinned_gateway_is_the_one_tested():
    out = subprocess.run([str(GATEWAY_PYTHON), "-c", "import importlib.metadata as m; print(m.version('smg'))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == _gateway.PINNED, f"the test venv has smg {out}, the collection pins {_gateway.PINNED}"
    lock = REPO / "roles" / "sglang_runtime" / "files" / "constraints" / f"smg-{_gateway.PINNED}.txt"
    locked = [line for line in lock.read_text().splitlines() if line.startswith("smg==")]
    assert locked == [f"smg=={_gateway.PINNED}"]


def test_the_launcher_needs_nothing_but_the_standard_library_and_smg():
    """A gateway host gets the launcher's code (the closure of its imports of the collection, as
    _host_code installs it) besides the gateway's venv: nothing in it imports anything outside the
    standard library and the collection but smg itself."""
    imported = set()
    for name, text in _host_code.code("_gateway_launch").items():
        tree = ast.parse(text)
        imported |= {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    outside = {m for m in imported - {"ansible_collections", "smg"} if m not in sys.stdlib_module_names}
    assert outside == set() and "smg" in imported


def test_the_switchs_host_takes_a_server_out_and_puts_it_back_on_the_same_url_at_once(gateway, launch, tmp_path):
    """In place, the server's URL is removed and added again: the host does not wait for the removal
    (the gateway routes nothing new to a draining worker), and waits for it to be gone before it adds the
    same URL again (smg would answer 409 for the draining one, which never turns ready)."""
    from ansible_collections.inferops.sglang.plugins.module_utils import _switch

    gw, process = gateway()
    server = serving(launch)
    url = f"http://127.0.0.1:{server.port}"
    gw.add(url)
    gw.wait_ready(url, timeout=30)
    (tmp_path / "control-key").write_text(KEY + "\n")
    settings = {"url": process.url, "control_key_file": str(tmp_path / "control-key"), "timeout": 30}
    host = _switch.SystemHost("sglang-qwen.service")
    out = host.gateway_out(settings, url)
    assert out["removed"] is True and out["seconds"] < 2
    # smg queues the removal (a job): on a loaded machine the list says draining a moment after the DELETE
    deadline = time.monotonic() + 5
    while gw.find(url)["status"] != "draining" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gw.find(url)["status"] == "draining"
    assert through_gateway(process.port, 4)["status"] != 200  # nothing new reaches it
    back = host.gateway_in(settings, url, None)
    assert back["added"] is True and gw.find(url)["status"] == "ready"
    assert back["seconds"] < 5 and through_gateway(process.port, 4)["status"] == 200
    # the gateway's own counters, as the switch reads them: the request while it had no server failed, the one after it not
    counted = host.gateway_responses({"metrics_url": f"http://127.0.0.1:{process.metrics}/metrics"})
    assert counted == {"answered": 2, "failed": 1}
    assert host.gateway_out(settings, "http://127.0.0.1:1") == {"removed": False, "seconds": 0.0}


def test_the_watchdog_puts_a_serving_server_the_real_gateway_lost_back(gateway, launch, tmp_path):
    """A switch killed after it took the server out of the gateway (or a hand that removed it) leaves a server that
    serves and a gateway that does not route to it: the watchdog's next run (its probe passing: a stand-in here,
    the real gate is the watchdog's own tests') adds it back through the real worker API, and clients are served."""
    import io

    from ansible_collections.inferops.sglang.plugins.module_utils import _watchdog

    gw, process = gateway()
    server = serving(launch)
    url = f"http://127.0.0.1:{server.port}"
    (tmp_path / "control-key").write_text(KEY + "\n")
    settings = _watchdog.load_settings({"unit": "sglang-qwen.service", "url": url, "service_dir": str(tmp_path),
                                        "gateway": {"url": process.url, "control_key_file": str(tmp_path / "control-key"),
                                                    "timeout": 30}})

    class Serving:
        def __init__(self, client, watcher, **kw) -> None:
            watcher.start_mono = time.monotonic() - 5000

        def run(self) -> dict:
            return {"ready": True, "generation": {"completion_tokens": 8, "latency": 0.1}, "msg": "ready"}

    def systemctl(argv):
        return 0, "LoadState=loaded\nActiveState=active\nSubState=running\nInvocationID=i1\nMainPID=1\n", ""

    assert through_gateway(process.port, 4)["status"] != 200
    event = _watchdog.Watchdog(settings, run=systemctl, out=io.StringIO(), gate_class=Serving).run()
    assert event == "gateway_routed" and gw.find(url)["status"] == "ready"
    assert through_gateway(process.port, 4)["status"] == 200
    # routed now: the next run leaves it alone
    assert _watchdog.Watchdog(settings, run=systemctl, out=io.StringIO(), gate_class=Serving).run() == "ok"
