# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The DDTree build: patched files laid over a pinned, installed SGLang as one
transaction that can be reverted exactly.

A build is either a patch series (unified diffs, applied in order) or an
overlay (whole files). Both are reduced to the same thing before anything on
the host changes: the result bytes of every file the build touches, computed
from the pinned SGLang's original files. Inputs are verified against their
SHA-256 first, the original files against the checksum the operator gives or,
failing that, the checksum in the installed package's ``RECORD``.

Patches are applied here, strictly, rather than by the ``patch`` binary: the
tool is not installed on every host (it is not essential on Debian and slim
LXC templates lack it), it edits files in place and, by default, applies hunks
at an offset or with fuzz. Here every hunk must match its context exactly at
the line it names: the originals are verified by checksum, so a hunk that
does not match means a patch made for another SGLang, and that is an error.

Applying and reverting share one transaction. The results are staged in a
work directory next to the package (``.inferops-ddtree``, same filesystem,
so each replace is an atomic rename), each replaced file is first hard-linked
into the stage, and a journal naming every file is written before the first
rename. A run that dies part way leaves the journal behind; the next run rolls
every file back to what it was before, then does what it was asked. The
originals of a build are kept beside its manifest for ``revert``.

A build can also be applied and *held*: its files are in place, the journal
and the stage are kept and the manifest says ``pending``, so that the runtime
probe can read the very files the unit would load. ``commit`` then ends the
transaction (the manifest says ``applied``); ``roll_back`` puts every file and
the manifest back as they were before: the previous build, or none. A run that
dies while a build is held leaves it pending, and the next run rolls it back:
a build nobody proved is never left behind.

