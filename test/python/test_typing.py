"""The package is typed for its users: mypy --strict checks code using it.

typing/typed_usage_ok.py (typical use, fully annotated) must pass
`mypy --strict` against the installed package (py.typed, the generated
_C.pyi); typing/typed_usage_bad.py must fail with exactly one error on each
line marked `# error:`. Both are checked from a scratch folder, so the
installed package is what mypy reads, not the source tree.
"""

import pathlib
import re
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("mypy")
pytest.importorskip("torch_monitor")

TYPING = pathlib.Path(__file__).resolve().parent / "typing"


@pytest.fixture(scope="module")
def mypy_results(tmp_path_factory):
    """{file name: (exit status, output)} of one mypy run per file."""
    work = tmp_path_factory.mktemp("typing")
    results = {}
    for name in ("typed_usage_ok.py", "typed_usage_bad.py"):
        shutil.copy(TYPING / name, work / name)
        proc = subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--no-color-output",
             "--cache-dir", str(work / ".mypy_cache"), name],
            cwd=work, capture_output=True, text=True, timeout=600,
        )
        results[name] = (proc.returncode, proc.stdout + proc.stderr)
    return results


def test_typical_use_passes_mypy_strict(mypy_results):
    status, output = mypy_results["typed_usage_ok.py"]
    assert status == 0, output


def test_mistakes_are_found(mypy_results):
    status, output = mypy_results["typed_usage_bad.py"]
    assert status == 1, output
    source = (TYPING / "typed_usage_bad.py").read_text().splitlines()
    expected = {i + 1 for i, line in enumerate(source) if "  # error:" in line}
    found = [
        int(m.group(1))
        for m in re.finditer(r"^typed_usage_bad\.py:(\d+): error:", output, re.M)
    ]
    assert sorted(found) == sorted(expected), output
