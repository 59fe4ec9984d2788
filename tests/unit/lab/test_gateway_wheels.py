"""lab/wheels/gateway_wheels.py without the package index: the cache key follows the
lock, a download that is not exactly the lock fails, and a wheelhouse gets the wheels
with another lock's gateway wheels taken out and the rest left."""

from __future__ import annotations

import sys

import pytest
from sim_helpers import LAB

sys.path.insert(0, str(LAB / "wheels"))
import gateway_wheels  # noqa: E402 - lab tool, not an installed module

LOCK = "# a comment\nsmg==1.13.0\nPyYAML==6.0.4\ntyping_extensions==4.16.0\n"
WHEELS = ["smg-1.13.0-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
          "pyyaml-6.0.4-cp311-cp311-manylinux2014_x86_64.whl", "typing_extensions-4.16.0-py3-none-any.whl"]


@pytest.fixture
def lock(tmp_path):
    path = tmp_path / "smg-1.13.0.txt"
    path.write_text(LOCK)
    return path


def test_the_lock_is_read_by_normalized_name(lock):
    assert gateway_wheels.locked(lock) == {"smg": "1.13.0", "pyyaml": "6.0.4", "typing-extensions": "4.16.0"}


def test_the_key_follows_the_lock(lock):
    before = gateway_wheels.key(lock, "1.13.0")
    lock.write_text(LOCK.replace("6.0.4", "6.0.5"))
    assert gateway_wheels.key(lock, "1.13.0") != before


def test_a_download_that_is_exactly_the_lock_passes(lock):
    gateway_wheels.check(WHEELS, gateway_wheels.locked(lock), lock)


@pytest.mark.parametrize("wheels, problem", [
    (WHEELS[:2], "no wheel of typing-extensions==4.16.0"),
    ([*WHEELS, "six-1.17.0-py2.py3-none-any.whl"], "six 1.17.0 (the lock pins nothing of it)"),
    ([WHEELS[0], "pyyaml-6.0.5-cp311-cp311-manylinux2014_x86_64.whl", WHEELS[2]], "pyyaml 6.0.5 (the lock pins 6.0.4)"),
])
def test_a_download_that_is_not_the_lock_fails(lock, wheels, problem):
    with pytest.raises(SystemExit, match=problem.replace("(", r"\(").replace(")", r"\)")):
        gateway_wheels.check(wheels, gateway_wheels.locked(lock), lock)


def test_the_wheelhouse_gets_the_wheels_and_loses_another_locks(tmp_path, lock):
    cached = tmp_path / "cached"
    cached.mkdir()
    for name in WHEELS:
        (cached / name).write_bytes(name.encode())
    house = tmp_path / "house"
    house.mkdir()
    (house / "smg-1.12.0-cp38-abi3-manylinux2014_x86_64.whl").write_bytes(b"old")
    (house / "torch-2.11.0+cu130-py3-none-any.whl").write_bytes(b"stand-in")
    gateway_wheels.place(cached, house, lock)
    assert sorted(p.name for p in house.iterdir()) == sorted([*WHEELS, "torch-2.11.0+cu130-py3-none-any.whl"])
    assert all((house / name).read_bytes() == name.encode() and (house / name).stat().st_mode & 0o777 == 0o644
               for name in WHEELS)