The module runs as root and trusts nothing it did not write itself. Every
file a build touches is under the ``sglang`` package directory (``confined``):
the patched files all are, while a file anywhere else at the top of
site-packages (a ``.pth`` file, ``sitecustomize.py``, a package shadowing
another) runs in every interpreter over the venv, root's probes included. A
``.pth`` file is refused anywhere. Every existing component of a path is
lstat'ed and a symbolic link is refused, out of the tree or in it (pip lays no
links in a package; through a link the file replaced is not the file hashed).
The journal is acted on only once validated (``pending``): a regular file of
the running user in a work directory of that user, neither writable by group
or others; its self-checksum (SHA-256 over its canonical JSON) matching; this
run's manifest; the module's own stage; every entry confined, its staged
copies the stage's own names, and every saved copy to be put back matching
its recorded SHA-256. The checksum catches a journal edited, truncated or
written by anything that did not recompute it; it is not a signature (whoever
can write as root could forge one): what bounds a forged journal is the
confinement. The manifest is read the same way (a regular file of the running
user, its files confined) and the originals directory is reached without a
link. The paths are checked when the build is planned and again just before
each file is replaced; a writer racing the module inside a site-packages it
can write is not defended against (the venv is root's, 0755).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import posixpath
import re
import shutil
import stat
import tempfile
import typing as t

from ansible_collections.inferops.sglang.plugins.module_utils import _state_files as state_files

WORK_DIR = ".inferops-ddtree"
JOURNAL = "journal.json"
JOURNAL_FORMAT = 2
MANIFEST_FORMAT = 1
PACKAGE = "sglang"
STAGE_RE = re.compile(r"^stage-[a-z0-9_]{8}$")
JOURNAL_KEYS = frozenset(("format", "stage", "entries", "manifest", "manifest_before", "held", "manifest_after",
                          "sglang_version", "checksum"))
ENTRY_KEYS = frozenset(("path", "before", "after", "new", "old"))
SOURCES = ("patch", "overlay")
HUNK_RE = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

# Swapped by the tests to interrupt a transaction part way.
replace_file = os.replace


class DDTreeError(Exception):
    """The build cannot be applied or reverted; the message says why and what to do."""


# -- hashing ---------------------------------------------------------------

def sha256_bytes(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def sha256_file(path: str) -> str | None:
    """The file's SHA-256, None when it does not exist."""
    if not os.path.lexists(path):
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_optional(path: str) -> bytes | None:
    if not os.path.lexists(path):
        return None
    with open(path, "rb") as handle:
        return handle.read()


def check_sha256(value: str, what: str) -> str:
    value = (value or "").strip().lower()
    if not SHA256_RE.match(value):
        raise DDTreeError(f"{what}: {value!r} is not a SHA-256 (64 hex digits)")
    return value


def build_id(source: str, inputs: list[dict]) -> str:
    """One hash naming the build: its source and every input with its checksum, in order."""
    text = json.dumps({"source": source, "inputs": [[i["name"], i["sha256"]] for i in inputs]}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


# -- paths -----------------------------------------------------------------

def safe_relpath(path: str, what: str) -> str:
    """A path inside site-packages, normalised; never absolute, never outside, never package metadata."""
    raw = (path or "").strip()
    norm = posixpath.normpath(raw.replace("\\", "/"))
    parts = norm.split("/")
    if not raw or raw.startswith("/") or norm in (".", "") or ".." in parts:
        raise DDTreeError(f"{what}: {path!r} must be a relative path inside site-packages")
    if parts[0] == WORK_DIR or parts[0].endswith((".dist-info", ".egg-info")):
        raise DDTreeError(f"{what}: {path!r} is package metadata or the build's work directory, not a package file")
    return norm


def confined(site: str, path: str, what: str) -> str:
    """The absolute path of ``path``, a file the build may touch: under the ``sglang`` package directory of
    ``site``, not a ``.pth`` file, and reached without a symbolic link. Every existing component is lstat'ed:
    a link (in the tree or out of it), a component that is not a directory, or a target that is not a regular
    file is refused. Components that do not exist yet are not checked (nothing below them can be a link)."""
    rel = safe_relpath(path, what)
    parts = rel.split("/")
    if parts[-1].lower().endswith(".pth"):
        raise DDTreeError(f"{what}: {rel} is a .pth file, which Python runs at the start of every interpreter over "
                          "this site-packages (root's included): a build never creates or changes one")
    if parts[0] != PACKAGE or len(parts) < 2:
        raise DDTreeError(f"{what}: {rel} is outside the {PACKAGE} package: a build only touches files under "
                          f"{PACKAGE}/ in site-packages")
    return _no_links(site, parts, what)


def _no_links(root: str, parts: list[str], what: str) -> str:
    current = root
    for number, part in enumerate(parts, 1):
        current = os.path.join(current, part)
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return os.path.join(root, *parts)
        if stat.S_ISLNK(info.st_mode):
            raise DDTreeError(f"{what}: {current} is a symbolic link (to {os.readlink(current)}); the build follows "
                              f"no link under {root}, in the tree or out of it")
        if number < len(parts) and not stat.S_ISDIR(info.st_mode):
            raise DDTreeError(f"{what}: {current} is not a directory")
        if number == len(parts) and not stat.S_ISREG(info.st_mode):
            raise DDTreeError(f"{what}: {current} is not a regular file")
    return current


def backup_path(backups_dir: str, path: str) -> str:
    """Where the original of ``path`` is kept: under the originals directory, reached without a link, the
    directory itself a real directory of the user running the build."""
    try:
        info = os.lstat(backups_dir)
    except FileNotFoundError:
        info = None
    if info is not None:
        if not stat.S_ISDIR(info.st_mode):
            raise DDTreeError(f"the originals directory {backups_dir} is not a directory (a symbolic link?): "
                              "it was not made by this module; move it away")
        _own(backups_dir, info, "the originals directory")
    return _no_links(backups_dir, safe_relpath(path, "originals").split("/"), "the kept original")


def _own(path: str, info: os.stat_result, what: str) -> None:
    """Refuse what the user running the build did not write, or what others could have changed."""
    if info.st_uid != os.geteuid():
        raise DDTreeError(f"{what} {path} is owned by uid {info.st_uid}, not by the user running the build "
                          f"(uid {os.geteuid()}): this module did not write it; it is not trusted")
    if info.st_mode & 0o022:
        raise DDTreeError(f"{what} {path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):04o}): "
                          "it is not trusted")


# -- the installed package -------------------------------------------------

def _dist_info(site: str) -> str:
    if not os.path.isdir(site):
        raise DDTreeError(f"site-packages {site} does not exist: is SGLang installed?")
    found = []
    for entry in sorted(os.listdir(site)):
        if entry.lower().startswith("sglang-") and entry.endswith(".dist-info"):
            found.append(os.path.join(site, entry))
    if not found:
        raise DDTreeError(f"SGLang is not installed in {site} (no sglang-*.dist-info)")
    if len(found) > 1:
        raise DDTreeError(f"more than one SGLang is recorded in {site}: {', '.join(os.path.basename(f) for f in found)}")
    return found[0]


def installed_version(site: str) -> str:
    """The version in the installed SGLang's METADATA."""
    path = os.path.join(_dist_info(site), "METADATA")
    try:
        with open(path, "r", encoding="utf-8") as handle:
            for line in handle:
                if not line.strip():
                    break
                if line.lower().startswith("version:"):
                    return line.split(":", 1)[1].strip()
    except OSError as exc:
        raise DDTreeError(f"cannot read {path}: {exc}") from exc
    raise DDTreeError(f"{path} names no Version")


def record_hashes(site: str) -> dict[str, str]:
    """Path -> SHA-256 (hex) of every file the installer recorded for SGLang (empty without a RECORD)."""
    path = os.path.join(_dist_info(site), "RECORD")
    hashes: dict[str, str] = {}
    if not os.path.isfile(path):
        return hashes
    with open(path, "r", encoding="utf-8") as handle:
        for line in handle:
            fields = line.rstrip("\n").rsplit(",", 2)
            if len(fields) != 3 or not fields[1].startswith("sha256="):
                continue
            digest = fields[1][len("sha256="):]
            raw = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4))
            hashes[posixpath.normpath(fields[0])] = raw.hex()
    return hashes


# -- unified diffs ---------------------------------------------------------

class Hunk(t.NamedTuple):
    old_start: int
    old_lines: list[bytes]
    new_lines: list[bytes]
    line: int


class FilePatch(t.NamedTuple):
    path: str
    old_exists: bool
    new_exists: bool
    hunks: list[Hunk]


def _split_lines(data: bytes) -> list[bytes]:
    """Lines with their b'\\n'; the last one without when the data does not end with one."""
    parts = data.split(b"\n")
    lines = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _header_path(line: bytes, strip: int, name: str, number: int) -> str | None:
    text = line[4:].split(b"\t")[0].rstrip(b"\r").decode("utf-8", "surrogateescape").strip()
    if text.startswith('"'):
        raise DDTreeError(f"{name} line {number}: quoted file names are not supported ({text})")
    if text == "/dev/null":
        return None
    parts = [p for p in text.split("/") if p]
    if len(parts) <= strip:
        raise DDTreeError(f"{name} line {number}: cannot strip {strip} leading component(s) from {text!r}")
    return safe_relpath("/".join(parts[strip:]), f"{name} line {number}")


def parse_patch(data: bytes, name: str, strip: int = 1) -> list[FilePatch]:
    """The files and hunks of a unified diff (as written by diff -u or git diff)."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    patches: list[FilePatch] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith((b"GIT binary patch", b"Binary files ")):
            raise DDTreeError(f"{name} line {i + 1}: binary patches are not supported")
        if not (line.startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ ")):
            i += 1
            continue
        old = _header_path(line, strip, name, i + 1)
        new = _header_path(lines[i + 1], strip, name, i + 2)
        if old is None and new is None:
            raise DDTreeError(f"{name} line {i + 1}: both sides are /dev/null")
        if old is not None and new is not None and old != new:
            raise DDTreeError(f"{name} line {i + 1}: renames are not supported ({old} -> {new})")
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith(b"@@"):
            match = HUNK_RE.match(lines[i])
            if not match:
                raise DDTreeError(f"{name} line {i + 1}: malformed hunk header {lines[i][:80]!r}")
            start = int(match.group(1))
            old_count = int(match.group(2) or b"1")
            new_count = int(match.group(4) or b"1")
            hunk_line = i + 1
            old_lines: list[bytes] = []
            new_lines: list[bytes] = []
            i += 1
            last: list[list[bytes]] = []
            while len(old_lines) < old_count or len(new_lines) < new_count or (
                    i < len(lines) and lines[i].startswith(b"\\")):
                if i >= len(lines):
                    raise DDTreeError(f"{name} line {hunk_line}: the hunk ends early (the patch is truncated)")
                body = lines[i]
                kind, text = body[:1], body[1:] + b"\n"
                if kind == b"\\":
                    for target in last:
                        target[-1] = target[-1][:-1]
                    last = []
                elif kind == b" " or body == b"":
                    old_lines.append(text)
                    new_lines.append(text)
                    last = [old_lines, new_lines]
                elif kind == b"-":
                    old_lines.append(text)
                    last = [old_lines]
                elif kind == b"+":
                    new_lines.append(text)
                    last = [new_lines]
                else:
                    raise DDTreeError(f"{name} line {i + 1}: unexpected line in a hunk: {body[:80]!r}")
                if len(old_lines) > old_count or len(new_lines) > new_count:
                    raise DDTreeError(f"{name} line {hunk_line}: the hunk has more lines than its header says")
                i += 1
            hunks.append(Hunk(start, old_lines, new_lines, hunk_line))
        if not hunks:
            raise DDTreeError(f"{name} line {i}: {new or old} has no hunks (mode changes and renames are not supported)")
        patches.append(FilePatch(t.cast(str, new or old), old is not None, new is not None, hunks))
    if not patches:
        raise DDTreeError(f"{name} is not a unified diff (no ---/+++ file headers)")
    return patches


def apply_file_patch(original: bytes | None, patch: FilePatch, name: str) -> bytes | None:
    """The file after the patch; None when the patch deletes it. Every hunk must match exactly where it says."""
    if patch.old_exists and original is None:
        raise DDTreeError(f"{name}: {patch.path} does not exist, so the patch cannot change it")
    if not patch.old_exists and original is not None:
        raise DDTreeError(f"{name}: creates {patch.path}, which already exists")
    source = _split_lines(original or b"")
    out: list[bytes] = []
    cursor = 0
    for number, hunk in enumerate(patch.hunks, 1):
        pos = hunk.old_start - 1 if hunk.old_lines else hunk.old_start
        end = pos + len(hunk.old_lines)
        if pos < cursor or end > len(source) or source[pos:end] != hunk.old_lines:
            raise DDTreeError(
                f"{name}: hunk {number} (line {hunk.line} of the patch) does not apply to {patch.path} at line "
                f"{hunk.old_start}: the file differs from what the patch was made against")
        out.extend(source[cursor:pos])
        out.extend(hunk.new_lines)
        cursor = end
    out.extend(source[cursor:])
    result = b"".join(out)
    if not patch.new_exists:
        if result:
            raise DDTreeError(f"{name}: deletes {patch.path} but the file has lines the patch does not remove")
        return None
    return result


# -- manifest, journal, atomic writes --------------------------------------

def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write a file by rename, so a reader sees the old or the new content, never part of one
    (``_state_files.write_atomic``: an exclusively created temporary file, fsync, the mode,
    rename, then the directory synced)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    state_files.write_atomic(path, data, mode, sync_dir=True)


def write_json(path: str, data: dict) -> None:
    write_atomic(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def _read_own(path: str, what: str) -> dict | None:
    """A JSON file this module wrote: a regular file (not a link) of the user running the build, not writable by
    group or others, read without following a link. None when it does not exist."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise DDTreeError(f"{what} {path} is not a regular file (a symbolic link?): this module did not write it; "
                          "it is not trusted")
    _own(path, info, what)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "r", encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise DDTreeError(f"{what} {path} is unreadable ({exc})") from exc
    if not isinstance(data, dict):
        raise DDTreeError(f"{what} {path} is not a JSON object")
    return data


