"""_deploy_lock and the switch job that holds a run's lock on the host: boot_id, job_alive
(the job's pid on this boot), claim_for_job, renew keeping the job's fields, describe naming
the job, and acquire() never taking over a lock whose job is alive, whatever the lease or
take_over_run_id say, but taking it once the job is gone (dead, or from another boot).
Real files under tmp_path; a live pid is this process's, a dead one a reaped child's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _deploy_lock as lock

ALICE = dict(service="sglang-qwen.service", variant="ddtree", controller_user="alice", controller_host="ctl-1",
             controller_pid=4242, awx_job_id="42")
BOB = dict(ALICE, variant="nextn", controller_user="bob", controller_host="ctl-2", controller_pid=77, awx_job_id=None)
A, B = "a" * 32, "b" * 32
BOOT, OTHER_BOOT = "3b0c2f4e-boot-this", "9d81aa07-boot-before"
NOW = 1796119200.0  # 2026-12-01T10:00:00Z


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "deploy.lock")


@pytest.fixture
def this_boot(monkeypatch):
    """The host's boot id as the kernel would say it (job_alive reads it when not given)."""
    monkeypatch.setattr(lock, "boot_id", lambda path=lock.BOOT_ID_FILE: BOOT)
    return BOOT


def on_disk(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def held_by_job(path: str, run_id: str, pid: int, boot: str | None, expires: float | None = None) -> dict:
    """A lock of ``run_id`` whose switch job is ``pid`` on boot ``boot``."""
    lock.acquire(path, run_id, ALICE, lease=1800, now=lambda: NOW)
    record = dict(on_disk(path), job_pid=pid, job_boot_id=boot)
    if expires is not None:
        record["expires"] = expires
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    return record


# -- boot_id ------------------------------------------------------------------------------------------------------

def test_boot_id_reads_the_file_stripped_and_is_none_without_one(tmp_path):
    (tmp_path / "boot_id").write_text("  f327ebd0-703f-4f88-b4fe-4b243a4777de\n")
    assert lock.boot_id(str(tmp_path / "boot_id")) == "f327ebd0-703f-4f88-b4fe-4b243a4777de"
    (tmp_path / "empty").write_text("\n")
    assert lock.boot_id(str(tmp_path / "empty")) is None
    assert lock.boot_id(str(tmp_path / "missing")) is None


# -- job_alive ----------------------------------------------------------------------------------------------------

def test_a_job_on_this_boot_whose_pid_lives_is_alive():
    record = {"job_pid": os.getpid(), "job_boot_id": BOOT}
    assert lock.job_alive(record, BOOT) == os.getpid()
    assert lock.job_alive(record, BOOT, alive=lambda pid: True) == os.getpid()


def test_a_pid_reused_by_a_later_process_is_not_the_job():
    started = lock.process_start(os.getpid())
    assert isinstance(started, int) and started > 0
    record = {"job_pid": os.getpid(), "job_boot_id": BOOT, "job_start": started}
    assert lock.job_alive(record, BOOT) == os.getpid()
    # the same pid on the same boot, but a process that started later: the job is gone
    assert lock.job_alive(dict(record, job_start=started - 1), BOOT) is None
    assert lock.job_alive(record, BOOT, start_of=lambda pid: started + 7) is None
    # a record written before the start was kept is judged by the pid and the boot
    assert lock.job_alive({"job_pid": os.getpid(), "job_boot_id": BOOT}, BOOT, start_of=lambda pid: None) == os.getpid()


def test_process_start_reads_the_22nd_field_whatever_the_command_name_holds(tmp_path):
    (tmp_path / "4242").mkdir()
    fields = " ".join(str(n) for n in range(3, 22))  # fields 3..21, then starttime
    (tmp_path / "4242" / "stat").write_text(f"4242 (sglang) x (1 2)) {fields} 987654 22 23\n")
    assert lock.process_start(4242, proc=str(tmp_path)) == 987654
    assert lock.process_start(4343, proc=str(tmp_path)) is None
    (tmp_path / "4242" / "stat").write_text("4242 (cut")
    assert lock.process_start(4242, proc=str(tmp_path)) is None


def test_a_job_whose_pid_is_gone_is_not_alive():
    pid = dead_pid()
    assert lock.job_alive({"job_pid": pid, "job_boot_id": BOOT}, BOOT) is None
    # the judge is the given one
    assert lock.job_alive({"job_pid": os.getpid(), "job_boot_id": BOOT}, BOOT, alive=lambda p: False) is None


@pytest.mark.parametrize("record_boot, this_boot", [(OTHER_BOOT, BOOT), (None, BOOT), ("", BOOT)],
                         ids=["another-boot", "no-boot-in-record", "empty-boot-in-record"])
def test_a_job_of_another_or_unknown_boot_is_not_alive_whatever_its_pid(record_boot, this_boot):
    asked: list[int] = []
    record = {"job_pid": os.getpid(), "job_boot_id": record_boot}
    assert lock.job_alive(record, this_boot, alive=lambda pid: asked.append(pid) or True) is None
    assert asked == []  # a pid of another boot means nothing: never even checked


def test_a_host_that_does_not_say_its_boot_cannot_have_a_live_job(monkeypatch):
    monkeypatch.setattr(lock, "boot_id", lambda path=lock.BOOT_ID_FILE: None)
    assert lock.job_alive({"job_pid": os.getpid(), "job_boot_id": BOOT}) is None
    assert lock.job_alive({"job_pid": os.getpid(), "job_boot_id": None}) is None


def test_job_alive_reads_this_boot_when_not_given(this_boot):
    assert lock.job_alive({"job_pid": os.getpid(), "job_boot_id": BOOT}) == os.getpid()
    assert lock.job_alive({"job_pid": os.getpid(), "job_boot_id": OTHER_BOOT}) is None


@pytest.mark.parametrize("pid", [None, 0, -3, True, "4242", 12.0], ids=repr)
def test_a_record_without_a_usable_job_pid_has_no_live_job(pid):
    record = {"job_pid": pid, "job_boot_id": BOOT}
    assert lock.job_alive(record, BOOT, alive=lambda p: True) is None
    assert lock.job_alive({"job_boot_id": BOOT}, BOOT, alive=lambda p: True) is None


# -- claim_for_job and renew --------------------------------------------------------------------------------------

def test_claim_for_job_marks_this_runs_lock_and_keeps_its_holder(path):
    lock.acquire(path, A, ALICE, lease=900, now=lambda: NOW)
    before = on_disk(path)
    result = lock.claim_for_job(path, A, 5151, lease=1800, this_boot=BOOT, now=lambda: NOW + 120)
    after = on_disk(path)
    assert result["lost"] is False and result["changed"] is True and result["holder"] == after
    assert after["job_pid"] == 5151 and after["job_boot_id"] == BOOT and after["job_start"] == lock.process_start(5151)
    assert after["expires"] == int(NOW) + 120 + 1800 and after["lease_s"] == 1800
    assert after["renewed"] == "2026-12-01T10:02:00Z" and after["started"] == before["started"]
    for key in lock.HOLDER_FIELDS + ("run_id",):
        assert after[key] == before[key], key
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_claim_for_job_reads_the_boot_id_when_not_given(path, this_boot):
    lock.acquire(path, A, ALICE)
    lock.claim_for_job(path, A, os.getpid())
    assert on_disk(path)["job_boot_id"] == BOOT and on_disk(path)["job_pid"] == os.getpid()
    # the job's start is kept with its pid: the lock names this process, found alive
    started = lock.process_start(os.getpid())
    assert started is not None and on_disk(path)["job_start"] == started
    assert lock.job_alive(on_disk(path)) == os.getpid()


def test_claim_for_job_on_another_runs_lock_is_lost_and_changes_nothing(path):
    lock.acquire(path, B, BOB, now=lambda: NOW)
    with open(path, "rb") as handle:
        held = handle.read()
    result = lock.claim_for_job(path, A, 5151, this_boot=BOOT)
    assert result["lost"] is True and result["changed"] is False and result["holder"]["run_id"] == B
    with open(path, "rb") as handle:
        assert handle.read() == held


def test_claim_for_job_without_a_lock_is_lost_and_creates_none(path):
    result = lock.claim_for_job(path, A, 5151, this_boot=BOOT)
    assert result == dict(lost=True, changed=False, holder=None)
    assert not os.path.exists(path)


def test_renew_keeps_the_jobs_fields(path):
    lock.acquire(path, A, ALICE, lease=900, now=lambda: NOW)
    lock.claim_for_job(path, A, 5151, lease=900, this_boot=BOOT, now=lambda: NOW)
    claimed = on_disk(path)
    result = lock.renew(path, A, lease=1800, now=lambda: NOW + 600)
    after = on_disk(path)
    assert result["lost"] is False and after["job_pid"] == 5151 and after["job_boot_id"] == BOOT
    assert after["expires"] == int(NOW) + 600 + 1800 and after["renewed"] == "2026-12-01T10:10:00Z"
    for key in lock.HOLDER_FIELDS + ("run_id", "started"):
        assert after[key] == claimed[key], key
    assert result["holder"] == after
    # a renewal by another run is lost and leaves the job's record alone
    assert lock.renew(path, B, now=lambda: NOW + 700)["lost"] is True and on_disk(path) == after


def test_describe_names_the_job():
    record = dict(lock.make_record(A, ALICE, 900, NOW), job_pid=5151, job_boot_id=BOOT)
    text = lock.describe(record)
    assert text.startswith("alice@ctl-1 (AWX job 42), variant ddtree, since 2026-12-01T10:00:00Z")
    assert text.endswith(", its switch job pid 5151 on the host")
    assert "switch job" not in lock.describe(lock.make_record(A, ALICE, 900, NOW))


# -- acquire() and a live job -------------------------------------------------------------------------------------

def test_a_live_job_keeps_its_lock_against_take_over_run_id(path, this_boot):
    held = held_by_job(path, A, os.getpid(), BOOT)
    outcome = lock.acquire(path, B, BOB, take_over_run_id=A, now=lambda: NOW + 60)
    assert outcome["acquired"] is False and outcome["taken_over"] is False and outcome["changed"] is False
    assert outcome["holder"] == held and on_disk(path) == held


def test_a_live_job_keeps_its_lock_after_its_lease_ran_out(path, this_boot):
    held = held_by_job(path, A, os.getpid(), BOOT, expires=NOW - 1)
    outcome = lock.acquire(path, B, BOB, now=lambda: NOW + 3600)
    assert outcome["acquired"] is False and on_disk(path) == held
    # check mode says the same: a real run would not have it
    outcome = lock.acquire(path, B, BOB, take_over_run_id=A, check_mode=True, now=lambda: NOW + 3600)
    assert outcome["acquired"] is False and outcome["taken_over"] is False and on_disk(path) == held


def test_a_lock_whose_controller_is_gone_is_still_held_while_its_job_runs(path, this_boot):
    """The controller's action plugin passes take_over_run_id when the holder's ansible-playbook
    process is gone (holder_gone): the host's job still decides."""
    held = held_by_job(path, A, os.getpid(), BOOT)
    assert lock.holder_gone(held, "ctl-1", alive=lambda pid: False) is not None
    outcome = lock.acquire(path, B, BOB, take_over_run_id=A, now=lambda: NOW)
    assert outcome["acquired"] is False and on_disk(path) == held


def test_a_dead_job_no_longer_holds_the_lock(path, this_boot):
    previous = held_by_job(path, A, dead_pid(), BOOT)
    outcome = lock.acquire(path, B, BOB, take_over_run_id=A, now=lambda: NOW + 60)
    assert outcome["acquired"] is True and outcome["taken_over"] is True
    assert outcome["previous"] == previous and outcome["stale"] == "take_over_run_id named it"
    record = on_disk(path)
    assert record["run_id"] == B and "job_pid" not in record and "job_boot_id" not in record


def test_a_job_of_the_boot_before_no_longer_holds_the_lock(path, this_boot):
    held_by_job(path, A, os.getpid(), OTHER_BOOT, expires=NOW - 1)
    outcome = lock.acquire(path, B, BOB, now=lambda: NOW + 60)
    assert outcome["acquired"] is True and outcome["taken_over"] is True
    assert outcome["stale"].startswith("its lease ran out at ")
    assert on_disk(path)["run_id"] == B


def test_a_live_job_never_makes_a_lock_stale_that_is_not(path, this_boot):
    """Without a reason to take it over (lease valid, no take_over_run_id), a dead job does not free it."""
    held = held_by_job(path, A, dead_pid(), BOOT)
    outcome = lock.acquire(path, B, BOB, now=lambda: NOW + 60)
    assert outcome["acquired"] is False and on_disk(path) == held


def test_the_jobs_own_run_reacquires_its_lock(path, this_boot):
    held_by_job(path, A, os.getpid(), BOOT)
    outcome = lock.acquire(path, A, ALICE, lease=900, now=lambda: NOW + 60)
    assert outcome["acquired"] is True and outcome["taken_over"] is False and on_disk(path)["run_id"] == A


def test_a_live_job_is_judged_by_its_pid_at_the_takeover(path, this_boot, monkeypatch):
    """The pid check is os.kill(pid, 0): a job pid that cannot be signalled (another user's) is alive."""
    held = held_by_job(path, A, 5151, BOOT)
    signalled: list[tuple[int, int]] = []

    def kill(pid, sig):
        signalled.append((pid, sig))
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "kill", kill)
    outcome = lock.acquire(path, B, BOB, take_over_run_id=A, now=lambda: NOW)
    assert outcome["acquired"] is False and on_disk(path) == held and signalled == [(5151, 0)]

    def gone(pid, sig):
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(os, "kill", gone)
    outcome = lock.acquire(path, B, BOB, take_over_run_id=A, now=lambda: NOW)
    assert outcome["acquired"] is True and outcome["taken_over"] is True
