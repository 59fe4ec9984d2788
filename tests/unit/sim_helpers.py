"""Helpers shared by the unit tests: running a module's main() as Ansible does,
a handle on a simulator process and the field story's command lines
(lab/field_cases.yml holds the same cases for the lab)."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

import pytest
from ansible.module_utils import _internal as ansible_internal
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common import warnings as ansible_warnings
from ansible.module_utils.testing import patch_module_args

REPO = Path(__file__).resolve().parents[2]
LAB = REPO / "lab"
MODELS = LAB / "models"


def run_module(main: Callable[[], None], capsys, args: dict, check_mode: bool = False) -> tuple[int, dict, str]:
    """Run a module's main() with these arguments; (exit code, result, raw output)."""
    if check_mode:
        args = dict(args, _ansible_check_mode=True)
    # A real module run is its own process: no warning of an earlier run carries over,
    # and module.warn() reports in the result even when a test before this one
    # imported controller code (which turns warn() into a controller display call).
    ansible_warnings._global_warnings.clear()
    ansible_warnings._global_deprecations.clear()
    was_controller = ansible_internal.is_controller
    ansible_internal.is_controller = False
    try:
        with patch_module_args(args):
            with pytest.raises(SystemExit) as exc:
                main()
    finally:
        ansible_internal.is_controller = was_controller
    out = capsys.readouterr().out
    return exc.value.code, json.loads(out), out


class FakeClock:
    """An injected clock that only its sleep() moves, and at once: a gate's deadlines,
    budgets and waits pass without real time passing. It starts at the real clocks'
    readings, so times taken from them (systemd's monotonic timestamps, the journal's
    epoch ones) mean what they would."""

    def __init__(self) -> None:
        self.now = time.monotonic()
        self.epoch = time.time() - self.now
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.epoch + self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += max(0.0, seconds)


class RunCommand:
    """AnsibleModule.run_command's stand-in for a module run in-process: every command answers
    ``rc`` and ``out`` (by default ``systemctl show`` of an active, loaded unit); every argv is kept."""

    def __init__(self, rc: int = 0, out: str = "ActiveState=active\nLoadState=loaded\n") -> None:
        self.rc, self.out, self.argvs = rc, out, []

    def __call__(self, args, **_kwargs):
        self.argvs.append(list(args))
        return self.rc, self.out, ""

    def install(self, monkeypatch) -> RunCommand:
        monkeypatch.setattr(AnsibleModule, "run_command", lambda _module, args, **kw: self(args, **kw))
        return self


def write_executable(path: Path, text: str) -> Path:
    """Write a script (a test double) that the test then runs, mode 0755. A child process
    writes it: a file this process has open for writing is "Text file busy" (ETXTBSY) to
    exec for as long as any child forked meanwhile (another thread's, under pytest-xdist
    too) still holds the descriptor; a file this process never opened cannot be."""
    subprocess.run(["sh", "-c", 'cat > "$1" && chmod 0755 "$1"', "sh", str(path)], input=text, text=True, check=True)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path) -> None:
        self.proc, self.port, self.log = proc, port, log

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def request(self, method: str, path: str, body: dict | None = None, headers: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
                                     headers={"content-type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            return exc.code, json.loads(raw) if raw else None

    def wait_for(self, predicate, timeout: float = 20.0, what: str = "condition"):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"{what} not reached in {timeout} s; output:\n{self.output()}")

    def status(self, path: str, headers: dict | None = None):
        try:
            return self.request("GET", path, headers=headers)[0]
        except (urllib.error.URLError, ConnectionError):
            return None


MODEL = ["--model-path", str(MODELS / "Qwen3.6-27B"), "--tp-size", "2", "--served-model-name", "Qwen3.6-27B"]
DDTREE = ["--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", str(MODELS / "Qwen3.6-27B-DFlash")]
# --disable-radix-cache: 0.5.10-0.5.13 refuse speculative decoding on the hybrid model with radix cache on
NEXTN = ["--speculative-algorithm", "NEXTN", "--context-length", "131072", "--max-running-requests", "16",
         "--mem-fraction-static", "0.88", "--disable-radix-cache"]
SHADOW_SMALL = [*DDTREE, "--context-length", "32768", "--max-running-requests", "4"]
# The field story's variants on ct129's stand-in (TP 2 on GPUs 0,2)
SHADOW = [*DDTREE, "--context-length", "131072", "--max-running-requests", "16", "--mem-fraction-static", "0.88"]
SMALL = [*SHADOW_SMALL, "--mem-fraction-static", "0.95"]
NOGRAPH = [*SMALL, "--disable-cuda-graph"]
BALANCED = [*SHADOW_SMALL, "--mem-fraction-static", "0.85", "--disable-cuda-graph"]


def run_local_play(tmp_path: Path, play: list) -> tuple[int, str]:
    """ansible-playbook of ``play`` on localhost (local connection, this interpreter, the collection
    from the tree): its exit status and its output, stdout then stderr."""
    import yaml  # pylint: disable=import-outside-toplevel

    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    (tmp_path / "ansible.cfg").write_text("[defaults]\nretry_files_enabled = False\n")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_NOCOLOR="1", ANSIBLE_CONFIG=str(tmp_path / "ansible.cfg"), ANSIBLE_LOCALHOST_WARNING="0")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c",
                           "local", "play.yml"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    return proc.returncode, proc.stdout + proc.stderr


