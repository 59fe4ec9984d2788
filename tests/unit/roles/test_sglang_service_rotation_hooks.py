"""The rotation hooks (plugin_utils/_rotation.py's run_hook, which sglang_switch's action plugin
runs around the switch's job), run by one real ansible-playbook -vvv run through a probe action
plugin that calls run_hook for its task: a command hook (an argv, no shell) or an HTTP call, on
the controller (the default, in the action's process) or on the host (the task's connection runs
ansible.legacy.command or ansible.legacy.uri there). It never fails itself: its result is
{ok, msg}. When the hooks run, and what follows a failed one, is the action's
(tests/unit/plugins/action/test_action_sglang_switch.py).

The play's host, ``target``, is the local machine too, but under an interpreter of
its own: a wrapper that sets HOOK_SIDE=host, so a hook run on the host and one run
on the controller can be told apart. The HTTP hooks call a local http.server (a
thread, answering at once) that records every request it gets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from sim_helpers import REPO, free_port, write_executable

PROBE = """from ansible.plugins.action import ActionBase
from ansible_collections.inferops.sglang.plugins.plugin_utils import _rotation


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        result.update(changed=False, hook_result=_rotation.run_hook(self, task_vars, self._task.args["hook"]))
        return result
"""
TOKEN = "rotation-secret-4b9e1c7d2a"
HEADERS = {"Authorization": f"Bearer {TOKEN}", "X-Rotation-Pool": "gpu-a"}
BODY = {"host": "target", "weight": 0, "drain": True, "tags": ["a", "b"], "note": "naïve ✓"}
PY = sys.executable
LONG_STDERR = "head-" + "x" * 400 + " the last words"
ODD_ARGV = ["a; exit 0", "`id`", "*", "| cat", "$(id)", "'quoted'", "pa$HOME", "~/x"]


class Recorder(BaseHTTPRequestHandler):
    """/ok/* 200, /accepted/* 202, /fail/* 500, /redirect/<x> 302 to /redirected/<x>."""

    requests: list[dict] = []

    def log_message(self, *args) -> None:  # quiet
        pass

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        self.requests.append({"method": self.command, "path": self.path,
                              "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
        kind = self.path.split("/")[1]
        status = {"ok": 200, "accepted": 202, "fail": 500, "redirect": 302, "redirected": 200}.get(kind, 404)
        payload = b"boom: the balancer is down" if status == 500 else b"{}"
        self.send_response(status)
        if status == 302:
            self.send_header("Location", self.path.replace("/redirect/", "/redirected/", 1))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle


def cases(base: str, unreachable: str) -> dict[str, dict]:
    """Case name -> hook; each case runs as the out hook with a fresh _sglang_service_rotation."""
    def side(where: str | None) -> dict:
        hook = {"command": [PY, "-c", "import os, sys; sys.stderr.write('side=' + os.environ.get('HOOK_SIDE', "
                                      "'controller')); sys.exit(4)"]}
        return hook if where is None else dict(hook, where=where)

    def url(path: str, **more) -> dict:
        return {"url": f"{base}/{path}", "headers": HEADERS, "timeout": 10, **more}

    return {
        "cmd_ok": {"command": [PY, "-c", "print('to stdout'); import sys; sys.stderr.write('  ')"]},
        "cmd_fail": {"command": [PY, "-c", f"import sys; sys.stderr.write({LONG_STDERR!r} + '\\n'); sys.exit(3)"]},
        # a hook that prints its credentials: the record keeps the exit code and the message, masked
        "cmd_fail_secret": {"command": [PY, "-c", "import sys; sys.stderr.write('401 for Authorization: Bearer %s, "
                                                  "token=%s'); sys.exit(22)" % (TOKEN, TOKEN[::-1])]},
        "cmd_fail_quiet": {"command": [PY, "-c", "import sys; print('only stdout'); sys.exit(3)"]},
        "cmd_argv_literal": {"command": [PY, "-c", "import sys; sys.stderr.write(repr(sys.argv[1:])); sys.exit(7)",
                                         *ODD_ARGV]},
        "cmd_missing": {"command": ["/nonexistent/rotation-hook", "out"]},
        "side_default": side(None),
        "side_controller": side("controller"),
        "side_host": side("host"),
        "http_post": url("ok/http_post"),
        "http_post_controller": url("ok/http_post_controller", where="controller"),
        "http_post_host": url("ok/http_post_host", where="host"),
        "http_put": url("ok/http_put", method="PUT"),
        "http_delete": url("ok/http_delete", method="DELETE"),
        "http_json": url("ok/http_json", body=BODY),
        "http_202_list": url("accepted/http_202_list", status_code=[200, 202]),
        "http_202_list_str": url("accepted/http_202_list_str", status_code=["202"]),
        "http_202_default": url("accepted/http_202_default"),
        "http_500": url("fail/http_500"),
        "http_500_list": url("fail/http_500_list", status_code=[200, 204]),
        "http_redirect": url("redirect/http_redirect"),
        "http_redirect_accepted": url("redirect/http_redirect_accepted", status_code=302),
        "http_unreachable": {"url": unreachable, "headers": HEADERS, "timeout": 5},
        "http_unreachable_host": {"url": unreachable, "headers": HEADERS, "timeout": 5, "where": "host"},
    }


def probe(case: str, hook: dict) -> list[dict]:
    """The hook run by the probe action (as sglang_switch's action runs it), its result kept."""
    return [{"name": f"Rotation hook {case}", "rotation_probe": {"hook": hook}, "register": "__probe"},
            {"name": f"Keep {case}", "ansible.builtin.set_fact": {
                "__cases": "{{ __cases | default({}) | combine({%r: __probe.hook_result}) }}" % case}}]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One ansible-playbook -vvv run of every case: (results by case, requests by path, output)."""
    tmp = tmp_path_factory.mktemp("rotation")
    Recorder.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        unreachable = f"http://127.0.0.1:{free_port()}/unreachable"
        tasks = [task for case, hook in cases(base, unreachable).items() for task in probe(case, hook)]
        tasks.append({"name": "Write the results", "ansible.builtin.copy": {
            "content": "{{ __cases | to_json }}", "dest": str(tmp / "results.json"), "mode": "0644"}})
        (tmp / "action_plugins").mkdir()
        (tmp / "action_plugins" / "rotation_probe.py").write_text(PROBE)
        wrapper = tmp / "host-python"
        write_executable(wrapper, f'#!/bin/sh\nHOOK_SIDE=host exec "{PY}" "$@"\n')
        (tmp / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {"target": {
            "ansible_connection": "local", "ansible_python_interpreter": str(wrapper)}}}}))
        (tmp / "play.yml").write_text(yaml.safe_dump([{"hosts": "target", "gather_facts": False, "tasks": tasks}],
                                                     allow_unicode=True))
        (tmp / "ansible.cfg").write_text("[defaults]\nretry_files_enabled = False\naction_plugins = action_plugins\n"
                                         "[connection]\npipelining = True\n")
        env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy")
               and k != "HOOK_SIDE"}
        env.update(ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_CONFIG=str(tmp / "ansible.cfg"),
                   ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="0", no_proxy="127.0.0.1,localhost",
                   NO_PROXY="127.0.0.1,localhost")
        proc = subprocess.run([os.path.join(os.path.dirname(PY), "ansible-playbook"), "-vvv", "-i", "inventory.yml",
                               "play.yml"], cwd=tmp, env=env, capture_output=True, text=True, timeout=300, check=False)
    finally:
        server.shutdown()
        server.server_close()
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    by_case = json.loads((tmp / "results.json").read_text())
    by_path: dict[str, list[dict]] = {}
    for request in Recorder.requests:
        by_path.setdefault(request["path"], []).append(request)
    return by_case, by_path, output


def test_every_case_ran_once_and_gave_ok_and_msg(run):
    by_case, dummy, output = run
    assert set(by_case) == set(cases("http://x", "http://y"))
    for case, result in by_case.items():
        assert set(result) == {"ok", "msg"} and isinstance(result["ok"], bool), case
    # The hook never fails the play: failures are results, not failed tasks.
    assert "failed=0" in output and "unreachable=0" in output


def test_command_exit_0_is_ok(run):
    # stdout and a blank stderr stay out of msg
    assert run[0]["cmd_ok"] == {"ok": True, "msg": "command exit 0"}


def test_command_failure_reports_exit_code_and_stderr_tail(run):
    by_case = run[0]
    assert by_case["cmd_fail"] == {"ok": False, "msg": "command exit 3: " + LONG_STDERR[-300:]}
    assert "head-" not in by_case["cmd_fail"]["msg"]  # the tail only
    assert by_case["cmd_fail_quiet"] == {"ok": False, "msg": "command exit 3"}


def test_command_failure_masks_the_secrets_it_prints(run):
    results, _requests, out = run
    msg = results["cmd_fail_secret"]["msg"]
    # (a bearer token runs to the next space: the comma after it is masked with it)
    assert msg == "command exit 22: 401 for Authorization: Bearer ******** token=********", msg
    assert TOKEN not in out and TOKEN[::-1] not in out


def test_command_is_an_argv_without_a_shell(run):
    assert run[0]["cmd_argv_literal"] == {"ok": False, "msg": f"command exit 7: {ODD_ARGV!r}"}


def test_missing_command_is_a_result_not_a_failure(run):
    result = run[0]["cmd_missing"]
    assert result["ok"] is False
    assert result["msg"].startswith("command exit ") and result["msg"] != "command exit 0"


def test_command_runs_on_the_controller_by_default_and_on_the_host_with_where_host(run):
    by_case = run[0]
    assert by_case["side_default"] == {"ok": False, "msg": "command exit 4: side=controller"}
    assert by_case["side_controller"] == by_case["side_default"]
    assert by_case["side_host"] == {"ok": False, "msg": "command exit 4: side=host"}


def test_http_hook_posts_by_default_with_its_headers(run):
    by_case, by_path, dummy = run
    assert by_case["http_post"] == {"ok": True, "msg": "HTTP 200"}
    [request] = by_path["/ok/http_post"]
    assert request["method"] == "POST"
    assert request["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert request["headers"]["x-rotation-pool"] == "gpu-a"
    assert request["body"] == b""


def test_http_hook_where_controller_and_where_host_give_the_same_result(run):
    by_case, by_path, dummy = run
    for case in ("http_post_controller", "http_post_host"):
        assert by_case[case] == by_case["http_post"], case
        [request] = by_path[f"/ok/{case}"]
        assert request["method"] == "POST" and request["headers"]["authorization"] == f"Bearer {TOKEN}"
    assert by_case["http_unreachable_host"] == by_case["http_unreachable"]


def test_http_hook_uses_the_given_method(run):
    by_case, by_path, dummy = run
    for case, method in (("http_put", "PUT"), ("http_delete", "DELETE")):
        assert by_case[case] == {"ok": True, "msg": "HTTP 200"}
        assert [r["method"] for r in by_path[f"/ok/{case}"]] == [method]


def test_http_hook_sends_its_body_as_json(run):
    by_case, by_path, dummy = run
    assert by_case["http_json"] == {"ok": True, "msg": "HTTP 200"}
    [request] = by_path["/ok/http_json"]
    assert request["method"] == "POST"
    assert request["headers"]["content-type"].startswith("application/json")
    assert json.loads(request["body"]) == BODY
    assert request["headers"]["authorization"] == f"Bearer {TOKEN}"


def test_http_status_code_list_accepts_202_and_the_default_is_200_only(run):
    by_case, by_path, dummy = run
    assert by_case["http_202_list"] == {"ok": True, "msg": "HTTP 202"}
    assert by_case["http_202_list_str"] == {"ok": True, "msg": "HTTP 202"}
    result = by_case["http_202_default"]
    assert result["ok"] is False and result["msg"].startswith("HTTP 202 (expected 200): ")
    assert len(by_path["/accepted/http_202_default"]) == 1


def test_http_wrong_status_is_not_ok_with_the_expected_codes_and_a_short_reason(run):
    by_case, by_path, dummy = run
    result = by_case["http_500"]
    assert result["ok"] is False
    prefix = "HTTP 500 (expected 200): "
    assert result["msg"].startswith(prefix) and "500" in result["msg"][len(prefix):]
    assert len(result["msg"]) <= len(prefix) + 200
    assert by_case["http_500_list"]["msg"].startswith("HTTP 500 (expected 200, 204): ")
    assert "204" in by_case["http_500_list"]["msg"][len("HTTP 500 (expected 200, 204): "):]  # uri got the list
    assert by_case["http_500_list"]["ok"] is False
    assert len(by_path["/fail/http_500"]) == 1  # no retry


def test_http_redirect_is_not_followed(run):
    by_case, by_path, dummy = run
    result = by_case["http_redirect"]
    assert result["ok"] is False and result["msg"].startswith("HTTP 302 (expected 200): ")
    assert by_case["http_redirect_accepted"] == {"ok": True, "msg": "HTTP 302"}
    assert len(by_path["/redirect/http_redirect"]) == 1
    assert len(by_path["/redirect/http_redirect_accepted"]) == 1
    assert not [path for path in by_path if path.startswith("/redirected/")]


def test_http_unreachable_url_is_status_minus_1(run):
    result = run[0]["http_unreachable"]
    assert result["ok"] is False
    assert result["msg"].startswith("HTTP -1 (expected 200): ")


def test_headers_never_reach_the_output_even_with_vvv(run):
    """-vvv prints every result: neither the controller's client nor the host's module (run
    with no_log, its arguments hidden from the host's log too) gives the headers back."""
    dummy, by_path, output = run
    assert sum(r["headers"].get("authorization") == f"Bearer {TOKEN}" for rs in by_path.values() for r in rs) >= 10
    assert "Rotation hook http_post_host" in output  # the tasks ran and were shown, not hidden
    assert TOKEN not in output
