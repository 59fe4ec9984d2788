"""The DDTree build's transaction on the real SGLang 0.5.11 package: patch and
overlay, checksums of inputs and originals, strict hunks, interruption (an
exception and a real SIGKILL), and revert to byte-identical files."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from ddtree_helpers import (DDTREE_UTILS, FIXTURES, REPO, SERVER_ARGS, SGLANG_VERSION, SPEC_INFO, copy_venv, import_in,
                            make_venv, overlay_dir, overlay_inputs, patch_inputs, sha256, site_packages, snapshot, tree)

from ansible_collections.inferops.sglang.plugins.module_utils import _ddtree as d


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return make_venv(tmp_path_factory.mktemp("ddtree") / "venv")


@pytest.fixture
def env(pristine, tmp_path):
    """(venv, site-packages, manifest path) of a fresh copy of the installed SGLang."""
    venv = copy_venv(pristine, tmp_path / "venv")
    return venv, str(site_packages(venv)), str(tmp_path / "state" / "manifest.json")


def build(site: str, manifest: str, source: str = "patch", inputs: list[dict] | None = None, version=SGLANG_VERSION):
    plan, _results = d.plan_apply(site, source, inputs or patch_inputs(), version, {}, manifest)
    return plan, d.apply(site, plan, manifest, "alice")


# -- the diff reader, on small inputs ------------------------------------------------

def test_hunks_apply_exactly_and_keep_a_missing_final_newline():
    patch = (b"--- a/pkg/m.py\n+++ b/pkg/m.py\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n"
             b"@@ -5,2 +5,2 @@\n e\n-f\n\\ No newline at end of file\n+F\n\\ No newline at end of file\n")
    (file_patch,) = d.parse_patch(patch, "t.patch")
    assert file_patch.path == "pkg/m.py"
    assert d.apply_file_patch(b"a\nb\nc\nd\ne\nf", file_patch, "t.patch") == b"a\nB\nc\nd\ne\nF"
    with pytest.raises(d.DDTreeError, match=r"hunk 2 .* does not apply to pkg/m.py at line 5"):
        d.apply_file_patch(b"a\nb\nc\nd\nx\ne\nf", file_patch, "t.patch")  # would apply at an offset: refused


def test_new_and_deleted_files_and_bad_patches():
    create = b"--- /dev/null\n+++ b/pkg/new.py\n@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n"
    (fp,) = d.parse_patch(create, "c.patch")
    assert d.apply_file_patch(None, fp, "c.patch") == b"x = 1\ny = 2\n"
    with pytest.raises(d.DDTreeError, match="already exists"):
        d.apply_file_patch(b"", fp, "c.patch")
    (rm,) = d.parse_patch(b"--- a/pkg/new.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-x = 1\n-y = 2\n", "d.patch")
    assert d.apply_file_patch(b"x = 1\ny = 2\n", rm, "d.patch") is None
    for bad, message in ((b"hello\n", "not a unified diff"),
                         (b"--- a/../etc/passwd\n+++ b/../etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "relative path inside"),
                         (b"--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n-a\n+b\n", "ends early"),
                         (b"--- a/x.py\n+++ b/y.py\n@@ -1 +1 @@\n-a\n+b\n", "renames are not supported")):
        with pytest.raises(d.DDTreeError, match=message):
            d.parse_patch(bad, "bad.patch")


def test_the_series_gives_what_gnu_patch_gives(env, tmp_path):
    """An independent check of the diff reader: GNU patch on a copy of the same files."""
    if not shutil.which("patch"):
        pytest.skip("GNU patch is not installed here; it is only the reference for this comparison")
    _venv, site, manifest = env
    copy = tmp_path / "gnu"
    for rel in (SERVER_ARGS, SPEC_INFO):
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(site) / rel, copy / rel)
    for item in patch_inputs():
        subprocess.run(["patch", "-p1", "-s", "--fuzz=0", "-i", item["src"]], cwd=copy, check=True)
    _plan, results = d.plan_apply(site, "patch", patch_inputs(), SGLANG_VERSION, {}, manifest)
    assert sorted(results) == [SERVER_ARGS, DDTREE_UTILS, SPEC_INFO]
    for rel, data in results.items():
        assert data == (copy / rel).read_bytes(), rel


# -- apply, idempotence, revert ------------------------------------------------------

def test_patch_series_applies_writes_a_manifest_and_imports(env):
    venv, site, manifest = env
    before = tree(Path(site))
    plan, record = build(site, manifest)
    assert plan.changed and sorted(plan.ops) == [SERVER_ARGS, DDTREE_UTILS, SPEC_INFO]
    after = tree(Path(site))
    assert {k for k in after if after[k] != before.get(k)} == {SERVER_ARGS, DDTREE_UTILS, SPEC_INFO}
    assert '"DDTREE", "DFLASH"' in (Path(site) / SERVER_ARGS).read_text()
    assert import_in(venv) == "DDTREE True ['libcudart.so.12']"

    written = json.loads(Path(manifest).read_text())
    assert written == record
    assert written["state"] == "applied" and written["source"] == "patch" and written["sglang_version"] == "0.5.11"
    assert written["applied_by"] == "alice" and written["applied_at"].endswith("Z")
    assert [i["sha256"] for i in written["inputs"]] == [sha256(Path(i["src"])) for i in patch_inputs()]
    files = {f["path"]: f for f in written["files"]}
    assert files[DDTREE_UTILS]["original_sha256"] is None
    assert files[SPEC_INFO]["original_sha256"] == before[SPEC_INFO]
    assert all(f["result_sha256"] == after[p] for p, f in files.items())
    assert not (Path(site) / d.WORK_DIR).exists()

    again, _results = d.plan_apply(site, "patch", patch_inputs(), SGLANG_VERSION, {}, manifest)
    assert not again.changed and again.ops == {}
    assert d.apply(site, again, manifest, "bob")["applied_by"] == "alice"


def test_revert_puts_back_byte_identical_files(env):
    _venv, site, manifest = env
    before = tree(Path(site))
    build(site, manifest)
    record, ops = d.plan_revert(site, manifest)
    assert sorted(ops) == [SERVER_ARGS, DDTREE_UTILS, SPEC_INFO] and ops[DDTREE_UTILS] is None
    reverted = d.revert(site, record, ops, manifest, "carol")
    assert tree(Path(site)) == before
    written = json.loads(Path(manifest).read_text())
    assert written == reverted and written["state"] == "reverted" and written["reverted_by"] == "carol"
    assert not Path(d.originals_dir(manifest)).exists()
    assert d.plan_revert(site, manifest) == (None, {})


def test_overlay_applies_and_switching_builds_restores_what_the_new_one_drops(env, tmp_path):
    venv, site, manifest = env
    before = tree(Path(site))
    build(site, manifest)
    # the overlay's spec_info is made from the pinned file, which the patch build has replaced: use a fresh copy
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / SPEC_INFO).parent.mkdir(parents=True)
    shutil.copy(d.originals_dir(manifest) + "/" + SPEC_INFO, fresh / SPEC_INFO)
    overlay = overlay_dir(fresh, tmp_path / "overlay")
    plan, record = build(site, manifest, "overlay", overlay_inputs(overlay))
    assert sorted(plan.ops) == [SERVER_ARGS]  # back to the original; spec_info and ddtree_utils are the same bytes
    after = tree(Path(site))
    assert after[SERVER_ARGS] == before[SERVER_ARGS]
    assert after[SPEC_INFO] == sha256(overlay / SPEC_INFO) and DDTREE_UTILS in after
    assert record["source"] == "overlay" and [f["path"] for f in record["files"]] == [DDTREE_UTILS, SPEC_INFO]
    assert import_in(venv) == "DDTREE True ['libcudart.so.12']"
    record, ops = d.plan_revert(site, manifest)
    d.revert(site, record, ops, manifest, "carol")
    assert tree(Path(site)) == before


# -- refusals: nothing changes -------------------------------------------------------

def refused(site: str, manifest: str, match: str, **kwargs) -> None:
    before = tree(Path(site))
    with pytest.raises(d.DDTreeError, match=match):
        build(site, manifest, **kwargs)
    assert tree(Path(site)) == before
    assert not Path(manifest).exists() and not (Path(site) / d.WORK_DIR).exists()


def test_an_input_with_the_wrong_checksum_changes_nothing(env):
    _venv, site, manifest = env
    inputs = patch_inputs()
    inputs[2]["sha256"] = "0" * 64
    refused(site, manifest, "0003-ddtree-utils.patch: checksum mismatch", inputs=inputs)


def test_another_sglang_version_changes_nothing(env):
    _venv, site, manifest = env
    refused(site, manifest, "the build is for SGLang 0.5.10 but .* has SGLang 0.5.11", version="0.5.10")


def test_a_patch_that_does_not_apply_changes_nothing(env, tmp_path):
    _venv, site, manifest = env
    broken = tmp_path / "patch"
    shutil.copytree(FIXTURES / "patch", broken)
    path = broken / "0002-spec-info-ddtree-algorithm.patch"
    path.write_text(path.read_text().replace("     NGRAM = auto()", "     NGRAMS = auto()"))
    inputs = patch_inputs(broken)
    inputs[1]["sha256"] = sha256(path)  # an honest checksum of a patch made for other sources
    refused(site, manifest, r"0002-spec-info-ddtree-algorithm.patch: hunk 1 .* does not apply", inputs=inputs)


def test_an_installed_file_that_is_not_the_pinned_one_changes_nothing(env):
    _venv, site, manifest = env
    target = Path(site) / SPEC_INFO
    target.write_text(target.read_text() + "# local edit\n")
    refused(site, manifest, f"{SPEC_INFO} is not the pinned SGLang's file")
    (Path(site) / SPEC_INFO).write_bytes(target.read_bytes()[: -len(b"# local edit\n")])
    (Path(site) / DDTREE_UTILS).write_text("CUDA_LIBRARIES = []\n")
    refused(site, manifest, f"{DDTREE_UTILS} exists but the pinned SGLang has no such file")


# -- interruption --------------------------------------------------------------------

def test_an_error_part_way_puts_every_file_back(env, monkeypatch):
    _venv, site, manifest = env
    before = tree(Path(site))
    calls = []

    def failing(src, dst):
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        calls.append(dst)
        d.os.replace(src, dst)

    monkeypatch.setattr(d, "replace_file", failing)
    with pytest.raises(d.DDTreeError, match="interrupted .*No space left on device.* put back"):
        build(site, manifest)
    assert len(calls) == 2 and tree(Path(site)) == before
    assert not Path(manifest).exists() and d.pending(site, manifest) is None


CRASH = """
import os, signal, sys
sys.path.insert(0, {collections!r})
from ansible_collections.inferops.sglang.plugins.module_utils import _ddtree as d
done = []
def crash(src, dst):
    if len(done) == {after}:
        os.kill(os.getpid(), signal.SIGKILL)
    os.replace(src, dst)
    done.append(dst)
