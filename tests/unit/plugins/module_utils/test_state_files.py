"""plugins/module_utils/_state_files.py: the one atomic write (``write_temp``, ``write_atomic``) that
every writer of the collection replaces a file with, and the state-file helpers built on it."""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _state_files as files


def leftovers(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".tmp"))


# -- exclusive creation --------------------------------------------------------------

def test_the_temporary_file_is_created_exclusively(tmp_path, monkeypatch):
    """The temporary file is opened with O_CREAT|O_EXCL (and never through a link): a name
    another user made first is refused by the kernel, not followed or truncated."""
    opened = []
    real_open = os.open

    def spy(path, flags, *args, **kwargs):
        opened.append((str(path), flags))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    files.write_atomic(str(tmp_path / "state.json"), "{}")
    created = [(path, flags) for path, flags in opened if os.path.dirname(path) == str(tmp_path)]
    assert created, opened
    for path, flags in created:
        assert flags & os.O_CREAT and flags & os.O_EXCL, (path, flags)
        if hasattr(os, "O_NOFOLLOW"):
            assert flags & os.O_NOFOLLOW, (path, flags)
    assert all(path != str(tmp_path / "state.json") for path, _flags in created)  # never the destination itself


def test_a_link_at_the_old_predictable_name_is_neither_followed_nor_clobbered(tmp_path):
    """Root used to write ``<path>.<pid>.tmp``: anyone who can write the directory could put a
    link there to a file of root's. That name is not used, and the link stays as it was."""
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    target = tmp_path / "state.json"
    planted = [tmp_path / f"state.json.{os.getpid()}.tmp", tmp_path / ".state.json.tmp", tmp_path / "state.json.tmp"]
    for link in planted:
        link.symlink_to(victim)
    assert files.replace(str(target), '{"a": 1}') is True
    assert victim.read_text() == "root's file\n"
    for link in planted:
        assert link.is_symlink() and os.readlink(link) == str(victim)
    assert json.loads(target.read_text()) == {"a": 1} and not target.is_symlink()
    assert leftovers(tmp_path) == sorted(link.name for link in planted)  # only the planted ones


def test_a_name_taken_by_another_user_is_skipped_not_written_through(tmp_path, monkeypatch):
    """The kernel refuses a candidate name that exists (EEXIST under O_EXCL) and the next one is
    taken: forced here by making the first candidate a link someone planted."""
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    planted = tmp_path / ".lock.json.taken.tmp"
    planted.symlink_to(victim)
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: iter(["taken", "free"]))
    temp = files.write_temp(str(tmp_path / "lock.json"), b"new record\n")
    assert os.path.basename(temp) == ".lock.json.free.tmp"
    assert victim.read_text() == "untouched\n" and planted.is_symlink()
    with open(temp, "rb") as handle:
        assert handle.read() == b"new record\n"


# -- the mode ---------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644])
def test_the_mode_is_the_one_asked_whatever_the_umask_and_set_before_the_rename(tmp_path, monkeypatch, mode):
    target = tmp_path / "out"
    target.write_text("old")
    target.chmod(0o666)
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        info = os.stat(src)
        with open(src, "rb") as handle:
            seen.append((stat.S_IMODE(info.st_mode), handle.read(), target.read_text()))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    old_umask = os.umask(0o077)
    try:
        files.write_atomic(str(target), b"new", mode)
    finally:
        os.umask(old_umask)
    # at the rename the temporary file already had its mode and all of its data; the destination
    # still had its old content (nothing is written to it in place)
    assert seen == [(mode, b"new", "old")]
    assert stat.S_IMODE(target.stat().st_mode) == mode and target.read_bytes() == b"new"


def test_the_data_is_synced_before_the_rename_unless_asked_not_to(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda src, dst: (events.append("replace"), real_replace(src, dst))[1])
    files.write_atomic(str(tmp_path / "a"), "x")
    assert events == ["fsync", "replace"]
    events.clear()
    files.write_atomic(str(tmp_path / "b"), "x", sync=False)
    assert events == ["replace"]
    events.clear()
    files.write_atomic(str(tmp_path / "c"), "x", sync_dir=True)
    assert events == ["fsync", "replace", "fsync"]  # the file, then the directory after the rename


