"""The harness every crash- or hang-prone test runs through (isolated.py):
a hang fails the one test, and leaves no process behind, not even one the
hung child started (mp.spawn ranks, servers)."""

import os
import sys
import time

import pytest
from isolated import run_isolated, run_ranks


def test_a_hang_fails_and_kills_what_the_child_started(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    with pytest.raises(pytest.fail.Exception, match="did not finish within 3 s"):
        run_isolated(
            f"""
            import subprocess, time
            sleeper = subprocess.Popen(["sleep", "600"])
            open({str(pid_file)!r}, "w").write(str(sleeper.pid))
            time.sleep(600)
            """,
            timeout=3,
        )
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild), "the hung child's own child outlived the test"


def _alive(pid):
    # A killed process whose parent is gone is reaped by init; until then it
    # is a zombie, which counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_failure_reports_the_exit_status_and_output():
    with pytest.raises(pytest.fail.Exception, match="exit status 3"):
        run_isolated("import sys; print('said'); sys.exit(3)")


def test_ranks_that_hang_or_fail_fail_the_test_and_leave_nothing_behind(tmp_path):
    pid_file = tmp_path / "rank1.pid"
    sleeper = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    with pytest.raises(pytest.fail.Exception, match="ranks still running after 3 s"):
        run_ranks([[sys.executable, "-c", "pass"], [sys.executable, "-c", sleeper]], timeout=3)
    assert not _alive(int(pid_file.read_text()))
    with pytest.raises(pytest.fail.Exception, match="rank 1 failed \\(3\\)"):
        run_ranks([[sys.executable, "-c", "pass"], [sys.executable, "-c", "raise SystemExit(3)"]], timeout=30)
    assert run_ranks([[sys.executable, "-c", "print('hi')"]], timeout=30) == ["hi\n"]
