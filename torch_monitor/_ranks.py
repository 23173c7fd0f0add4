"""The rank of this process, which the file sinks use to keep ranks apart.

The core holds one (rank, world size), or nothing = not distributed (see
``csrc/include/torch_monitor/process_rank.h``); at load it takes ``RANK`` and
``WORLD_SIZE`` from the environment (torchrun sets them). Python refreshes it
from ``torch.distributed`` (default group) when a file sink is made or
``process_rank()`` is called, so ``mp.spawn`` workers that pass their rank to
``init_process_group`` need nothing more. Never per event or per add.
"""

from typing import Optional, Tuple

import torch

from . import _C

__all__ = ["set_process_rank", "process_rank"]

# Set by set_process_rank: the user's word then stands over torch.distributed.
_set_by_hand = False


def set_process_rank(rank: Optional[int], world_size: Optional[int]) -> None:
    """Sets this process' rank and world size by hand (``None, None``: not
    distributed), for launchers ``torch.distributed`` does not know; after it
    ``torch.distributed`` is no longer consulted. File sinks made afterwards
    keep ranks apart as docs/sinks.md "Rank-aware sinks" says."""
    global _set_by_hand
    _C._set_process_rank(rank, world_size)
    _set_by_hand = True


def process_rank() -> Optional[Tuple[int, int]]:
    """``(rank, world_size)`` as the sinks see it, or ``None``."""
    sync_process_rank()
    return _C._process_rank()


def sync_process_rank() -> None:
    """Takes the rank from ``torch.distributed`` when it is initialised."""
    if _set_by_hand:
        return
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        _C._set_process_rank(dist.get_rank(), dist.get_world_size())
