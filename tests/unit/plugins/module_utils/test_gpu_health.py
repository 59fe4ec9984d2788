"""GPU health: the Xid reader on verbatim real kernel-log lines (sources in docs/gpu-health.md),
the XML reader on real ``nvidia-smi -q -x`` layouts (DTD v11 with a pending remap's values,
v13 with ECC off, pre-Turing per-location counts, a GPU without a row remapper), and the decision."""

from __future__ import annotations

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _gpu_health as h

# Real lines: an H100 node's Xid 48 -> 63 -> 94 (dmesg --time-format iso, here with dmesg's default
# [seconds] stamp), a desktop GPU's Xid 62 without pid/name and Xid 31, NVIDIA's Xid 79 example,
# a MIG-attributed Xid 94, and driver 570's Xid-less "fallen off the bus" block.
DMESG = """\
[    0.000000] Linux version 6.8.0-45-generic (buildd@lcy02-amd64-075) (x86_64-linux-gnu-gcc-13)
[315905.140245] NVRM: GPU at PCI:0000:03:00: GPU-409297e7-8fea-6fdd-c14e-73154d286f4a
[315905.140252] NVRM: Xid (PCI:0000:03:00): 62, 00000a9f 00000a85 00000a72 00003786 00001d3e 000027d6 01013289 00000000
[315911.559820] NVRM: Xid (PCI:0000:03:00): 31, pid=12083, name=chrome, Ch 00000010, intr 10000000. MMU Fault: \
ENGINE CE0 HUBCLIENT_CE0 faulted @ 0x0_04a00000. Fault is of type FAULT_INFO_TYPE_UNSUPPORTED_KIND ACCESS_TYPE_WRITE
[316000.000001] NVRM: Xid (PCI:0000:19:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error \
(DBE) has been detected on GPU in the framebuffer at physAddr 0x12bac1c3e0 partition 2, subpartition 1.
[316000.028686] NVRM: Xid (PCI:0000:19:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: New row \
(0x00000012bac1c3e0) marked for remapping, reset gpu to activate.
[316000.051549] NVRM: Xid (PCI:0000:19:00): 94, pid=1248209, name=python3.10, Ch 00000008
[316001.000000] NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No
[316002.000000] NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus
[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0
[ 1843.308146] NVRM: (PCI ID: 10de:26b5) installed in this system has
[ 1843.308147] NVRM: fallen off the bus and is not responding to commands.
"""
# The same Xid as journalctl -k -o short-monotonic prints it.
JOURNAL = """\
[  412.118201] ct129 kernel: NVRM: Xid (PCI:0000:41:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp \
Exception on (GPC 8, TPC 5, SM 0): Out Of Range Address
"""

# nvidia-smi -q -x, DTD v11 (an Ampere GA102 card) with the values of a real GA102 capture's
# pending remap (Uncorrectable Error 4, Pending Yes).
XML_V11_PENDING = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v11.dtd">
<nvidia_smi_log>
    <driver_version>515.105.01</driver_version>
    <attached_gpus>1</attached_gpus>
    <gpu id="00000000:07:00.0">
        <product_name>NVIDIA A10G</product_name>
        <ecc_mode>
            <current_ecc>Enabled</current_ecc>
            <pending_ecc>Enabled</pending_ecc>
        </ecc_mode>
        <ecc_errors>
            <volatile>
                <sram_correctable>0</sram_correctable>
                <sram_uncorrectable>0</sram_uncorrectable>
                <dram_correctable>3</dram_correctable>
                <dram_uncorrectable>2</dram_uncorrectable>
            </volatile>
            <aggregate>
                <sram_correctable>0</sram_correctable>
                <sram_uncorrectable>0</sram_uncorrectable>
                <dram_correctable>7</dram_correctable>
                <dram_uncorrectable>4</dram_uncorrectable>
            </aggregate>
        </ecc_errors>
        <retired_pages>
            <multiple_single_bit_retirement>
                <retired_count>N/A</retired_count>
                <retired_pagelist>N/A</retired_pagelist>
            </multiple_single_bit_retirement>
            <double_bit_retirement>
                <retired_count>N/A</retired_count>
                <retired_pagelist>N/A</retired_pagelist>
            </double_bit_retirement>
            <pending_blacklist>N/A</pending_blacklist>
            <pending_retirement>N/A</pending_retirement>
        </retired_pages>
        <remapped_rows>
            <remapped_row_corr>0</remapped_row_corr>
            <remapped_row_unc>4</remapped_row_unc>
            <remapped_row_pending>Yes</remapped_row_pending>
            <remapped_row_failure>No</remapped_row_failure>
            <row_remapper_histogram>
                <row_remapper_histogram_max>192 bank(s)</row_remapper_histogram_max>
            </row_remapper_histogram>
        </remapped_rows>
    </gpu>