class GatewayProcess:
    """The real gateway (smg, from ``python``'s venv) as its unit runs it: ``_gateway_launch`` with
    ``command``'s arguments and its keys in a credentials directory under ``directory``."""

    MODULE = "ansible_collections.inferops.sglang.plugins.module_utils._gateway_launch"

    def __init__(self, python: Path, directory: Path, control_key: str, api_key: str | None = None,
                 extra: tuple[str, ...] = (), workers: list[str] | None = None) -> None:
        from ansible_collections.inferops.sglang.plugins.module_utils import _gateway, _gateway_launch

        assert python.exists(), f"no gateway venv at {python}: make units and make conformance build it"
        credentials = directory / "credentials"
        credentials.mkdir(parents=True)
        (credentials / "control-key").write_text(control_key + "\n")
        if api_key:
            (credentials / "api-key").write_text(api_key + "\n")
        if workers is not None:
            (credentials / "workers").write_text(json.dumps({"workers": workers}))
        self.port, self.metrics = free_port(), free_port()
        self.log = directory / "gateway.log"
        env = dict(os.environ, CREDENTIALS_DIRECTORY=str(credentials), PYTHONPATH=str(REPO / "collections"))
        self.proc = subprocess.Popen([str(python), "-m", self.MODULE, *_gateway_launch.command("127.0.0.1", self.port, self.metrics), *extra],
                                     env=env, stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while _gateway.Gateway(self.client(control_key)).readiness().kind != "http":
            assert self.proc.poll() is None and time.monotonic() < deadline, self.output()
            time.sleep(0.05)

    def client(self, key: str | None):
        from ansible_collections.inferops.sglang.plugins.module_utils._http import Client

        return Client(self.url, key, True, 30)

    def output(self) -> str:
        return re.sub(r"\x1b\[[0-9;]*m", "", self.log.read_text(encoding="utf-8", errors="replace"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def through_gateway(port: int, tokens: int, stream: bool = False, key: str | None = None) -> dict:
    """One /generate through a gateway on ``port``: its status and, streamed, the tokens that arrived
    (``ignore_eos``: a real model generates exactly ``tokens``)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    body = {"text": "Once upon a time", "stream": stream, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}
    try:
        conn.request("POST", "/generate", json.dumps(body), headers)
        resp = conn.getresponse()
        if not stream:
            resp.read()
            return {"status": resp.status}
        last = None
        for line in resp:
            if line.startswith(b"data:") and b"[DONE]" not in line:
                last = json.loads(line[5:])
        return {"status": resp.status, "tokens": last["meta_info"]["completion_tokens"] if last else 0}
    except (OSError, http.client.HTTPException) as exc:
        return {"status": None, "error": repr(exc)}
    finally:
        conn.close()


class GatewayTraffic:
    """Clients of a gateway while a switch runs behind it: one long stream, started first, and short
    requests one after another until ``stop``. ``answers``: each short request's status; ``stream``:
    the stream's status and tokens; ``stream_ended``: when it ended (time.monotonic)."""

    def __init__(self, port: int, stream_tokens: int, key: str | None = None) -> None:
        self.port, self.key, self.answers, self.stream, self.stream_ended = port, key, [], {}, None
        self._stop = threading.Event()
        self._streaming = threading.Thread(target=self._stream, args=(stream_tokens,))
        self._short = threading.Thread(target=self._requests)
        self._streaming.start()
        self._short.start()

    def _stream(self, tokens: int) -> None:
        self.stream.update(through_gateway(self.port, tokens, True, self.key))
        self.stream_ended = time.monotonic()

    def _requests(self) -> None:
        while not self._stop.is_set():
            self.answers.append(through_gateway(self.port, 2, False, self.key)["status"])

    def stop(self, more: int = 5, timeout: float = 120) -> None:
        """Wait for the stream's end and ``more`` short answers after this call, then stop."""
        deadline = time.monotonic() + timeout
        self._streaming.join(timeout=timeout)
        after = len(self.answers)
        while len(self.answers) < after + more and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop.set()
        self._short.join(timeout=timeout)


class FakeSystemctl:
    """systemctl as run_command runs it: a timer's enabled and active states, every call kept."""

    def __init__(self, enabled: bool = False, active: bool = False, fail: str | None = None) -> None:
        self.enabled, self.active, self.fail = enabled, active, fail
        self.calls: list[str] = []

    def __call__(self, argv, **_kwargs):
        assert argv[0] == "systemctl", argv
        self.calls.append(" ".join(argv[1:]))
        verb = argv[1]
        if verb == self.fail:
            return 1, "", f"Failed to {verb} unit: Access denied\n"
        if verb == "is-enabled":
            return (0 if self.enabled else 1), "", ""
        if verb == "is-active":
            return (0 if self.active else 3), "", ""
        if verb == "enable":
            self.enabled = True
        elif verb in ("start", "restart"):
            self.active = True
        elif verb == "disable":
            self.enabled = False
            self.active = self.active and "--now" not in argv
        return 0, "", ""

    def changing(self) -> list[str]:
        """The calls that change something (every one but the is-enabled and is-active queries)."""
        return [call for call in self.calls if not call.startswith("is-")]


class FakeClocks:
    """A fake host's clocks: monotonic ``mono`` and epoch ``wall``, moved only by ``sleep`` (never backwards)."""

    mono: float
    wall: float

    def clock(self) -> float:
        return self.mono

    def time(self) -> float:
        return self.wall

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.mono += seconds
        self.wall += seconds
