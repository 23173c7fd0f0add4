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
import time

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
    functions). See ``run_script`` for the rest.
    """
    code = textwrap.dedent(source)
    with tempfile.NamedTemporaryFile("w", suffix=".py", prefix="isolated_", delete=False) as f:
        f.write(code)
        script = f.name
    try:
        return run_script(script, timeout=timeout, env=env, cwd=cwd, check=check)
    finally:
        os.unlink(script)


def run_script(script, *args, timeout=DEFAULT_TIMEOUT_S, env=None, cwd=None, check=True):
    """Runs ``python -P script *args`` and returns an Outcome.

    ``faulthandler`` is on, so a crash or a hang prints every thread's Python
    stack. The child leads a session of its own: if it is still running after
    ``timeout`` seconds, it and every process it started (``mp.spawn``
    ranks, say) are killed, and the test fails as a hang. With ``check`` (the
    default) any exit status but 0 fails the test too; pass ``check=False``
    to inspect a deliberate signal or error exit.
    """
    import pytest

    child_env = dict(os.environ)
    child_env["PYTHONFAULTHANDLER"] = "1"
    if env:
        child_env.update(env)
    child = subprocess.Popen(
        [sys.executable, "-P", str(script), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env,
        cwd=cwd,
        errors="replace",
        start_new_session=True,
    )
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        try:
            out, err = child.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            # A process that left the session still holds the pipes open.
            out, err = "", "(no output: a process outside the child's session kept its pipes open)"
        pytest.fail(
            f"hang: the child process did not finish within {timeout} s\n"
            f"--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{err[-4000:]}"
        )
    outcome = Outcome(child.returncode, out, err)
    if check and child.returncode != 0:
        pytest.fail(outcome.describe())
    return outcome


def run_ranks(commands, timeout, env=None):
    """Runs ``commands`` (one argv per rank of a job) at once and returns
    their outputs (stdout and stderr together), in order.

    Each child leads a session of its own with ``faulthandler`` on. The test
    fails as a hang when any is still running after ``timeout`` seconds in
    all (every child and what it started is killed), and fails naming the
    rank when one exits with another status than 0.
    """
    import pytest

    child_env = dict(os.environ, PYTHONFAULTHANDLER="1", **(env or {}))
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            command, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace", start_new_session=True,
        )
        for command in commands
    ]
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1, timeout - (time.monotonic() - started)))
            outputs.append(out)
    except subprocess.TimeoutExpired:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
        pytest.fail(f"ranks still running after {timeout} s: a hang")
    for r, (p, out) in enumerate(zip(procs, outputs)):
        if p.returncode != 0:
            pytest.fail(f"rank {r} failed ({p.returncode}):\n{out[-4000:]}")
    return outputs