</nvidia_smi_log>
"""
# DTD v13 (an RTX A5000, GA102 workstation card, ECC off as shipped), tab-indented as printed.
XML_V13_ECC_OFF = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">
<nvidia_smi_log>
\t<driver_version>590.44.01</driver_version>
\t<gpu id="00000000:81:00.0">
\t\t<product_name>NVIDIA RTX A5000</product_name>
\t\t<ecc_mode>
\t\t\t<current_ecc>Disabled</current_ecc>
\t\t\t<pending_ecc>Disabled</pending_ecc>
\t\t</ecc_mode>
\t\t<ecc_errors>
\t\t\t<volatile>
\t\t\t\t<sram_correctable>N/A</sram_correctable>
\t\t\t\t<sram_uncorrectable_parity>N/A</sram_uncorrectable_parity>
\t\t\t\t<sram_uncorrectable_secded>N/A</sram_uncorrectable_secded>
\t\t\t\t<dram_correctable>N/A</dram_correctable>
\t\t\t\t<dram_uncorrectable>N/A</dram_uncorrectable>
\t\t\t</volatile>
\t\t\t<aggregate>
\t\t\t\t<sram_correctable>N/A</sram_correctable>
\t\t\t\t<sram_uncorrectable_parity>N/A</sram_uncorrectable_parity>
\t\t\t\t<sram_uncorrectable_secded>N/A</sram_uncorrectable_secded>
\t\t\t\t<dram_correctable>N/A</dram_correctable>
\t\t\t\t<dram_uncorrectable>N/A</dram_uncorrectable>
\t\t\t\t<sram_threshold_exceeded>N/A</sram_threshold_exceeded>
\t\t\t</aggregate>
\t\t\t<channel_repair_pending>No</channel_repair_pending>
\t\t</ecc_errors>
\t\t<remapped_rows>
\t\t\t<remapped_row_corr>0</remapped_row_corr>
\t\t\t<remapped_row_unc>0</remapped_row_unc>
\t\t\t<remapped_row_pending>No</remapped_row_pending>
\t\t\t<remapped_row_failure>No</remapped_row_failure>
\t\t</remapped_rows>
\t\t<gpu_recovery_action>None</gpu_recovery_action>
\t</gpu>
</nvidia_smi_log>
"""
# Pre-Turing per-location counts (a Pascal card, driver 418) and a Turing card without a row remapper.
XML_OLD = """<?xml version="1.0" ?>
<nvidia_smi_log>
        <gpu id="00000000:02:00.0">
                <ecc_mode><current_ecc>Enabled</current_ecc><pending_ecc>Enabled</pending_ecc></ecc_mode>
                <ecc_errors>
                        <volatile>
                                <single_bit><device_memory>5</device_memory><total>5</total></single_bit>
                                <double_bit><device_memory>1</device_memory><total>1</total></double_bit>
                        </volatile>
                        <aggregate>
                                <single_bit><device_memory>9</device_memory><total>9</total></single_bit>
                                <double_bit><device_memory>1</device_memory><total>1</total></double_bit>
                        </aggregate>
                </ecc_errors>
                <retired_pages>
                        <multiple_single_bit_retirement><retired_count>0</retired_count><retired_pagelist>
                        </retired_pagelist></multiple_single_bit_retirement>
                        <double_bit_retirement><retired_count>1</retired_count><retired_pagelist>
                        </retired_pagelist></double_bit_retirement>
                        <pending_blacklist>Yes</pending_blacklist>
                        <pending_retirement>No</pending_retirement>
                </retired_pages>
                <remapped_rows>N/A</remapped_rows>
        </gpu>
</nvidia_smi_log>
"""


