"""Model weights staged from the lab's model mirror (prepare.yml: the real tiny model,
revisions r1 and r2 with their manifests, served over HTTP with Range requests).

Converge staged r1 (provision.yml's sglang_model step). Here, through the role alone
(model.yml, as `provision.yml --tags sglang_model` runs it): a corrupt shard, a missing
shard and an interrupted download of r2 are each refused with a clear message and leave
r1 in place and whole; then r2 is staged, resuming the interrupted download, and swapped in.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import testinfra

HOST = testinfra.get_host("podman://prov-ct129")
SCENARIO = Path(__file__).resolve().parents[1]
MODEL = "/srv/models/tiny-qwen2"
MIRROR = "/srv/inferops-models/tiny-qwen2"
SHARD = "model.safetensors"


def role(*extra: str) -> subprocess.CompletedProcess:
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", os.environ["MOLECULE_INVENTORY_FILE"],
            str(SCENARIO / "model.yml")]
    for item in extra:
        argv += ["-e", item]
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    # one stream: a task's failure goes to stderr, the rest to stdout
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, check=False,
                          env=env)


def sums(directory: str) -> dict[str, str]:
    out = HOST.check_output(f"cd {directory} && find . -type f ! -name .inferops-model.json -print0 | sort -z "
                            "| xargs -0 sha256sum")
    return {line.split()[1]: line.split()[0] for line in out.splitlines()}


def assert_r1_in_place() -> None:
    assert HOST.file(MODEL).is_symlink and HOST.file(MODEL).linked_to.endswith("/.tiny-qwen2.revisions/r1")
    assert sums(MODEL + "/") == sums(f"{MIRROR}/r1/")
    check = role("sglang_model_state=verified", "sglang_model_verify=full", "sglang_model_revision=r1")
    assert check.returncode == 0, check.stdout[-3000:]


def test_converge_staged_r1_from_the_mirror():
    assert_r1_in_place()
    marker = HOST.file(f"{MODEL}/.inferops-model.json")
    assert '"revision": "r1"' in marker.content_string and "http://127.0.0.1:8082/tiny-qwen2/r1" in marker.content_string
    assert HOST.file(f"{MODEL}/").mode == 0o755 and HOST.file(f"{MODEL}/{SHARD}").mode & 0o004


def test_a_corrupt_shard_is_refused_and_r1_stays():
    HOST.check_output(f"rm -rf {MIRROR}/r2-corrupt && cp -a {MIRROR}/r2 {MIRROR}/r2-corrupt && "
                      f"python3 -c \"p='{MIRROR}/r2-corrupt/{SHARD}'; d=bytearray(open(p,'rb').read()); "
                      f"d[-5]^=255; open(p,'wb').write(bytes(d))\"")
    run = role("sglang_model_revision=r2", "sglang_model_source=http://127.0.0.1:8082/tiny-qwen2/r2-corrupt")
    assert run.returncode == 2, run.stdout[-3000:]
    assert f"{SHARD} is corrupt: its sha256 differs from the manifest's" in run.stdout, run.stdout[-3000:]
    assert f"{MODEL} is unchanged" in run.stdout
    assert_r1_in_place()


def test_a_missing_shard_is_refused_and_r1_stays():
    HOST.check_output(f"rm -rf {MIRROR}/r2-missing && cp -a {MIRROR}/r2 {MIRROR}/r2-missing && "
                      f"rm {MIRROR}/r2-missing/{SHARD}")
    run = role("sglang_model_revision=r2", "sglang_model_source=http://127.0.0.1:8082/tiny-qwen2/r2-missing")
    assert run.returncode == 2, run.stdout[-3000:]
    assert f"{SHARD} listed in the manifest is missing at the source (HTTP 404" in run.stdout, run.stdout[-3000:]
    assert_r1_in_place()


def test_an_interrupted_download_is_refused_then_resumed_and_r2_swapped_in():
    HOST.check_output("systemd-run --unit inferops-model-mirror-cut /usr/bin/python3 /usr/local/sbin/inferops-model-mirror "
                      f"/srv/inferops-models --bind 127.0.0.1 --port 8083 --cut tiny-qwen2/r2/{SHARD}:100000")
    try:
        HOST.check_output("for i in $(seq 50); do curl -sf -o /dev/null http://127.0.0.1:8083/tiny-qwen2/r2/"
                          "inferops-manifest.json && exit 0; sleep 0.2; done; exit 1")
        run = role("sglang_model_revision=r2", "sglang_model_source=http://127.0.0.1:8083/tiny-qwen2/r2")
    finally:
        HOST.run("systemctl stop inferops-model-mirror-cut")
    assert run.returncode == 2, run.stdout[-3000:]
    assert f"the download of {SHARD} was interrupted after 100000 bytes" in run.stdout, run.stdout[-3000:]
    assert "run again to resume" in run.stdout
    partial = HOST.file(f"/srv/models/.tiny-qwen2.revisions/.staging-r2/{SHARD}")
    assert partial.size == 100000
    assert_r1_in_place()

    run = role("sglang_model_revision=r2", "sglang_model_source=http://127.0.0.1:8082/tiny-qwen2/r2")
    assert run.returncode == 0, run.stdout[-3000:]
    assert f"resumed={SHARD}" in run.stdout and "changed=True" in run.stdout, run.stdout[-3000:]
    assert HOST.file(MODEL).linked_to.endswith("/.tiny-qwen2.revisions/r2")
    assert sums(MODEL + "/") == sums(f"{MIRROR}/r2/")
    assert HOST.file("/srv/models/.tiny-qwen2.revisions/r1/config.json").exists  # the previous revision is kept
    again = role("sglang_model_revision=r2", "sglang_model_source=http://127.0.0.1:8082/tiny-qwen2/r2")
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]
