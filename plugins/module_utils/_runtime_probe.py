# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The runtime probe: prove, inside the SGLang virtual environment's own
interpreter, what the field story's crash lacked.

On ct129 the DDTree build passed its health check and then died on the first
real request: its kernels needed ``libcudart.so.12`` on a host with the CUDA 13
user space only. This module checks the same things before any unit starts:
the installed torch and sglang equal their pins, the pins agree with the
toolkit (``2.11.0+cu130`` for CUDA 13.0), ``torch.version.cuda`` equals the
toolkit's major.minor, the per-release CUDA libraries SGLang's kernel package
opens itself really load (``ctypes.CDLL``), and (``dependencies``) the dynamic
dependencies of every shared object of SGLang, its kernel packages,
flashinfer, torch and the installed DDTree build resolve: each file's ELF
``DT_NEEDED`` names, found the way glibc's loader finds them (RPATH, the
unit's ``LD_LIBRARY_PATH``, RUNPATH, ``/etc/ld.so.cache``, the default
directories). The files are the truth; nothing a build declares is trusted.

The checks run in a separate process, the venv's Python, with only the
environment the unit will have (``env -i``); the module reports that
environment, every variable, so that the unit can be given exactly it.
PROBE_SOURCE is that process's program (standard library only): it reads a
JSON request on stdin and prints one JSON line after MARKER. ELF_SOURCE (the
ELF reader and the resolver) is part of it and is also run here, as ``elf``,
for the tests. Everything else here is pure logic on that report.
"""

from __future__ import annotations

import json
import os
import re

try:
    from ansible_collections.inferops.sglang.plugins.module_utils import _sglang_releases as releases
except ImportError:  # loaded from the tree
    import _sglang_releases as releases  # type: ignore[no-redef]

MARKER = "INFEROPS_RUNTIME_PROBE "
CHECKS = ("versions", "torch", "libraries", "dependencies")
# The CUDA libraries an SGLang release's kernel package opens itself with ctypes
# (not DT_NEEDED, so the ELF scan cannot see them) are the release table's
# kernel_cuda_libraries; {major} is the toolkit's CUDA major version.
# The distributions whose shared objects the dependency scan reads (from their
# RECORD): SGLang, its kernel packages (sgl-kernel was renamed sglang-kernel:
# the 0.5.11 venv has sglang_kernel-0.4.2, 0.5.23's sglang_kernel-0.4.10 plus
# sgl-deep-gemm, sgl-flash-mla, sgl-deep-ep), flashinfer and torch. Absent
# ones are skipped; the DDTree build's files come from its manifest.
SCAN_DISTRIBUTIONS = ("sglang", "sglang-kernel", "sgl-kernel", "sgl-deep-gemm", "sgl-flash-mla", "sgl-deep-ep",
                      "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache", "torch")
# Libraries of the NVIDIA driver's user space, never of a package or the
# toolkit: on a GPU host (or an LXC container with the GPUs passed through)
# they come with the driver. They are searched for like any other (the unit's
# environment); unresolved, they fail with a message naming the driver, unless
# the probe is told the driver is not there yet (require_driver false).
DRIVER_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1", "libnvidia-nvvm.so.4",
                    "libcudadebugger.so.1")
DDTREE_MANIFEST = "/var/lib/inferops-sglang/ddtree/manifest.json"
# systemd's PATH for services (systemd.exec(5), Environment): the unit has this one.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
ELF_SOURCE = r'''
import os
import struct
import sys

DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ, DT_SONAME, DT_RPATH, DT_RUNPATH = 0, 1, 5, 10, 14, 15, 29
PT_LOAD, PT_DYNAMIC = 1, 2
CACHE_MAGIC_NEW = b"glibc-ld.so.cache1.1"
CACHE_MAGIC_OLD = b"ld.so-1.7.0"
# The multiarch directories glibc's loader searches last, per (ELF class, e_machine)
# (Debian and Ubuntu configure these as its system directories); /lib64, /usr/lib64,
# /lib and /usr/lib are searched after them.
MULTIARCH = {(64, 62): "x86_64-linux-gnu", (64, 183): "aarch64-linux-gnu", (32, 3): "i386-linux-gnu",
             (64, 21): "powerpc64le-linux-gnu", (64, 22): "s390x-linux-gnu", (32, 40): "arm-linux-gnueabihf"}


class ElfError(Exception):
    pass


def _read_at(handle, offset, size):
    handle.seek(offset)
    data = handle.read(size)
    if len(data) != size:
        raise ElfError("truncated at offset %d (wanted %d bytes, got %d)" % (offset, size, len(data)))
    return data


def read_dynamic(path):
    """The ELF identity and dynamic section of a file: {"class": 32|64, "machine": e_machine,
    "needed": [...], "soname", "rpath", "runpath" (lists of directories, None when absent)}.
    None when the file is not ELF. Only the headers, the dynamic segment and its string
    table are read (torch's libraries are hundreds of MB)."""
    with open(path, "rb") as handle:
        ident = handle.read(16)
        if len(ident) < 16 or ident[:4] != b"\x7fELF":
            return None
        klass = {1: 32, 2: 64}.get(ident[4])
        order = {1: "<", 2: ">"}.get(ident[5])
        if klass is None or order is None:
            raise ElfError("unknown ELF class %d or data encoding %d" % (ident[4], ident[5]))
        if klass == 64:
            head = struct.unpack(order + "HHIQQQIHHHHHH", _read_at(handle, 16, 48))
            phdr_format, dyn_format = order + "IIQQQQQQ", order + "qQ"
        else:
            head = struct.unpack(order + "HHIIIIIHHHHHH", _read_at(handle, 16, 36))
            phdr_format, dyn_format = order + "IIIIIIII", order + "iI"
        machine, phoff, phentsize, phnum = head[1], head[4], head[8], head[9]
        info = {"class": klass, "machine": machine, "needed": [], "soname": None, "rpath": None, "runpath": None}
        if phnum == 0 or phentsize < struct.calcsize(phdr_format):
            return info
        table = _read_at(handle, phoff, phentsize * phnum)
        loads, dynamic = [], None
        for index in range(phnum):
            fields = struct.unpack_from(phdr_format, table, index * phentsize)
            if klass == 64:
                p_type, p_offset, p_vaddr, p_filesz = fields[0], fields[2], fields[3], fields[5]
            else:
                p_type, p_offset, p_vaddr, p_filesz = fields[0], fields[1], fields[2], fields[4]
            if p_type == PT_LOAD:
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == PT_DYNAMIC:
                dynamic = (p_offset, p_filesz)
        if dynamic is None:
            return info
        data = _read_at(handle, dynamic[0], dynamic[1])
        size = struct.calcsize(dyn_format)
        entries = []
        for start in range(0, len(data) - size + 1, size):
            tag, value = struct.unpack_from(dyn_format, data, start)
            if tag == DT_NULL:
                break
            entries.append((tag, value))
        tags = dict((tag, value) for tag, value in entries if tag in (DT_STRTAB, DT_STRSZ))
        if DT_STRTAB not in tags:
            raise ElfError("the dynamic section has no DT_STRTAB")
        strtab = None
        for vaddr, offset, filesz in loads:
            if vaddr <= tags[DT_STRTAB] < vaddr + filesz:
                strtab = offset + tags[DT_STRTAB] - vaddr
                break
        if strtab is None:
            raise ElfError("DT_STRTAB 0x%x is in no loadable segment" % tags[DT_STRTAB])
        strings = _read_at(handle, strtab, tags.get(DT_STRSZ, 0)) if DT_STRSZ in tags else None

        def text(offset):
            if strings is not None:
                end = strings.find(b"\0", offset)
                raw = strings[offset:end if end >= 0 else len(strings)]
            else:
                handle.seek(strtab + offset)
                raw = handle.read(4096).split(b"\0", 1)[0]
            return raw.decode("utf-8", "surrogateescape")

        for tag, value in entries:
            if tag == DT_NEEDED:
                info["needed"].append(text(value))
            elif tag == DT_SONAME:
                info["soname"] = text(value)
            elif tag in (DT_RPATH, DT_RUNPATH):
                key = "rpath" if tag == DT_RPATH else "runpath"
                info[key] = (info[key] or []) + text(value).split(":")
        return info


def read_ld_cache(path="/etc/ld.so.cache"):
    """[(name, path, flags)] of glibc's loader cache, in file order (the order the loader
    prefers). The new format (glibc-ld.so.cache1.1) alone or after the old one."""
    with open(path, "rb") as handle:
        data = handle.read()
    start = 0
    if data.startswith(CACHE_MAGIC_OLD):
        (old_count,) = struct.unpack_from("=I", data, 12)
        start = 16 + old_count * 12
        start += -start % 8
    if data[start:start + len(CACHE_MAGIC_NEW)] != CACHE_MAGIC_NEW:
        raise ElfError("%s is not a glibc-ld.so.cache1.1 file" % path)
    flags = data[start + 28]
    order = {2: "<", 3: ">"}.get(flags & 3, "=")
    count, _strings = struct.unpack_from(order + "II", data, start + 20)
    out = []
    for index in range(count):
        entry_flags, key, value, _os, _hwcap = struct.unpack_from(order + "iIIIQ", data, start + 48 + index * 24)

        def text(offset):
            end = data.find(b"\0", offset)
            return data[offset:end].decode("utf-8", "surrogateescape")

        # String offsets are from the start of the new-format header.
        out.append((text(start + key), text(start + value), entry_flags))
    return out


def ldconfig_entries():
    """The cache as ``ldconfig -p`` prints it: the fallback for a cache file this reader does
    not know. None when there is no ldconfig."""
    import subprocess
    for tool in ("/sbin/ldconfig", "/usr/sbin/ldconfig", "ldconfig"):
        try:
            out = subprocess.run([tool, "-p"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 universal_newlines=True, timeout=30, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        entries = []
        for line in out.splitlines()[1:]:
            if " => " in line:
                left, right = line.split(" => ", 1)
                entries.append((left.split(" (", 1)[0].strip(), right.strip(), 0))
        return entries
    return None


def origin_of(path):
    """$ORIGIN of a shared object: the directory of the path it was opened by. glibc's loader does
    not resolve symbolic links here (only for the main program, through /proc/self/exe)."""
    return os.path.dirname(os.path.abspath(path))


def expand(entry, origin, klass):
    """$ORIGIN, $LIB and $PLATFORM (also as ${...}) in an RPATH or RUNPATH entry."""
    lib = "lib64" if klass == 64 else "lib"
    for name, value in (("ORIGIN", origin), ("LIB", lib), ("PLATFORM", os.uname().machine)):
        entry = entry.replace("${%s}" % name, value).replace("$" + name, value)
    return entry


class Resolver(object):
    """Finds a DT_NEEDED name as glibc's loader would: RPATH of the object (only when it has no
    RUNPATH) and of the objects that loaded it, LD_LIBRARY_PATH, RUNPATH of the object, the
    ld.so cache, the default directories. A candidate of another ELF class or machine is
    skipped, as the loader does. Parsed files are cached by (path, mtime, size)."""

    def __init__(self, ld_library_path, cache_path="/etc/ld.so.cache", executable=None):
        self.ld_library_path = [p or "." for p in ld_library_path.split(":")] if ld_library_path else []
        self.cache = {}
        self.ld_cache = None
        self.cache_error = None
        if cache_path:
            try:
                self.ld_cache = read_ld_cache(cache_path)
            except (OSError, ElfError, struct.error) as exc:
                self.cache_error = "%s: %s" % (cache_path, exc)
                self.ld_cache = ldconfig_entries()
        self.executable_rpath = []
        if executable:
            info = self.dynamic(executable)
            if info and info.get("runpath") is None and info.get("rpath"):
                self.executable_rpath = [expand(p, os.path.dirname(os.path.realpath(executable)), info["class"])
                                         for p in info["rpath"]]

    def dynamic(self, path):
        """read_dynamic, cached; {"error": ...} for a file that cannot be read."""
        try:
            st = os.stat(path)
        except OSError as exc:
            return {"error": str(exc)}
        key = (os.path.realpath(path), st.st_mtime_ns, st.st_size)
        if key not in self.cache:
            try:
                self.cache[key] = read_dynamic(path)
            except (OSError, ElfError, struct.error) as exc:
                self.cache[key] = {"error": "%s: %s" % (type(exc).__name__, exc)}
        return self.cache[key]

    def fits(self, candidate, want):
        if not os.path.isfile(candidate):
            return False
        info = self.dynamic(candidate)
        return bool(info) and "error" not in info and (info["class"], info["machine"]) == want

    def default_dirs(self, want):
        dirs = []
        triplet = MULTIARCH.get(want)
        if triplet:
            dirs += ["/lib/" + triplet, "/usr/lib/" + triplet]
        if want[0] == 64:
            dirs += ["/lib64", "/usr/lib64"]
        return dirs + ["/lib", "/usr/lib"]

    def find(self, name, requester, info, rpath_chain):
        """(path, how) for ``name`` needed by ``requester`` (its dynamic info), or (None, None).
        rpath_chain: the expanded RPATHs of the objects that loaded the requester, nearest first."""
        want = (info["class"], info["machine"])
        if "/" in name:
            return (name, "path") if self.fits(name, want) else (None, None)
        origin = origin_of(requester)
        dirs = []
        if info.get("runpath") is None:
            own = [expand(p, origin, info["class"]) for p in (info.get("rpath") or [])]
            for path in own:
                dirs.append((path, "RPATH"))
            for path in rpath_chain:
                dirs.append((path, "RPATH of a loading object"))
            for path in self.executable_rpath:
                dirs.append((path, "RPATH of the interpreter"))
        for path in self.ld_library_path:
            dirs.append((path, "LD_LIBRARY_PATH"))
        for path in (info.get("runpath") or []):
            dirs.append((expand(path, origin, info["class"]), "RUNPATH"))
        for directory, how in dirs:
            candidate = os.path.join(directory, name)
            if self.fits(candidate, want):
                return candidate, how
        for entry_name, path, _flags in self.ld_cache or []:
            if entry_name == name and self.fits(path, want):
                return path, "ld.so.cache"
        for directory in self.default_dirs(want):
            candidate = os.path.join(directory, name)
            if self.fits(candidate, want):
                return candidate, "default directory"
        return None, None


def scan(roots, resolver, limit=None):
    """Every shared object (*.so, *.so.*) under ``roots`` (directories or files), its dynamic
    dependencies resolved, and theirs, with ``resolver``. Returns (objects, unresolved):
    objects {path: {"needed", "soname", "runpath", "rpath", "error"}}, unresolved
    [{"name", "needed_by", "runpath", "rpath"}] for each name no search finds and no object
    of the set provides by its SONAME."""
    files = []
    for root in roots:
        if os.path.isfile(root):
            files.append(root)
            continue
        for directory, dirnames, names in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for fname in sorted(names):
                if fname.endswith(".so") or ".so." in fname:
                    path = os.path.join(directory, fname)
                    if os.path.isfile(path):
                        files.append(path)
    objects, missing, queue, seen = {}, [], [], set()
    for path in files:
        real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            queue.append((path, ()))
    while queue:
        path, chain = queue.pop(0)
        info = resolver.dynamic(path)
        if info is None:
            continue
        record = {"needed": [], "soname": None, "runpath": None, "rpath": None, "error": info.get("error"),
                  "scanned": path in files}
        objects[path] = record
        if "error" in info:
            continue
        record.update(soname=info["soname"], runpath=info["runpath"], rpath=info["rpath"])
        origin = origin_of(path)
        own = [] if info.get("runpath") is not None else [expand(p, origin, info["class"]) for p in (info.get("rpath") or [])]
        for name in info["needed"]:
            found, how = resolver.find(name, path, info, list(chain))
            record["needed"].append({"name": name, "path": found, "how": how})
            if found is None:
                missing.append((name, path, info))
                continue
            real = os.path.realpath(found)
            if real not in seen:
                seen.add(real)
                queue.append((found, tuple(own) + tuple(chain)))
    provided = set()
    for path, record in objects.items():
        if record.get("error") is None:
            provided.add(record.get("soname") or os.path.basename(path))
    unresolved = []
    for name, path, info in missing:
        if name in provided:
            for entry in objects[path]["needed"]:
                if entry["name"] == name and entry["path"] is None:
                    entry["how"] = "an object of the set (by its SONAME)"
            continue
        unresolved.append({"name": name, "needed_by": path, "runpath": info.get("runpath"), "rpath": info.get("rpath")})
    return objects, unresolved
'''


# Runs in the venv's interpreter (any Python 3.8+): standard library only.
PROBE_SOURCE = ELF_SOURCE + r"""
import ctypes
import json
import time


request = json.loads(sys.stdin.read())
checks = request["checks"]
report = {"executable": sys.executable, "prefix": sys.prefix, "version": "%d.%d.%d" % tuple(sys.version_info[:3])}


def error_text(exc):
    text = str(exc).strip()
    return text if isinstance(exc, OSError) and text else ("%s: %s" % (type(exc).__name__, text) if text else type(exc).__name__)


try:
    from importlib import metadata
except ImportError:
    metadata = None
installed = {}
for name in request["distributions"]:
    try:
        installed[name] = metadata.version(name) if metadata else None
    except Exception:
        installed[name] = None
report["installed"] = installed

if "torch" in checks:
    try:
        import torch
        report["torch"] = {"version": str(getattr(torch, "__version__", "")),
                           "cuda": getattr(getattr(torch, "version", None), "cuda", None), "error": None}
    except BaseException as exc:
        report["torch"] = {"version": None, "cuda": None, "error": error_text(exc)}


class LinkMap(ctypes.Structure):
    _fields_ = [("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p)]


def loaded_from(library):
    # The file the dynamic loader opened for a CDLL handle (dlinfo RTLD_DI_LINKMAP).
    for owner in (None, "libdl.so.2"):
        try:
            dlinfo = ctypes.CDLL(owner).dlinfo
            break
        except (OSError, AttributeError):
            dlinfo = None
    if dlinfo is None:
        return None
    link = ctypes.POINTER(LinkMap)()
    if dlinfo(ctypes.c_void_p(library._handle), 2, ctypes.byref(link)) != 0 or not link:
        return None
    name = link.contents.l_name
    return name.decode("utf-8", "replace") if name else None


if "libraries" in checks:
    results, seen = [], set()
    for name in request["libraries"]:
        if name in seen:
            continue
        seen.add(name)
        entry = {"name": name, "source": "configured", "loaded": False, "path": None, "error": None,
                 "runtime_version": None}
        try:
            library = ctypes.CDLL(name)
        except OSError as exc:
            entry["error"] = error_text(exc)
        else:
            entry["loaded"] = True
            entry["path"] = loaded_from(library)
            if os.path.basename(name).startswith("libcudart.so"):
                try:
                    version = ctypes.c_int(0)
                    if library.cudaRuntimeGetVersion(ctypes.byref(version)) == 0:
                        entry["runtime_version"] = version.value
                except AttributeError:
                    pass
        results.append(entry)
    report["libraries"] = results


def distribution_objects(name):
    # The shared objects a distribution installed (its RECORD), None when it is not installed.
    if metadata is None:
        return None
    try:
        dist = metadata.distribution(name)
    except Exception:
        return None
    out = []
    for item in dist.files or []:
        base = os.path.basename(str(item))
        if base.endswith(".so") or ".so." in base:
            path = str(dist.locate_file(item))
            if os.path.isfile(path):
                out.append(os.path.normpath(path))
    return out


if "dependencies" in checks:
    started = time.time()
    roots, scanned = [], {}
    for name in request["scan_distributions"]:
        found = distribution_objects(name)
        if found is not None:
            scanned[name] = len(found)
            roots += found
    build = [path for path in request["build_files"] if os.path.isfile(path)]
    roots += [path for path in build if path not in roots]
    roots += [path for path in request["scan_paths"] if os.path.exists(path)]
    resolver = Resolver(os.environ.get("LD_LIBRARY_PATH", ""), request.get("ld_cache", "/etc/ld.so.cache"),
                        sys.executable)
    objects, unresolved = scan(roots, resolver)
    for entry in unresolved:
        entry["build"] = "ddtree" if entry["needed_by"] in build else None
    report["dependencies"] = {
        "distributions": scanned, "build_files": build, "scanned": sum(1 for o in objects.values() if o["scanned"]),
        "objects": len(objects), "unresolved": unresolved, "ld_cache_error": resolver.cache_error,
        "seconds": round(time.time() - started, 3),
        "errors": [{"path": path, "error": o["error"]} for path, o in sorted(objects.items()) if o.get("error")]}

sys.stdout.write("\n" + request["marker"] + json.dumps(report) + "\n")
"""

_ELF_NAMESPACE: dict = {"__name__": "inferops_elf"}
# ELF_SOURCE is this module's own code (the probe program's part), run here too for the tests.
exec(compile(ELF_SOURCE, "<inferops runtime probe: ELF_SOURCE>", "exec"), _ELF_NAMESPACE)  # pylint: disable=exec-used


class _Elf:
    """ELF_SOURCE's functions, run here too: read_dynamic, read_ld_cache, expand, Resolver, scan."""

    def __getattr__(self, name: str):
        try:
            return _ELF_NAMESPACE[name]
        except KeyError:
            raise AttributeError(name) from None


elf = _Elf()


class ProbeError(Exception):
    """The probe's options are inconsistent; the message says why."""


def cuda_major_minor(text: str) -> tuple[int, int]:
    """(13, 0) from '13.0', '13.0.2' or 'CUDA 13.0'."""
    match = re.search(r"(\d+)\.(\d+)", str(text or ""))
    if not match:
        raise ProbeError(f"cannot read a CUDA major.minor version from {text!r} (expected e.g. 13.0)")
    return int(match.group(1)), int(match.group(2))


def cuda_text(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def cuda_tag(version: tuple[int, int]) -> str:
    """PyTorch's local version label for a CUDA build: cu130 for 13.0, cu128 for 12.8."""
    return f"cu{version[0]}{version[1]}"


def split_version(text: str) -> tuple[str, str]:
    """(public, local) of a PEP 440 version: '2.11.0+cu130' -> ('2.11.0', 'cu130')."""
    text = str(text or "").strip().lower()
    if text.startswith("v"):
        text = text[1:]
    public, sep, local = text.partition("+")
    return public, local if sep else ""


def _release_key(public: str) -> tuple:
    match = re.match(r"^(\d+(?:\.\d+)*)(.*)$", public)
    if not match:
        return (public,)
    release = [int(part) for part in match.group(1).split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    return tuple(release) + (match.group(2).lstrip(".-_"),)


def version_matches(installed: str | None, pin: str) -> bool:
    """PEP 440 ``==`` for exact pins: the public versions are equal (2.11 == 2.11.0); a pin
    with a local label (+cu130) needs the same label, a pin without one accepts any
    (sglang==0.5.11 is met by 0.5.11+simulator, as pip's resolver sees it)."""
    if not installed:
        return False
    inst_public, inst_local = split_version(installed)
    pin_public, pin_local = split_version(pin)
    if _release_key(inst_public) != _release_key(pin_public):
        return False
    return not pin_local or re.split(r"[-_.]", inst_local) == re.split(r"[-_.]", pin_local)


def tag_cuda(local: str) -> tuple[int, int] | None:
    """The CUDA version a torch local label names: cu128 -> (12, 8); None for cpu, rocm..."""
    match = re.fullmatch(r"cu(\d+)(\d)", local or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def pin_errors(torch_pin: str | None, cuda: tuple[int, int]) -> list[str]:
    """Problems with the pins themselves, found before anything is installed."""
    if not torch_pin:
        return []
    public, local = split_version(torch_pin)
    want = f"{public}+{cuda_tag(cuda)}"
    if not local:
        return [f"the torch pin {torch_pin} names no CUDA build; the toolkit is CUDA {cuda_text(cuda)}: pin {want}"]
    built_for = tag_cuda(local)
    if built_for is None:
        return [f"the torch pin {torch_pin} is not a CUDA build ({local}); the toolkit is CUDA {cuda_text(cuda)}: pin {want}"]
    if built_for != cuda:
        return [f"the torch pin {torch_pin} is built for CUDA {cuda_text(built_for)} but the toolkit is CUDA "
                f"{cuda_text(cuda)}: pin {want} (or change the toolkit)"]
    return []


def default_libraries(sglang_pin: str | None, cuda: tuple[int, int]) -> list[str]:
    """The CUDA libraries the kernel package of this SGLang release opens itself (the
    newest entry of the release table when the pin is unset or unreadable)."""
    try:
        names = releases.fact("kernel_cuda_libraries", sglang_pin) if sglang_pin else None
    except ValueError:
        names = None
    if names is None:
        names = releases.BY_NAME["kernel_cuda_libraries"][-1].value
    return [name.format(major=cuda[0], minor=cuda[1]) for name in names]


def library_path(cuda_home: str, extra: list[str], environment: dict) -> str:
    """The LD_LIBRARY_PATH the unit will have: the toolkit's lib64, the extra
    directories, then an LD_LIBRARY_PATH given in the unit's environment."""
    parts = [os.path.join(cuda_home, "lib64")] + list(extra)
    parts += [part for part in str(environment.get("LD_LIBRARY_PATH", "")).split(":") if part]
    seen: list[str] = []
    for part in parts:
        if part not in seen:
            seen.append(part)
    return ":".join(seen)


def environment(python: str, ld_library_path: str, extra: dict) -> dict[str, str]:
    """Every variable the probe process runs with, which is what the unit must be given: PATH
    (the venv's bin, where JIT tools such as ninja are, then systemd's default), LANG, the
    unit's further environment, and LD_LIBRARY_PATH."""
    env = {"PATH": f"{os.path.dirname(python)}:{DEFAULT_PATH}", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    env.update({str(k): str(v) for k, v in extra.items()})
    env["LD_LIBRARY_PATH"] = ld_library_path
    return env


def command(python: str, env: dict, timeout: int) -> list[str]:
    """argv that runs PROBE_SOURCE in ``python`` with only ``env`` (environment())."""
    argv = ["timeout", "--kill-after=10", str(timeout), "env", "-i"]
    argv += [f"{key}={value}" for key, value in sorted(env.items())]
    return argv + [python, "-c", PROBE_SOURCE]


def build_files(manifest_path: str) -> tuple[list[str], dict | None]:
    """The shared objects of the installed DDTree build (absolute paths), from its manifest;
    a build being applied or held for its probe counts as installed. ([], None) without one."""
    try:
        with open(manifest_path, "r", encoding="utf-8") as handle:
            manifest = json.load(handle)
    except (OSError, ValueError):
        return [], None
    if not isinstance(manifest, dict) or manifest.get("state") not in ("applied", "applying", "pending"):
        return [], manifest if isinstance(manifest, dict) else None
    site = manifest.get("site_packages") or ""
    out = []
    for item in manifest.get("files") or []:
        name = os.path.basename(str(item.get("path", "")))
        if item.get("result_sha256") and (name.endswith(".so") or ".so." in name):
            out.append(os.path.join(site, item["path"]))
    return out, manifest


def request(checks: list[str], distributions: list[str], libraries: list[str],
            scan_distributions: list[str] | tuple = SCAN_DISTRIBUTIONS, build: list[str] | tuple = (),
            scan_paths: list[str] | tuple = (), ld_cache: str = "/etc/ld.so.cache") -> str:
    return json.dumps({"marker": MARKER, "checks": list(checks), "distributions": list(distributions),
                       "libraries": list(libraries), "scan_distributions": list(scan_distributions),
                       "build_files": list(build), "scan_paths": list(scan_paths), "ld_cache": ld_cache})


def parse_report(stdout: str) -> dict | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARKER):
            try:
                return json.loads(line[len(MARKER):])
            except ValueError:
                return None
    return None


def needs_install(installed: dict, pins: dict) -> list[str]:
    """Requirement strings (name==pin) for each pinned distribution not installed at its pin."""
    return [f"{name}=={pin}" for name, pin in pins.items() if pin and not version_matches(installed.get(name), pin)]


def evaluate(report: dict, pins: dict, cuda: tuple[int, int], ld_library_path: str, where: str,
             driver_libraries: list[str] | tuple = DRIVER_LIBRARIES, require_driver: bool = True) -> list[str]:
    """Every problem in a probe report, each with the name and the reason."""
    errors = []
    installed = report.get("installed") or {}
    for name, pin in pins.items():
        if not pin:
            continue
        version = installed.get(name)
        if version is None:
            errors.append(f"{name} is not installed in {where} (pin {pin})")
        elif not version_matches(version, pin):
            errors.append(f"{name} {version} is installed in {where}, the pin is {pin}")

    torch = report.get("torch")
    if torch is not None:
        if torch.get("error"):
            errors.append(f"import torch fails in {where}: {torch['error']}")
        else:
            built = torch.get("cuda")
            label = f"torch {torch.get('version')}"
            if not built:
                errors.append(f"{label} is a CPU-only build (torch.version.cuda is None) but the toolkit is CUDA "
                              f"{cuda_text(cuda)}: install the {cuda_tag(cuda)} build")
            else:
                try:
                    built_cuda = cuda_major_minor(built)
                except ProbeError:
                    built_cuda = None
                if built_cuda != cuda:
                    errors.append(f"{label} is built for CUDA {built} (torch.version.cuda) but the toolkit is CUDA "
                                  f"{cuda_text(cuda)}: install the {cuda_tag(cuda)} build")

    for lib in report.get("libraries") or []:
        if not lib.get("loaded"):
            errors.append(f"{lib['name']} (opened by SGLang's kernel package with ctypes) does not load with "
                          f"ctypes.CDLL: {lib.get('error')} (LD_LIBRARY_PATH={ld_library_path})")
            continue
        runtime = lib.get("runtime_version")
        # A CUDA runtime must be the major its soname promises (libcudart.so.13: 13.x),
        # or, named without one, the toolkit's.
        soname = re.search(r"\.so\.(\d+)", os.path.basename(lib["name"]))
        major = int(soname.group(1)) if soname else cuda[0]
        if isinstance(runtime, int) and runtime > 0 and runtime // 1000 != major:
            promised = f"its name promises CUDA {major}" if soname else f"the toolkit is CUDA {cuda_text(cuda)}"
            errors.append(f"{lib['name']} loaded from {lib.get('path')} is CUDA runtime {runtime // 1000}."
                          f"{(runtime % 1000) // 10} but {promised}")
    errors += dependency_errors(report.get("dependencies"), ld_library_path, driver_libraries, require_driver)
    return errors


def _paths(entries: list | None) -> str:
    return ":".join(entries) if entries else "none"


def dependency_errors(deps: dict | None, ld_library_path: str, driver_libraries: list[str] | tuple = DRIVER_LIBRARIES,
                      require_driver: bool = True) -> list[str]:
    """One error per name that does not resolve, with every file that needs it (the first five
    named) and where the loader looked: the unit's LD_LIBRARY_PATH and the file's RUNPATH/RPATH."""
    if not deps:
        return []
    errors = []
    if deps.get("ld_cache_error"):
        errors.append(f"cannot read the loader cache {deps['ld_cache_error']}")
    for item in deps.get("errors") or []:
        errors.append(f"cannot read the ELF dynamic section of {item['path']}: {item['error']}")
    by_name: dict[str, list[dict]] = {}
    for entry in deps.get("unresolved") or []:
        by_name.setdefault(entry["name"], []).append(entry)
    for name, entries in by_name.items():
        driver = name in driver_libraries
        if driver and not require_driver:
            continue
        first = entries[0]
        needers = []
        for entry in entries[:5]:
            what = " (the DDTree build)" if entry.get("build") == "ddtree" else ""
            needers.append(f"{entry['needed_by']}{what}")
        more = f" and {len(entries) - 5} more" if len(entries) > 5 else ""
        where = f"LD_LIBRARY_PATH={ld_library_path or 'none'}, RUNPATH={_paths(first.get('runpath'))}"
        if first.get("rpath"):
            where += f", RPATH={_paths(first.get('rpath'))}"
        hint = (": it is a library of the NVIDIA driver's user space, which is not installed where the loader "
                "looks") if driver else ""
        errors.append(f"{name} needed by {', '.join(needers)}{more} does not resolve ({where}){hint}")
    return errors
