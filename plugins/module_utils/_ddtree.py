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
import tempfile
import typing as t

WORK_DIR = ".inferops-ddtree"
JOURNAL = "journal.json"
MANIFEST_FORMAT = 1
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


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write a file by rename, so a reader sees the old or the new content, never part of one."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(directory)


def write_json(path: str, data: dict) -> None:
    write_atomic(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def read_manifest(path: str) -> dict | None:
    if not os.path.exists(path):
        return None
    try:
        with open(path, "r", encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError) as exc:
        raise DDTreeError(f"the build manifest {path} is unreadable ({exc}); move it away only if no build is applied")
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise DDTreeError(f"the build manifest {path} is not a format {MANIFEST_FORMAT} manifest")
    return data


def originals_dir(manifest_path: str) -> str:
    return os.path.join(os.path.dirname(manifest_path), "originals")


def journal_path(site: str) -> str:
    return os.path.join(site, WORK_DIR, JOURNAL)


def pending(site: str) -> dict | None:
    """The journal of an interrupted transaction, None when there is none."""
    path = journal_path(site)
    if not os.path.exists(path):
        return None
    with open(path, "r", encoding="utf-8") as handle:
        return json.load(handle)


def roll_back(site: str) -> list[str]:
    """Undo an interrupted transaction: every file back to what it was before it began, and the
    manifest too. Returns the files put back. Safe to run again if it is itself interrupted."""
    journal = pending(site)
    if journal is None:
        return []
    restored = []
    for entry in reversed(journal["entries"]):
        target = os.path.join(site, entry["path"])
        if sha256_file(target) == entry["before"]:
            continue
        if entry["before"] is None:
            os.unlink(target)
        elif entry["old"] and os.path.exists(entry["old"]) and sha256_file(entry["old"]) == entry["before"]:
            os.replace(entry["old"], target)
        else:
            raise DDTreeError(f"cannot roll back {entry['path']}: its saved copy {entry['old']} is missing or changed; "
                              f"reinstall SGLang {journal.get('sglang_version')} and remove {journal_path(site)}")
        restored.append(entry["path"])
        _fsync_dir(os.path.dirname(target))
    before = journal.get("manifest_before")
    if before is None:
        if os.path.exists(journal["manifest"]):
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


def held(site: str) -> dict | None:
    """The journal of a build applied and held for its probe, None when there is none."""
    journal = pending(site)
    return journal if journal is not None and journal.get("held") else None


def commit(site: str) -> dict | None:
    """End a held transaction: the build stays, its manifest says ``applied``. Returns the
    manifest written, None when no build is held."""
    journal = held(site)
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
    roll_back() ends it."""
    work = os.path.join(site, WORK_DIR)
    os.makedirs(work, mode=0o700, exist_ok=True)
    if os.path.exists(journal_path(site)):
        raise DDTreeError(f"an interrupted build is pending ({journal_path(site)}); it must be rolled back first")
    stage = tempfile.mkdtemp(prefix="stage-", dir=work)
    entries = []
    try:
        for number, (path, data) in enumerate(sorted(ops.items())):
            target = os.path.join(site, path)
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
        _fsync_dir(stage)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        _tidy(site)
        raise
    write_json(journal_path(site), {"stage": stage, "entries": entries, "manifest": manifest_path,
                                    "manifest_before": manifest_before, "held": hold,
                                    "manifest_after": manifest_after if hold else None,
                                    "sglang_version": manifest_after.get("sglang_version")})
    try:
        write_json(manifest_path, manifest_during)
        for entry in entries:
            target = os.path.join(site, entry["path"])
            if entry["new"] is not None:
                replace_file(entry["new"], target)
            elif os.path.lexists(target):
                os.unlink(target)
            _fsync_dir(os.path.dirname(target))
    except Exception as exc:
        roll_back(site)
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
    target = os.path.join(site, path)
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
        backup = read_optional(os.path.join(backups_dir, path))
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
        applied = {f["path"]: f for f in manifest["files"]}
    backups_dir = originals_dir(manifest_path)
    pristine: dict[str, bytes | None] = {}
    results: dict[str, bytes | None] = {}

    def content(path: str) -> bytes | None:
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
            content(path)
            results[path] = raw
    else:
        for item, raw in data:
            for file_patch in parse_patch(raw, item["name"], strip):
                results[file_patch.path] = apply_file_patch(content(file_patch.path), file_patch, item["name"])
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
    for path, data in plan.backups.items():
        target = os.path.join(backups_dir, path)
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
    applied = {f["path"]: f for f in manifest["files"]}
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