def test_xid_lines_of_real_drivers():
    events = h.parse_kernel_log(DMESG)
    got = [(e["bus_id"], e["xid"], e["action"]) for e in events]
    assert got == [
        ("00000000:03:00.0", 62, "reset_gpu"),
        ("00000000:03:00.0", 31, "restart_app"),
        ("00000000:19:00.0", 48, "reset_gpu"),
        ("00000000:19:00.0", 63, "ignore"),
        ("00000000:19:00.0", 94, "restart_app"),
        ("00000000:01:00.0", 94, "restart_app"),   # MIG's GPU-I tag does not hide the PCI address
        ("00000000:44:00.0", 79, "reboot"),
        ("00000000:B3:00.0", 79, "reboot"),        # driver 570's block, no Xid number
    ]
    assert events[1]["pid"] == "12083" and events[1]["process"] == "chrome"
    assert events[1]["detail"].startswith("Ch 00000010, intr 10000000. MMU Fault")
    assert events[2]["pid"] == "<unknown>" and events[2]["time"] == pytest.approx(316000.000001)
    assert events[0]["pid"] is None and events[0]["detail"].startswith("00000a9f")
    assert events[-1]["time"] == pytest.approx(1843.308145)


def test_journal_short_monotonic_is_read_as_dmesg():
    (event,) = h.parse_kernel_log(JOURNAL)
    assert (event["bus_id"], event["xid"], event["action"], event["time"]) == ("00000000:41:00.0", 13, "restart_app", 412.118201)
    assert event["detail"].startswith("Graphics SM Warp Exception")
    assert h.kernel_lines(JOURNAL) == 1 and h.kernel_lines("-- No entries --\n") == 0


def test_catalog_actions():
    assert h.classify(79)[1] == "reboot"
    assert h.classify(48) == ("Double Bit ECC Error", "reset_gpu")
    assert h.classify(45)[1] == "ignore"        # follows the Xid before it
    assert h.classify(54)[1] == "contact_support"
    assert h.classify(999) == ("Xid 999, not in NVIDIA's catalog", "contact_support")
    assert h.classify(154, "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)")[1] == "reset_gpu"
    assert h.classify(154, "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)")[1] == "reboot"
    assert h.classify(154, "GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)")[1] == "contact_support"


def test_xml_layouts():
    pending = h.parse_smi_xml(XML_V11_PENDING)["00000000:07:00.0"]
    assert pending["ecc"] == {"current": "Enabled", "pending": "Enabled"}
    assert pending["volatile"] == {"corrected": 3, "uncorrected": 2}
    assert pending["aggregate"] == {"corrected": 7, "uncorrected": 4}
    assert pending["retired"] == {"single_bit": None, "double_bit": None, "pending": None}
    assert pending["remap"] == {"supported": True, "correctable": 0, "uncorrectable": 4, "pending": True, "failure": False}
    off = h.parse_smi_xml(XML_V13_ECC_OFF)["00000000:81:00.0"]
    assert off["ecc"]["current"] == "Disabled" and off["aggregate"] == {"corrected": None, "uncorrected": None}
    assert off["remap"]["pending"] is False and off["recovery_action"] == "None"
    old = h.parse_smi_xml(XML_OLD)["00000000:02:00.0"]
    assert old["volatile"] == {"corrected": 5, "uncorrected": 1} and old["aggregate"]["uncorrected"] == 1
    assert old["retired"] == {"single_bit": 0, "double_bit": 1, "pending": True}
    assert old["remap"]["supported"] is False and old["remap"]["pending"] is None


