# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Model weights staged from a mirror, verified, then swapped into place atomically.

A model directory on a host is a symlink, ``<parent>/<name>`` ->
``<parent>/.<name>.revisions/<revision>/``. A stage fetches every file the mirror's
manifest lists into ``.<name>.revisions/.staging-<revision>/`` (kept across runs: an
interrupted download resumes, with an HTTP Range request or a seek in a local file),
verifies each file's size and sha256 and each safetensors file's header, writes the
marker ``.inferops-model.json``, renames the staging directory to its revision, and
points the symlink at it with one ``rename`` (a directory that was there before is
exchanged with the symlink in one ``renameat2(RENAME_EXCHANGE)`` and kept as
``previous-<time>``). Anything refused leaves the model path as it was.

The manifest (``inferops-manifest.json`` at the mirror, ``make_manifest`` writes one)::

    {"revision": "2026-11-30", "files": {"config.json": {"size": 1234, "sha256": "..."}, ...}}

The quick check (the deploy's preflight): every file the manifest lists is there with
its size, every safetensors header parses and its tensors end at the file's end, every
shard the safetensors index names is there. Without a manifest, the index and the
headers alone. The full check adds every file's sha256.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import http.client
import json
import os
import re
import shutil
import stat
import struct
import time
import urllib.error
from urllib.parse import quote, urlsplit, urlunsplit

try:
    from ansible_collections.inferops.sglang.plugins.module_utils import _prom_targets
    from ansible_collections.inferops.sglang.plugins.module_utils import _state_files as files
except ImportError:  # loaded from the tree (tools/)
    import _prom_targets  # type: ignore[no-redef]
    import _state_files as files  # type: ignore[no-redef]

MANIFEST = "inferops-manifest.json"
MARKER = ".inferops-model.json"
INDEX = "model.safetensors.index.json"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# A safetensors header larger than this is not a header (the format's own limit is 100 MB).
_MAX_HEADER = 100 * 1024 * 1024
_CHUNK = 1 << 20


class StageError(Exception):
    """A stage or a check that cannot succeed; the message says why and what was left."""


# -- the manifest ------------------------------------------------------------------------

def safe_relpath(name: object) -> str | None:
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name or "\x00" in name:
        return None
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts) or parts[0] in (MARKER,):
        return None
    return name


