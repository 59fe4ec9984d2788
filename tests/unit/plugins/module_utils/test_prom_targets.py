"""_prom_targets and the prometheus_file_sd filter: file_sd target groups from the inventory's metrics targets."""

from __future__ import annotations

import pytest

from ansible.errors import AnsibleFilterError

from ansible_collections.inferops.sglang.plugins.filter.prometheus_file_sd import FilterModule
from ansible_collections.inferops.sglang.plugins.module_utils import _prom_targets as pt


def entry(host, bind="127.0.0.1", address=None, port=30000, metrics=True, service="sglang-qwen.service"):
    return {"host": host, "address": address or f"{host}.lab", "bind_host": bind, "port": port, "service": service,
            "metrics": metrics}


def test_loopback_servers_are_scraped_only_by_a_prometheus_on_their_own_host():
    out = pt.file_sd([entry("mon"), entry("ct129", bind="0.0.0.0", address="10.0.0.5"), entry("ct200"),
                      entry("ct201", bind="10.1.1.7", port=30001), entry("v6", bind="::", address="fd00::5")], "mon")
    assert out["sglang"] == [
        {"targets": ["127.0.0.1:30000"], "labels": {"host": "mon", "service": "sglang-qwen.service"}},
        {"targets": ["10.0.0.5:30000"], "labels": {"host": "ct129", "service": "sglang-qwen.service"}},
        {"targets": ["10.1.1.7:30001"], "labels": {"host": "ct201", "service": "sglang-qwen.service"}},
        {"targets": ["[fd00::5]:30000"], "labels": {"host": "v6", "service": "sglang-qwen.service"}},
    ]
    assert out["skipped"] == ["ct200: sglang-qwen.service listens on 127.0.0.1 only (sglang_service_bind_host), "
                              "which a Prometheus on mon cannot reach"]
    # every host's node_exporter is a target, its own through loopback
    assert [g["targets"][0] for g in out["node"]] == ["127.0.0.1:9100", "10.0.0.5:9100", "ct200.lab:9100",
                                                      "ct201.lab:9100", "[fd00::5]:9100"]


def test_a_server_without_metrics_is_named_and_one_node_group_per_host():
    out = pt.file_sd([entry("a", bind="0.0.0.0", metrics=False), entry("a", bind="0.0.0.0", port=30001, service="b.service")],
                     "mon", 9101)
    assert out["skipped"] == ["a: sglang-qwen.service runs without --enable-metrics (sglang_service_metrics: false)"]
    assert out["sglang"] == [{"targets": ["a.lab:30001"], "labels": {"host": "a", "service": "b.service"}}]
    assert out["node"] == [{"targets": ["a.lab:9101"], "labels": {"host": "a"}}]


@pytest.mark.parametrize("entries, message", [
    ([{"address": "x"}], "each entry needs a host"),
    ([entry("a", bind="0.0.0.0", port=70000)], "a: port 70000 is not in 1-65535"),
    ([entry("a", bind="0.0.0.0", port="http")], "a: port 'http' is not a number"),
])
def test_bad_entries_are_refused_by_the_filter_with_the_reason(entries, message):
    with pytest.raises(AnsibleFilterError, match=message):
        FilterModule().filters()["prometheus_file_sd"](entries, "mon")
