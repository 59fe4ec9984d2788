# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The per-host deploy lock: one deploy at a time per service and host.

The lock is one JSON file on the host (``LOCK_FIELDS``). It is created
atomically: the record is written to a temporary file in the same directory
(mode 0600, created exclusively under an unpredictable name by
``_state_files.write_temp``) and ``os.link()``-ed to the lock's name, which fails when the
name exists, so two deploys can never both create it. An existing lock is
only ever changed by replacing it whole (a fresh temporary file renamed over
it) or by removing it, always after re-reading it under an exclusive
``flock`` on ``<lock>.guard`` and finding the expected run there: renew and
release act only on this run's own lock, a takeover only on the same stale
holder it decided on. So two takeovers of one stale lock cannot both win,
and a holder's late release never removes its successor's lock.

Staleness: a lock is stale when its ``expires`` (epoch seconds on the host's
clock) has passed, or when its holder ran on this controller host and that
ansible-playbook process is gone (decided on the controller, ``stale_reason``
with ``pid_alive``). Never while the run's switch job runs on the host: the
job (sglang_switch) writes its pid and the host's boot id into the lock
(``claim_for_job``) and renews the lease as it goes, so a lock whose job is
alive (``job_alive``, judged on the host) is held whatever became of the
controller and whatever ``take_over_run_id`` says; a reboot ends the job and
with it that hold.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from ansible_collections.inferops.sglang.plugins.module_utils import _state_files as state_files

# The lock file's keys, in the order they are written.
LOCK_FIELDS = ("run_id", "service", "variant", "controller_user", "controller_host", "controller_pid",
               "awx_job_id", "started", "renewed", "expires", "lease_s")
# The keys of a holder (who deploys what), as the action plugin builds it.
HOLDER_FIELDS = ("service", "variant", "controller_user", "controller_host", "controller_pid", "awx_job_id")
DEFAULT_LEASE = 1800
# Where the kernel says which boot this is: a job's pid means nothing after a reboot.
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
PROC = "/proc"
# How often acquire() re-reads a lock that changed under it before giving up.
ATTEMPTS = 5

# The module's options (the action plugin validates the task's arguments with the same spec).
ARGUMENT_SPEC = dict(
    path=dict(type="path", required=True),
    state=dict(type="str", default="acquired", choices=["acquired", "renewed", "released"]),
    service=dict(type="str"),
    variant=dict(type="str"),
    run_id=dict(type="str"),
    holder=dict(type="dict"),
    lease=dict(type="int", default=DEFAULT_LEASE),
    take_over_run_id=dict(type="str"),
    timeout=dict(type="int", default=600),
    poll=dict(type="float", default=2.0),
    inspect=dict(type="dict", options=dict(
        service_dir=dict(type="path", required=True),
        files=dict(type="list", elements="dict", default=[]),
    )),
)


def default_service(path: str) -> str:
    """The service named by the lock's directory, for a task that names none."""
    return os.path.basename(os.path.dirname(os.path.abspath(path))) or path


class LockError(Exception):
    """The lock file cannot be read, parsed or written (not contention)."""


def utc_iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def make_record(run_id: str, holder: dict, lease: int, now: float, started: str | None = None) -> dict:
    """The lock file's content for this run, leased ``lease`` seconds from ``now``."""
    record = dict.fromkeys(LOCK_FIELDS)
    for key in HOLDER_FIELDS:
        record[key] = holder.get(key)
    record.update(run_id=run_id, started=started or utc_iso(now), renewed=utc_iso(now),
                  expires=int(now) + int(lease), lease_s=int(lease))
    return record