def read_manifest(path: str) -> dict | None:
    try:
        data = _read_own(path, "the build manifest")
    except DDTreeError as exc:
        raise DDTreeError(f"{exc}; move it away only if no build is applied") from exc
    if data is not None and data.get("format") != MANIFEST_FORMAT:
        raise DDTreeError(f"the build manifest {path} is not a format {MANIFEST_FORMAT} manifest")
    return data


def _sha_or_none(value: t.Any) -> bool:
    return value is None or (isinstance(value, str) and bool(SHA256_RE.match(value)))


def applied_files(site: str, manifest: dict, manifest_path: str) -> dict[str, dict]:
    """Path -> file record of the build in ``manifest``, every path confined as the build's own."""
    files = manifest.get("files")
    if not isinstance(files, list):
        raise DDTreeError(f"the build manifest {manifest_path} lists no files")
    out: dict[str, dict] = {}
    for record in files:
        if not (isinstance(record, dict) and isinstance(record.get("path"), str)
                and _sha_or_none(record.get("original_sha256")) and _sha_or_none(record.get("result_sha256"))):
            raise DDTreeError(f"the build manifest {manifest_path} has a malformed file record: {record!r}")
        path = confined(site, record["path"], f"the build manifest {manifest_path}")
        out[os.path.relpath(path, site)] = record
    return out


