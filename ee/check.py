# -*- coding: utf-8 -*-
# Copyright (c) inferops.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run deploy.yml inside the execution environment as AWX runs a job (make ee-check).

ansible-runner with the EE image (process isolation, podman) and a private data directory
laid out as AWX lays one out for a job:

- project/: the repository's deploy.yml alone (it imports inferops.sglang.deploy), with no
  ansible.cfg and no collections/ link: the collection is the one installed in the image;
- inventory/: the lab inventory (inventories/lab, links resolved), each lab host reached over
  SSH at its container's address, as a machine credential reaches a host;
- env/ssh_key: that credential's private key (ansible-runner adds it to an agent in the job);
- env/extravars: the job's extra vars (the survey's answers).

Against the lab's ct129 and ct200 (lab/labctl up): variant=nextn (both on the baseline),
then variant=balanced with rollout_canary=2, the field story: ct129 fails and is rolled back to
NEXTN, ct200 switches, the job fails (exit 2). Checked from the runner's artifacts as AWX reads
them: rc and status, the deploy summary in stdout, the set_stats artifacts of each host's record.

    python3 ee/check.py [--image inferops-sglang-ee:VERSION]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / ".cache" / "ee" / "job"
HOSTS = ("ct129", "ct200")


def sh(*argv: str, stdin: str | None = None) -> str:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, check=True).stdout


def lab_up() -> dict[str, str]:
    """The lab's hosts up, each one's address."""
    subprocess.run([str(REPO / "lab" / "labctl"), "up", *HOSTS], check=True, stdout=subprocess.DEVNULL)
    return {host: sh("podman", "exec", f"inferops-lab-{host}", "hostname", "-I").split()[0] for host in HOSTS}


def credential(addresses: dict[str, str]) -> str:
    """A key of this check, authorized for root on each lab host (as a machine credential is)."""
    key = WORK / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "inferops-ee-check", "-f", str(key)], check=True)
    public = key.with_suffix(".pub").read_text()
    for host in addresses:
        sh("podman", "exec", "-i", f"inferops-lab-{host}", "sh", "-c",
           "umask 077 && mkdir -p /root/.ssh && cat >> /root/.ssh/authorized_keys", stdin=public)
    return key.read_text()


def private_data_dir(addresses: dict[str, str], key: str) -> Path:
    pdd = WORK / "runner"
    (pdd / "project").mkdir(parents=True)
    shutil.copy(REPO / "deploy.yml", pdd / "project" / "deploy.yml")
    shutil.copytree(REPO / "inventories" / "lab", pdd / "inventory", symlinks=False)
    # A later inventory source wins for a host's variables: SSH instead of the lab's podman connection.
    (pdd / "inventory" / "zz-ssh.yml").write_text(yaml.safe_dump({"all": {"hosts": {
        host: {"ansible_connection": "ssh", "ansible_host": address, "ansible_user": "root",
               "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"}
        for host, address in addresses.items()}}}))
    (pdd / "env").mkdir()
    (pdd / "env" / "ssh_key").write_text(key)
    os.chmod(pdd / "env" / "ssh_key", 0o600)
    return pdd


def job(pdd: Path, image: str, ident: str, extravars: dict) -> dict:
    """One job: ansible-runner in the EE; what AWX keeps of it."""
    (pdd / "env" / "extravars").write_text(json.dumps(extravars))
    start = time.monotonic()
    proc = subprocess.run(
        ["ansible-runner", "run", str(pdd), "-p", "deploy.yml", "--ident", ident, "--limit", ",".join(HOSTS),
         "--process-isolation", "--process-isolation-executable", "podman", "--container-image", image,
         # This machine's podman is root's, and so are the job's files (the key's pipe is 0600): the job
         # runs as root in the container. AWX's rootless podman maps the job's own user instead.
         "--container-option=--user=0"],
        capture_output=True, text=True, check=False, timeout=1800)
    seconds = time.monotonic() - start
    artifacts = pdd / "artifacts" / ident
    stats = {}
    for event in sorted((artifacts / "job_events").glob("*.json")):
        data = json.loads(event.read_text())
        if data.get("event") == "playbook_on_stats":
            stats = data["event_data"].get("artifact_data") or {}
    return {"runner_rc": proc.returncode, "rc": int((artifacts / "rc").read_text()),
            "status": (artifacts / "status").read_text().strip(), "stdout": (artifacts / "stdout").read_text(),
            "artifact_data": stats, "seconds": round(seconds, 1)}


def summary(stdout: str) -> list[str]:
    """The deploy summary's host rows (and why a host did not switch), read as make lab reads them."""
    spec = importlib.util.spec_from_file_location("lab_step", REPO / "lab" / "step.py")
    step = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step)
    return [line.strip() for line in step.summary(re.sub(r"\x1b\[[0-9;]*m", "", stdout).splitlines())
            if line.startswith(HOSTS)]


def main() -> int:
    version = yaml.safe_load((REPO / "galaxy.yml").read_text())["version"]
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--image", default=f"inferops-sglang-ee:{version}")
    args = parser.parse_args()
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    addresses = lab_up()
    pdd = private_data_dir(addresses, credential(addresses))
    problems = []

    baseline = job(pdd, args.image, "nextn", {"variant": "nextn"})
    print(f"job nextn: rc {baseline['rc']}, {baseline['status']}, {baseline['seconds']} s")
    print("\n".join(f"  {line}" for line in summary(baseline["stdout"])))
    if (baseline["rc"], baseline["status"]) != (0, "successful"):
        problems.append(f"job nextn: rc {baseline['rc']} {baseline['status']}:\n{baseline['stdout'][-3000:]}")

    story = job(pdd, args.image, "balanced", {"variant": "balanced", "rollout_canary": 2})
    print(f"job balanced: rc {story['rc']}, {story['status']}, {story['seconds']} s")
    rows = summary(story["stdout"])
    print("\n".join(f"  {line}" for line in rows))
    records = story["artifact_data"].get("inferops_deploy") or {}
    for host, record in sorted(records.items()):
        print(f"  artifact inferops_deploy[{host}]: outcome {record.get('outcome')}, running {record.get('running')}, "
              f"failure {(record.get('verdict') or {}).get('failure')}")
    if (story["rc"], story["status"]) != (2, "failed"):
        problems.append(f"job balanced: rc {story['rc']} {story['status']}, expected 2 failed")
    ct129 = next((row for row in rows if row.startswith("ct129")), "")
    ct200 = next((row for row in rows if row.startswith("ct200")), "")
    if "rolled back" not in ct129 or "nextn" not in ct129:
        problems.append(f"ct129's summary row is not a rollback to nextn: {ct129!r}")
    if "switched" not in ct200 or "shadow-balanced" not in ct200:
        problems.append(f"ct200's summary row is not a switch to shadow-balanced: {ct200!r}")
    if (records.get("ct129") or {}).get("outcome") != "rolled_back" or (records.get("ct200") or {}).get("outcome") != "switched":
        problems.append(f"set_stats artifacts: {json.dumps(records)[:2000]}")
    print("\n".join(["ee-check: FAILED"] + problems) if problems else
          f"ee-check: passed ({args.image}; artifacts in {pdd / 'artifacts'})")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
