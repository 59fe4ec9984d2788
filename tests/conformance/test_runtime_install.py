"""The sglang_runtime role's constraints files make real installs that import.

The role installs ``torch==<pin> sglang==<pin>`` with ``pip install -c
roles/sglang_runtime/files/constraints/sglang-<release>-cu130.txt``. These tests
prove, per supported release, that this set really installs and imports, without
installing 8-11 GB per run:

- the cached real venv of lab/real/build.sh was built with ``-c`` exactly this
  file (its directory's key is derived from the file's bytes), so that build is
  the install;
- in that venv ``pip check`` is clean, ``pip freeze`` is exactly the file's pins,
  and ``import sglang`` works (with the driver stand-in, as real_sglang.py does);
- the index still serves that set: a ``pip install --dry-run --report`` of
  ``sglang==<release>`` with the file, in a throwaway venv isolated from this
  machine's pip configuration, resolves to exactly the file's pins (metadata
  only, read with HTTP range requests; the big wheels are not downloaded);
- the failure the 0.5.11 file prevents is real: the ``kernels`` a free
  resolution takes makes ``import sglang`` die.

The index tests need the public index (INFEROPS_PYPI_INDEX_URL, "off" to skip);
without it they skip, saying so. Measured on the lab's 2-core machines: about
80 s for the whole file; the two resolutions (about 20-25 s each) run in the
background of the import checks.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import urllib.request
import zipfile
from pathlib import Path

import pytest

from real_sglang import RELEASES, REPO, environment, python, venv

CONSTRAINTS = REPO / "roles/sglang_runtime/files/constraints"
# PyPI's torch of both releases is the CUDA 13.0 build (torch.version.cuda 13.0),
# the build the role pins by default (2.11.0+cu130): the lab's venvs are cu130.
CUDA_TAG = "cu130"
# What a venv brings itself: in `pip freeze --all`, never in a resolution of sglang.
VENV_OWN = {"pip"}
INDEX = os.environ.get("INFEROPS_PYPI_INDEX_URL", "https://pypi.org/simple").rstrip("/")
# The role's own torch build (torch==<public>+cu130) lives on PyTorch's index of
# the CUDA build; resolved only when that index is given.
TORCH_INDEX = os.environ.get("INFEROPS_TORCH_INDEX_URL", "").rstrip("/")
# The pip that resolves (a fixed one, so a resolver change shows as a change here)
RESOLVER_PIP = "pip==26.3"
# Where the index serves no PEP 658 metadata files, pip's --dry-run downloads every
# wheel to read its METADATA: 3.8 GB for 0.5.11 (measured). fast-deps reads METADATA
# with HTTP range requests instead: 84 MB, as fast (pip calls it experimental).
RESOLVE_METADATA_ONLY = ("--use-feature=fast-deps",)
# pip settings that only carry the transport; every source setting of this machine goes
PIP_TRANSPORT = {"PIP_CERT", "PIP_CLIENT_CERT", "PIP_PROXY", "PIP_DEFAULT_TIMEOUT", "PIP_RETRIES"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def constraints_file(release: str) -> Path:
    return CONSTRAINTS / f"sglang-{release}-{CUDA_TAG}.txt"


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"{path.name}: {line!r} is not an exact pin"
            found[normalize(name)] = version
    return found


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, check=False, cwd="/", **kwargs)


def isolated_pip_env() -> dict[str, str]:
    """This machine's pip is configured globally (local indexes, find-links, a torch
    cap): none of it may reach the resolution, only the index named here."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in PIP_TRANSPORT}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


# --- what the role ships -------------------------------------------------------------------------

@pytest.mark.parametrize("release", RELEASES)
def test_role_ships_a_complete_lock_per_supported_release(release):
    lock = pins(constraints_file(release))
    assert "sglang" not in lock  # the role's own pin says which sglang
    # torch at a public version: the role's CUDA build pin (2.11.0+cu130) meets it
    assert "+" not in lock["torch"]
    # The file name's CUDA build is the one its CUDA runtime pin is of
    major_minor = ".".join(lock["nvidia-cuda-runtime"].split(".")[:2])
    assert f"cu{major_minor.replace('.', '')}" == CUDA_TAG


def test_role_default_pins_have_a_shipped_lock():
    defaults = (REPO / "roles/sglang_runtime/defaults/main.yml").read_text()
    sglang = re.search(r'^sglang_runtime_sglang_version: "([^"]+)"', defaults, re.M).group(1)
    torch = re.search(r"^sglang_runtime_torch_version: .*default\('([^']+)'", defaults, re.M).group(1)
    cuda = re.search(r"^sglang_runtime_cuda_version: .*default\('([^']+)'", defaults, re.M).group(1)
    assert f"cu{cuda.replace('.', '')}" == CUDA_TAG
    public, _sep, local = torch.partition("+")
    assert local == CUDA_TAG
    assert pins(constraints_file(sglang))["torch"] == public