def parse_manifest(text: str, where: str) -> dict:
    """The manifest's files, checked: relative paths inside the model, a size and a sha256 each."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise StageError(f"{where} is not a manifest (not JSON: {exc})") from exc
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not files:
        raise StageError(f"{where} is not a manifest: no files")
    problems = []
    for name, entry in files.items():
        if safe_relpath(name) is None:
            problems.append(f"{name!r} is not a path inside the model")
        elif (not isinstance(entry, dict) or isinstance(entry.get("size"), bool) or not isinstance(entry.get("size"), int)
              or entry["size"] < 0 or not isinstance(entry.get("sha256"), str) or not _HEX64.match(entry["sha256"])):
            problems.append(f"{name}: needs a size (bytes) and a sha256 (64 hex digits)")
    if problems:
        raise StageError(f"{where}: " + "; ".join(problems))
    revision = data.get("revision")
    return {"revision": revision if isinstance(revision, str) else None, "files": files}


def make_manifest(directory: str, revision: str) -> dict:
    """The manifest of a model directory (every regular file but the marker), for a mirror."""
    files = {}
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, directory).replace(os.sep, "/")
            if rel in (MARKER, MANIFEST) or not os.path.isfile(path):
                continue
            files[rel] = {"size": os.path.getsize(path), "sha256": sha256_of(path)}
    return {"revision": revision, "files": files}


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


# -- checks ------------------------------------------------------------------------------

def safetensors_problem(path: str) -> str | None:
    """Why a safetensors file is not whole: its 8-byte header length, its JSON header, and
    its tensors' data ending exactly at the file's end (a cut download ends early)."""
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"{size} bytes, shorter than a safetensors header"
        (length,) = struct.unpack("<Q", head)
        if length > _MAX_HEADER or 8 + length > size:
            return f"header length {length} does not fit its {size} bytes"
        raw = handle.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        return f"header does not parse ({exc})"
    if not isinstance(header, dict):
        return "header is not a JSON object"
    end = 0
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        offsets = tensor.get("data_offsets") if isinstance(tensor, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return f"tensor {name} has no data_offsets"
        end = max(end, offsets[1])
    if 8 + length + end != size:
        return f"its tensors end at byte {8 + length + end}, the file has {size}"
    return None


def check(directory: str, manifest: dict | None, full: bool = False) -> list[str]:
    """What is wrong with a model directory (empty: nothing). With a manifest, it is the
    authority: every file it lists is there with its size (and its sha256 when ``full``),
    and each safetensors file it lists has a header that parses and tensors that end at the
    file's end. Without one: every shard the safetensors index names is there, and every
    safetensors file passes the header check; a directory with neither is refused."""
    if not os.path.isdir(directory):
        return [f"{directory} is not a directory"]
    problems: list[str] = []
    if manifest:
        weights = []
        for name, entry in manifest["files"].items():
            path = os.path.join(directory, name)
            if not os.path.isfile(path):
                problems.append(f"{name} is missing")
                continue
            size = os.path.getsize(path)
            if size != entry["size"]:
                problems.append(f"{name} has {size} bytes, the manifest {entry['size']}")
                continue
            if full and sha256_of(path) != entry["sha256"]:
                problems.append(f"{name}: sha256 differs from the manifest's")
            if name.endswith(".safetensors"):
                weights.append(name)
        return problems + _headers(directory, weights)
    shards: set[str] = set()
    index = os.path.join(directory, INDEX)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as handle:
                weight_map = json.load(handle).get("weight_map")
            shards = {s for s in weight_map.values() if isinstance(s, str)} if isinstance(weight_map, dict) else set()
        except (OSError, ValueError, AttributeError) as exc:
            problems.append(f"{INDEX} does not parse ({exc})")
        for shard in sorted(shards):
            if safe_relpath(shard) is None or not os.path.isfile(os.path.join(directory, shard)):
                problems.append(f"shard {shard} named by {INDEX} is missing")
    present = [n for n in _listing(directory) if n.endswith(".safetensors") and os.path.isfile(os.path.join(directory, n))]
    present += [s for s in sorted(shards) if s not in present and safe_relpath(s) and os.path.isfile(os.path.join(directory, s))]
    if not shards and not present and not problems:
        return [f"{directory} has no {MANIFEST}, no {INDEX} and no .safetensors file to check"]
    return problems + _headers(directory, present)


def _headers(directory: str, names: list[str]) -> list[str]:
    problems = []
    for name in names:
        problem = safetensors_problem(os.path.join(directory, name))
        if problem:
            problems.append(f"{name}: {problem}")
    return problems


def _listing(directory: str) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except OSError:
        return []


def local_manifest(directory: str) -> dict | None:
    """The manifest a model directory carries (the stage writes it in), or None."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return parse_manifest(handle.read(), path)


# -- sources -----------------------------------------------------------------------------

