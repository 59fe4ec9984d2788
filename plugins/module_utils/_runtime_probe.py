# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The runtime probe: prove, inside the SGLang virtual environment's own
interpreter, what the field story's crash lacked.

On ct129 the DDTree build passed its health check and then died on the first
real request: its kernels opened ``libcudart.so.12`` with ``ctypes.CDLL`` on a
host with the CUDA 13 user space only. This module checks the same things
before any unit starts: the installed torch and sglang equal their pins, the
pins agree with the toolkit (``2.11.0+cu130`` for CUDA 13.0),
``torch.version.cuda`` equals the toolkit's major.minor, and every CUDA library
SGLang, its kernel package and the installed DDTree build open really loads
(``ctypes.CDLL``) with the library path the unit will have.

The checks run in a separate process, the venv's Python, with a clean
environment (``env -i``): PROBE_SOURCE is that process's program, PROBE_SOURCE
reads a JSON request on stdin and prints one JSON line after MARKER. Everything
else here is pure logic on that report.
"""

from __future__ import annotations

import json
import os
import re

MARKER = "INFEROPS_RUNTIME_PROBE "
CHECKS = ("versions", "torch", "libraries")
DDTREE_MODULE = "sglang.srt.speculative.ddtree_utils"
# The lab's convention: the DDTree build declares the CUDA libraries its kernels
# open in this module-level list (see lab/ddtree/ddtree_utils.py).
DDTREE_ATTRIBUTE = "CUDA_LIBRARIES"
# The CUDA libraries an SGLang release and its kernel package (sgl-kernel) open
# from the toolkit, per (major, minor) release line; {major} is the toolkit's
# CUDA major version. sgl-kernel preloads the CUDA runtime from the toolkit
# (RTLD_GLOBAL) when it is imported.
DEFAULT_LIBRARIES: dict[tuple[int, int], tuple[str, ...]] = {
    (0, 5): ("libcudart.so.{major}",),
}
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Runs in the venv's interpreter (any Python 3.8+): standard library only.
PROBE_SOURCE = r'''
import ast
import ctypes
import json
import os
import sys

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


def declared(module, attribute):
    """The library list a module declares, read with ast: never imported, never run."""
    relative = os.path.join(*module.split(".")) + ".py"
    found = None
    for entry in sys.path:
        if entry and os.path.isfile(os.path.join(entry, relative)):
            found = os.path.join(entry, relative)
            break
    info = {"module": module, "path": found, "libraries": [], "error": None}
    if found is None:
        return info
    try:
        with open(found, "rb") as handle:
            tree = ast.parse(handle.read(), found)
        for node in tree.body:
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets = [node.target]
            else:
                continue
            if any(isinstance(target, ast.Name) and target.id == attribute for target in targets):
                value = ast.literal_eval(node.value)
                value = [value] if isinstance(value, str) else list(value)
                if not all(isinstance(item, str) for item in value):
                    raise ValueError("%s must be a list of library names, got %r" % (attribute, value))
                info["libraries"] = value
    except (SyntaxError, ValueError, TypeError, OSError) as exc:
        info["error"] = error_text(exc)
    return info


class LinkMap(ctypes.Structure):
    _fields_ = [("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p)]


def loaded_from(library):
    """The file the dynamic loader opened for a CDLL handle (dlinfo RTLD_DI_LINKMAP)."""
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
    report["ddtree"] = declared(request["ddtree_module"], request["ddtree_attribute"])
    wanted = [(name, "configured") for name in request["libraries"]]
    wanted += [(name, "ddtree") for name in report["ddtree"]["libraries"]]
    results, seen = [], set()
    for name, source in wanted:
        if name in seen:
            continue
        seen.add(name)
        entry = {"name": name, "source": source, "loaded": False, "path": None, "error": None, "runtime_version": None}
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

sys.stdout.write("\n" + request["marker"] + json.dumps(report) + "\n")
'''


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
    """The CUDA libraries to load for an SGLang release line (the newest known line
    when the pin is unset or newer than the table)."""
    lines = sorted(DEFAULT_LIBRARIES)
    chosen = lines[-1]
    match = re.match(r"\s*v?(\d+)\.(\d+)", sglang_pin or "")
    if match:
        wanted = (int(match.group(1)), int(match.group(2)))
        older = [line for line in lines if line <= wanted]
        chosen = older[-1] if older else lines[0]
    return [name.format(major=cuda[0], minor=cuda[1]) for name in DEFAULT_LIBRARIES[chosen]]


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


def command(python: str, ld_library_path: str, environment: dict, timeout: int) -> list[str]:
    """argv that runs PROBE_SOURCE in ``python`` with only the unit's environment."""
    env = {"PATH": f"{os.path.dirname(python)}:{DEFAULT_PATH}", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    env.update({str(k): str(v) for k, v in environment.items()})
    env["LD_LIBRARY_PATH"] = ld_library_path
    argv = ["timeout", "--kill-after=10", str(timeout), "env", "-i"]
    argv += [f"{key}={value}" for key, value in sorted(env.items())]
    return argv + [python, "-c", PROBE_SOURCE]


def request(checks: list[str], distributions: list[str], libraries: list[str], ddtree_module: str) -> str:
    return json.dumps({"marker": MARKER, "checks": list(checks), "distributions": list(distributions),
                       "libraries": list(libraries), "ddtree_module": ddtree_module,
                       "ddtree_attribute": DDTREE_ATTRIBUTE})


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


def evaluate(report: dict, pins: dict, cuda: tuple[int, int], ld_library_path: str, where: str) -> list[str]:
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

    ddtree = report.get("ddtree") or {}
    if ddtree.get("error"):
        errors.append(f"cannot read {DDTREE_ATTRIBUTE} from the DDTree build {ddtree.get('path')} without running it: "
                      f"{ddtree['error']}")
    for lib in report.get("libraries") or []:
        origin = (f"declared by the DDTree build {ddtree.get('module')} ({ddtree.get('path')})"
                  if lib.get("source") == "ddtree" else "needed by SGLang and its kernel package")
        if not lib.get("loaded"):
            errors.append(f"{lib['name']} ({origin}) does not load with ctypes.CDLL: {lib.get('error')} "
                          f"(LD_LIBRARY_PATH={ld_library_path})")
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
    return errors
