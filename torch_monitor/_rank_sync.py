"""Where ``Stat(..., sync_ranks=...)`` finds its rank group in torch.distributed.

The merge itself runs in C++ (``csrc/src/rank_sync/``) through the group's
c10d Store; see ``docs/distributed.md``.
"""

import torch.distributed as dist

from . import _C, _internals

#: How long rank 0 waits for the other ranks' share of a window, in seconds
#: (applies to groups resolved after it is set).
_deadline_seconds = 5.0


def set_rank_sync_deadline(seconds: float) -> None:
    """Sets how long rank 0 waits for the other ranks' share of a window.

    Taken by the objects made with ``sync_ranks`` from now on (default 5 s);
    those on the default group share it, so the next one made sets it for
    the older ones too (docs/distributed.md, "The deadline").
    A window is then merged from the ranks that arrived; its event's
    ``"<name>.ranks"`` says how many.
    """
    global _deadline_seconds
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
        0.001 <= seconds <= 86400
    ):
        raise ValueError(
            f"the rank sync deadline must be a number of seconds in [0.001, 86400], got {seconds!r}"
        )
    _deadline_seconds = float(seconds)


#: What resolve() gives for the process default group.
DEFAULT_GROUP = (None,)


def resolve(sync_ranks, prefix="", before="creating the Stat"):
    """DEFAULT_GROUP for the process default group (which it sets), or (store,
    rank, world_size, deadline). ``prefix`` and ``before`` word the error
    for the caller (watch() has its own prefix)."""
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError(
            f"{prefix}sync_ranks needs torch.distributed initialised: call "
            f"torch.distributed.init_process_group(...) before {before}"
        )
    if sync_ranks is True or sync_ranks is dist.group.WORLD:
        group = dist.group.WORLD
        _C._set_default_rank_group(
            _internals.group_store(group),
            dist.get_rank(),
            dist.get_world_size(),
            _deadline_seconds,
        )
        return DEFAULT_GROUP
    if not isinstance(sync_ranks, dist.ProcessGroup):
        raise TypeError(
            f"{prefix}sync_ranks must be a bool or a torch.distributed ProcessGroup, got "
            f"{type(sync_ranks).__name__}"
        )
    rank = dist.get_rank(sync_ranks)
    if rank < 0:
        raise ValueError(
            f"{prefix}sync_ranks: this process is not a member of the given process group; "
            "make it only on the group's members (or pass sync_ranks=False)"
        )
    return (
        _internals.group_store(sync_ranks),
        rank,
        dist.get_world_size(sync_ranks),
        _deadline_seconds,
    )


def flush_rank_sync() -> None:
    """Waits until every window closed so far by a Stat with ``sync_ranks``
    has been posted and, on rank 0, merged and logged (at most the longest
    deadline of the groups in use, plus 5 s). Runs by itself at exit; call
    it on every rank after closing the last windows (``del stat``) to read
    the merged results before then."""
    _C._flush_rank_sync()


def set_default_rank_group() -> None:
    """Makes torch.distributed's default group the process default rank group.

    TorchScript's ``Stat(..., sync_ranks=True)`` merges over it. Creating a
    Python ``Stat(..., sync_ranks=True)`` does the same.
    """
    resolve(True, prefix="torch_monitor.set_default_rank_group: ", before="calling it")
