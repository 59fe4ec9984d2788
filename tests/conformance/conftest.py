"""Conformance tests: the collection's claims checked against real SGLang
(0.5.11, the pinned release, and 0.5.23) from lab/real/build.sh's cache.

``make conformance`` runs them in two pytest-xdist workers (``--dist loadscope``):
most of their time is real servers loading and the gate waiting on them, so two
cases side by side take little more than one. What a worker takes as one unit is
decided here (``Units``), so that whatever a fixture builds once is built in one
worker only.
"""

from __future__ import annotations

import sys

import pytest

from real_sglang import REPO, paths, validate_gpu_cases

sys.path.insert(0, str(REPO / "collections"))
sys.path.insert(0, str(REPO / "lab" / "simulator"))


@pytest.fixture(scope="session")
def real() -> dict[str, str]:
    return paths()


@pytest.fixture(scope="session")
def gpu_validated(real) -> dict:
    """lab/real/validate_args.py's answers to every case the modules registered
    (real_sglang.register_gpu_cases): one process per release and GPU profile, two at a time."""
    return validate_gpu_cases(real)


# Modules whose tests one worker runs together though they are two files: the session fixtures
# of real SGLang's argument checks (gpu_validated, which runs validate_args.py for both, and the
# simulator's wheels) are built once, and their imports of sglang, all CPU, run beside the
# gate's waits.
TOGETHER = {"test_real_args.py": "real arguments", "test_real_server_args.py": "real arguments"}
# Modules whose tests each run alone: each starts its own servers and builds nothing shared.
ALONE = ("test_real_gate_own_servers.py",)


def unit(nodeid: str) -> str:
    """The unit of work a test belongs to: a module's tests together (its module fixtures: the
    shared server, a wheel index, corpora), but for TOGETHER and ALONE."""
    module = nodeid.split("::", 1)[0]
    name = module.rsplit("/", 1)[-1]
    if name in ALONE:
        return nodeid
    return TOGETHER.get(name, module)


def pytest_xdist_make_scheduler(config, log):
    """The loadscope scheduler with ``unit`` as its scope. (xdist's own loadgroup marks do not
    reach the scheduler under pytest 9: they rename a node id that pytest 9 no longer keeps.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling  # noqa: PLC0415 - only where xdist runs

    class Units(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit(nodeid)

    return Units(config, log)


FIGURES: list[tuple[str, dict]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Figures a test noted (its report's user_properties), from any worker."""
    if report.when == "teardown":
        FIGURES.extend((name, value) for name, value in report.user_properties if isinstance(value, dict))


def pytest_terminal_summary(terminalreporter) -> None:
    by_title: dict[str, list[str]] = {}
    for title, figures in FIGURES:
        for case, values in figures.items():
            by_title.setdefault(title, []).append(f"  {case}: " + ", ".join(f"{k}={v}" for k, v in values.items()))
    for title, lines in by_title.items():
        terminalreporter.write_line(f"\n{title}:\n" + "\n".join(lines))