def originals_dir(manifest_path: str) -> str:
    return os.path.join(os.path.dirname(manifest_path), "originals")


def journal_path(site: str) -> str:
    return os.path.join(site, WORK_DIR, JOURNAL)


def journal_checksum(journal: dict) -> str:
    """SHA-256 over the journal's canonical JSON, its own checksum left out."""
    body = {k: v for k, v in journal.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()).hexdigest()


def _refuse_journal(path: str, why: str) -> t.NoReturn:
    raise DDTreeError(f"the build journal {path} is not trusted: {why}. Nothing was changed; if no build of this "
                      "module is under way, check the SGLang files (reinstall the pinned SGLang) and remove "
                      f"{os.path.dirname(path)}")


def pending(site: str, manifest_path: str) -> dict | None:
    """The journal of an interrupted (or held) transaction, None when there is none. It is validated before
    anything acts on it, and refused (DDTreeError) unless all of this holds: the work directory and the journal
    are a real directory and a regular file (no link) of the user running the build, not writable by group or
    others; the journal's checksum matches its content; it names this run's manifest; its stage is the module's
    own (``stage-XXXXXXXX`` in the work directory, a real directory of that user); every entry's path is
    confined as a build's file (``confined``) and its staged copies are the stage's own names; and every saved
    copy a roll-back would put back is a regular file whose SHA-256 is the one recorded."""
    work = os.path.join(site, WORK_DIR)
    path = journal_path(site)
    try:
        info = os.lstat(work)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(info.st_mode):
        _refuse_journal(path, f"the work directory {work} is not a directory (a symbolic link?)")
    try:
        _own(work, info, "the work directory")
        journal = _read_own(path, "the journal")
    except DDTreeError as exc:
        _refuse_journal(path, str(exc))
    if journal is None:
        return None
    if "checksum" not in journal:
        _refuse_journal(path, "it has no checksum (written by hand, or by a collection older than journal format "
                              f"{JOURNAL_FORMAT})")
    if journal["checksum"] != journal_checksum(journal):
        _refuse_journal(path, "its checksum does not match its content (edited, truncated or not written by this "
                              "module)")
    if set(journal) != JOURNAL_KEYS or journal["format"] != JOURNAL_FORMAT:
        _refuse_journal(path, f"it is not a format {JOURNAL_FORMAT} journal")
    if journal["manifest"] != os.path.abspath(manifest_path):
        _refuse_journal(path, f"it names the manifest {journal['manifest']!r}, this run's is {manifest_path}")
    stage = journal["stage"]
    if not (isinstance(stage, str) and os.path.dirname(stage) == work and STAGE_RE.match(os.path.basename(stage))):
        _refuse_journal(path, f"its stage {stage!r} is not the module's own (stage-XXXXXXXX in {work})")
    try:
        info = os.lstat(stage)
    except FileNotFoundError:
        _refuse_journal(path, f"its stage {stage} does not exist")
    if not stat.S_ISDIR(info.st_mode):
        _refuse_journal(path, f"its stage {stage} is not a directory (a symbolic link?)")
    try:
        _own(stage, info, "the stage")
    except DDTreeError as exc:
        _refuse_journal(path, str(exc))
    if not isinstance(journal["held"], bool) or not all(
            journal[k] is None or isinstance(journal[k], dict) for k in ("manifest_before", "manifest_after")):
        _refuse_journal(path, "its held state or manifests are malformed")
    entries = journal["entries"]
    if not isinstance(entries, list):
        _refuse_journal(path, "its entries are not a list")
    seen = set()
    for number, entry in enumerate(entries):
        if not (isinstance(entry, dict) and set(entry) == ENTRY_KEYS and isinstance(entry["path"], str)
                and _sha_or_none(entry["before"]) and _sha_or_none(entry["after"])):
            _refuse_journal(path, f"entry {number} is malformed: {entry!r}")
        try:
            target = confined(site, entry["path"], f"entry {number}")
        except DDTreeError as exc:
            _refuse_journal(path, str(exc))
        if target in seen:
            _refuse_journal(path, f"entry {number} names {entry['path']} twice")
        seen.add(target)
        for key, suffix, digest in (("new", "new", entry["after"]), ("old", "old", entry["before"])):
            want = None if digest is None else os.path.join(stage, f"{number}.{suffix}")
            if entry[key] != want:
                _refuse_journal(path, f"entry {number}'s {key} copy {entry[key]!r} is not the stage's own ({want})")
        if sha256_file(target) == entry["before"] or entry["before"] is None:
            continue
        try:
            info = os.lstat(entry["old"])
        except FileNotFoundError:
            info = None
        if info is None or not stat.S_ISREG(info.st_mode) or sha256_file(entry["old"]) != entry["before"]:
            raise DDTreeError(f"cannot roll back {entry['path']}: its saved copy {entry['old']} is missing or changed "
                              f"(not sha256 {entry['before']}); nothing was changed. Reinstall SGLang "
                              f"{journal.get('sglang_version')} and remove {path}")
    return journal


