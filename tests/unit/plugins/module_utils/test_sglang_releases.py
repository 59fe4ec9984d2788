"""The release table's shape and accessors (its facts are checked against the real
wheels by tests/conformance/test_releases_wheels.py)."""

from __future__ import annotations

import pytest

from ansible_collections.inferops.sglang.plugins.module_utils import _sglang_releases as rel


@pytest.mark.parametrize("name", rel.NAMES)
def test_each_fact_covers_every_release_once(name):
    entries = rel.BY_NAME[name]
    assert entries[0].since == rel.FIRST, f"{name} starts at {entries[0].since}"
    assert entries[-1].until is None, f"{name} ends at {entries[-1].until}"
    for before, after in zip(entries, entries[1:]):
        assert before.until is not None and before.until < after.since, (name, before.until, after.since)
        # no gap: the next entry starts at the release after `until` (patch + 1 on the 0.5 line)
        assert after.since == (before.until[0], before.until[1], before.until[2] + 1), (name, before, after)
        assert before.value != after.value, f"{name}: two entries with the same value {before.value!r}"


def test_every_entry_cites_a_source_and_a_check():
    for entry in rel.FACTS:
        assert entry.source and "0.5." in entry.source, entry
        assert isinstance(entry.probe, (tuple, str)) and entry.probe, entry


@pytest.mark.parametrize("text,version", [
    ("0.5.13.post1", (0, 5, 13)), ("0.5.11+simulator", (0, 5, 11)), ("v0.5.9", (0, 5, 9)),
    ("0.5.23", (0, 5, 23)), ((0, 5, 20), (0, 5, 20)), ("0.5.10rc1", (0, 5, 10)),
])
def test_parse(text, version):
    assert rel.parse(text) == version


@pytest.mark.parametrize("text", ["latest", "", "0.5", None])
def test_parse_refuses(text):
    with pytest.raises(ValueError):
        rel.parse(text)


def test_fact_follows_the_ranges():
    # the new pool error: 0.5.14 mixin :103-118 (absent from 0.5.13.post1)
    assert rel.fact("new_pool_error", "0.5.13.post1") is False
    assert rel.fact("new_pool_error", "0.5.14") is True and rel.fact("new_pool_error", "0.5.99") is True
    # a release before the table's first takes the first entry
    assert rel.fact("dflash", (0, 5, 2)) is False
    assert rel.fact("spec_reserve_mb", "0.5.9") == 2048
    assert rel.fact("spec_reserve_mb", "0.5.10.post1") == rel.fact("spec_reserve_mb", "0.5.13") == 4096
    assert rel.fact("spec_reserve_mb", "0.5.14") == 0
    assert dict(rel.fact("gpu_tiers", "0.5.19"))[35][0] == 2048
    assert dict(rel.fact("gpu_tiers", "0.5.20"))[35] == (4096, 48, 160)
    assert rel.first("ready_endpoint") == (0, 5, 20)
    with pytest.raises(KeyError):
        rel.first("ready_endpoint", "sometimes")


def test_facts_is_cached_per_version():
    assert rel.facts("0.5.11") is rel.facts((0, 5, 11)) is rel.facts("0.5.11+simulator")
    assert set(rel.facts("0.5.11")) == set(rel.NAMES)


def test_kernel_cuda_libraries_for_the_probe():
    # what _runtime_probe.default_libraries loads for the 0.5 line
    assert rel.fact("kernel_cuda_libraries", "0.5.11") == ("libcudart.so.{major}",)
