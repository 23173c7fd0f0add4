"""Runs a test body in a fresh Python process with a time limit.

Anything that could crash or hang (threads, fork, signals, exit, sinks) runs
through ``run_isolated``: a segfault, an abort or a deadlock then fails the one
test that caused it, with the child's output in the message, instead of taking
the whole pytest run down or stalling it until CI's limit.
"""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap

DEFAULT_TIMEOUT_S = 60


class Outcome:
    """What a child process did: ``returncode``, ``stdout``, ``stderr``."""

    def __init__(self, returncode, stdout, stderr):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr

    def describe(self):
        code = self.returncode
        if code is not None and code < 0:
            try:
                what = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                what = f"killed by signal {-code}"
        else:
            what = f"exit status {code}"
        return (
            f"child process: {what}\n--- stdout ---\n{self.stdout[-4000:]}"
            f"\n--- stderr ---\n{self.stderr[-4000:]}"
        )


def run_isolated(source, timeout=DEFAULT_TIMEOUT_S, env=None, cwd=None, check=True):
    """Runs ``source`` (dedented) in a new interpreter and returns an Outcome.

    The source is written to a file first, so that code in it can be
    scripted (``torch.jit.script`` reads the source of classes and
    functions).

    ``faulthandler`` is on, so a crash or a hang prints every thread's Python
    stack. A child still running after ``timeout`` seconds is killed and the
    test fails as a hang. With ``check`` (the default) any exit status but 0
    fails the test too; pass ``check=False`` to inspect a deliberate signal or
    error exit.
    """
    import pytest

    child_env = dict(os.environ)
    child_env["PYTHONFAULTHANDLER"] = "1"
    if env:
        child_env.update(env)
    code = textwrap.dedent(source)
    with tempfile.NamedTemporaryFile("w", suffix=".py", prefix="isolated_", delete=False) as f:
        f.write(code)
        script = f.name
    try:
        done = subprocess.run(
            [sys.executable, "-P", script],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=child_env,
            cwd=cwd,
            errors="replace",
        )
    except subprocess.TimeoutExpired as e:
        os.unlink(script)
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(
            f"hang: the child process did not finish within {timeout} s\n"
            f"--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{err[-4000:]}"
        )
    os.unlink(script)
    outcome = Outcome(done.returncode, done.stdout, done.stderr)
    if check and done.returncode != 0:
        pytest.fail(outcome.describe())
    return outcome
