"""The C++ tree shows the architecture (docs/design.md#layout).

csrc/src mirrors csrc/include/torch_monitor, and no file includes a file of a
higher layer. Reads the source tree only: no build needed.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "csrc" / "include" / "torch_monitor"
SRC = ROOT / "csrc" / "src"

# Lowest first. A file may include the files of its own layer and of lower
# ones. A unit (a header and its .cpp) is named by its path under
# include/torch_monitor without the extension; an entry ending in "/" takes
# a whole folder, and the longest matching entry decides.
LAYERS = [
    # detail/: process-wide mechanisms with no knowledge of events or stats
    # (fork and exit hooks, fork-safe and blocking locks, thread slots and
    # the asymmetric barrier, text checks, small helpers).
    ("detail utilities", ["export", "detail/"]),
    # The vocabulary and the services a Stat logs through.
    ("core", ["version", "aggregation", "event", "statistics_events", "step", "clock",
              "process_rank", "background_warnings", "event_handler"]),
    # engine/: what a Stat is made of, and the threads and registries that
    # close and reset its windows; rank_sync/: the thread that merges them
    # across ranks (a Stat's and a watch's), with the rank groups it serves.
    # One layer: the engine posts to the rank sync, which closes the live
    # Stats' windows at exit.
    ("stat engine", ["engine/", "rank_sync/", "rank_sync"]),
    ("stats", ["stat", "wait_counter", "pytorch_counters"]),
    ("reducers", ["reducers/"]),
    ("monitors", ["monitors/"]),
    ("nn", ["nn/", "nn"]),
    ("sinks", ["sinks/"]),
    # watch(model): statistics of every layer, written to the sinks.
    ("watch", ["watch/"]),
    ("script", ["script/"]),
    ("umbrella", ["torch_monitor"]),
]

# Headers with no out-of-line code, so without a .cpp.
HEADER_ONLY = {
    "export", "torch_monitor", "nn", "nn/call", "engine/accumulator",
    "engine/thread_shard", "detail/bytes", "detail/call_each",
    "detail/in_place", "reducers/factory", "reducers/reducers",
    "sinks/sinks",
}

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*[<"]torch_monitor/(\S+)\.h[>"]', re.M)


def units(folder, suffix):
    return {str(p.relative_to(folder).with_suffix("")): p
            for p in folder.rglob("*" + suffix)}


def layer_of(unit):
    best = None
    for rank, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            matches = unit.startswith(entry) if entry.endswith("/") else unit == entry
            if matches and (best is None or len(entry) > len(best[1])):
                best = (rank, entry)
    assert best is not None, f"{unit}: in no layer of test_layout.LAYERS"
    return best[0]


def test_src_mirrors_include():
    headers = units(INCLUDE, ".h")
    sources = units(SRC, ".cpp")
    no_header = sorted(set(sources) - set(headers))
    assert not no_header, f"src files without include/torch_monitor/<same>.h: {no_header}"
    for unit, path in sources.items():
        first = INCLUDE_RE.search(path.read_text())
        assert first and first.group(1) == unit, (
            f"{path.relative_to(ROOT)} must include <torch_monitor/{unit}.h> first")
    no_source = sorted(set(headers) - set(sources) - HEADER_ONLY)
    assert not no_source, f"headers without src/<same>.cpp (or list them in HEADER_ONLY): {no_source}"
    stale = sorted(HEADER_ONLY - set(headers))
    assert not stale, f"HEADER_ONLY names missing headers: {stale}"


def test_no_include_from_a_lower_layer_to_a_higher_one():
    violations = []
    for folder, suffix in ((INCLUDE, ".h"), (SRC, ".cpp")):
        for unit, path in units(folder, suffix).items():
            for included in INCLUDE_RE.findall(path.read_text()):
                if layer_of(included) > layer_of(unit):
                    violations.append(
                        f"{path.relative_to(ROOT)} ({LAYERS[layer_of(unit)][0]}) includes "
                        f"{included}.h ({LAYERS[layer_of(included)][0]})")
    assert not violations, "\n".join(violations)
