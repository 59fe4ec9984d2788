"""Build the lab's stand-in for NVIDIA's CUDA apt repository (a test double).

A flat, signed apt repository laid out like the vendor's
(<out>/cuda/debian12/x86_64/: the .deb files, Packages, Packages.gz, Release,
InRelease, Release.gpg) with packages carrying the REAL names and versions and
tiny payloads: version.json, a stand-in nvcc and a real, gcc-built
libcudart.so.13 that ctypes can load. Signed with a throwaway gpg key made for
this build; its public key is published next to the packages.

    python3 lab/aptrepo/build.py --out .cache/aptrepo

Prints a JSON summary (repository URL path, key file, key sha256, packages).
Rebuilds only when this file changes (the stamp holds its hash).
Needs dpkg-deb, dpkg-scanpackages (dpkg-dev), gpg and gcc.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

RELEASE = "13.0"
DASHED = RELEASE.replace(".", "-")
HOME = f"/usr/local/cuda-{RELEASE}"
LIBDIR = f"{HOME}/targets/x86_64-linux/lib"
REPO_PATH = "cuda/debian12/x86_64"
KEY_FILE = "cuda-lab-archive-key.asc"
MAINTAINER = "inferops.sglang lab <lab@inferops.invalid>"

# Toolkit release -> component version its packages carry (as in the vendor's
# repository, components have their own patch numbers).
TOOLKITS = {"13.0.1-1": "13.0.88-1", "13.0.2-1": "13.0.96-1"}

CUDART_C = textwrap.dedent("""\
    /* Stand-in libcudart of the inferops.sglang lab (a test double): only the
       version queries a provisioning probe needs. */
    const char inferops_lab_stand_in[] = "inferops.sglang lab libcudart stand-in";
    int cudaRuntimeGetVersion(int *version) { *version = 13000; return 0; }
    int cudaDriverGetVersion(int *version) { *version = 0; return 35; }
    """)

NVCC = textwrap.dedent("""\
    #!/bin/sh
    # Stand-in nvcc of the inferops.sglang lab (a test double): prints the
    # version banner of the real compiler driver and compiles nothing.
    case "$1" in
      --version|-V)
        echo "nvcc: NVIDIA (R) Cuda compiler driver"
        echo "Copyright (c) 2005-2025 NVIDIA Corporation"
        echo "Cuda compilation tools, release {release}, V{component}"
        echo "Build cuda_{release}.r{release}/compiler.lab_0"
        ;;
      *) echo "nvcc (inferops lab stand-in): compiling is not supported" >&2; exit 1 ;;
    esac
    """)


def run(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs)


def write(path: Path, content: str | bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    path.chmod(mode)


def deb(pool: Path, work: Path, name: str, version: str, fields: dict, files: dict, arch: str = "amd64") -> str:
    """Build one .deb; files maps an absolute path to bytes/str, or to ('symlink', target)."""
    root = work / f"{name}_{version}"
    for path, content in files.items():
        dest = root / path.lstrip("/")
        if isinstance(content, tuple):
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(content[1], dest)
        else:
            write(dest, content, 0o755 if path.endswith("/nvcc") else 0o644)
    control = {
        "Package": name,
        "Version": version,
        "Architecture": arch,
        "Maintainer": MAINTAINER,
        "Section": "devel",
        "Priority": "optional",
        **fields,
    }
    write(root / "DEBIAN/control", "".join(f"{k}: {v}\n" for k, v in control.items()))
    out = pool / f"{name}_{version}_{arch}.deb"
    run("dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out))
    return out.name


def packages(pool: Path, work: Path) -> list[str]:
    built = []
    so = work / "libcudart.so"
    src = work / "cudart.c"
    src.write_text(CUDART_C)
    run("gcc", "-shared", "-fPIC", "-O2", "-Wl,-soname,libcudart.so.13", "-o", str(so), str(src))
    for config in ("cuda-toolkit-config-common", "cuda-toolkit-13-config-common", f"cuda-toolkit-{DASHED}-config-common"):
        built.append(deb(pool, work, config, "13.0.96-1", {
            "Description": f"{config} (inferops lab stand-in: no payload)"}, {}, arch="all"))
    for toolkit, component in TOOLKITS.items():
        upstream = component.split("-", maxsplit=1)[0]
        built.append(deb(pool, work, f"cuda-cudart-{DASHED}", component, {
            "Depends": f"cuda-toolkit-{DASHED}-config-common",
            "Description": "CUDA Runtime native Libraries (inferops lab stand-in: version queries only)"}, {
            f"{LIBDIR}/libcudart.so.{upstream}": so.read_bytes(),
            f"{LIBDIR}/libcudart.so.13": ("symlink", f"libcudart.so.{upstream}"),
            f"{HOME}/lib64": ("symlink", "targets/x86_64-linux/lib"),
        }))
        built.append(deb(pool, work, f"cuda-nvcc-{DASHED}", component, {
            "Depends": f"cuda-toolkit-{DASHED}-config-common",
            "Description": "CUDA nvcc (inferops lab stand-in: prints the version banner only)"}, {
            f"{HOME}/bin/nvcc": NVCC.format(release=RELEASE, component=upstream),
        }))
        version_json = {
            "cuda": {"name": "CUDA SDK", "version": toolkit.split("-", maxsplit=1)[0]},
            "cuda_cudart": {"name": "CUDA Runtime (cudart)", "version": upstream},
            "cuda_nvcc": {"name": "CUDA NVCC", "version": upstream},
        }
        built.append(deb(pool, work, f"cuda-toolkit-{DASHED}", toolkit, {
            "Depends": ", ".join([
                f"cuda-cudart-{DASHED} (>= {component})", f"cuda-nvcc-{DASHED} (>= {component})",
                f"cuda-toolkit-{DASHED}-config-common", "cuda-toolkit-13-config-common",
                "cuda-toolkit-config-common"]),
            "Description": f"CUDA Toolkit {RELEASE} meta-package (inferops lab stand-in)"}, {
            f"{HOME}/version.json": json.dumps(version_json, indent=3) + "\n",
        }))
    # What the role must never install: the kernel driver and the meta packages that pull it.
    built.append(deb(pool, work, "cuda-drivers", "580.82.07-1", {
        "Description": "NVIDIA driver meta-package (inferops lab stand-in: must never be installed)"}, {}))
    built.append(deb(pool, work, "nvidia-kernel-open-dkms", "580.82.07-1", {
        "Description": "NVIDIA kernel module (inferops lab stand-in: must never be installed)"}, {}))
    built.append(deb(pool, work, f"cuda-runtime-{DASHED}", "13.0.2-1", {
        "Depends": f"cuda-drivers (>= 580.82.07), cuda-cudart-{DASHED}",
        "Description": "CUDA runtime meta-package, pulls the driver (inferops lab stand-in)"}, {}))
    built.append(deb(pool, work, f"cuda-{DASHED}", "13.0.2-1", {
        "Depends": f"cuda-runtime-{DASHED} (>= 13.0.2), cuda-toolkit-{DASHED} (>= 13.0.2)",
        "Description": "CUDA meta-package, pulls the driver (inferops lab stand-in)"}, {}))
    built.append(deb(pool, work, "cuda-keyring", "1.1-1", {
        "Description": "CUDA archive keyring (inferops lab stand-in: the lab's throwaway key)"}, {
        "/usr/share/keyrings/cuda-archive-keyring.gpg": (work / "key.gpg").read_bytes(),
    }, arch="all"))
    return sorted(built)


def release(repo: Path) -> str:
    lines = ["Origin: NVIDIA", "Label: NVIDIA CUDA (inferops lab stand-in)", "Architecture: x86_64",
             "Date: Thu, 01 Jan 2026 00:00:00 UTC"]
    for algo, field in (("md5", "MD5Sum"), ("sha1", "SHA1"), ("sha256", "SHA256"), ("sha512", "SHA512")):
        lines.append(f"{field}:")
        for name in ("Packages", "Packages.gz"):
            data = (repo / name).read_bytes()
            lines.append(f" {hashlib.new(algo, data).hexdigest()} {len(data):>16} {name}")
    return "\n".join(lines) + "\n"


def build(out: Path) -> dict:
    repo = out / REPO_PATH
    stamp = out / ".stamp"
    recipe = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text().strip() == recipe and (repo / "InRelease").exists():
        return json.loads((out / "summary.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    repo.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="inferops-aptrepo-") as tmp:
        work = Path(tmp)
        gnupg = work / "gnupg"
        gnupg.mkdir(mode=0o700)
        gpg = ("gpg", "--homedir", str(gnupg), "--batch", "--pinentry-mode", "loopback", "--passphrase", "")
        run(*gpg, "--quick-gen-key", "inferops lab CUDA repository (throwaway) <lab@inferops.invalid>",
            "rsa3072", "sign", "1d")
        (work / "key.gpg").write_bytes(subprocess.run((*gpg, "--export"), check=True, capture_output=True).stdout)
        key = run(*gpg, "--armor", "--export").stdout
        names = packages(repo, work)
        scan = run("dpkg-scanpackages", "--multiversion", ".", "/dev/null", cwd=repo).stdout
        (repo / "Packages").write_text(scan)
        (repo / "Packages.gz").write_bytes(gzip.compress(scan.encode(), mtime=0))
        (repo / "Release").write_text(release(repo))
        run(*gpg, "--yes", "--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release"))
        run(*gpg, "--yes", "--armor", "--detach-sign", "-o", str(repo / "Release.gpg"), str(repo / "Release"))
    write(repo / KEY_FILE, key)
    summary = {
        "path": REPO_PATH,
        "key": KEY_FILE,
        "key_sha256": hashlib.sha256(key.encode()).hexdigest(),
        "packages": names,
    }
    write(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    write(stamp, recipe + "\n")
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="directory to build the repository in")
    args = parser.parse_args()
    for tool in ("dpkg-deb", "dpkg-scanpackages", "gpg", "gcc"):
        if not shutil.which(tool):
            print(f"{tool} is missing (needs dpkg-dev, gnupg, gcc)", file=sys.stderr)
            return 1
    print(json.dumps(build(args.out.resolve())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
