"""The server's own lines, as the watchers read them (its log file, the unit's journal), reach the
gate's evidence, the records and the terminal: without terminal control (_mask.printable)."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _process_watch
from ansible_collections.inferops.sglang.plugins.module_utils._process_watch import PidWatcher, UnitWatcher


def test_a_log_files_lines_come_without_terminal_control(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(b"[t] Load weight end.\n\x1b]0;pwned\x07[t] \x1b[31mRuntimeError\x1b[0m: boom\xc2\x9b\xff\npartial")
    watcher = PidWatcher(os.getpid(), str(log))
    assert watcher.new_lines() == ["[t] Load weight end.", "[t] RuntimeError: boom?\ufffd"]


def test_the_journals_lines_come_without_terminal_control():
    entries = [{"__CURSOR": "c1", "MESSAGE": "ok line"},
               {"__CURSOR": "c2", "MESSAGE": list(b"\x1b[2Jbytes \xff\x07")},  # journald's non-UTF-8 form
               {"__CURSOR": "c3", "MESSAGE": "two\r\nlines\x1b]8;;x\x1b\\"}]

    def run_command(argv):
        return 0, "\n".join(json.dumps(e) for e in entries) + "\n", ""

    watcher = UnitWatcher("sglang-qwen.service", run_command)
    lines, cursor = watcher._journal([f"_SYSTEMD_UNIT={watcher.unit}"], None)  # pylint: disable=protected-access
    assert (lines, cursor) == (["ok line", "bytes \ufffd?", "two", "lines"], "c3")


@pytest.mark.parametrize("rc,out,state", [
    (0, "ActiveState=active\nLoadState=loaded\n", {"active": True, "loaded": True}),
    (0, "ActiveState=failed\nLoadState=loaded\n", {"active": False, "loaded": True}),
    (0, "ActiveState=inactive\nLoadState=not-found\n", {"active": False, "loaded": False}),
    (1, "ActiveState=active\n", {"active": False, "loaded": False}),
])
def test_unit_state_reads_systemctl_show(rc, out, state):
    calls = []

    def run_command(argv):
        calls.append(argv)
        return rc, out, ""
    assert _process_watch.unit_state(run_command, "sglang-green.service") == state
    assert calls == [["systemctl", "show", "-p", "ActiveState,LoadState", "--", "sglang-green.service"]]
