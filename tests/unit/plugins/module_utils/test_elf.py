"""The runtime probe's ELF reader and loader-search resolver (ELF_SOURCE in
_runtime_probe.py, the code the probe runs in the venv's interpreter): real
shared objects compiled with gcc here, crafted 32-bit and big-endian blobs,
this machine's real /etc/ld.so.cache against ``ldconfig -p``, and the real
dynamic loader (ctypes.CDLL in a fresh process) as the referee of the search
order."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils._runtime_probe import elf

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc builds the shared objects")


def gcc_so(out: Path, soname: str | None = None, needs: tuple[Path, ...] = (), rpath: str | None = None,
           runpath: str | None = None, source: str = "int inferops_test_symbol(void) { return 1; }\n") -> Path:
    """A real shared object: ``needs`` are linked in (their SONAMEs become DT_NEEDED)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.parent / f".{out.name}.c"
    src.write_text(source)
    argv = ["gcc", "-shared", "-fPIC", "-o", str(out), str(src)]
    if soname:
        argv.append(f"-Wl,-soname,{soname}")
    argv.append("-Wl,--no-as-needed")
    argv += [str(path) for path in needs]
    if rpath:
        argv += [f"-Wl,-rpath,{rpath}", "-Wl,--disable-new-dtags"]
    if runpath:
        argv += [f"-Wl,-rpath,{runpath}", "-Wl,--enable-new-dtags"]
    subprocess.run(argv, check=True)
    src.unlink()
    return out


def readelf_dynamic(path: Path) -> dict:
    """binutils' view, to check the reader against (absent readelf: skip)."""
    if shutil.which("readelf") is None:
        pytest.skip("readelf is not installed")
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    found: dict = {"needed": [], "soname": None, "rpath": None, "runpath": None}
    for line in out.splitlines():
        if "(NEEDED)" in line:
            found["needed"].append(line.split("[", 1)[1].rstrip("]"))
        elif "(SONAME)" in line:
            found["soname"] = line.split("[", 1)[1].rstrip("]")
        elif "(RPATH)" in line:
            found["rpath"] = line.split("[", 1)[1].rstrip("]").split(":")
        elif "(RUNPATH)" in line:
            found["runpath"] = line.split("[", 1)[1].rstrip("]").split(":")
    return found


def crafted(klass: int, order: str, needed: list[str], soname: str | None = None, runpath: str | None = None,
            machine: int = 62) -> bytes:
    """A minimal ELF shared object (headers, one PT_LOAD, PT_DYNAMIC, a string table), either class and byte
    order, as the reader sees files made for other machines (32-bit, big-endian)."""
    strings = b"\0"
    offsets = {}
    for name in needed + [s for s in (soname, runpath) if s]:
        offsets[name] = len(strings)
        strings += name.encode() + b"\0"
    ehsize, phentsize = (64, 56) if klass == 64 else (52, 32)
    phoff = ehsize
    strtab_off = phoff + 2 * phentsize
    dyn_off = strtab_off + len(strings) + (-(strtab_off + len(strings)) % 8)
    base = 0x10000
    dyn = [(1, offsets[n]) for n in needed]
    if soname:
        dyn.append((14, offsets[soname]))
    if runpath:
        dyn.append((29, offsets[runpath]))
    dyn += [(5, base + strtab_off), (10, len(strings)), (0, 0)]
    dyn_format = order + ("qQ" if klass == 64 else "iI")
    dynamic = b"".join(struct.pack(dyn_format, tag, value) for tag, value in dyn)
    total = dyn_off + len(dynamic)
    ident = b"\x7fELF" + bytes([1 if klass == 32 else 2, 1 if order == "<" else 2, 1]) + b"\0" * 9
    if klass == 64:
        header = struct.pack(order + "HHIQQQIHHHHHH", 3, machine, 1, 0, phoff, 0, 0, ehsize, phentsize, 2, 64, 0, 0)
        load = struct.pack(order + "IIQQQQQQ", 1, 5, 0, base, base, total, total, 0x1000)
        dyn_ph = struct.pack(order + "IIQQQQQQ", 2, 6, dyn_off, base + dyn_off, base + dyn_off, len(dynamic), len(dynamic), 8)
    else:
        header = struct.pack(order + "HHIIIIIHHHHHH", 3, machine, 1, 0, phoff, 0, 0, ehsize, phentsize, 2, 40, 0, 0)
        load = struct.pack(order + "IIIIIIII", 1, 0, base, base, total, total, 5, 0x1000)
        dyn_ph = struct.pack(order + "IIIIIIII", 2, dyn_off, base + dyn_off, base + dyn_off, len(dynamic), len(dynamic), 6, 4)
    blob = ident + header + load + dyn_ph + strings
    blob += b"\0" * (dyn_off - len(blob))
    return blob + dynamic


