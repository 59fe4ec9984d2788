"""_deploy_lock: the lock file's format, atomic acquire, contention, renew and
release of this run's lock only, staleness (lease, dead controller process)
and the takeover race, against real files in a temporary directory."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_lock as lock

ALICE = dict(service="sglang-qwen.service", variant="shadow-balanced", controller_user="alice",
             controller_host="ctl-1", controller_pid=4242, awx_job_id="42")
BOB = dict(ALICE, variant="nextn", controller_user="bob", controller_host="ctl-2", controller_pid=77, awx_job_id=None)
A, B, C = "a" * 32, "b" * 32, "c" * 32


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "deploy.lock")


def on_disk(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def write(path: str, record: dict) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(record, handle)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def leftovers(path: str) -> list[str]:
    return sorted(name for name in os.listdir(os.path.dirname(path)) if name.endswith(".tmp"))


def test_acquire_writes_the_holder_record_0600_atomically(path):
    outcome = lock.acquire(path, A, ALICE, lease=900, now=lambda: 1796119200.7)
    assert outcome["acquired"] and outcome["changed"] and not outcome["taken_over"] and outcome["previous"] is None
    record = on_disk(path)
    assert list(record) == list(lock.LOCK_FIELDS)
    assert record == dict(ALICE, run_id=A, started="2026-12-01T10:00:00Z", renewed="2026-12-01T10:00:00Z",
                          expires=1796119200 + 900, lease_s=900)
    assert outcome["holder"] == record
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.stat(path).st_nlink == 1 and leftovers(path) == []


def test_a_lock_that_cannot_be_written_is_an_error_and_leaves_nothing(path, monkeypatch):
    """The record goes through _state_files.write_temp: a failed write is the lock's error, and
    neither the temporary file nor a lock is left."""
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(lock.LockError, match="cannot write the deploy lock .*No space left"):
        lock.acquire(path, A, ALICE)
    assert not os.path.exists(path) and leftovers(path) == []


def test_a_link_planted_beside_the_lock_is_never_written_through(path, tmp_path):
    """The temporary record is created exclusively (O_EXCL) under an unpredictable name: links
    another user put in the directory stay as they were, and the lock is a file of its own."""
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    planted = [f"{path}.{os.getpid()}.tmp", f"{path}.tmp", f"{os.path.dirname(path)}/.deploy.lock.tmp"]
    for name in planted:
        os.symlink(victim, name)
    assert lock.acquire(path, A, ALICE, lease=60, now=lambda: 1000.0)["acquired"]  # created (link)
    renewed = lock.renew(path, A, lease=60, now=lambda: 1030.0)  # replaced (rename)
    assert not renewed["lost"] and renewed["changed"] and on_disk(path)["expires"] == 1090
    assert victim.read_text() == "root's file\n" and all(os.path.islink(name) for name in planted)
    assert not os.path.islink(path) and on_disk(path)["run_id"] == A and os.stat(path).st_nlink == 1
    assert leftovers(path) == sorted(os.path.basename(name) for name in planted)


def test_a_second_run_is_refused_and_told_the_holder_nothing_changes(path):
    lock.acquire(path, A, ALICE)
    before = open(path, "rb").read()
    outcome = lock.acquire(path, B, BOB)
    assert not outcome["acquired"] and not outcome["changed"]
    assert outcome["holder"]["run_id"] == A and outcome["holder"]["controller_user"] == "alice"
    assert open(path, "rb").read() == before and leftovers(path) == []


def test_the_same_run_acquires_again_keeps_started_and_extends_the_lease(path):
    lock.acquire(path, A, ALICE, lease=60, now=lambda: 1000.0)
    outcome = lock.acquire(path, A, ALICE, lease=60, now=lambda: 1500.0)
    assert outcome["acquired"] and not outcome["taken_over"]
    assert on_disk(path)["started"] == lock.utc_iso(1000) and on_disk(path)["expires"] == 1560


def test_creation_is_atomic_when_runs_race_for_a_free_lock(path, monkeypatch):
    """Every run reads 'no lock' before any creates it; os.link lets exactly one create it."""
    runs = 6
    barrier = threading.Barrier(runs)
    real_read = lock.read
    first = threading.local()

    def read(p):
        record = real_read(p)
        if not getattr(first, "done", False):
            first.done = True
            barrier.wait(timeout=10)
        return record

    monkeypatch.setattr(lock, "read", read)
    results = {}

    def take(run_id):
        results[run_id] = lock.acquire(path, run_id, dict(ALICE, controller_user=run_id))

    threads = [threading.Thread(target=take, args=(f"{i:032x}",)) for i in range(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    winners = [run_id for run_id, outcome in results.items() if outcome["acquired"]]
    assert len(results) == runs and len(winners) == 1
    assert on_disk(path)["run_id"] == winners[0]
    assert all(outcome["holder"]["run_id"] == winners[0] for outcome in results.values())
    assert leftovers(path) == []


def test_renew_extends_only_this_runs_lease(path):
    lock.acquire(path, A, ALICE, lease=60, now=lambda: 1000.0)
    outcome = lock.renew(path, A, lease=600, now=lambda: 1100.0)
    assert not outcome["lost"] and outcome["changed"]
    record = on_disk(path)
    assert record["expires"] == 1700 and record["lease_s"] == 600 and record["renewed"] == lock.utc_iso(1100)
    assert record["started"] == lock.utc_iso(1000) and record["controller_user"] == "alice"
    before = open(path, "rb").read()
    other = lock.renew(path, B, lease=600, now=lambda: 1200.0)
    assert other["lost"] and not other["changed"] and other["holder"]["run_id"] == A
    assert open(path, "rb").read() == before


def test_renew_of_a_removed_lock_is_lost(path):
    outcome = lock.renew(path, A)
    assert outcome == dict(lost=True, changed=False, holder=None)
    assert not os.path.exists(path)


def test_release_removes_only_this_runs_lock(path):
    lock.acquire(path, A, ALICE)
    before = open(path, "rb").read()
    other = lock.release(path, B)
    assert other["lost"] and not other["changed"] and other["holder"]["run_id"] == A
    assert open(path, "rb").read() == before
    mine = lock.release(path, A)
    assert not mine["lost"] and mine["changed"] and not os.path.exists(path)
    assert lock.release(path, A)["lost"]


def test_lease_expiry_makes_the_lock_stale_and_it_is_taken_over(path):
    lock.acquire(path, A, ALICE, lease=60, now=lambda: 1000.0)
    assert not lock.acquire(path, B, BOB, now=lambda: 1059.0)["acquired"]
    outcome = lock.acquire(path, B, BOB, lease=300, now=lambda: 1060.0)
    assert outcome["acquired"] and outcome["taken_over"] and outcome["changed"]
    assert outcome["previous"]["run_id"] == A and outcome["previous"]["controller_user"] == "alice"
    assert outcome["stale"] == "its lease ran out at " + lock.utc_iso(1060)
    assert on_disk(path)["run_id"] == B and on_disk(path)["expires"] == 1360 and leftovers(path) == []


def test_a_dead_controller_process_on_this_controller_makes_it_stale():
    now = time.time()
    record = dict(ALICE, run_id=A, controller_host="ctl-1", controller_pid=dead_pid(), expires=int(now) + 600)
    assert lock.stale_reason(record, now, "ctl-1", lock.pid_alive) == (
        f"its ansible-playbook process (pid {record['controller_pid']} on ctl-1) is gone")
    # Not without the controller's view, not from another controller, not while the process lives.
    assert lock.stale_reason(record, now) is None
    assert lock.stale_reason(record, now, "ctl-9", lock.pid_alive) is None
    assert lock.stale_reason(dict(record, controller_pid=os.getpid()), now, "ctl-1", lock.pid_alive) is None


def test_a_process_that_may_not_be_signalled_is_alive(monkeypatch):
    def kill(pid, sig):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(lock.os, "kill", kill)
    assert lock.pid_alive(1) is True

    def gone(pid, sig):
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(lock.os, "kill", gone)
    assert lock.pid_alive(1) is False
    # A pid that is not one cannot be judged dead.
    assert lock.pid_alive(None) is True and lock.pid_alive(0) is True and lock.pid_alive(True) is True


def test_take_over_run_id_takes_over_only_that_run(path):
    lock.acquire(path, A, ALICE)
    refused = lock.acquire(path, B, BOB, take_over_run_id=C)
    assert not refused["acquired"] and on_disk(path)["run_id"] == A
    outcome = lock.acquire(path, B, BOB, take_over_run_id=A)
    assert outcome["acquired"] and outcome["taken_over"] and outcome["previous"]["run_id"] == A
    assert outcome["stale"] == "take_over_run_id named it" and on_disk(path)["run_id"] == B


def test_a_takeover_rechecks_the_holder_so_the_second_of_two_loses(path):
    """Two takers decided on the same stale holder; the later one finds another run there."""
    write(path, dict(ALICE, run_id=A, started="x", renewed="x", expires=0, lease_s=1))
    stale = lock.read(path)
    first, found = lock.replace(path, lock.make_record(B, BOB, 60, time.time()), stale["run_id"])
    assert first and found["run_id"] == A
    second, found = lock.replace(path, lock.make_record(C, BOB, 60, time.time()), stale["run_id"])
    assert not second and found["run_id"] == B
    assert on_disk(path)["run_id"] == B


def test_concurrent_takeovers_of_one_stale_lock_exactly_one_wins(path, monkeypatch):
    """Both read the stale lock before either acts, and each is slow between its re-read and its
    rename: without the guard both would re-read the stale holder and both would rename."""
    write(path, dict(ALICE, run_id=A, started="x", renewed="x", expires=0, lease_s=1))
    barrier = threading.Barrier(2)
    real_read, real_write = lock.read, lock._write_temp
    first = threading.local()

    def read(p):
        record = real_read(p)
        if not getattr(first, "done", False):
            first.done = True
            barrier.wait(timeout=10)
        return record

    def slow_write(p, record):
        time.sleep(0.3)
        return real_write(p, record)

    monkeypatch.setattr(lock, "read", read)
    monkeypatch.setattr(lock, "_write_temp", slow_write)
    results = {}

    def take(run_id):
        results[run_id] = lock.acquire(path, run_id, dict(BOB, controller_user=run_id))

    threads = [threading.Thread(target=take, args=(run_id,)) for run_id in (B, C)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    winners = [run_id for run_id, outcome in results.items() if outcome["taken_over"]]
    assert len(winners) == 1
    loser = ({B, C} - set(winners)).pop()
    assert not results[loser]["acquired"] and results[loser]["holder"]["run_id"] == winners[0]
    assert results[winners[0]]["previous"]["run_id"] == A
    assert on_disk(path)["run_id"] == winners[0] and leftovers(path) == []


def test_a_late_release_by_the_stale_holder_leaves_its_successor_alone(path):
    lock.acquire(path, A, ALICE, lease=60, now=lambda: 1000.0)
    assert lock.acquire(path, B, BOB, now=lambda: 2000.0)["taken_over"]
    assert lock.release(path, A)["lost"] and lock.renew(path, A)["lost"]
    assert on_disk(path)["run_id"] == B


def test_a_release_racing_a_takeover_never_removes_the_successors_lock(path, monkeypatch):
    """The holder's release has read its own lock when another run takes it over (its lease ran out):
    the release must find that out under the guard and leave the new lock."""
    lock.acquire(path, A, ALICE, lease=60, now=lambda: 1000.0)
    real_read = lock.read
    state = {"raced": False}

    def read(p):
        record = real_read(p)
        if not state["raced"]:
            state["raced"] = True
            assert lock.acquire(p, B, BOB, now=lambda: 2000.0)["taken_over"]
        return record

    monkeypatch.setattr(lock, "read", read)
    outcome = lock.release(path, A)
    assert outcome["lost"] and not outcome["changed"] and outcome["holder"]["run_id"] == B
    assert on_disk(path)["run_id"] == B


def test_a_file_that_is_not_a_lock_is_reported_and_kept(path):
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("held by me\n")
    with pytest.raises(lock.LockError, match="is not a deploy lock"):
        lock.acquire(path, A, ALICE)
    write(path, {"owner": "me"})
    with pytest.raises(lock.LockError, match="no run_id or expires"):
        lock.release(path, A)
    assert on_disk(path) == {"owner": "me"}


def test_check_mode_writes_nothing(tmp_path):
    path = str(tmp_path / "deploy.lock")
    assert lock.acquire(path, A, ALICE, check_mode=True)["acquired"]
    assert os.listdir(tmp_path) == []
    lock.acquire(path, A, ALICE, lease=60, now=lambda: 1000.0)
    before = open(path, "rb").read()
    held = lock.acquire(path, B, BOB, check_mode=True, now=lambda: 1001.0)
    assert not held["acquired"] and held["holder"]["run_id"] == A
    stale = lock.acquire(path, B, BOB, check_mode=True, now=lambda: 5000.0)
    assert stale["acquired"] and stale["taken_over"] and stale["previous"]["run_id"] == A
    assert lock.renew(path, A, check_mode=True, now=lambda: 1001.0)["changed"]
    assert lock.release(path, A, check_mode=True)["changed"]
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["deploy.lock"]


def test_ensure_dir_creates_a_0700_directory(tmp_path):
    path = str(tmp_path / "state" / "sglang-qwen" / "deploy.lock")
    assert lock.ensure_dir(path) is True
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert lock.ensure_dir(path) is False


def test_the_contention_message_names_the_holder():
    record = dict(ALICE, run_id=A, started="2026-12-01T10:00:00Z", expires=1796121000)
    message = lock.contention_message(record, "ct200", 600.4, "/var/lib/inferops-sglang/sglang-qwen/deploy.lock")
    assert message.startswith(
        "sglang-qwen.service on ct200 is being deployed by alice@ctl-1 (AWX job 42), variant shadow-balanced, "
        "since 2026-12-01T10:00:00Z; waited 600 s (sglang_service_lock_timeout). "
        f"The lock is /var/lib/inferops-sglang/sglang-qwen/deploy.lock (run {A}, lease until 2026-12-01T10:30:00Z)")
    assert f"take_over_run_id={A}" in message
    assert lock.describe(dict(record, awx_job_id=None)) == "alice@ctl-1, variant shadow-balanced, since 2026-12-01T10:00:00Z"