def test_0_5_11_lock_pins_kernels_transformers_can_import():
    # transformers 5.6.0 wants kernels>=0.12.0,<0.13 (transformers/dependency_versions_table.py:26
    # of the 0.5.11 venv); sglang 0.5.11 asks for `kernels` with no version (wheel METADATA:277)
    lock = pins(constraints_file("0.5.11"))
    assert lock["transformers"] == "5.6.0"
    assert (0, 12) <= tuple(int(p) for p in lock["kernels"].split(".")) < (0, 13)


# --- (a) the cached real venv is the install of exactly this file ----------------------------------

@pytest.mark.parametrize("release", RELEASES)
def test_cached_venv_was_built_from_the_role_lock(real, release):
    """lab/real/build.sh keys venv-<release>-<key> by the lock's bytes, the interpreter's
    version and its recipe, and installs it with `-c <lock>`: the key computed here from
    the role's file names the venv it built, and its stamp says the build passed."""
    build = (REPO / "lab/real/build.sh").read_text()
    assert '-c "$(lock_of "$release")" "sglang==$release"' in build
    recipe = re.search(r"^recipe=(\d+)$", build, re.M).group(1)
    pyver = run([python(real, release), "-I", "-c", "import sys; print(sys.version.split()[0])"]).stdout
    key = hashlib.sha256(constraints_file(release).read_bytes() + pyver.encode()
                         + f"venv recipe {recipe}\n".encode()).hexdigest()[:12]
    assert venv(real, release).name == f"venv-{release}-{key}"
    assert (venv(real, release) / ".inferops-stamp").read_text().startswith(f"sglang=={release} built in ")


# --- (b) that venv is consistent, holds exactly the lock and imports --------------------------------

@pytest.mark.parametrize("release", RELEASES)
def test_cached_venv_is_the_lock_and_imports(real, release):
    py = python(real, release)
    check = run([py, "-m", "pip", "check"])
    assert check.returncode == 0, check.stdout + check.stderr

    freeze = run([py, "-m", "pip", "freeze", "--all"])
    installed = {normalize(n): v for n, _sep, v in (line.partition("==") for line in freeze.stdout.splitlines())}
    assert installed.pop("sglang") == release
    assert installed == pins(constraints_file(release))

    code = ("import json, sglang, sgl_kernel, sglang.srt.server_args, torch; "
            "print(json.dumps([sglang.__version__, torch.__version__, torch.version.cuda]))")
    proc = run([py, "-I", "-c", code], env=environment(real), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    version, torch_version, torch_cuda = json.loads(proc.stdout.splitlines()[-1])
    assert version == release
    # PyPI's torch is the CUDA build the file is named for
    assert torch_cuda == "13.0" and torch_version.endswith("+" + CUDA_TAG)


# --- (c) the index still serves exactly the locked set ---------------------------------------------

class Index:
    """A throwaway venv of the lab's interpreter with a fixed pip, and the resolutions
    started in it in the background (they wait on the network while the import tests
    run); ``skip`` says why there is none."""

    def __init__(self, real: dict[str, str], where: Path) -> None:
        self.where, self.skip, self.running = where, None, {}
        if INDEX == "off":
            self.skip = "INFEROPS_PYPI_INDEX_URL=off: the index resolution is not checked"
            return
        try:
            urllib.request.urlopen(f"{INDEX}/pip/", timeout=15).close()
        except OSError as exc:
            self.skip = (f"the index {INDEX} cannot be reached ({exc}): the resolution of the locks is not "
                         "checked (offline; set INFEROPS_PYPI_INDEX_URL to a mirror of it)")
            return
        made = run([python(real, RELEASES[0]), "-I", "-m", "venv", str(where / "venv")])
        assert made.returncode == 0, made.stderr
        self.python = str(where / "venv/bin/python")
        up = run([self.python, "-m", "pip", "install", "-q", "--index-url", INDEX, RESOLVER_PIP],
                 env=isolated_pip_env())
        assert up.returncode == 0, up.stderr[-3000:]

    def start(self, name: str, *args: str) -> None:
        """`pip install --dry-run --report` of args from the index, isolated."""
        report = self.where / f"{name}.json"
        argv = [self.python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--no-cache-dir",
                *RESOLVE_METADATA_ONLY, "--index-url", INDEX, "--report", str(report), *args]
        self.running[name] = (subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                               cwd="/", env=isolated_pip_env()), report)

    def result(self, name: str) -> dict[str, str]:
        """name -> version of everything the resolution would install."""
        proc, report = self.running[name]
        out, _skip = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-3000:]
        return {normalize(item["metadata"]["name"]): item["metadata"]["version"]
                for item in json.loads(report.read_text())["install"]}

    def stop(self) -> None:
        for proc, _skip in self.running.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module", autouse=True)