class Source:
    """A mirror: an http(s) base URL, or a local or NFS directory.

    Plain ``http://`` is refused unless the mirror is on this host's loopback or ``allow_http``
    says so (anyone on the path could choose the weights, only the manifest's digest would
    tell); a redirect to another scheme or host is refused. A local mirror's files are opened
    under its root without following a link (a link there could make root copy any file of the
    host into the model), regular files only. ``shown``: the location without credentials."""

    def __init__(self, location: str, timeout: float = 60.0, validate_certs: bool = True, allow_http: bool = False) -> None:
        self.location = location.rstrip("/")
        self.timeout = timeout
        parts = urlsplit(location)
        self.http = parts.scheme in ("http", "https")
        if not self.http and location.startswith("file://"):
            self.location = parts.path.rstrip("/")
        if not self.http and not os.path.isabs(self.location):
            raise StageError(f"source {_shown(location)!r} is neither an http(s) URL nor an absolute path")
        self.shown = _shown(self.location)
        if parts.scheme == "http" and not allow_http and not _prom_targets.loopback(parts.hostname or ""):
            raise StageError(f"source {self.shown} is plain http: anyone on the way could choose the weights; use https, "
                             "or allow it (allow_http) for a mirror on a network you trust")
        self.validate_certs = validate_certs

    def _open(self, name: str, headers: dict | None = None):
        """GET one file with Ansible's own HTTP client (proxies, TLS checks, redirects within the
        mirror's scheme and host only). Imported here: the checks and the manifest
        (tools/inferops_model_manifest.py) run without Ansible."""
        from ansible.module_utils import urls  # pylint: disable=import-outside-toplevel
        try:
            resp = urls.open_url(self._url(name), headers=headers or {}, timeout=self.timeout,
                                 validate_certs=self.validate_certs, follow_redirects="safe")
        except urls.ConnectionError as exc:  # a TLS check or a proxy that failed: not an HTTP answer
            raise OSError(str(exc)) from exc
        asked, got = urlsplit(self.location), urlsplit(resp.geturl())
        if (got.scheme, got.hostname, got.port) != (asked.scheme, asked.hostname, asked.port):
            resp.close()
            raise StageError(f"{name}: the mirror redirected to {_shown(resp.geturl())}, another scheme or host than "
                             f"{self.shown}: refused")
        return resp

    def _url(self, name: str) -> str:
        return f"{self.location}/{quote(name)}"

    def _open_local(self, name: str):
        """``name`` (a manifest's relative path) under the local mirror's root, every part of it
        opened without following a link; a regular file, else OSError."""
        fd = os.open(self.location, os.O_RDONLY | os.O_DIRECTORY)
        try:
            parts = name.split("/")
            for part in parts[:-1]:
                following = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = following
            file_fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
        finally:
            os.close(fd)
        if not stat.S_ISREG(os.fstat(file_fd).st_mode):
            os.close(file_fd)
            raise OSError(errno.EINVAL, "not a regular file")
        return os.fdopen(file_fd, "rb")

    def read_text(self, name: str) -> str:
        if not self.http:
            try:
                with self._open_local(name) as handle:
                    return handle.read(16 << 20).decode("utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                if isinstance(exc, OSError) and exc.errno == errno.ELOOP:
                    why = "a symbolic link, not followed"
                raise StageError(f"{name} cannot be read at the source {self.shown}: {why}") from exc
        try:
            with self._open(name) as resp:
                return resp.read(16 << 20).decode("utf-8")
        except urllib.error.HTTPError as exc:
            raise StageError(f"{name} at {self.shown}: HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError, UnicodeDecodeError) as exc:
            raise StageError(f"{name} at {self.shown}: {getattr(exc, 'reason', exc)}") from exc

    def fetch(self, name: str, target: str, size: int) -> tuple[int, bool]:
        """Bring ``name`` into ``target``, continuing a partial file; (bytes fetched, resumed).
        Never more than ``size`` (the manifest's) is written: a source that sends more is
        refused and what it sent removed."""
        have = os.path.getsize(target) if os.path.exists(target) else 0
        if have > size:
            os.unlink(target)
            have = 0
        if have == size:
            return 0, False
        return (self._copy(name, target, have, size) if not self.http else self._download(name, target, have, size)), have > 0

    @staticmethod
    def _write_capped(read, out, name: str, target: str, room: int) -> int:
        """Copy ``read(n)`` blocks into ``out`` up to ``room`` bytes; one byte more is an error."""
        done = 0
        while True:
            block = read(min(_CHUNK, room - done + 1))
            if not block:
                return done
            if done + len(block) > room:
                out.close()
                os.unlink(target)
                raise StageError(f"{name}: the source sends more than the manifest's size; what it sent was removed "
                                 "from the staging directory, nothing more is read")
            out.write(block)
            done += len(block)

    def _copy(self, name: str, target: str, offset: int, size: int) -> int:
        try:
            src = self._open_local(name)
        except OSError as exc:
            why = "a symbolic link, not followed" if exc.errno == errno.ELOOP else exc.strerror
            raise StageError(f"{name} listed in the manifest is missing at the source {self.shown} ({why})") from exc
        with src, open(target, "ab") as out:
            src.seek(offset)
            return self._write_capped(src.read, out, name, target, size - offset)

    def _download(self, name: str, target: str, offset: int, size: int) -> int:
        done = 0
        try:
            with self._open(name, {"Range": f"bytes={offset}-"} if offset else None) as resp:
                if offset and resp.status != 206:
                    offset = 0  # the server sends the whole file: start it again
                announced = resp.headers.get("Content-Length")
                with open(target, "ab" if offset else "wb") as out:
                    def read(n: int) -> bytes:
                        nonlocal done
                        block = resp.read(n)
                        done += len(block)
                        return block
                    self._write_capped(read, out, name, target, size - offset)
                if announced and announced.isdigit() and done < int(announced):
                    raise http.client.IncompleteRead(b"", int(announced) - done)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise StageError(f"{name} listed in the manifest is missing at the source (HTTP 404 at "
                                 f"{self.shown}/{quote(name)})") from exc
            raise StageError(f"{name}: HTTP {exc.code} at {self.shown}/{quote(name)}") from exc
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            why = getattr(exc, "reason", None) or (f"{exc.expected} bytes short" if isinstance(exc, http.client.IncompleteRead)
                                                   else exc)
            raise StageError(f"the download of {name} was interrupted after {offset + done} bytes "
                             f"({why}); what arrived is kept: run again to resume") from exc
        return done


def _shown(location: str) -> str:
    """A location without the credentials a URL may carry (user:password@)."""
    parts = urlsplit(location)
    if parts.scheme not in ("http", "https") or "@" not in parts.netloc:
        return location
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


# -- the stage ---------------------------------------------------------------------------

def layout(dest: str, revision: str) -> dict:
    parent, name = os.path.split(os.path.abspath(dest).rstrip("/"))
    store = os.path.join(parent, f".{name}.revisions")
    return {"parent": parent, "name": name, "store": store, "final": os.path.join(store, revision),
            "staging": os.path.join(store, f".staging-{revision}")}


def _trusted_parent(paths: dict) -> None:
    """StageError when another user could rearrange the model's parent directory (its owner is
    neither root nor the user staging, or group or others may write it) or has put a link in
    place of the revisions' directory: a stage moves, removes and prunes directories there, as
    root, and a planted link would make it do so elsewhere."""
    try:
        info = os.stat(paths["parent"])
    except FileNotFoundError:
        return  # made by the stage, as root's
    if info.st_uid not in (0, os.geteuid()) or info.st_mode & 0o022:
        raise StageError(f"{paths['parent']} (the model's parent directory) can be changed by another user "
                         f"(owner uid {info.st_uid}, mode {info.st_mode & 0o7777:04o}): a stage there would move and "
                         "remove directories it could plant; make it root's and not group or world writable")
    if os.path.islink(paths["store"]):
        raise StageError(f"{paths['store']} is a symbolic link: the revisions' directory is not followed")


def current(dest: str) -> dict:
    """What the model path is now: absent, a directory, or a symlink and its revision marker."""
    if os.path.islink(dest):
        target = os.path.realpath(dest)
        marker = _read_marker(target)
        return {"kind": "symlink", "target": target, "marker": marker}
    if os.path.isdir(dest):
        return {"kind": "directory", "target": dest, "marker": _read_marker(dest)}
    if os.path.exists(dest):
        return {"kind": "other", "target": dest, "marker": None}
    return {"kind": "absent", "target": None, "marker": None}


def _read_marker(directory: str) -> dict | None:
    return files.read_json(os.path.join(directory, MARKER))


def check_revision(revision: str) -> None:
    if not isinstance(revision, str) or not _REVISION.match(revision):
        raise StageError(f"revision {revision!r} must be 1-128 of A-Z a-z 0-9 . _ - (it names a directory)")


def _exchange(one: str, other: str) -> bool:
    """renameat2(RENAME_EXCHANGE): swap two paths in one step; False where the kernel or libc lacks it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(one), at_fdcwd, os.fsencode(other), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(code, os.strerror(code), other)


def swap_in(dest: str, final: str, now: float) -> str | None:
    """Point ``dest`` at ``final`` in one step; the directory that was ``dest`` (if any) is
    kept beside the revisions. Returns where the previous model is now, or None."""
    temp = f"{dest}.inferops-link-{os.getpid()}"
    if os.path.lexists(temp):
        os.unlink(temp)
    os.symlink(os.path.relpath(final, os.path.dirname(os.path.abspath(dest))), temp)
    state = current(dest)
    if state["kind"] in ("absent", "symlink"):
        os.replace(temp, dest)
        return state["target"]
    if state["kind"] != "directory":
        os.unlink(temp)
        raise StageError(f"{dest} is neither a directory nor a symlink: nothing is changed")
    kept = os.path.join(os.path.dirname(final), "previous-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now)))
    if _exchange(temp, dest):
        os.rename(temp, kept)  # temp now names the directory that was dest
    else:  # no renameat2: two renames, the model path absent between them
        os.rename(dest, kept)
        os.replace(temp, dest)
    return kept


def stage(dest: str, source: Source, revision: str, manifest_name: str = MANIFEST, keep: int = 2,
          check_mode: bool = False, now=time.time, manifest_sha256: str | None = None) -> dict:
    """Stage ``revision`` from ``source`` at ``dest``. Returns changed, path, previous,
    files, bytes, fetched_bytes, resumed, msg. StageError when refused; the model path is
    then unchanged and the staging directory (root's only, 0700, until the swap) keeps what
    was verified or partly fetched. ``manifest_sha256``: the manifest's digest as the
    inventory pins it; another manifest is refused before anything is fetched, as is a
    stage the file system's free space cannot hold."""
    check_revision(revision)
    if manifest_sha256 is not None and not _HEX64.match(manifest_sha256):
        raise StageError(f"manifest_sha256 must be 64 lowercase hex digits, got {manifest_sha256!r}")
    manifest_text = source.read_text(manifest_name)
    digest = hashlib.sha256(manifest_text.encode("utf-8")).hexdigest()
    if manifest_sha256 is not None and digest != manifest_sha256:
        raise StageError(f"the source's manifest {source.shown}/{manifest_name} has sha256 {digest}, not the pinned "
                         f"{manifest_sha256}: nothing is fetched")
    manifest = parse_manifest(manifest_text, f"{source.shown}/{manifest_name}")
    if manifest["revision"] not in (None, revision):
        raise StageError(f"the source's manifest is of revision {manifest['revision']}, not {revision}: "
                         "nothing is changed")
    paths = layout(dest, revision)
    _trusted_parent(paths)
    total = sum(e["size"] for e in manifest["files"].values())
    result = {"changed": False, "path": dest, "revision": revision, "previous": None, "files": len(manifest["files"]),
              "bytes": total, "fetched_bytes": 0, "resumed": [], "manifest_sha256": digest}
    now_state = current(dest)
    marker = now_state["marker"] or {}
    if (now_state["kind"] == "symlink" and marker.get("revision") == revision
            and marker.get("manifest_sha256") == digest and not check(now_state["target"], manifest)):
        return dict(result, msg=f"{dest} is revision {revision} already (quick check passed)")
    kept = _read_marker(paths["final"]) if os.path.isdir(paths["final"]) else None
    if (kept and kept.get("manifest_sha256") == digest and os.path.realpath(paths["final"]) != now_state["target"]
            and not check(paths["final"], manifest)):
        # a revision kept beside the model (the previous one): verified when it was staged,
        # whole now (quick check): swapped back in without a download
        if check_mode:
            return dict(result, changed=True, msg=f"would swap the kept revision {revision} back in at {dest}")
        previous = swap_in(dest, paths["final"], now())
        return dict(result, changed=True, previous=previous, pruned=prune(paths["store"], paths["final"], keep),
                    msg=f"swapped the kept revision {revision} back in at {dest} (quick check passed, nothing fetched)")
    if check_mode:
        return dict(result, changed=True, msg=f"would stage revision {revision} at {dest}")
    os.makedirs(paths["store"], mode=0o755, exist_ok=True)
    os.makedirs(paths["staging"], mode=0o700, exist_ok=True)
    os.chmod(paths["staging"], 0o700)  # no other user reads a revision before it is verified
    _room_for(paths["staging"], manifest)
    for name, entry in manifest["files"].items():
        target = os.path.join(paths["staging"], name)
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        fetched, resumed = source.fetch(name, target, entry["size"])
        result["fetched_bytes"] += fetched
        if resumed:
            result["resumed"].append(name)
        size = os.path.getsize(target)
        if size != entry["size"]:
            raise StageError(f"{name} arrived with {size} bytes, the manifest says {entry['size']}; "
                             "what arrived is kept: run again to resume")
        if sha256_of(target) != entry["sha256"]:
            os.unlink(target)
            raise StageError(f"{name} is corrupt: its sha256 differs from the manifest's (removed from the "
                             f"staging directory; {dest} is unchanged)")
    with open(os.path.join(paths["staging"], MANIFEST), "w", encoding="utf-8") as handle:
        handle.write(manifest_text)
    problems = check(paths["staging"], manifest)
    if problems:
        raise StageError(f"revision {revision} fails its checks: {'; '.join(problems)}; {dest} is unchanged")
    with open(os.path.join(paths["staging"], MARKER), "w", encoding="utf-8") as handle:
        json.dump({"revision": revision, "source": source.shown, "manifest_sha256": digest,
                   "staged_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now())),
                   "files": len(manifest["files"]), "bytes": total}, handle)
    final = paths["final"]
    if os.path.lexists(final):
        if now_state["kind"] == "symlink" and os.path.realpath(final) == now_state["target"]:
            # the model path points there now: the new copy gets a name of its own, so the
            # path keeps resolving to a whole model until the symlink moves
            final = f"{final}.{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now()))}"
        else:
            shutil.rmtree(final)
    os.chmod(paths["staging"], 0o755)  # verified: readable by the service, as the model was
    os.rename(paths["staging"], final)
    previous = swap_in(dest, final, now())
    result.update(changed=True, previous=previous, pruned=prune(paths["store"], final, keep),
                  msg=f"staged revision {revision} at {dest} ({len(manifest['files'])} files, {total} bytes, "
                      f"{result['fetched_bytes']} fetched)")
    return result


def _room_for(staging: str, manifest: dict) -> None:
    """StageError when the file system of ``staging`` has less room than the manifest's files
    still need (what is there already, whole or in part, counts), before anything is fetched."""
    needed = 0
    for name, entry in manifest["files"].items():
        try:
            have = os.path.getsize(os.path.join(staging, name))
        except OSError:
            have = 0
        needed += entry["size"] - have if have <= entry["size"] else entry["size"]
    info = os.statvfs(staging)
    free = info.f_bavail * info.f_frsize
    if needed > free:
        raise StageError(f"the stage needs {needed} bytes and {staging} has {free} free: nothing is fetched")


def prune(store: str, keep_path: str, keep: int) -> list[str]:
    """Remove revisions beyond the newest ``keep`` (the current one always stays)."""
    entries = [os.path.join(store, n) for n in _listing(store) if not n.startswith(".")]
    entries = [p for p in entries if os.path.isdir(p) and not os.path.islink(p)]
    entries.sort(key=os.path.getmtime, reverse=True)
    kept = [keep_path] + [p for p in entries if p != keep_path][:max(0, keep - 1)]
    removed = []
    for path in entries:
        if path not in kept:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(os.path.basename(path))
    return removed