# -- the reader ------------------------------------------------------------

def test_a_gcc_built_object_with_needed_and_runpath_origin(tmp_path):
    libfoo = gcc_so(tmp_path / "lib" / "libfoo.so.1", soname="libfoo.so.1")
    needer = gcc_so(tmp_path / "libbar.so", soname="libbar.so", needs=(libfoo,), runpath="$ORIGIN/lib")
    info = elf.read_dynamic(str(needer))
    assert info["class"] == 64 and info["machine"] == {"x86_64": 62, "aarch64": 183}.get(os.uname().machine, info["machine"])
    assert "libfoo.so.1" in info["needed"] and info["soname"] == "libbar.so"
    assert info["runpath"] == ["$ORIGIN/lib"] and info["rpath"] is None
    assert {k: info[k] for k in ("needed", "soname", "rpath", "runpath")} == readelf_dynamic(needer)


def test_a_gcc_built_object_with_rpath(tmp_path):
    libfoo = gcc_so(tmp_path / "lib" / "libfoo.so.1", soname="libfoo.so.1")
    needer = gcc_so(tmp_path / "libbar.so", needs=(libfoo,), rpath="/opt/one:$ORIGIN/lib")
    info = elf.read_dynamic(str(needer))
    assert info["rpath"] == ["/opt/one", "$ORIGIN/lib"] and info["runpath"] is None and info["soname"] is None
    assert {k: info[k] for k in ("needed", "soname", "rpath", "runpath")} == readelf_dynamic(needer)


@pytest.mark.parametrize("klass, order, machine", [(32, "<", 3), (32, ">", 8), (64, ">", 22), (64, "<", 62)])
def test_crafted_objects_of_either_class_and_byte_order(tmp_path, klass, order, machine):
    path = tmp_path / "crafted.so"
    path.write_bytes(crafted(klass, order, ["libcudart.so.12", "libc.so.6"], soname="libk.so", runpath="$ORIGIN",
                             machine=machine))
    assert elf.read_dynamic(str(path)) == {"class": klass, "machine": machine, "needed": ["libcudart.so.12", "libc.so.6"],
                                           "soname": "libk.so", "rpath": None, "runpath": ["$ORIGIN"]}


def test_what_is_not_elf_and_what_is_truncated(tmp_path):
    text = tmp_path / "linker-script.so"
    text.write_text("/* GNU ld script */\nGROUP ( /lib/x86_64-linux-gnu/libc.so.6 )\n")
    assert elf.read_dynamic(str(text)) is None
    blob = crafted(64, "<", ["libfoo.so.1"])
    cut = tmp_path / "cut.so"
    cut.write_bytes(blob[:150])
    with pytest.raises(elf.ElfError, match="truncated"):
        elf.read_dynamic(str(cut))


def test_the_lab_ddtree_kernels_need_the_cuda_12_runtime():
    from ddtree_helpers import ddtree_overlay

    info = elf.read_dynamic(str(ddtree_overlay() / "sglang/srt/speculative/ddtree_kernels.so"))
    assert "libcudart.so.12" in info["needed"] and info["soname"] == "ddtree_kernels.so"
    assert info["rpath"] is None and info["runpath"] is None


# -- the ld.so cache ---------------------------------------------------------

@pytest.mark.skipif(not os.path.exists("/etc/ld.so.cache"), reason="no loader cache on this machine")
def test_the_real_ld_so_cache_reads_as_ldconfig_prints_it():
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, check=True).stdout.splitlines()
    expected = [(line.split(" (", 1)[0].strip(), line.split(" => ", 1)[1].strip()) for line in out[1:] if " => " in line]
    entries = elf.read_ld_cache("/etc/ld.so.cache")
    assert len(entries) > 10
    assert [(name, path) for name, path, _flags in entries] == expected
    # The fallback reads the same entries from ldconfig's output (without the flags).
    assert [e[:2] for e in entries] == [e[:2] for e in elf.ldconfig_entries()]


