# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading and writing the small state files on a host: a JSON object, a JSON-lines history,
a file replaced in one step.

Shared by the deploy state module, the watchdog (which runs on the host from a copy of
module_utils, so this file uses the standard library only), the model stager, and every
writer of the collection that replaces a file whole (``write_atomic``: the deploy lock, the
host manifest, the DDTree build's manifest and journal, the gate's progress file,
tools/inferops_model_manifest.py). ``open_directory`` and ``replace_at`` write as root into a
directory another user owns (node_exporter's textfile directory) without following a link
that user could plant.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import tempfile

# The longest part of the destination's name kept in its temporary file's name.
_TEMP_NAME_MAX = 100


def parse_json_object(data: bytes | str | None) -> dict | None:
    """The JSON object in ``data``; None when there is none, it is not JSON or not an object."""
    try:
        value = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def read_json(path: str) -> dict | None:
    """The JSON object in ``path``; None when it is missing, unreadable, not JSON or not an object."""
    try:
        with open(path, "rb") as handle:
            return parse_json_object(handle.read())
    except OSError:
        return None


def parse_jsonl(text: str) -> list[dict]:
    """The objects of JSON-lines text, oldest first; a line that does not parse (a write cut
    short) or is not an object is skipped."""
    records = []
    for line in text.splitlines():
        value = parse_json_object(line)
        if value is not None:
            records.append(value)
    return records


def read_jsonl(path: str) -> list[dict]:
    """The objects of a JSON-lines file (parse_jsonl); a missing or unreadable file is empty."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return parse_jsonl(handle.read())
    except OSError:
        return []


def append_line(path: str, line: str, mode: int = 0o600) -> None:
    """Append one line and sync it: a history survives a crash of the host right after."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode)
    try:
        os.fchmod(fd, mode)
        os.write(fd, (line.rstrip("\n") + "\n").encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: str) -> None:
    """Sync a directory, so a rename in it survives a crash of the host; best effort (a
    directory that cannot be opened or synced, on some filesystems, is left as it is)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _discard(temp: str) -> None:
    try:
        os.unlink(temp)
    except FileNotFoundError:
        pass


def _fill(fd: int, data: bytes, mode: int, sync: bool) -> None:
    """A new file's mode (fchmod: not subject to the umask) and all of ``data``, synced
    (``sync``); the descriptor is closed whatever happens."""
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def write_temp(path: str, data: bytes | str, mode: int = 0o600, sync: bool = True) -> str:
    """A new temporary file beside ``path`` (same directory, so a rename onto ``path`` is one
    step) holding ``data`` (text is written as UTF-8) with ``mode``; returns its name.

    The name is unpredictable and the file is created exclusively (tempfile.mkstemp:
    O_CREAT|O_EXCL, mode 0600 from the start): a file or symbolic link another user left at
    any name in the directory is never followed, truncated or written through, which matters
    for files written as root. The mode is set with fchmod (not subject to the umask) and the
    data synced (``sync``) before the name is returned; on any error the temporary file is
    removed and the error raised. The caller renames or links it (``write_atomic``)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    directory = os.path.dirname(os.path.abspath(path))
    prefix = "." + os.path.basename(path)[:_TEMP_NAME_MAX] + "."
    fd, temp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
    try:
        _fill(fd, data, mode, sync)
    except BaseException:
        _discard(temp)
        raise
    return temp


def write_atomic(path: str, data: bytes | str, mode: int = 0o600, sync: bool = True, sync_dir: bool = False) -> None:
    """Replace ``path`` with ``data`` in one step: ``write_temp`` beside it (exclusive create,
    the data written and synced, the mode set), then os.replace onto ``path``. A reader sees
    the old content or the new, never part of one; on any error ``path`` is unchanged and no
    temporary file is left. ``sync=False`` skips the file's fsync (a status file rewritten
    often, whose loss in a crash of the host does not matter); ``sync_dir`` also syncs the
    directory after the rename, so the new name itself survives a crash."""
    temp = write_temp(path, data, mode, sync)
    try:
        os.replace(temp, path)
    except BaseException:
        _discard(temp)
        raise
    if sync_dir:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def differs(path: str, data: bytes | str, mode: int) -> bool:
    """Whether ``path`` is not already a regular file holding ``data`` (text as UTF-8) with
    ``mode``: missing, unreadable, another content or another mode."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        with open(path, "rb") as handle:
            if handle.read() != data:
                return True
        return (os.lstat(path).st_mode & 0o7777) != mode
    except OSError:
        return True


def replace(path: str, text: bytes | str, mode: int = 0o600) -> bool:
    """Write ``text`` to ``path`` in one step (``write_atomic``), so a reader sees the old
    content or the new, never half; nothing is written when the content and mode are already
    those (``differs``). Returns whether the file changed."""
    if not differs(path, text, mode):
        return False
    write_atomic(path, text, mode)
    return True


def ensure_directory(path: str, mode: int, uid: int | None = None, gid: int | None = None, check: bool = False) -> bool:
    """``path`` a directory with ``mode`` (and owner ``uid``:``gid`` when given), created (its
    parent must exist) or mended; returns whether anything changed (``check``: would change,
    nothing is done). A symbolic link or another kind of file at ``path`` is refused (OSError),
    never followed: the directories of a root-only state tree are not taken from whoever
    planted a link there."""
    created = False
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        if check:
            return True
        try:
            os.mkdir(path, mode)
            created = True
        except FileExistsError:
            pass
        info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(f"{path} exists and is not a directory")
    owner = uid is not None and gid is not None and (info.st_uid, info.st_gid) != (uid, gid)
    mended = owner or (info.st_mode & 0o7777) != mode
    if mended and not check:
        if owner:
            os.lchown(path, uid, gid)
        os.chmod(path, mode)
    return created or mended


# -- writing as root where another user owns the directory -----------------------------------------

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_MAX_LINKS = 40  # as the kernel's path walk (ELOOP)


def _trusted_dir(fd: int) -> bool:
    """Only root can change this directory's entries (root's, no group or other write)."""
    info = os.fstat(fd)
    return info.st_uid == 0 and not info.st_mode & 0o022


def open_directory(path: str, create_mode: int | None = None) -> int:
    """A file descriptor of the directory ``path``, walked one name at a time from ``/`` without
    following a symbolic link that another user could have planted: a link is followed only
    where it sits in a directory that only root can change (as fs.protected_symlinks reasons),
    else OSError names it. ``create_mode``: a missing directory on the way is made (mkdir, that
    mode), as os.makedirs would. Whatever later replaces a name on the way, the descriptor stays this directory:
    write relative to it (``replace_at``). The caller closes it."""
    if not os.path.isabs(path):
        raise OSError(f"{path} is not an absolute path")
    fd = os.open("/", _DIR_FLAGS)
    names = [n for n in path.split("/") if n not in ("", ".")]
    hops = 0
    try:
        while names:
            name = names.pop(0)
            if name == "..":
                raise OSError(f"{path}: '..' is not followed")
            try:
                following = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if create_mode is None:
                    raise
                os.mkdir(name, create_mode, dir_fd=fd)
                following = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISLNK(info.st_mode):
                    raise OSError(f"{path}: {name} is not a directory") from None
                if not _trusted_dir(fd):
                    raise OSError(f"{path}: {name} is a symbolic link in a directory that another user than root "
                                  "can change; it is not followed") from None
                hops += 1
                if hops > _MAX_LINKS:
                    raise OSError(f"{path}: too many symbolic links") from None
                target = os.readlink(name, dir_fd=fd)
                names = [n for n in target.split("/") if n not in ("", ".")] + names
                if target.startswith("/"):
                    os.close(fd)
                    fd = -1
                    fd = os.open("/", _DIR_FLAGS)
                continue
            os.close(fd)
            fd = following
        return fd
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise


def replace_at(dir_fd: int, name: str, data: bytes | str, mode: int) -> bool:
    """``replace`` relative to a directory descriptor (``open_directory``): nothing is written
    when the file there already holds ``data`` with ``mode`` (read without following a link);
    else a new file with an unpredictable name, created exclusively (O_EXCL, O_NOFOLLOW), its
    mode set with fchmod, synced, renamed onto ``name`` in the same directory (a link at
    ``name`` is replaced, never written through). Returns whether the file changed."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
    except OSError:
        pass
    else:
        try:
            info = os.fstat(fd)
            current = os.read(fd, len(data) + 1) if stat.S_ISREG(info.st_mode) else None
        finally:
            os.close(fd)
        if current == data and (info.st_mode & 0o7777) == mode:
            return False
    temp = f".{name[:_TEMP_NAME_MAX]}.{secrets.token_hex(8)}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600,
                 dir_fd=dir_fd)
    try:
        _fill(fd, data, mode, True)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        raise
    return True
