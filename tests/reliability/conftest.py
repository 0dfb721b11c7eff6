"""The reliability suites: faults, hostile text, bad files, load.

They run offline like the unit tests (network sockets disabled), and each records
what it measured in one report, printed as Markdown tables at the end of the run:
the closing-note table of the reliability issue comes from there, not from prose.
"""

from __future__ import annotations

import pytest

from tests.reliability.report import REPORT_KEY, ReliabilityReport
from tests.unit_tests.conftest import pytest_runtest_setup

__all__ = ["pytest_runtest_setup", "pytest_terminal_summary", "reliability_report"]


@pytest.fixture(scope="session")
def reliability_report(pytestconfig: pytest.Config) -> ReliabilityReport:
    """The run's report; tests add what they measured."""
    return pytestconfig.stash.setdefault(REPORT_KEY, ReliabilityReport())


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    """Print the measured tables after the test summary."""
    report = config.stash.get(REPORT_KEY, None)
    if report is not None and not report.empty:
        terminalreporter.section("reliability report")
        terminalreporter.write_line(report.markdown())