def test_xml_that_is_not():
    with pytest.raises(h.HealthError, match="no XML"):
        h.parse_smi_xml("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    with pytest.raises(h.HealthError, match="does not parse"):
        h.parse_smi_xml("<nvidia_smi_log><gpu id='x'>")


def test_a_pending_remap_and_a_fatal_xid_make_a_gpu_sick():
    memory = h.parse_smi_xml(XML_V11_PENDING)["00000000:07:00.0"]
    verdict = h.assess("00000000:07:00.0", memory, [])
    assert any("row remap is pending" in s for s in verdict["sick"])
    assert any("2 uncorrectable ECC error(s) since the driver loaded" in s for s in verdict["sick"])
    events = h.events_of(h.parse_kernel_log(DMESG), "00000000:44:00.0")
    verdict = h.assess("00000000:44:00.0", None, events)
    assert verdict["sick"] == ["Xid 79 (GPU has fallen off the bus) at 316002.0 s since boot: reboot the host"]


def test_restart_app_and_ignore_class_xids_leave_a_gpu_usable():
    events = h.events_of(h.parse_kernel_log(DMESG + JOURNAL), "00000000:41:00.0")
    assert [e["xid"] for e in events] == [13]
    assert h.assess("00000000:41:00.0", None, events)["sick"] == []


def test_new_uncorrectable_errors_since_the_baseline():
    memory = h.parse_smi_xml(XML_V11_PENDING)["00000000:07:00.0"]
    memory["remap"]["pending"] = False
    same = h.counters(memory)
    assert h.assess("00000000:07:00.0", memory, [], baseline=same)["sick"] == []
    before = dict(same, aggregate_uncorrected=1)
    assert h.assess("00000000:07:00.0", memory, [], baseline=before)["sick"] == [
        "3 new uncorrectable ECC error(s) since the last check (aggregate 1 -> 4)"]


def test_ecc_off_warns_or_refuses():
    memory = h.parse_smi_xml(XML_V13_ECC_OFF)["00000000:81:00.0"]
    warned = h.assess("00000000:81:00.0", memory, [])
    assert warned["sick"] == [] and "nvidia-smi -i 00000000:81:00.0 -e 1, then reboot" in warned["warnings"][0]
    assert "ECC is disabled" in h.assess("00000000:81:00.0", memory, [], ecc_disabled="refuse")["sick"][0]
    memory["ecc"]["pending"] = "Enabled"
    assert "enabled at the next reboot" in h.assess("00000000:81:00.0", memory, [])["warnings"][0]


def test_new_events_follow_the_cursor_within_a_boot_and_all_after_a_reboot():
    events = h.parse_kernel_log(DMESG)
    bus = "00000000:19:00.0"
    assert [e["xid"] for e in h.new_events(events, bus, {"boot_id": "a", "time": 316000.01}, "a")] == [63, 94]
    assert [e["xid"] for e in h.new_events(events, bus, {"boot_id": "b", "time": 316000.01}, "a")] == [48, 63, 94]
    assert [e["xid"] for e in h.new_events(events, bus, None, "a")] == [48, 63, 94]


def test_reading_falls_back_to_dmesg_and_says_when_neither_reads(tmp_path):
    boot = tmp_path / "boot_id"
    boot.write_text("5d2c1ba1\n")
    calls = []

    def run(answers):
        def run_command(argv):
            calls.append(argv[0])
            return answers[argv[0]]
        return run_command

    got = h.read_kernel_log(run({"journalctl": (0, "-- No entries --\n", ""), "dmesg": (0, DMESG, "")}), str(boot))
    assert got["source"] == "dmesg" and got["boot_id"] == "5d2c1ba1" and len(got["events"]) == 8
    assert calls == ["journalctl", "dmesg"]
    lxc = h.read_kernel_log(run({"journalctl": (0, "-- No entries --\n", ""),
                                 "dmesg": (1, "", "dmesg: read kernel buffer failed: Operation not permitted")}), str(boot))
    assert lxc["source"] is None and lxc["events"] == []
    assert "Operation not permitted" in lxc["problem"] and "Xid events are not checked" in lxc["problem"]


def test_a_deploy_judges_what_provisioning_has_not_seen(tmp_path, monkeypatch):
    """The manifest's cursor (this boot, up to 512 s): the Xid 48 it saw refuses nothing now, the Xid 79
    after it does; after a reboot (another boot id) every event of the new boot is new."""
    query = ("0, NVIDIA RTX A6000, GPU-a, 00000000:01:00.0, 49140, 0, 8.6, 580.95.05\n"
             "2, NVIDIA RTX A6000, GPU-b, 00000000:41:00.0, 49140, 0, 8.6, 580.95.05\n")
    log = ("[  512.000000] NVRM: Xid (PCI:0000:41:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit\n"
           "[  600.000000] NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n")

    def run_command(argv):
        if argv[0] == "dmesg":
            return 0, log, ""
        if "-q" in argv:
            return 0, XML_V13_ECC_OFF, ""
        return 0, query, ""

    boot = tmp_path / "boot_id"
    boot.write_text("boot-a\n")
    monkeypatch.setattr(h, "KERNEL_LOG_COMMANDS", (("dmesg", ["dmesg"]),))
    real = h.read_kernel_log
    monkeypatch.setattr(h, "read_kernel_log", lambda rc: real(rc, str(boot)))
    baseline = {"kernel_log": {"boot_id": "boot-a", "time": 512.0, "source": "dmesg"}, "usable": [], "unusable": []}
    assert h.deploy_problems(run_command, [2], baseline) == []
    assert h.deploy_problems(run_command, [0, 2], baseline) == [
        "GPU 0 (00000000:01:00.0) is not healthy since provisioning: "
        "Xid 79 (GPU has fallen off the bus) at 600.0 s since boot: reboot the host"]
    baseline["kernel_log"]["boot_id"] = "boot-before"
    assert [p.split(":")[0] for p in h.deploy_problems(run_command, [0, 2], baseline)] == [
        "GPU 0 (00000000", "GPU 2 (00000000"]


# dcgmi diag -r 1 of DCGM 3.1.8 on an 8-GPU host with persistence mode off (real, the rows elided here
# are Pass rows), and the 4.x layout with per-GPU rows.
DCGM_3 = """\
Successfully ran diagnostic for group.
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Metadata  ----------+------------------------------------------------|
| DCGM Version              | 3.1.8                                          |
| Driver Version Detected   | 550.127.08                                     |
| GPU Device IDs Detected   | 2335,2335,2335,2335,2335,2335,2335,2335        |
|-----  Deployment  --------+------------------------------------------------|
| Denylist                  | Pass                                           |
| NVML Library              | Pass                                           |
| Persistence Mode          | Fail                                           |
| Error                     | Persistence mode for GPU 0 is currently disab  |
|                           | led. The DCGM diagnostic requires peristence   |
| Environment Variables     | Pass                                           |
| Page Retirement/Row Remap | Pass                                           |
+---------------------------+------------------------------------------------+
"""
DCGM_4 = """\
|-----  Metadata  ----------+------------------------------------------------|
| DCGM Version              | 4.4.2                                          |
|-----  Deployment  --------+------------------------------------------------|
| software                  | Pass                                           |
|                           | GPU0: Pass                                     |
+-----  Hardware  ----------+------------------------------------------------+
| memory                    | Fail                                           |
|                           | GPU0: Fail                                     |
"""


def test_dcgm_level_1_tables():
    rows = h.parse_dcgm_diag(DCGM_3)
    assert [(r["test"], r["result"]) for r in rows] == [
        ("Denylist", "Pass"), ("NVML Library", "Pass"), ("Persistence Mode", "Fail"), ("Environment Variables", "Pass"),
        ("Page Retirement/Row Remap", "Pass")]
    assert rows[2]["detail"] == "Persistence mode for GPU 0 is currently disabled. The DCGM diagnostic requires peristence"
    assert [(r["test"], r["result"]) for r in h.parse_dcgm_diag(DCGM_4)] == [
        ("software", "Pass"), ("software GPU0", "Pass"), ("memory", "Fail"), ("memory GPU0", "Fail")]
    said, problem = h.read_dcgm(lambda argv: (226, DCGM_3, ""), "/usr/bin/dcgmi")
    assert problem is None and said == ["DCGM diagnostic level 1: Persistence Mode Fail: Persistence mode for GPU 0 is "
                                        "currently disabled. The DCGM diagnostic requires peristence"]
    said, problem = h.read_dcgm(lambda argv: (1, "Error: unable to establish a connection to the specified host: "
                                                 "localhost", ""), "/usr/bin/dcgmi")
    assert said == [] and problem.startswith("dcgmi diag -r 1 did not run (exit 1): Error: unable to establish")
