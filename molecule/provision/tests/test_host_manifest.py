"""The host manifest provision.yml writes (molecule verify, pytest-testinfra;
after the toolkit tests, before the DDTree ones): root 0644, no secrets. That a
second run that finds the same host leaves it byte for byte as it was is proven
by the second run after the move back (test_zz_cuda_toolkit_downgrade.py), and
the DDTree cases (test_runtime_and_ddtree.py) check its verdict per build."""

from __future__ import annotations

import json

import testinfra

HOST = testinfra.get_host("podman://prov-ct129")
PATH = "/etc/inferops-sglang/host.json"


def manifest() -> dict:
    return json.loads(HOST.file(PATH).content_string)


def test_written_by_root_for_everyone_to_read():
    f = HOST.file(PATH)
    assert (f.user, f.group, f.mode) == ("root", "root", 0o644)
    assert HOST.file("/etc/inferops-sglang").mode == 0o755
    text = f.content_string
    assert "password" not in text.lower() and "api_key" not in text.lower()
    data = manifest()
    assert data["schema"] == 1 and data["builds"]["sglang"]["ok"] is True


def test_each_gpu_keeps_its_health_and_the_kernel_log_its_cursor():
    """The container's journal has no kernel entries: the Xid events come from dmesg (the lab's)."""
    gpus = manifest()["gpus"]
    assert gpus["kernel_log"]["source"] == "dmesg" and gpus["kernel_log"]["boot_id"]
    for gpu in gpus["usable"]:
        assert gpu["health"]["counters"]["ecc_mode"] == "Enabled" and gpu["health"]["sick"] == [], gpu
        assert gpu["health"]["counters"]["remap_pending"] is False


def gpu_facts() -> dict:
    """inferops.sglang.gpu_facts run on the host as provisioning runs it (gpu_preflight)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    argv = [str(Path(sys.executable).with_name("ansible")), "prov-ct129", "-i", os.environ["MOLECULE_INVENTORY_FILE"],
            "-m", "inferops.sglang.gpu_facts", "-a", "health_baseline=/etc/inferops-sglang/none.json container_checks=never"]
    env = {**os.environ, "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_STDOUT_CALLBACK": "json", "ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout)["plays"][0]["tasks"][0]["hosts"]["prov-ct129"]
    return result["ansible_facts"]["inferops_gpus"]


def test_a_gpu_with_a_pending_remap_or_fallen_off_the_bus_is_kept_out():
    """GPU 3 with a row remap pending (its hardware file), GPU 5 fallen off the bus (Xid 79 in the kernel log
    the container's dmesg prints): both unusable with the reason, the TP size chosen from the rest."""
    hardware = "/etc/inferops-lab/hardware.json"
    original = HOST.file(hardware).content_string
    data = json.loads(original)
    data["gpus"][3]["health"] = {"remap_pending": True, "remapped_uncorrectable": 1}
    line = ("import sys; sys.path.insert(0, '/opt/inferops-lab/lib'); from sglang_simulator import hardware as hw; "
            "hw.log_kernel(hw.xid_line(hw.load().gpu(5), 79, 'GPU has fallen off the bus.'), name='kernel-test.log')")
    try:
        HOST.run_test("printf %%s %s > %s", json.dumps(data), hardware)
        HOST.run_test("python3 -c %s", line)
        facts = gpu_facts()
    finally:
        HOST.run_test("printf %%s %s > %s", original, hardware)
        HOST.run_test("rm -f /run/inferops-lab/gpu/kernel-test.log")
    sick = {g["index"]: g["problem"] for g in facts["unusable"] if g["state"] == "sick"}
    assert sorted(sick) == [3, 5], facts["unusable"]
    assert sick[3].startswith("a row remap is pending")
    assert sick[5].startswith("Xid 79 (GPU has fallen off the bus) at ") and sick[5].endswith(": reboot the host")
    assert facts["usable"] == [0, 2, 4, 6, 7] and facts["tp"]["devices"] == [0, 2, 4, 6]
    assert facts["kernel_log"]["source"] == "dmesg"
