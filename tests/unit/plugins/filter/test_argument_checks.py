"""The argument_checks filter the sglang_service role loops sglang_server_args over: the role's
values as Jinja gives them (GPU indexes that came from -e as strings) reach _deploy.argument_checks
(whose cases are in tests/unit/plugins/module_utils/test_deploy.py)."""

from __future__ import annotations

from ansible_collections.inferops.sglang.plugins.filter.argument_checks import FilterModule

NEXTN = ["--model-path", "/m", "--speculative-algorithm", "NEXTN"]


def test_the_filter_is_the_module_utils_decision_with_the_roles_values():
    checks = FilterModule().filters()["argument_checks"]
    before = {"active": True, "variant": "nextn", "argv": NEXTN, "sglang_version": "0.5.11", "gpu_devices": [0, 2],
              "interrupted": False, "known_good": True, "known_good_variant": "nextn", "known_good_argv": NEXTN}
    nextn = {"variant": "nextn", "argv": NEXTN, "sglang_version": "0.5.11"}
    assert checks(before, nextn, None, ["0", "2"]) == []
    assert checks(before, nextn, None, ["0", "1"]) == [{"label": "variant nextn", "argv": NEXTN}]
    assert checks({}, nextn, None, [0]) == [{"label": "variant nextn", "argv": NEXTN}]