d.replace_file = crash
plan, _ = d.plan_apply({site!r}, "patch", {inputs!r}, "0.5.11", {{}}, {manifest!r})
d.apply({site!r}, plan, {manifest!r}, "alice")
"""


@pytest.mark.parametrize("after", [1, 2])
def test_a_killed_apply_is_rolled_back_by_the_next_run_which_then_completes(env, after):
    venv, site, manifest = env
    before = tree(Path(site))
    code = CRASH.format(collections=str(REPO / "collections"), after=after, site=site, inputs=patch_inputs(),
                        manifest=manifest)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    half = tree(Path(site))
    assert sum(half.get(k) != before.get(k) for k in set(half) | set(before)) == after  # really half applied
    journal = d.pending(site, manifest)
    assert journal is not None and len(journal["entries"]) == 3
    assert json.loads(Path(manifest).read_text())["state"] == "applying"  # a deploy can tell it is not a build

    assert sorted(d.roll_back(site, manifest)) == sorted(e["path"] for e in journal["entries"][:after])
    assert tree(Path(site)) == before and not Path(manifest).exists() and d.pending(site, manifest) is None
    build(site, manifest)
    assert json.loads(Path(manifest).read_text())["state"] == "applied"
    assert import_in(venv) == "DDTREE True ['libcudart.so.12']"


# -- trust: what the module did not write ------------------------------------------

def test_confined_refuses_links_pth_files_and_files_outside_the_package(tmp_path):
    site = tmp_path / "site"
    (site / "sglang" / "srt").mkdir(parents=True)
    (site / "sglang" / "srt" / "ok.py").write_text("x = 1\n")
    (tmp_path / "outside").mkdir()
    (site / "sglang" / "out").symlink_to(tmp_path / "outside")
    (site / "sglang" / "alias").symlink_to("srt")
    (site / "sglang" / "srt" / "linked.py").symlink_to("ok.py")
    (site / "sglang" / "file").write_text("")
    assert d.confined(str(site), "sglang/srt/ok.py", "t") == str(site / "sglang" / "srt" / "ok.py")
    assert d.confined(str(site), "sglang/srt/new/deeper.py", "t") == str(site / "sglang" / "srt" / "new" / "deeper.py")
    for path, message in (("sglang/out/x.py", r"t: .*/sglang/out is a symbolic link \(to .*outside\)"),
                          ("sglang/alias/ok.py", r"t: .*/sglang/alias is a symbolic link \(to srt\)"),
                          ("sglang/srt/linked.py", r"t: .*/sglang/srt/linked.py is a symbolic link \(to ok.py\)"),
                          ("sglang/file/x.py", r"t: .*/sglang/file is not a directory"),
                          ("sglang/srt", r"t: .*/sglang/srt is not a regular file"),
                          ("sglang/srt/x.pth", r"t: sglang/srt/x.pth is a \.pth file"),
                          ("evil.pth", r"t: evil.pth is a \.pth file"),
                          ("sitecustomize.py", "t: sitecustomize.py is outside the sglang package"),
                          ("sglang", "t: sglang is outside the sglang package"),
                          ("../site/sglang/srt/ok.py", "must be a relative path inside site-packages"),
                          ("/etc/passwd", "must be a relative path inside site-packages")):
        with pytest.raises(d.DDTreeError, match=message):
            d.confined(str(site), path, "t")


def test_a_planted_journal_entry_is_refused_before_any_genuine_entry_is_rolled_back(env, tmp_path):
    _venv, site, manifest = env
    plan, _results = d.plan_apply(site, "patch", patch_inputs(), SGLANG_VERSION, {}, manifest)
    d.apply(site, plan, manifest, "alice", hold=True)
    path = Path(d.journal_path(site))
    journal = json.loads(path.read_text())
    # Entries are rolled back last first: the planted one comes first, so the genuine ones would be undone
    # before it is reached. It aims at /etc/passwd (with its own checksum: nothing to restore there).
    journal["entries"].insert(0, {"path": "/etc/passwd", "before": sha256(Path("/etc/passwd")), "after": None,
                                  "new": None, "old": None})
    journal["checksum"] = d.journal_checksum(journal)
    path.write_text(json.dumps(journal))
    before = snapshot(tmp_path)
    with pytest.raises(d.DDTreeError, match=r"journal .* is not trusted: entry 0: '/etc/passwd' must be a relative "
                                            "path inside site-packages. Nothing was changed"):
        d.roll_back(site, manifest)
    assert snapshot(tmp_path) == before
    # The journal's own checksum: any change to it that is not resealed is refused.
    journal["held"] = False
    path.write_text(json.dumps(journal))
    with pytest.raises(d.DDTreeError, match="its checksum does not match its content"):
        d.pending(site, manifest)