def test_a_cache_file_of_another_format_falls_back_to_ldconfig(tmp_path):
    bogus = tmp_path / "ld.so.cache"
    bogus.write_bytes(b"not a cache")
    with pytest.raises(elf.ElfError, match="not a glibc-ld.so.cache1.1 file"):
        elf.read_ld_cache(str(bogus))
    resolver = elf.Resolver("", str(bogus))
    assert resolver.cache_error.startswith(f"{bogus}: ")
    if shutil.which("ldconfig") or os.path.exists("/sbin/ldconfig"):
        assert resolver.ld_cache and any(name == "libc.so.6" for name, _p, _f in resolver.ld_cache)


# -- the search order ----------------------------------------------------------

def loader_picks(library: Path, ld_library_path: str, soname: str) -> str | None:
    """The file the real dynamic loader maps for ``soname`` when ``library`` is opened (or None if it fails)."""
    code = ("import ctypes, sys\n"
            "try:\n    ctypes.CDLL(sys.argv[1])\nexcept OSError as exc:\n    print('ERROR', exc); sys.exit(0)\n"
            "for line in open('/proc/self/maps'):\n"
            "    if line.rstrip().endswith('/' + sys.argv[2]):\n        print(line.split()[-1]); break\n")
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": ld_library_path}
    out = subprocess.run([sys.executable, "-c", code, str(library), soname], capture_output=True, text=True, env=env,
                         check=True).stdout.strip()
    return None if not out or out.startswith("ERROR") else out


def resolve(resolver, path: Path, name: str):
    return resolver.find(name, str(path), elf.read_dynamic(str(path)), [])


@pytest.fixture
def two_foos(tmp_path):
    """libfoo.so.1 in two directories, each telling which it is."""
    first = gcc_so(tmp_path / "one" / "libfoo.so.1", soname="libfoo.so.1", source="int which(void) { return 1; }\n")
    second = gcc_so(tmp_path / "two" / "libfoo.so.1", soname="libfoo.so.1", source="int which(void) { return 2; }\n")
    return first, second


def test_ld_library_path_is_searched_in_order(tmp_path, two_foos):
    first, second = two_foos
    needer = gcc_so(tmp_path / "libbar.so", needs=(first,))
    for path in (f"{first.parent}:{second.parent}", f"{second.parent}:{first.parent}"):
        found, how = resolve(elf.Resolver(path, None), needer, "libfoo.so.1")
        assert how == "LD_LIBRARY_PATH"
        assert found == loader_picks(needer, path, "libfoo.so.1") == str(Path(path.split(":", maxsplit=1)[0]) / "libfoo.so.1")
    assert resolve(elf.Resolver("", None), needer, "libfoo.so.1") == (None, None)
    assert loader_picks(needer, "", "libfoo.so.1") is None


def test_rpath_comes_before_ld_library_path_and_runpath_after(tmp_path, two_foos):
    first, second = two_foos
    with_rpath = gcc_so(tmp_path / "rpath" / "libbar.so", needs=(first,), rpath=str(first.parent))
    with_runpath = gcc_so(tmp_path / "runpath" / "libbar.so", needs=(first,), runpath=str(first.parent))
    resolver = elf.Resolver(str(second.parent), None)
    assert resolve(resolver, with_rpath, "libfoo.so.1") == (str(first), "RPATH")
    assert loader_picks(with_rpath, str(second.parent), "libfoo.so.1") == str(first)
    assert resolve(resolver, with_runpath, "libfoo.so.1") == (str(second), "LD_LIBRARY_PATH")
    assert loader_picks(with_runpath, str(second.parent), "libfoo.so.1") == str(second)
    # Without LD_LIBRARY_PATH, the RUNPATH finds it.
    assert resolve(elf.Resolver("", None), with_runpath, "libfoo.so.1") == (str(first), "RUNPATH")


def test_origin_is_the_directory_of_the_object_itself(tmp_path):
    libfoo = gcc_so(tmp_path / "pkg" / "lib" / "libfoo.so.1", soname="libfoo.so.1")
    needer = gcc_so(tmp_path / "pkg" / "libbar.so", needs=(libfoo,), runpath="$ORIGIN/lib")
    link = tmp_path / "elsewhere" / "libbar.so"
    link.parent.mkdir()
    link.symlink_to(needer)
    assert resolve(elf.Resolver("", None), needer, "libfoo.so.1") == (str(libfoo), "RUNPATH")
    assert loader_picks(needer, "", "libfoo.so.1") == str(libfoo)
    # $ORIGIN is the directory of the path the object was opened by: glibc does not follow the link.
    assert resolve(elf.Resolver("", None), link, "libfoo.so.1") == (None, None)
    assert loader_picks(link, "", "libfoo.so.1") is None
    assert elf.expand("${ORIGIN}/../lib:$LIB", "/a/b", 64) == "/a/b/../lib:lib64"


