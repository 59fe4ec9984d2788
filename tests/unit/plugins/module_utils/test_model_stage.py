"""Model weights staged from a mirror (plugins/module_utils/_model_stage.py): from a real HTTP
mirror (lab/mirror/serve.py: Range requests, and a body cut after N bytes) and from a local
directory; a corrupt shard, a missing shard and an interrupted download each refused with
the model path unchanged; the resume; the atomic swap; the quick and full checks."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from model_helpers import make_model, publish
from sim_helpers import REPO

from ansible_collections.inferops.sglang.plugins.module_utils import _model_stage as ms

SERVE = REPO / "lab" / "mirror" / "serve.py"


class Mirror:
    def __init__(self, directory: Path, tmp: Path, *cut: str) -> None:
        port_file = tmp / f"port-{time.monotonic_ns()}"
        args = [sys.executable, str(SERVE), str(directory), "--port-file", str(port_file)]
        for item in cut:
            args += ["--cut", item]
        self.proc = subprocess.Popen(args, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not port_file.exists():
            assert time.monotonic() < deadline and self.proc.poll() is None, "the mirror did not start"
            time.sleep(0.02)
        self.url = f"http://127.0.0.1:{port_file.read_text()}"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def mirrors(tmp_path):
    started: list[Mirror] = []

    def start(directory: Path, *cut: str) -> Mirror:
        started.append(Mirror(directory, tmp_path, *cut))
        return started[-1]

    yield start
    for mirror in started:
        mirror.stop()


@pytest.fixture
def published(tmp_path):
    """Revision r1 and r2 of a model, published to mirror directories."""
    r1 = publish(make_model(tmp_path / "build-r1", 7), tmp_path / "mirror" / "r1", "r1")
    r2 = publish(make_model(tmp_path / "build-r2", 40), tmp_path / "mirror" / "r2", "r2")
    return {"r1": r1, "r2": r2}


def same_tree(one: Path, other: Path) -> bool:
    names = sorted(p.name for p in one.iterdir() if p.name != ms.MARKER)
    return names == sorted(p.name for p in other.iterdir() if p.name != ms.MARKER) and all(
        (one / n).read_bytes() == (other / n).read_bytes() for n in names)


def test_a_revision_is_staged_from_an_http_mirror_then_left_alone(tmp_path, published, mirrors):
    dest = tmp_path / "models" / "tiny"
    (tmp_path / "models").mkdir()
    mirror = mirrors(published["r1"])
    result = ms.stage(str(dest), ms.Source(mirror.url), "r1")
    assert result["changed"] is True and result["previous"] is None
    assert result["fetched_bytes"] == result["bytes"] and result["files"] == 4
    assert dest.is_symlink() and os.readlink(dest) == ".tiny.revisions/r1"
    assert same_tree(dest.resolve(), published["r1"])
    marker = json.loads((dest / ms.MARKER).read_text())
    assert marker["revision"] == "r1" and marker["source"] == mirror.url
    assert ms.check(str(dest), ms.local_manifest(str(dest)), full=True) == []
    again = ms.stage(str(dest), ms.Source(mirror.url), "r1")
    assert again["changed"] is False and again["fetched_bytes"] == 0 and "already" in again["msg"]


def test_a_new_revision_from_a_local_mirror_swaps_in_and_keeps_the_previous(tmp_path, published):
    dest = tmp_path / "tiny"
    ms.stage(str(dest), ms.Source(str(published["r1"])), "r1")
    result = ms.stage(str(dest), ms.Source(f"file://{published['r2']}"), "r2")
    assert result["changed"] is True and result["previous"] == str(tmp_path / ".tiny.revisions" / "r1")
    assert os.readlink(dest) == ".tiny.revisions/r2" and same_tree(dest.resolve(), published["r2"])
    assert (tmp_path / ".tiny.revisions" / "r1" / "config.json").exists()  # kept (keep=2)
    back = ms.stage(str(dest), ms.Source(str(published["r1"])), "r1", keep=1)
    # the kept revision comes back without a download; keep=1 then prunes r2
    assert back["changed"] is True and back["fetched_bytes"] == 0 and "swapped the kept revision r1 back" in back["msg"]
    assert os.readlink(dest) == ".tiny.revisions/r1" and same_tree(dest.resolve(), published["r1"])
    assert sorted(os.listdir(tmp_path / ".tiny.revisions")) == ["r1"]
    # a kept revision that was damaged since is fetched again, not swapped in
    ms.stage(str(dest), ms.Source(str(published["r2"])), "r2")
    os.truncate(tmp_path / ".tiny.revisions" / "r1" / "config.json", 3)
    again = ms.stage(str(dest), ms.Source(str(published["r1"])), "r1")
    assert again["fetched_bytes"] == again["bytes"] and same_tree(dest.resolve(), published["r1"])


def test_a_model_directory_is_exchanged_for_the_symlink_and_kept(tmp_path, published):
    dest = make_model(tmp_path / "tiny", 99)
    before = (dest / "config.json").read_bytes()
    result = ms.stage(str(dest), ms.Source(str(published["r1"])), "r1")
    assert dest.is_symlink() and same_tree(dest.resolve(), published["r1"])
    kept = Path(result["previous"])
    assert kept.parent == tmp_path / ".tiny.revisions" and kept.name.startswith("previous-")
    assert (kept / "config.json").read_bytes() == before


def test_a_corrupt_shard_is_refused_and_the_model_stays(tmp_path, published, mirrors):
    dest = tmp_path / "tiny"
    ms.stage(str(dest), ms.Source(str(published["r1"])), "r1")
    shard = published["r2"] / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF  # same size, one byte off: only the sha256 tells
    shard.write_bytes(bytes(data))
    mirror = mirrors(published["r2"])
    with pytest.raises(ms.StageError, match=r"model-00002-of-00002.safetensors is corrupt: its sha256 differs"):
        ms.stage(str(dest), ms.Source(mirror.url), "r2")
    assert os.readlink(dest) == ".tiny.revisions/r1" and same_tree(dest.resolve(), published["r1"])
    staging = tmp_path / ".tiny.revisions" / ".staging-r2"
    assert not (staging / "model-00002-of-00002.safetensors").exists()  # the next run fetches it again
    assert (staging / "model-00001-of-00002.safetensors").exists()  # verified, kept


def test_a_missing_shard_is_refused_and_the_model_stays(tmp_path, published, mirrors):
    dest = tmp_path / "tiny"
    ms.stage(str(dest), ms.Source(str(published["r1"])), "r1")
    (published["r2"] / "model-00001-of-00002.safetensors").unlink()
    mirror = mirrors(published["r2"])
    with pytest.raises(ms.StageError, match=r"model-00001-of-00002.safetensors listed in the manifest is missing at "
                                            r"the source \(HTTP 404"):
        ms.stage(str(dest), ms.Source(mirror.url), "r2")
    with pytest.raises(ms.StageError, match="missing at the source"):
        ms.stage(str(dest), ms.Source(str(published["r2"])), "r2")
    assert os.readlink(dest) == ".tiny.revisions/r1" and same_tree(dest.resolve(), published["r1"])


def test_an_interrupted_download_is_refused_kept_and_resumed(tmp_path, published, mirrors):
    dest = tmp_path / "tiny"
    ms.stage(str(dest), ms.Source(str(published["r1"])), "r1")
    name = "model-00001-of-00002.safetensors"
    cut = mirrors(published["r2"], f"{name}:100000")
    with pytest.raises(ms.StageError, match=rf"the download of {name} was interrupted after 100000 bytes.*run again to "
                                            "resume"):
        ms.stage(str(dest), ms.Source(cut.url), "r2")
    assert os.readlink(dest) == ".tiny.revisions/r1"
    partial = tmp_path / ".tiny.revisions" / ".staging-r2" / name
    assert partial.stat().st_size == 100000
    whole = mirrors(published["r2"])
    result = ms.stage(str(dest), ms.Source(whole.url), "r2")
    assert result["changed"] is True and result["resumed"] == [name]
    # only what was missing came over the wire: the manifest lists config.json first (whole
    # after the first run), then the cut shard (100000 bytes kept), then the rest
    assert list(json.loads((published["r2"] / ms.MANIFEST).read_text())["files"])[:2] == ["config.json", name]
    assert result["fetched_bytes"] == result["bytes"] - 100000 - (published["r2"] / "config.json").stat().st_size
    assert same_tree(dest.resolve(), published["r2"])


def test_the_manifest_pins_the_revision_and_its_paths_stay_inside_the_model(tmp_path, published):
    with pytest.raises(ms.StageError, match="the source's manifest is of revision r1, not r9"):
        ms.stage(str(tmp_path / "tiny"), ms.Source(str(published["r1"])), "r9")
    assert not (tmp_path / "tiny").exists()
    for bad in ({"../etc/passwd": {"size": 1, "sha256": "0" * 64}}, {"/etc/shadow": {"size": 1, "sha256": "0" * 64}},
                {"ok.json": {"size": 1, "sha256": "xyz"}}, {}):
        with pytest.raises(ms.StageError):
            ms.parse_manifest(json.dumps({"files": bad}), "m")
    with pytest.raises(ms.StageError, match="neither an http"):
        ms.Source("relative/path")
    with pytest.raises(ms.StageError, match="revision '../x' must be"):
        ms.stage(str(tmp_path / "tiny"), ms.Source(str(published["r1"])), "../x")


def test_the_quick_check_finds_cut_missing_and_broken_weights_and_the_full_check_a_changed_byte(tmp_path):
    model = make_model(tmp_path / "m")
    manifest = ms.make_manifest(str(model), "r1")
    assert ms.check(str(model), manifest) == [] and ms.check(str(model), None) == []
    shard = model / "model-00002-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[:-1000])  # a cut download
    problems = ms.check(str(model), manifest)
    assert any("has 199" in p and "the manifest" in p for p in problems), problems
    assert any("tensors end at byte" in p for p in ms.check(str(model), None)), "without a manifest: the header"
    shard.write_bytes(b"garbage!" * 4)
    assert any("does not fit" in p or "does not parse" in p for p in ms.check(str(model), None))
    shard.unlink()
    assert "shard model-00002-of-00002.safetensors named by model.safetensors.index.json is missing" in ms.check(
        str(model), None)
    shard.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert ms.check(str(model), manifest) == []
    assert ms.check(str(model), manifest, full=True) == ["model-00002-of-00002.safetensors: sha256 differs from the "
                                                         "manifest's"]
    (tmp_path / "empty").mkdir()
    assert "no inferops-manifest.json" in ms.check(str(tmp_path / "empty"), None)[0]


@pytest.mark.parametrize("model", ["Qwen3.6-27B", "Qwen3.6-27B-DFlash"])
def test_the_lab_stand_in_models_carry_current_manifests(model):
    """lab/models/* list their own files (no weights): the deploy's quick check passes on the
    simulated hosts; without the manifest the index's 15 missing shards would refuse them."""
    directory = str(REPO / "lab" / "models" / model)
    manifest = ms.local_manifest(directory)
    assert manifest["revision"] == "lab-standin"
    assert ms.check(directory, manifest, full=True) == []
    assert ms.make_manifest(directory, "lab-standin") == json.loads(Path(directory, ms.MANIFEST).read_text())
    if model == "Qwen3.6-27B":
        assert any("named by model.safetensors.index.json is missing" in p for p in ms.check(directory, None))


# -- issue 29: what a mirror, or the path to it, can do to the host ---------------------------------------------------

def test_a_file_larger_than_the_manifest_says_is_never_read_past_its_size_and_removed(tmp_path, published, mirrors):
    """A 10-byte entry answered with 200 MiB was written whole, then kept for resuming."""
    dest = tmp_path / "tiny"
    shard = published["r2"] / "model-00002-of-00002.safetensors"
    with open(shard, "ab") as handle:
        handle.write(b"\0" * (3 << 20))  # the mirror now sends 3 MiB more than its manifest says
    staged = tmp_path / ".tiny.revisions" / ".staging-r2" / shard.name
    for source in (ms.Source(mirrors(published["r2"]).url), ms.Source(str(published["r2"]))):
        with pytest.raises(ms.StageError, match=f"{shard.name}: the source sends more than the manifest's size; what it "
                                                "sent was removed"):
            ms.stage(str(dest), source, "r2")
        assert not staged.exists() and not dest.exists()


def test_plain_http_is_refused_beyond_loopback_unless_allowed_and_redirects_stay_on_the_mirror(tmp_path, published, mirrors):
    with pytest.raises(ms.StageError, match="source http://mirror.internal/m/r1 is plain http: anyone on the way could "
                                            "choose the weights; use https, or allow it"):
        ms.Source("http://mirror.internal/m/r1")
    assert ms.Source("http://mirror.internal/m/r1", allow_http=True).http
    assert ms.Source("https://mirror.internal/m/r1").http and ms.Source("http://[::1]:8080/m").http
    # a mirror that redirects to another host (here another port of this one) is refused
    target = mirrors(published["r1"])

    class Redirect(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(302)
            self.send_header("Location", target.url + self.path)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(ms.StageError, match=rf"the mirror redirected to {target.url}/inferops-manifest.json, another "
                                                rf"scheme or host than http://127.0.0.1:{server.server_port}: refused"):
            ms.stage(str(tmp_path / "tiny"), ms.Source(f"http://127.0.0.1:{server.server_port}"), "r1")
    finally:
        server.shutdown()
        server.server_close()
    assert not (tmp_path / "tiny").exists()


def test_a_pinned_manifest_digest_refuses_another_manifest_before_anything_is_fetched(tmp_path, published):
    pinned = hashlib.sha256((published["r1"] / ms.MANIFEST).read_bytes()).hexdigest()
    with pytest.raises(ms.StageError, match=f"has sha256 [0-9a-f]{{64}}, not the pinned {pinned}: nothing is fetched"):
        ms.stage(str(tmp_path / "tiny"), ms.Source(str(published["r2"])), "r2", manifest_sha256=pinned)
    assert not (tmp_path / ".tiny.revisions").exists()
    with pytest.raises(ms.StageError, match="manifest_sha256 must be 64 lowercase hex digits"):
        ms.stage(str(tmp_path / "tiny"), ms.Source(str(published["r1"])), "r1", manifest_sha256="abc")
    result = ms.stage(str(tmp_path / "tiny"), ms.Source(str(published["r1"])), "r1", manifest_sha256=pinned)
    assert result["changed"] and result["manifest_sha256"] == pinned


def test_a_link_in_a_local_mirror_is_not_followed_and_the_staging_directory_is_roots_only(tmp_path, published):
    """A symlink in a local or NFS mirror made root copy any host file into a world-readable staging file."""
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret\n")
    secret.chmod(0o600)
    config = published["r2"] / "config.json"
    config.unlink()
    config.symlink_to(secret)
    dest = tmp_path / "tiny"
    with pytest.raises(ms.StageError, match="config.json listed in the manifest is missing at the source .*a symbolic "
                                            "link, not followed"):
        ms.stage(str(dest), ms.Source(str(published["r2"])), "r2")
    staging = tmp_path / ".tiny.revisions" / ".staging-r2"
    assert (staging.stat().st_mode & 0o777) == 0o700 and not (staging / "config.json").exists()
    # a link in place of a directory on the way is not followed either, nor is the manifest read through one
    (published["r2"] / ms.MANIFEST).rename(tmp_path / "manifest")
    (published["r2"] / ms.MANIFEST).symlink_to(tmp_path / "manifest")
    with pytest.raises(ms.StageError, match="cannot be read at the source .*a symbolic link, not followed"):
        ms.stage(str(dest), ms.Source(str(published["r2"])), "r2")
    # verified and swapped in: the revision is readable again, as the model was
    result = ms.stage(str(dest), ms.Source(str(published["r1"])), "r1")
    assert (Path(result["path"]).resolve().stat().st_mode & 0o777) == 0o755


def test_a_stage_the_disk_cannot_hold_is_refused_before_anything_is_fetched(tmp_path, published, monkeypatch):
    real = os.statvfs

    def almost_full(path):
        info = real(path)
        return os.statvfs_result((info.f_bsize, info.f_frsize, info.f_blocks, info.f_bfree, 10, info.f_files,
                                  info.f_ffree, info.f_favail, info.f_flag, info.f_namemax))

    monkeypatch.setattr(ms.os, "statvfs", almost_full)
    total = sum(e["size"] for e in json.loads((published["r1"] / ms.MANIFEST).read_text())["files"].values())
    with pytest.raises(ms.StageError, match=rf"the stage needs {total} bytes and .* has {10 * os.statvfs(tmp_path).f_frsize} "
                                            "free: nothing is fetched"):
        ms.stage(str(tmp_path / "tiny"), ms.Source(str(published["r1"])), "r1")
    assert os.listdir(tmp_path / ".tiny.revisions" / ".staging-r1") == []


def test_the_sources_credentials_are_in_no_message_and_no_marker(tmp_path, published, mirrors):
    mirror = mirrors(published["r1"])
    url = mirror.url.replace("http://", "http://mirror-user:s3cret-pass@")
    result = ms.stage(str(tmp_path / "tiny"), ms.Source(url), "r1")
    marker = (tmp_path / "tiny" / ms.MARKER).read_text()
    assert "s3cret" not in marker and json.loads(marker)["source"] == mirror.url
    assert "s3cret" not in json.dumps(result)
    with pytest.raises(ms.StageError) as refused:
        ms.stage(str(tmp_path / "other"), ms.Source(url + "/absent"), "r1")
    assert "s3cret" not in str(refused.value) and "HTTP 404" in str(refused.value)


def test_a_parent_directory_another_user_can_change_is_refused(tmp_path, published):
    """A user who can write /srv/models plants .<name>.revisions as a link: the stage, as root,
    would then rename and prune directories wherever it points."""
    models = tmp_path / "models"
    models.mkdir()
    models.chmod(0o777)
    with pytest.raises(ms.StageError, match=r"models \(the model's parent directory\) can be changed by another user "
                                            r"\(owner uid \d+, mode 0777\)"):
        ms.stage(str(models / "tiny"), ms.Source(str(published["r1"])), "r1")
    models.chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (models / ".tiny.revisions").symlink_to(elsewhere)
    with pytest.raises(ms.StageError, match=r"\.tiny\.revisions is a symbolic link"):
        ms.stage(str(models / "tiny"), ms.Source(str(published["r1"])), "r1")
    assert os.listdir(elsewhere) == [] and not (models / "tiny").exists()