def index(real, tmp_path_factory):
    found = Index(real, tmp_path_factory.mktemp("index"))
    if not found.skip:
        for release in RELEASES:
            lock = constraints_file(release)
            found.start(release, "-c", str(lock), f"torch=={pins(lock)['torch']}", f"sglang=={release}")
    yield found
    found.stop()


@pytest.mark.parametrize("release", RELEASES)
def test_index_resolves_sglang_to_exactly_the_lock(index, release):
    if index.skip:
        pytest.skip(index.skip)
    resolved = index.result(release)
    assert resolved.pop("sglang") == release
    expected = {name: version for name, version in pins(constraints_file(release)).items() if name not in VENV_OWN}
    # every resolved distribution is pinned by the file, and every pin is used: complete, no drift
    assert sorted(set(resolved) - set(expected)) == []
    assert sorted(set(expected) - set(resolved)) == []
    assert resolved == expected


@pytest.mark.parametrize("release", RELEASES)
def test_index_resolves_the_role_cuda_build_pin_within_the_lock(index, release):
    """The role's torch pin is the CUDA build (torch==2.11.0+cu130) from PyTorch's index."""
    if index.skip or not TORCH_INDEX:
        pytest.skip(index.skip or "INFEROPS_TORCH_INDEX_URL (PyTorch's index of the cu130 build) is not set")
    lock = pins(constraints_file(release))
    index.start(f"{release}-{CUDA_TAG}", "--extra-index-url", TORCH_INDEX, "-c", str(constraints_file(release)),
                f"torch=={lock['torch']}+{CUDA_TAG}", f"sglang=={release}")
    resolved = index.result(f"{release}-{CUDA_TAG}")
    assert resolved.pop("torch") == f"{lock['torch']}+{CUDA_TAG}"
    assert resolved.pop("sglang") == release
    assert resolved == {name: version for name, version in lock.items() if name not in VENV_OWN | {"torch"}}


# --- (d) the failure the 0.5.11 lock prevents -------------------------------------------------------

def test_without_the_lock_0_5_11_takes_a_kernels_it_cannot_import(real, index, tmp_path):
    # Only sglang's own `Requires-Dist: kernels` (no version; the 0.5.11 wheel's METADATA:277)
    # reaches a resolution: transformers 5.6.0 asks for kernels<0.13 only in its extras.
    wheel = next(Path(real["INFEROPS_REAL_WHEELS"]).glob("sglang-0.5.11-*.whl"))
    metadata = zipfile.ZipFile(wheel).read("sglang-0.5.11.dist-info/METADATA").decode()
    assert re.findall(r"^Requires-Dist: kernels\b(.*)$", metadata, re.M) == [""]
    code = ("import importlib.metadata as m, json, re\n"
            "print(json.dumps(sorted({d.metadata['Name'] + ' ' + r for d in m.distributions() for r in d.requires or []"
            " if re.match(r'kernels\\b', r) and 'extra ==' not in r})))")
    proc = run([python(real, "0.5.11"), "-I", "-c", code])
    assert json.loads(proc.stdout) == ["sglang kernels"]

    # So a free resolution takes the newest kernels the index has: outside transformers' range,
    if index.skip:
        pytest.skip(index.skip)
    taken = tmp_path / "kernels"
    got = run([index.python, "-m", "pip", "install", "-q", "--no-deps", "--no-cache-dir", "--index-url", INDEX,
               "--target", str(taken), "kernels"], env=isolated_pip_env())
    assert got.returncode == 0, got.stderr[-3000:]
    dist = next(taken.glob("kernels-*.dist-info")).name
    version = tuple(int(p) for p in re.match(r"kernels-(\d+)\.(\d+)", dist).groups())
    assert version >= (0, 13), dist
    # and with it in place of the lock's kernels 0.12, the 0.5.11 venv no longer imports
    env = environment(real, PYTHONPATH=str(taken))
    proc = run([python(real, "0.5.11"), "-c", "import sglang.srt.server_args"], env=env, timeout=300)
    assert proc.returncode != 0
    assert "ValueError: Either a revision or a version must be specified." in proc.stderr