def test_a_library_of_another_class_is_skipped(tmp_path, two_foos):
    first, second = two_foos
    wrong = tmp_path / "wrong" / "libfoo.so.1"
    wrong.parent.mkdir()
    wrong.write_bytes(crafted(32, "<", [], soname="libfoo.so.1", machine=3))
    needer = gcc_so(tmp_path / "libbar.so", needs=(first,))
    path = f"{wrong.parent}:{second.parent}"
    assert resolve(elf.Resolver(path, None), needer, "libfoo.so.1") == (str(second), "LD_LIBRARY_PATH")
    assert loader_picks(needer, path, "libfoo.so.1") == str(second)


def test_the_rpath_of_the_loading_object_serves_its_dependencies(tmp_path):
    # torch's layout: libtorch_cuda.so has an RPATH ($ORIGIN/../../nvidia/...); what it loads inherits it.
    deep = gcc_so(tmp_path / "nvidia" / "libdeep.so.1", soname="libdeep.so.1")
    middle = gcc_so(tmp_path / "lib" / "libmiddle.so", soname="libmiddle.so", needs=(deep,))  # no RPATH of its own
    top = gcc_so(tmp_path / "lib" / "libtop.so", needs=(middle,), rpath="$ORIGIN:$ORIGIN/../nvidia")
    objects, missing = elf.scan([str(top)], elf.Resolver("", None))
    assert missing == []
    [deep_entry] = [n for n in objects[str(middle)]["needed"] if n["name"] == "libdeep.so.1"]
    assert deep_entry == {"name": "libdeep.so.1", "path": str(tmp_path / "lib" / ".." / "nvidia" / "libdeep.so.1"),
                          "how": "RPATH of a loading object"}
    assert loader_picks(top, "", "libdeep.so.1") == str(deep)
    # A RUNPATH is not inherited: the same layout with RUNPATH leaves libdeep unresolved, for the loader too.
    top2 = gcc_so(tmp_path / "lib2" / "libtop.so", needs=(middle,), runpath=f"{middle.parent}:{deep.parent.parent / 'nvidia'}")
    shutil.copy(middle, tmp_path / "lib2" / "libmiddle.so")
    objects, missing = elf.scan([str(top2)], elf.Resolver("", None))
    assert [(m["name"], os.path.basename(m["needed_by"])) for m in missing] == [("libdeep.so.1", "libmiddle.so")]
    assert loader_picks(top2, "", "libdeep.so.1") is None


def test_a_name_provided_by_an_object_of_the_set_resolves(tmp_path):
    # sgl-kernel's common_ops needs libc10.so with no path to torch/lib: import torch loaded it first.
    c10 = gcc_so(tmp_path / "torch" / "lib" / "libc10.so", soname="libc10.so")
    ops = gcc_so(tmp_path / "sgl_kernel" / "common_ops.abi3.so", needs=(c10,))
    objects, missing = elf.scan([str(tmp_path / "torch"), str(tmp_path / "sgl_kernel")], elf.Resolver("", None))
    assert missing == []
    [entry] = [n for n in objects[str(ops)]["needed"] if n["name"] == "libc10.so"]
    assert entry["path"] is None and entry["how"] == "an object of the set (by its SONAME)"
    objects, missing = elf.scan([str(tmp_path / "sgl_kernel")], elf.Resolver("", None))
    assert [m["name"] for m in missing] == ["libc10.so"]


def test_the_scan_finds_so_and_versioned_so_files_and_rereads_a_changed_file(tmp_path):
    gcc_so(tmp_path / "a" / "libx.so.2.1", soname="libx.so.2")
    gcc_so(tmp_path / "a" / "mod.cpython-311-x86_64-linux-gnu.so")
    (tmp_path / "a" / "notes.solution").write_text("not a library")
    resolver = elf.Resolver("", None)
    objects, missing = elf.scan([str(tmp_path / "a")], resolver)
    assert sorted(os.path.basename(p) for p, o in objects.items() if o["scanned"]) == [
        "libx.so.2.1", "mod.cpython-311-x86_64-linux-gnu.so"]
    assert missing == []
    target = tmp_path / "a" / "mod.cpython-311-x86_64-linux-gnu.so"
    target.write_bytes(crafted(64, "<", ["libgone.so.9"]))
    os.utime(target, ns=(1, 1))
    objects, missing = elf.scan([str(tmp_path / "a")], resolver)
    assert [m["name"] for m in missing] == ["libgone.so.9"]
