"""examples/cpp/watch_mlp: a C++ training program watched by
``torch_monitor::Watch``, built against the installed package with
``find_package(TorchMonitor)`` by the commands docs/api.md gives. Its last
line is ``summary {json}``.

Skips when cmake or a C++ compiler is missing.
"""

import json
import os

import pytest

pytest.importorskip("torch")

from cpp_build import REPO_ROOT, requires_toolchain, run  # noqa: E402
from test_docs import SHELL_BLOCKS, run_shell_block  # noqa: E402


@pytest.fixture(scope="session")
def watch_mlp():
    """The program as docs/api.md builds it, in the folder it names. The same
    block runs in test_docs.py: whichever runs second builds nothing, so CI
    compiles the example once."""
    (block,) = [b for b in SHELL_BLOCKS if "-S examples/cpp/watch_mlp" in b.code]
    run_shell_block(block)
    return os.path.join(REPO_ROOT, "build", "examples", "watch_mlp", "watch_mlp")


def summary_of(exe, *args):
    proc = run([exe, *args], timeout=120)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    lines = [l for l in proc.stdout.splitlines() if l.startswith("summary ")]
    assert len(lines) == 1, proc.stdout
    return proc.stdout, json.loads(lines[0][len("summary "):])


@requires_toolchain
def test_the_watch_logs_every_window_with_every_key(watch_mlp):
    stdout, s = summary_of(watch_mlp)
    assert s["loss_last"] < s["loss_first"]
    # 100 steps, windows of 20: closed at steps 20, 40, 60, 80, the last by
    # remove(), one step after the last step set (99).
    assert s["windows"] == 5 and s["last_step"] == 100
    # grad and update of 4 parameters and of the whole model (total.grad,
    # total.update), output of 2 modules; 9 statistics a key, updates a ratio too.
    assert s["keys"] == (4 + 1) + (4 + 1) + 2
    assert s["statistics"] == (4 + 1) * 9 + (4 + 1) * 10 + 2 * 9
    # The watch's number equals the one computed by hand in the program.
    assert s["grad_norm"] == pytest.approx(s["grad_norm_by_hand"], rel=1e-6)
    assert 0 < s["ratio"] < 1
    assert stdout.count("[watch] step") == 5
    assert s["seconds"] < 30


@requires_toolchain
def test_one_step_gives_one_window(watch_mlp):
    _, s = summary_of(watch_mlp, "1")
    assert s["windows"] == 1 and s["last_step"] == 1  # closed by remove() after step 0
    assert s["grad_norm"] == pytest.approx(s["grad_norm_by_hand"], rel=1e-6)
