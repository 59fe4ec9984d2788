"""ddtree_build trusts nothing it did not write (issue 16, defence in depth):
a symlinked directory or file under site-packages, a .pth file from an overlay
or a patch, a planted or tampered journal, a journal that is a link, and a
manifest or originals directory that leads elsewhere are refused with a clear
error, and nothing under the test's directory (the venv, the state directory,
the files outside the tree) changes: a full snapshot is compared before and
after each refusal. The module runs on a virtual environment with the real
SGLang 0.5.11 installed."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from ddtree_helpers import DDTREE_UTILS, SERVER_ARGS, SGLANG_VERSION, SPEC_INFO, patch_inputs, sha256, site_packages, snapshot
from sim_helpers import run_module

from ansible_collections.inferops.sglang.plugins.modules import ddtree_build

WORK_DIR = ".inferops-ddtree"


def run(capsys, venv: Path, tmp_path: Path, **overrides) -> tuple[int, dict]:
    args = dict(venv=str(venv), source="patch", sglang_version=SGLANG_VERSION, built_by="alice",
                manifest=str(tmp_path / "state" / "manifest.json"),
                patches=[{"src": i["src"], "sha256": i["sha256"]} for i in patch_inputs()])
    args.update(overrides)
    return run_module(ddtree_build.main, capsys, args)[:2]


def refused(capsys, venv: Path, tmp_path: Path, match: str, **overrides) -> dict:
    """Run the module; it must fail with ``match`` and leave everything under tmp_path as it was."""
    before = snapshot(tmp_path)
    rc, result = run(capsys, venv, tmp_path, **overrides)
    assert rc == 1 and result["failed"] is True, result
    assert re.search(match, result["msg"]), result["msg"]
    assert snapshot(tmp_path) == before
    return result


def victim(tmp_path: Path) -> Path:
    """A file outside the tree that a planted journal or manifest aims at."""
    path = tmp_path / "victim" / "important.conf"
    path.parent.mkdir(exist_ok=True)
    path.write_text("keep me\n")
    return path


# -- the tree: links, .pth, paths outside the package ------------------------------------

@pytest.mark.parametrize("where", ["directory-out", "directory-in-tree", "file-out"])
def test_a_symlink_under_site_packages_is_refused(venv, tmp_path, capsys, where):
    site = site_packages(venv)
    speculative = site / os.path.dirname(SPEC_INFO)
    outside = tmp_path / "outside"
    outside.mkdir()
    if where == "directory-out":
        # sglang/srt/speculative -> a directory outside site-packages: the build would write there.
        shutil.move(str(speculative), str(outside / "speculative"))
        speculative.symlink_to(outside / "speculative")
        link = speculative
    elif where == "directory-in-tree":
        shutil.move(str(speculative), str(site / "sglang" / "srt" / "speculative-real"))
        speculative.symlink_to("speculative-real")
        link = speculative
    else:
        # spec_info.py -> a copy outside the tree (same bytes, so the RECORD checksum holds).
        shutil.move(str(site / SPEC_INFO), str(outside / "spec_info.py"))
        (site / SPEC_INFO).symlink_to(outside / "spec_info.py")
        link = site / SPEC_INFO
    named = site.resolve() / link.relative_to(site)
    refused(capsys, venv, tmp_path, "0002-spec-info-ddtree-algorithm.patch: " + re.escape(str(named))
            + r" is a symbolic link \(to .*\); the build follows no link under .*, in the tree or out of it")


@pytest.mark.parametrize("name", ["zz-inferops.pth", "sglang/srt/hook.pth", "sglang/srt/HOOK.PTH"])
def test_an_overlay_that_creates_a_pth_file_is_refused(venv, tmp_path, capsys, name):
    hook = tmp_path / "inputs" / "hook.pth"
    hook.parent.mkdir()
    hook.write_text("import os; os.system('id > /tmp/pwned')\n")
    files = [{"path": name, "src": str(hook), "sha256": sha256(hook)}]
    refused(capsys, venv, tmp_path, re.escape(name) + r" is a \.pth file, which Python runs at the start of every "
            "interpreter", source="overlay", patches=None, files=files)


@pytest.mark.parametrize("header", ["b/zz-inferops.pth", "b/sglang/srt/hook.pth"])
def test_a_patch_that_creates_a_pth_file_is_refused(venv, tmp_path, capsys, header):
    patch = tmp_path / "inputs" / "0004-hook.patch"
    patch.parent.mkdir()
    patch.write_text(f"--- /dev/null\n+++ {header}\n@@ -0,0 +1 @@\n+import os; os.system('id > /tmp/pwned')\n")
    patches = [{"src": i["src"], "sha256": i["sha256"]} for i in patch_inputs()] + [
        {"src": str(patch), "sha256": sha256(patch)}]
    refused(capsys, venv, tmp_path, r"0004-hook.patch: .*\.pth is a \.pth file", patches=patches)


def test_an_overlay_file_outside_the_sglang_package_is_refused(venv, tmp_path, capsys):
    hook = tmp_path / "inputs" / "sitecustomize.py"
    hook.parent.mkdir()
    hook.write_text("import os\n")
    files = [{"path": "sitecustomize.py", "src": str(hook), "sha256": sha256(hook)}]
    refused(capsys, venv, tmp_path, "overlay file: sitecustomize.py is outside the sglang package",
            source="overlay", patches=None, files=files)


# -- the journal -------------------------------------------------------------------------

def hold(capsys, venv: Path, tmp_path: Path) -> Path:
    """A genuine held build (the patch series); the path of its journal."""
    rc, result = run(capsys, venv, tmp_path, hold=True)
    assert rc == 0 and result["held"] is True, result
    return site_packages(venv).resolve() / WORK_DIR / "journal.json"


def reseal(journal: dict) -> dict:
    """The journal's checksum as documented: SHA-256 over its canonical JSON (sorted keys, no spaces, ASCII),
    the checksum itself left out. A planted journal made with it passes the checksum: what refuses it then
    is the check the test is about."""
    journal.setdefault("format", 2)
    body = {k: v for k, v in journal.items() if k != "checksum"}
    journal["checksum"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"),
                                                    ensure_ascii=True).encode()).hexdigest()
    return journal


def plant(path: Path, journal: dict) -> None:
    path.write_text(json.dumps(journal))
    path.chmod(0o600)


@pytest.mark.parametrize("case, match", [
    # An entry aimed at /etc: an absolute path, with /etc/passwd's own checksum (nothing to restore).
    ("etc", r"entry 0: '/etc/passwd' must be a relative path inside site-packages"),
    # An entry that climbs out of the tree to a file it would delete (before: none).
    ("escape", r"entry 0: '\.\./.*important.conf' must be a relative path inside site-packages"),
    # An entry outside the sglang package (a .pth at the top of site-packages).
    ("pth", r"entry 0: zz-inferops.pth is a \.pth file"),
    # The stage is a directory outside the work directory: it would be removed.
    ("stage", r"its stage '.*victim' is not the module's own"),
    # The manifest is another file: it would be removed or overwritten.
    ("manifest", r"it names the manifest '.*important.conf', this run's is"),
    # A saved copy from outside the stage: it would be renamed over a package file.
    ("old", r"entry 0's old copy '.*planted.old' is not the stage's own"),
])
def test_a_planted_journal_is_refused_and_nothing_changes(venv, tmp_path, capsys, case, match):
    path = hold(capsys, venv, tmp_path)
    target = victim(tmp_path)
    site = site_packages(venv).resolve()
    journal = json.loads(path.read_text())
    entry = journal["entries"][0]
    if case == "etc":
        journal["entries"] = [dict(entry, path="/etc/passwd", before=sha256(Path("/etc/passwd")), after=None,
                                   new=None, old=None)] + journal["entries"]
    elif case == "escape":
        journal["entries"] = [dict(entry, path=os.path.relpath(target, site), before=None, new=None,
                                   after=sha256(target))] + journal["entries"]
    elif case == "pth":
        journal["entries"] = [dict(entry, path="zz-inferops.pth", before=None, new=None, after=None)]
    elif case == "stage":
        journal["stage"] = str(target.parent)
    elif case == "manifest":
        journal["manifest"] = str(target)
        journal["manifest_before"] = None
    else:
        planted = tmp_path / "planted.old"
        planted.write_text("import os  # the attacker's server_args\n")
        entry.update(old=str(planted), before=sha256(planted))
    plant(path, reseal(journal))
    result = refused(capsys, venv, tmp_path, "the build journal .* is not trusted: " + match, state="rollback")
    assert "Nothing was changed" in result["msg"]


def test_a_journal_with_a_tampered_entry_hash_is_refused(venv, tmp_path, capsys):
    path = hold(capsys, venv, tmp_path)
    journal = json.loads(path.read_text())
    # The last entry is rolled back first; the first one is tampered with: the checksum no longer matches.
    journal["entries"][0]["before"] = "0" * 64
    plant(path, journal)
    refused(capsys, venv, tmp_path, "is not trusted: its checksum does not match its content", state="rollback")


def test_a_saved_copy_that_does_not_match_its_checksum_is_refused_before_any_file_is_put_back(venv, tmp_path, capsys):
    path = hold(capsys, venv, tmp_path)
    journal = json.loads(path.read_text())
    first = journal["entries"][0]
    assert first["path"] == SERVER_ARGS and first["old"]
    # The saved copy of server_args.py is changed; the journal is intact. The other files could be put back,
    # but a transaction whose backups were tampered with is not half undone: nothing is touched.
    os.unlink(first["old"])
    Path(first["old"]).write_text("import os  # not SGLang's\n")
    refused(capsys, venv, tmp_path, f"cannot roll back {SERVER_ARGS}: its saved copy .* is missing or changed "
            r"\(not sha256 [0-9a-f]{64}\); nothing was changed", state="rollback")


@pytest.mark.parametrize("case, match", [
    ("link", "the journal .* is not a regular file \\(a symbolic link\\?\\)"),
    ("writable", "the journal .* is writable by group or others \\(mode 0666\\)"),
    ("work-link", "the work directory .* is not a directory \\(a symbolic link\\?\\)"),
])
def test_a_journal_that_is_a_link_or_writable_by_others_is_refused(venv, tmp_path, capsys, case, match):
    path = hold(capsys, venv, tmp_path)
    if case == "link":
        # The real journal moved elsewhere, a link in its place: whoever controls the link controls the journal.
        elsewhere = tmp_path / "elsewhere.json"
        shutil.move(str(path), str(elsewhere))
        path.symlink_to(elsewhere)
    elif case == "writable":
        path.chmod(0o666)
    else:
        work = path.parent
        shutil.move(str(work), str(tmp_path / "work-elsewhere"))
        work.symlink_to(tmp_path / "work-elsewhere")
    refused(capsys, venv, tmp_path, "the build journal .* is not trusted: " + match, state="rollback")


def test_a_journal_owned_by_another_user_is_refused(venv, tmp_path, capsys, monkeypatch):
    hold(capsys, venv, tmp_path)
    # The test cannot chown as an unprivileged user: the module runs as if it were another user instead.
    owner = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)
    refused(capsys, venv, tmp_path, f"the work directory .* is owned by uid {owner}, not by the user running the "
            f"build \\(uid {owner + 1}\\)", state="rollback")


def test_an_interrupted_build_of_this_module_is_still_rolled_back(venv, tmp_path, capsys):
    """The checks refuse what the module did not write, not what it did: a genuine held journal rolls back."""
    before = snapshot(site_packages(venv))
    hold(capsys, venv, tmp_path)
    rc, result = run(capsys, venv, tmp_path, state="rollback")
    assert rc == 0 and sorted(result["recovered"]) == sorted([SERVER_ARGS, DDTREE_UTILS, SPEC_INFO]), result
    assert snapshot(site_packages(venv)) == before


# -- the manifest and its originals ------------------------------------------------------

def test_a_manifest_that_names_a_file_outside_the_package_is_refused(venv, tmp_path, capsys):
    rc, result = run(capsys, venv, tmp_path)
    assert rc == 0, result
    target = victim(tmp_path)
    manifest = tmp_path / "state" / "manifest.json"
    data = json.loads(manifest.read_text())
    # A revert would delete a file the build "created" whose result is the victim's content.
    rel = os.path.relpath(target, site_packages(venv).resolve())
    data["files"].append({"path": rel, "original_sha256": None, "result_sha256": sha256(target)})
    manifest.write_text(json.dumps(data))
    refused(capsys, venv, tmp_path, "the build manifest .* must be a relative path inside site-packages",
            state="absent")


def test_a_manifest_that_is_a_link_is_refused(venv, tmp_path, capsys):
    rc, result = run(capsys, venv, tmp_path)
    assert rc == 0, result
    manifest = tmp_path / "state" / "manifest.json"
    shutil.move(str(manifest), str(tmp_path / "elsewhere.json"))
    manifest.symlink_to(tmp_path / "elsewhere.json")
    refused(capsys, venv, tmp_path, "the build manifest .* is not a regular file \\(a symbolic link\\?\\)",
            state="absent")


def test_an_originals_directory_that_leads_out_is_refused(venv, tmp_path, capsys):
    # The originals directory's sglang/ is a link to a directory outside: the kept originals would be written there.
    outside = tmp_path / "outside"
    outside.mkdir()
    originals = tmp_path / "state" / "originals"
    originals.mkdir(parents=True)
    (originals / "sglang").symlink_to(outside)
    refused(capsys, venv, tmp_path, "the kept original: .*originals/sglang is a symbolic link")
