"""Test helper: close every open Stat window now and read each stat's aggregates."""

import torch_monitor as tm


def closed_windows(*stats):
    """Logs the open window of every live stat and returns, for each of
    ``stats``, its window's data with the stat's name taken off the keys
    ({".sum": ..., ".count": ...}); asserts each logged exactly one window."""
    events = []
    handle = tm.register_event_handler(events.append)
    try:
        tm._close_all_stats()
    finally:
        tm.unregister_event_handler(handle)

    def window(name):
        # a window's event: {"<name>.sum": ..., "<name>.count": ...}
        mine = [e.data for e in events if any(k.startswith(name + ".") for k in e.data)]
        assert len(mine) == 1, f"expected one window event of {name}, got {mine}"
        return {k[len(name):]: v for k, v in mine[0].items()}

    return [window(stat.name) for stat in stats]