def roll_back(site: str, manifest_path: str) -> list[str]:
    """Undo an interrupted transaction: every file back to what it was before it began, and the
    manifest too. Returns the files put back. Safe to run again if it is itself interrupted.
    The journal is validated (``pending``) before anything is touched."""
    journal = pending(site, manifest_path)
    if journal is None:
        return []
    restored = []
    for entry in reversed(journal["entries"]):
        target = confined(site, entry["path"], "roll back")
        if sha256_file(target) == entry["before"]:
            continue
        if entry["before"] is None:
            os.unlink(target)
        elif sha256_file(entry["old"]) == entry["before"]:
            os.replace(entry["old"], target)
        else:
            raise DDTreeError(f"cannot roll back {entry['path']}: its saved copy {entry['old']} is missing or changed; "
                              f"reinstall SGLang {journal.get('sglang_version')} and remove {journal_path(site)}")
        restored.append(entry["path"])
        state_files.fsync_dir(os.path.dirname(target))
    before = journal.get("manifest_before")
    if before is None:
        if os.path.lexists(journal["manifest"]):
            os.unlink(journal["manifest"])
    else:
        write_json(journal["manifest"], before)
    if before is None or before.get("state") != "applied":
        # No build is left applied: the originals kept for the one rolled back are not needed.
        shutil.rmtree(originals_dir(journal["manifest"]), ignore_errors=True)
    os.unlink(journal_path(site))
    shutil.rmtree(journal["stage"], ignore_errors=True)
    _tidy(site)
    return restored


