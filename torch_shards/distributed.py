"""The torch.distributed process group the native objects agree over.

Only finding the group is Python's job (the default group lives in Python);
rank, world size, seed agreement and the consistency check are native.
"""

import torch.distributed as dist


def resolve_group(process_group=None):
    """The process group to use: the one given, else the initialised default
    group, else None (no torch.distributed in this process)."""
    if process_group is not None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("process_group was given but torch.distributed is not initialised in this process")
        return process_group
    if dist.is_available() and dist.is_initialized():
        return dist.group.WORLD
    return None


def boxed(group):
    """The group as the script object native methods take (None stays None)."""
    return None if group is None else group.boxed()