def read(path: str) -> dict | None:
    """The lock's record, or None when there is no lock. LockError when the file is not a deploy lock."""
    try:
        with open(path, "r", encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LockError(f"cannot read the deploy lock {path}: {exc}") from exc
    try:
        record = json.loads(text)
    except ValueError as exc:
        raise LockError(f"{path} is not a deploy lock (not JSON: {exc}); if no deploy is running, remove it") from exc
    if (not isinstance(record, dict) or not isinstance(record.get("run_id"), str) or not record["run_id"]
            or isinstance(record.get("expires"), bool) or not isinstance(record.get("expires"), (int, float))):
        raise LockError(f"{path} is not a deploy lock (no run_id or expires); if no deploy is running, remove it")
    return record


def expired(record: dict, now: float) -> bool:
    return record["expires"] <= now


def pid_alive(pid) -> bool:
    """Whether a process with this pid exists on this machine (one we may not signal counts as alive).
    A pid that is not a positive int cannot be judged and counts as alive."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def boot_id(path: str = BOOT_ID_FILE) -> str | None:
    """This boot's id, or None where the kernel does not say."""
    try:
        with open(path, "r", encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def process_start(pid: int, proc: str = PROC) -> int | None:
    """When the process ``pid`` started, in clock ticks since boot (/proc/PID/stat's 22nd field,
    proc(5)); None when there is no such process or the kernel does not say. With the boot id,
    it names one process: a pid reused by a later process has another start."""
    try:
        with open(f"{proc}/{int(pid)}/stat", "r", encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except (OSError, ValueError):
        return None
    # the command name (field 2) is in parentheses and may itself hold ")" or spaces
    fields = text[text.rfind(")") + 1:].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def job_alive(record: dict, this_boot: str | None = None, alive: Callable[[int], bool] = pid_alive,
              start_of: Callable[[int], int | None] = process_start) -> int | None:
    """The pid of the record's switch job when it still runs on this host (same boot, and the
    process with that pid started when the job did: not a later process given the same pid),
    else None. A record without the job's start (written before it was kept) is judged by the
    pid and boot alone."""
    pid = record.get("job_pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    this_boot = this_boot if this_boot is not None else boot_id()
    if not this_boot or record.get("job_boot_id") != this_boot:
        return None
    if not alive(pid):
        return None
    started = record.get("job_start")
    if isinstance(started, int) and not isinstance(started, bool) and start_of(pid) != started:
        return None
    return pid


def holder_gone(record: dict, controller_host: str | None, alive: Callable[[int], bool] = pid_alive) -> str | None:
    """Why the holder is gone when it ran on this controller (``controller_host``) and its
    ansible-playbook process no longer exists; None otherwise (another controller's holder
    is never judged by its pid)."""
    pid = record.get("controller_pid")
    if controller_host and record.get("controller_host") == controller_host and not alive(pid):
        return f"its ansible-playbook process (pid {pid} on {controller_host}) is gone"
    return None


def stale_reason(record: dict, now: float, controller_host: str | None = None,
                 alive: Callable[[int], bool] | None = None) -> str | None:
    """Why the lock is stale, or None when its holder may still be deploying.

    Stale when its lease ran out (``now`` on the host's clock), or, given this
    controller's host name and ``alive``, when the holder ran on this controller
    and its ansible-playbook process is gone (``holder_gone``)."""
    if expired(record, now):
        return f"its lease ran out at {utc_iso(record['expires'])}"
    if alive is not None:
        return holder_gone(record, controller_host, alive)
    return None


def describe(record: dict) -> str:
    """Who holds the lock: 'alice@ctl-1 (AWX job 42), variant shadow-balanced, since 2026-12-01T10:00:00Z'."""
    who = f"{record.get('controller_user') or '?'}@{record.get('controller_host') or '?'}"
    if record.get("awx_job_id") not in (None, ""):
        who += f" (AWX job {record['awx_job_id']})"
    text = f"{who}, variant {record.get('variant') or '?'}, since {record.get('started') or '?'}"
    if record.get("job_pid"):
        text += f", its switch job pid {record['job_pid']} on the host"
    return text


def contention_message(record: dict, host: str, waited: float, path: str,
                       timeout_name: str = "sglang_service_lock_timeout") -> str:
    """The failure of a deploy that did not get the lock in time."""
    service = record.get("service") or "the service"
    return (f"{service} on {host} is being deployed by {describe(record)}; waited {int(waited)} s ({timeout_name}). "
            f"The lock is {path} (run {record['run_id']}, lease until {utc_iso(record['expires'])}); it is freed when "
            f"that deploy ends or its lease runs out; if that deploy is gone, take_over_run_id={record['run_id']} "
            f"(deploy.yml: -e sglang_service_lock_take_over={record['run_id']}) takes it over.")


def ensure_dir(path: str) -> bool:
    """Create the lock's directory (0700) when missing; whether it was created."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(directory):
        return False
    try:
        os.makedirs(directory, mode=0o700)
        os.chmod(directory, 0o700)
    except FileExistsError:
        return False
    except OSError as exc:
        raise LockError(f"cannot create the deploy lock's directory {directory}: {exc}") from exc
    return True


def _write_temp(path: str, record: dict) -> str:
    """The record in a new temporary file beside the lock (mode 0600, synced), created
    exclusively under an unpredictable name (``_state_files.write_temp``); the caller links
    it to the lock's name (create) or renames it over the lock (replace), and removes it."""
    data = (json.dumps(record, indent=2) + "\n").encode("utf-8")
    try:
        return state_files.write_temp(path, data, 0o600)
    except OSError as exc:
        raise LockError(f"cannot write the deploy lock {path}: {exc}") from exc


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


@contextmanager
def _guard(path: str) -> Iterator[None]:
    """Serialize the changes of an existing lock (renew, release, takeover) on this host."""
    try:
        fd = os.open(f"{path}.guard", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise LockError(f"cannot open {path}.guard: {exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def create(path: str, record: dict) -> bool:
    """Create the lock with this record; False when a lock exists (nothing is changed then)."""
    temp = _write_temp(path, record)
    try:
        os.link(temp, path)
    except FileExistsError:
        return False
    except OSError as exc:
        raise LockError(f"cannot create the deploy lock {path}: {exc}") from exc
    finally:
        _unlink(temp)
    return True


def replace(path: str, record: dict, expected_run_id: str) -> tuple[bool, dict | None]:
    """Replace the lock with ``record`` if it still holds ``expected_run_id``; (replaced, the lock as found)."""
    with _guard(path):
        current = read(path)
        if current is None or current["run_id"] != expected_run_id:
            return False, current
        temp = _write_temp(path, record)
        try:
            os.replace(temp, path)
        except OSError as exc:
            _unlink(temp)
            raise LockError(f"cannot replace the deploy lock {path}: {exc}") from exc
        return True, current


def acquire(path: str, run_id: str, holder: dict, lease: int = DEFAULT_LEASE, take_over_run_id: str | None = None,
            check_mode: bool = False, now: Callable[[], float] = time.time) -> dict:
    """Take the lock for ``run_id``.

    Free: created. Already this run's: its lease is renewed. Held by the run
    ``take_over_run_id``, or by a run whose lease ran out: taken over (the
    previous record is returned). Otherwise not acquired, and ``holder`` is
    the lock's current record. In check mode nothing is written, and
    ``acquired`` says whether a real run would have it now.

    Returns acquired, changed, holder (the lock's record afterwards), previous
    (the record taken over, or None), taken_over, stale (why it was taken over).
    """
    outcome = dict(acquired=False, changed=False, holder=None, previous=None, taken_over=False, stale=None)
    for _attempt in range(ATTEMPTS):
        current = read(path)
        stamp = now()
        if current is None:
            record = make_record(run_id, holder, lease, stamp)
            if check_mode:
                return dict(outcome, acquired=True, changed=True)
            if create(path, record):
                return dict(outcome, acquired=True, changed=True, holder=record)
            continue
        if current["run_id"] == run_id:
            record = make_record(run_id, holder, lease, stamp, started=current.get("started"))
            if check_mode:
                return dict(outcome, acquired=True, changed=True, holder=current)
            replaced, current = replace(path, record, run_id)
            if replaced:
                return dict(outcome, acquired=True, changed=True, holder=record)
            continue
        if take_over_run_id and current["run_id"] == take_over_run_id:
            reason = stale_reason(current, stamp) or "take_over_run_id named it"
        else:
            reason = stale_reason(current, stamp)
        if reason is not None and job_alive(current) is not None:
            # its switch job still runs here: the controller's fate does not free the host
            reason = None
        if reason is None:
            return dict(outcome, holder=current)
        if check_mode:
            return dict(outcome, acquired=True, changed=True, holder=current, previous=current, taken_over=True, stale=reason)
        record = make_record(run_id, holder, lease, stamp)
        replaced, found = replace(path, record, current["run_id"])
        if replaced:
            return dict(outcome, acquired=True, changed=True, holder=record, previous=found, taken_over=True, stale=reason)
    current = read(path)
    return dict(outcome, holder=current)


def renew(path: str, run_id: str, lease: int = DEFAULT_LEASE, check_mode: bool = False,
          now: Callable[[], float] = time.time, fields: dict | None = None) -> dict:
    """Extend this run's lease, setting ``fields`` in the lock's record too (the record's other
    fields are kept). Returns lost (the lock is no longer this run's), changed, holder (the lock's record)."""
    current = read(path)
    if current is None or current["run_id"] != run_id:
        return dict(lost=True, changed=False, holder=current)
    stamp = now()
    record = dict(current, **(fields or {}), renewed=utc_iso(stamp), expires=int(stamp) + int(lease), lease_s=int(lease))
    if check_mode:
        return dict(lost=False, changed=True, holder=current)
    replaced, found = replace(path, record, run_id)
    if not replaced:
        return dict(lost=True, changed=False, holder=found)
    return dict(lost=False, changed=True, holder=record)


def claim_for_job(path: str, run_id: str, pid: int, lease: int = DEFAULT_LEASE, this_boot: str | None = None,
                  now: Callable[[], float] = time.time) -> dict:
    """Mark this run's lock as held by its switch job (``pid`` on this boot, with its start:
    ``process_start``) and extend the lease; renewed as the job goes on (``renew`` keeps the
    job's fields). Returns as renew."""
    job = dict(job_pid=int(pid), job_boot_id=this_boot if this_boot is not None else boot_id(),
               job_start=process_start(pid))
    return renew(path, run_id, lease, now=now, fields=job)


def release(path: str, run_id: str, check_mode: bool = False) -> dict:
    """Remove this run's lock; another run's lock is never removed (lost). Returns lost, changed, holder (as found)."""
    current = read(path)
    if current is None or current["run_id"] != run_id:
        return dict(lost=True, changed=False, holder=current)
    if check_mode:
        return dict(lost=False, changed=True, holder=current)
    with _guard(path):
        found = read(path)
        if found is None or found["run_id"] != run_id:
            return dict(lost=True, changed=False, holder=found)
        try:
            os.unlink(path)
        except OSError as exc:
            raise LockError(f"cannot remove the deploy lock {path}: {exc}") from exc
    return dict(lost=False, changed=True, holder=found)