def held(site: str, manifest_path: str) -> dict | None:
    """The journal of a build applied and held for its probe, None when there is none."""
    journal = pending(site, manifest_path)
    return journal if journal is not None and journal.get("held") else None


def commit(site: str, manifest_path: str) -> dict | None:
    """End a held transaction: the build stays, its manifest says ``applied``. Returns the
    manifest written, None when no build is held."""
    journal = held(site, manifest_path)
    if journal is None:
        return None
    for entry in journal["entries"]:
        if sha256_file(os.path.join(site, entry["path"])) != entry["after"]:
            raise DDTreeError(f"{entry['path']} changed while the build was held for its probe; "
                              "roll it back (state=rollback) and apply it again")
    write_json(journal["manifest"], journal["manifest_after"])
    os.unlink(journal_path(site))
    shutil.rmtree(journal["stage"], ignore_errors=True)
    _tidy(site)
    return journal["manifest_after"]


def _tidy(site: str) -> None:
    """Remove the work directory once no change is under way."""
    try:
        os.rmdir(os.path.join(site, WORK_DIR))
    except OSError:
        pass


def transact(site: str, ops: dict[str, bytes | None], manifest_path: str, manifest_before: dict | None,
             manifest_during: dict, manifest_after: dict, hold: bool = False) -> None:
    """Lay ``ops`` (path -> new bytes, None = remove) over site-packages, all or nothing. With ``hold``
    the transaction stays open once the files are in place (manifest ``pending``): commit() or
    roll_back() ends it. Every path is confined (``confined``) before anything changes, and again
    just before its file is replaced."""
    for path in ops:
        confined(site, path, "the build")
    work = os.path.join(site, WORK_DIR)
    try:
        os.mkdir(work, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(work)
    if not stat.S_ISDIR(info.st_mode):
        raise DDTreeError(f"the work directory {work} is not a directory (a symbolic link?): this module did not make "
                          "it; move it away")
    _own(work, info, "the work directory")
    if os.path.lexists(journal_path(site)):
        raise DDTreeError(f"an interrupted build is pending ({journal_path(site)}); it must be rolled back first")
    stage = tempfile.mkdtemp(prefix="stage-", dir=work)
    entries = []
    try:
        for number, (path, data) in enumerate(sorted(ops.items())):
            target = confined(site, path, "the build")
            entry = {"path": path, "before": sha256_file(target), "after": sha256_bytes(data), "new": None, "old": None}
            if data is not None:
                entry["new"] = os.path.join(stage, f"{number}.new")
                with open(entry["new"], "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                mode = os.stat(target).st_mode & 0o7777 if os.path.exists(target) else 0o644
                os.chmod(entry["new"], mode)
            if entry["before"] is not None:
                entry["old"] = os.path.join(stage, f"{number}.old")
                try:
                    os.link(target, entry["old"])
                except OSError:
                    shutil.copy2(target, entry["old"])
            if data is not None and not os.path.isdir(os.path.dirname(target)):
                raise DDTreeError(f"{path}: the directory {os.path.dirname(target)} does not exist in the installed SGLang")
            entries.append(entry)
        state_files.fsync_dir(stage)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        _tidy(site)
        raise
    journal = {"format": JOURNAL_FORMAT, "stage": stage, "entries": entries, "manifest": os.path.abspath(manifest_path),
               "manifest_before": manifest_before, "held": hold, "manifest_after": manifest_after if hold else None,
               "sglang_version": manifest_after.get("sglang_version")}
    journal["checksum"] = journal_checksum(journal)
    write_atomic(journal_path(site), (json.dumps(journal, indent=2, sort_keys=True) + "\n").encode(), 0o600)
    try:
        write_json(manifest_path, manifest_during)
        for entry in entries:
            target = confined(site, entry["path"], "the build")
            if entry["new"] is not None:
                replace_file(entry["new"], target)
            elif os.path.lexists(target):
                os.unlink(target)
            state_files.fsync_dir(os.path.dirname(target))
    except Exception as exc:
        roll_back(site, manifest_path)
        raise DDTreeError(f"the build was interrupted ({exc}); every file was put back as it was") from exc
    if hold:
        write_json(manifest_path, dict(manifest_after, state="pending"))
        return
    write_json(manifest_path, manifest_after)
    os.unlink(journal_path(site))
    shutil.rmtree(stage, ignore_errors=True)
    _tidy(site)


# -- planning ----------------------------------------------------------------

class Plan(t.NamedTuple):
    changed: bool
    ops: dict[str, bytes | None]
    files: list[dict]
    backups: dict[str, bytes]
    manifest: dict | None


def _read_input(src: str, expected: str, what: str) -> bytes:
    try:
        with open(src, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise DDTreeError(f"{what}: cannot read {src} ({exc.strerror})") from exc
    actual = sha256_bytes(data)
    if actual != expected:
        raise DDTreeError(f"{what}: checksum mismatch for {src}: expected {expected}, got {actual}")
    return data


def _pristine(site: str, path: str, expected: dict[str, str], applied: dict[str, dict], backups_dir: str) -> bytes | None:
    """The pinned SGLang's content of ``path`` (None: SGLang has no such file), verified by checksum."""
    target = confined(site, path, path)
    current = read_optional(target)
    current_sha = sha256_bytes(current)
    if path in applied:
        record = applied[path]
        if current_sha == record["original_sha256"]:
            return current
        if current_sha != record["result_sha256"]:
            raise DDTreeError(
                f"{path} changed since the build was applied (sha256 {current_sha}, the build wrote "
                f"{record['result_sha256']}): was SGLang reinstalled or the file edited? Reinstall the pinned SGLang "
                "and move the manifest away")
        if record["original_sha256"] is None:
            return None
        backup = read_optional(backup_path(backups_dir, path))
        if sha256_bytes(backup) != record["original_sha256"]:
            raise DDTreeError(f"the saved original of {path} in {backups_dir} is missing or changed")
        return backup
    want = expected.get(path)
    if want is None:
        if current is not None:
            raise DDTreeError(
                f"{path} exists but the pinned SGLang has no such file (it is neither in the package RECORD nor in "
                "originals) and no build manifest accounts for it: remove it or give its checksum in originals")
        return None
    if current is None:
        raise DDTreeError(f"{path} is missing from the installed SGLang")
    if current_sha != want:
        raise DDTreeError(f"{path} is not the pinned SGLang's file: sha256 {current_sha}, expected {want}")
    return current


def plan_apply(site: str, source: str, inputs: list[dict], sglang_version: str, originals: dict[str, str],
               manifest_path: str, strip: int = 1) -> tuple[Plan, dict[str, bytes | None]]:
    """What applying the build changes. ``inputs``: for a patch series [{name, src, sha256}] in order, for an
    overlay [{name (the path inside site-packages), src, sha256}]. Nothing on the host changes here."""
    if source not in SOURCES:
        raise DDTreeError(f"source must be one of {', '.join(SOURCES)}, got {source!r}")
    if not inputs:
        raise DDTreeError(f"the {source} build has no inputs")
    installed = installed_version(site)
    if installed != sglang_version:
        raise DDTreeError(f"the build is for SGLang {sglang_version} but {site} has SGLang {installed}")
    data = [(item, _read_input(item["src"], item["sha256"], item["name"])) for item in inputs]
    expected = record_hashes(site)
    expected.update(originals)
    manifest = read_manifest(manifest_path)
    applied = {}
    if manifest and manifest.get("state") == "applied" and manifest.get("site_packages") == site:
        applied = applied_files(site, manifest, manifest_path)
    backups_dir = originals_dir(manifest_path)
    pristine: dict[str, bytes | None] = {}
    results: dict[str, bytes | None] = {}

    def content(path: str, what: str = "the build manifest") -> bytes | None:
        confined(site, path, what)
        if path not in pristine:
            pristine[path] = _pristine(site, path, expected, applied, backups_dir)
        return results[path] if path in results else pristine[path]

    if source == "overlay":
        seen = set()
        for item, raw in data:
            path = safe_relpath(item["name"], "overlay file")
            if path in seen:
                raise DDTreeError(f"overlay file {path} is listed twice")
            seen.add(path)
            content(path, "overlay file")
            results[path] = raw
    else:
        for item, raw in data:
            for file_patch in parse_patch(raw, item["name"], strip):
                results[file_patch.path] = apply_file_patch(content(file_patch.path, item["name"]), file_patch,
                                                            item["name"])
    for path in applied:
        content(path)
    return _finish(site, source, inputs, sglang_version, manifest, applied, pristine, results), results


def _finish(site: str, source: str, inputs: list[dict], sglang_version: str, manifest: dict | None,
            applied: dict[str, dict], pristine: dict[str, bytes | None], results: dict[str, bytes | None]) -> Plan:
    files = [{"path": path, "original_sha256": sha256_bytes(pristine[path]), "result_sha256": sha256_bytes(results[path])}
             for path in sorted(results)]
    ops: dict[str, bytes | None] = {}
    for path in sorted(set(results) | set(applied)):
        target = results[path] if path in results else pristine[path]
        if sha256_file(os.path.join(site, path)) != sha256_bytes(target):
            ops[path] = target
    backups = {path: t.cast(bytes, pristine[path]) for path in results
               if pristine[path] is not None and path not in applied}
    record = {"format": MANIFEST_FORMAT, "state": "applied", "sglang_version": sglang_version, "site_packages": site,
              "source": source, "build_id": build_id(source, inputs),
              "inputs": [{"name": i["name"], "src": i["src"], "sha256": i["sha256"]} for i in inputs], "files": files}
    same = manifest is not None and all(manifest.get(k) == v for k, v in record.items())
    return Plan(bool(ops) or not same, ops, files, backups, record)


def apply(site: str, plan: Plan, manifest_path: str, built_by: str, hold: bool = False) -> dict:
    """Carry out ``plan`` and return the manifest it ends with (``hold``: the one commit() writes;
    the manifest on the host says ``pending`` until then)."""
    before = read_manifest(manifest_path)
    if not plan.changed and before is not None:
        return before
    backups_dir = originals_dir(manifest_path)
    if plan.backups:
        # Its own mode, not the umask's: the directory is checked (no link, not writable by others) on every use.
        os.makedirs(os.path.dirname(backups_dir), exist_ok=True)
        try:
            os.mkdir(backups_dir, 0o700)
        except FileExistsError:
            pass
    for path, data in plan.backups.items():
        target = backup_path(backups_dir, path)
        if sha256_file(target) != sha256_bytes(data):
            write_atomic(target, data)
    record = dict(t.cast(dict, plan.manifest), applied_at=now(), applied_by=built_by)
    transact(site, plan.ops, manifest_path, before, dict(record, state="applying"), record, hold)
    return record


def plan_revert(site: str, manifest_path: str) -> tuple[dict | None, dict[str, bytes | None]]:
    """The manifest to revert (None: nothing applied) and the files to put back."""
    manifest = read_manifest(manifest_path)
    if manifest is None or manifest.get("state") != "applied":
        return None, {}
    if manifest.get("site_packages") != site:
        raise DDTreeError(f"the build in {manifest_path} was applied to {manifest.get('site_packages')}, not {site}")
    applied = applied_files(site, manifest, manifest_path)
    ops: dict[str, bytes | None] = {}
    for path in sorted(applied):
        original = _pristine(site, path, {}, applied, originals_dir(manifest_path))
        if sha256_file(os.path.join(site, path)) != applied[path]["original_sha256"]:
            ops[path] = original
    return manifest, ops


def revert(site: str, manifest: dict, ops: dict[str, bytes | None], manifest_path: str, reverted_by: str) -> dict:
    record = dict(manifest, state="reverted", reverted_at=now(), reverted_by=reverted_by)
    transact(site, ops, manifest_path, manifest, dict(manifest, state="reverting"), record)
    shutil.rmtree(originals_dir(manifest_path), ignore_errors=True)
    return record


# -- the installed Python's view -------------------------------------------

COMPILE_PROBE = (
    "import json, sys\n"
    "files = json.load(sys.stdin)\n"
    "errors = []\n"
    "for path, text in files.items():\n"
    "    try:\n"
    "        compile(text, path, 'exec', dont_inherit=True)\n"
    "    except SyntaxError as exc:\n"
    "        errors.append(f'{path} line {exc.lineno}: {exc.msg}')\n"
    "print(json.dumps(errors))\n"
)


def compile_input(results: dict[str, bytes | None]) -> str:
    """The Python files of a build, for COMPILE_PROBE on the host's interpreter (its stdin)."""
    return json.dumps({path: data.decode("utf-8", "surrogateescape") for path, data in results.items()
                       if data is not None and path.endswith(".py")})