# -- failures leave nothing behind ------------------------------------------------------

def test_a_failed_write_removes_the_temporary_file_and_keeps_the_old_content(tmp_path, monkeypatch):
    target = tmp_path / "state.json"
    target.write_text("old\n")

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError) as exc:
        files.write_atomic(str(target), "new\n")
    assert exc.value.errno == errno.ENOSPC
    assert target.read_text() == "old\n" and leftovers(tmp_path) == []
    with pytest.raises(OSError):
        files.write_temp(str(target), "new\n")
    assert leftovers(tmp_path) == []


def test_a_failed_sync_or_rename_removes_the_temporary_file(tmp_path, monkeypatch):
    target = tmp_path / "state.json"
    target.write_text("old\n")

    def broken(*_args):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError):
        files.write_atomic(str(target), "new\n")
    assert target.read_text() == "old\n" and leftovers(tmp_path) == []
    monkeypatch.undo()
    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError):
        files.write_atomic(str(target), "new\n")
    assert target.read_text() == "old\n" and leftovers(tmp_path) == []


def test_an_interrupt_during_the_write_removes_the_temporary_file(tmp_path, monkeypatch):
    def interrupted(fd, data):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        files.write_atomic(str(tmp_path / "state.json"), "new\n")
    assert os.listdir(tmp_path) == []


# -- the replacement is one rename ------------------------------------------------------

def test_the_destination_is_replaced_by_a_rename_not_rewritten(tmp_path):
    """A reader that opened the old file keeps reading all of the old content; the name then
    points at a new file with all of the new."""
    target = tmp_path / "host.json"
    target.write_text("old content\n")
    before = target.stat().st_ino
    with open(target, encoding="utf-8") as reader:
        files.write_atomic(str(target), "new content\n", 0o644)
        assert reader.read() == "old content\n"
    assert target.stat().st_ino != before and target.read_text() == "new content\n"
    assert leftovers(tmp_path) == []


def test_text_is_written_as_utf8_and_a_missing_directory_fails_without_a_trace(tmp_path):
    files.write_atomic(str(tmp_path / "t"), "déjà vu\n")
    assert (tmp_path / "t").read_bytes() == "déjà vu\n".encode("utf-8")
    with pytest.raises(FileNotFoundError):
        files.write_atomic(str(tmp_path / "missing" / "t"), "x")
    assert not (tmp_path / "missing").exists()


def test_write_temp_leaves_the_renaming_to_the_caller(tmp_path):
    """The deploy lock links the temporary file to the lock's name (creation fails when it
    exists): write_temp gives it a complete, synced file beside the lock, and nothing else."""
    path = tmp_path / "deploy.lock"
    temp = files.write_temp(str(path), b'{"run_id": "r1"}\n', 0o600)
    assert os.path.dirname(temp) == str(tmp_path) and os.path.basename(temp).startswith(".deploy.lock.")
    assert not path.exists() and stat.S_IMODE(os.stat(temp).st_mode) == 0o600
    os.link(temp, path)
    os.unlink(temp)
    assert path.read_bytes() == b'{"run_id": "r1"}\n'


# -- the helpers built on it ---------------------------------------------------------------

def test_replace_writes_only_a_change_of_content_or_mode(tmp_path):
    path = str(tmp_path / "state.json")
    assert files.replace(path, "{}") is True
    inode = os.stat(path).st_ino
    assert files.replace(path, "{}") is False and os.stat(path).st_ino == inode
    assert files.replace(path, "{}", 0o644) is True and stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert files.replace(path, '{"a": 1}', 0o644) is True and files.read_json(path) == {"a": 1}
    assert leftovers(tmp_path) == []


def test_append_line_and_read_jsonl_skip_what_is_not_an_object(tmp_path):
    path = str(tmp_path / "history.jsonl")
    files.append_line(path, json.dumps({"n": 1}))
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("not json\n[2]\n")
    files.append_line(path, json.dumps({"n": 3}) + "\n")
    assert [r["n"] for r in files.read_jsonl(path)] == [1, 3]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert files.read_jsonl(str(tmp_path / "missing")) == [] and files.read_json(str(tmp_path / "missing")) is None
