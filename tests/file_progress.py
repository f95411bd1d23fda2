"""Progress a reader can follow: one line per test file as its last test
finishes, instead of a wall of dots.

    [ 41%] tests/losses/test_fused_linear.py  57 passed, 2 skipped  31.2 s

With ``-n auto`` the files run interleaved over the workers, so a line says
which file is done, its counts and the seconds its tests took (summed over
their setup, call and teardown, on whichever workers ran them); the slowest
tests come after the summary (``--durations`` in pyproject.toml).  Failures
still print their ``F`` where they happen.  ``-v`` turns this off and gives
pytest's own line per test.  A plugin of the test run, not of the package.
"""

from __future__ import annotations

import collections

import pytest


class FileProgress:
    def __init__(self, config):
        self.config = config
        self.left: collections.Counter = collections.Counter()   # tests still to finish, per file
        self.total = 0
        self.done = 0
        self.outcomes: dict = collections.defaultdict(collections.Counter)
        self.seconds: collections.Counter = collections.Counter()
        self.failed: set = set()

    def expect(self, nodeids) -> None:
        if self.total:  # every xdist worker reports the same collection
            return
        for nodeid in nodeids:
            self.left[_file(nodeid)] += 1
        self.total = len(nodeids)

    # ``-n``: the controller hears the workers' collections (a hook xdist
    # adds, optional so that ``-p no:xdist`` runs still load this plugin)
    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self.expect(ids)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session):
        if not hasattr(self.config, "workerinput") and session.items:
            self.expect([item.nodeid for item in session.items])

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report, config):
        # a passed or skipped test writes no letter: its file's line counts it
        if report.when == "call" and report.passed and not hasattr(report, "wasxfail"):
            return "passed", "", "PASSED"
        if report.skipped and not hasattr(report, "wasxfail"):
            return "skipped", "", "SKIPPED"
        return None

    def pytest_runtest_logreport(self, report):
        f = _file(report.nodeid)
        self.seconds[f] += report.duration
        if report.failed:
            self.failed.add(report.nodeid)
        if report.when == "call" or (report.when == "setup" and not report.passed):
            kind = "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome
            self.outcomes[f]["error" if report.when == "setup" and report.failed else kind] += 1
        if report.when != "teardown" or f not in self.left:
            return
        self.done += 1
        self.left[f] -= 1
        if self.left[f] == 0:
            del self.left[f]
            counts = ", ".join(f"{n} {k}" for k, n in sorted(self.outcomes[f].items()))
            percent = 100 * self.done // max(self.total, 1)
            reporter = self.config.pluginmanager.get_plugin("terminalreporter")
            if reporter._tw.width_of_current_line:  # after a failure's F
                reporter.write("\n")
            reporter.write_line(f"[{percent:3d}%] {f}  {counts}  {self.seconds[f]:.1f} s")


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def register(config) -> None:
    """Install the plugin on the process that prints (not on xdist's workers),
    unless ``-v`` asked for pytest's own lines."""
    if hasattr(config, "workerinput") or config.get_verbosity() > 0:
        return
    config.pluginmanager.register(FileProgress(config), "softk-file-progress")
