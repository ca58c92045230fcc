"""Where this process stands in a distributed job: rank, world size, seed."""

import os

import torch.distributed as dist

from . import _convert
from ._library import ops


def _default_group_active():
    return dist.is_available() and dist.is_initialized()


def resolve_group(process_group=None):
    """The process group to use: the one given, else the initialised default
    group, else None (no torch.distributed in this process)."""
    if process_group is not None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("process_group was given but torch.distributed is not initialised in this process")
        return process_group
    return dist.group.WORLD if _default_group_active() else None


def resolve_rank_and_world_size(rank=None, world_size=None, who="ShardedDataset", group=None):
    """Explicit values first, then the process group (the default one unless
    `group` is given), then the RANK / WORLD_SIZE environment variables
    (torchrun), else 0 and 1."""
    if group is None and _default_group_active():
        group = dist.group.WORLD
    if world_size is None:
        if group is not None:
            world_size = dist.get_world_size(group)
        elif "WORLD_SIZE" in os.environ:
            world_size = _env_int("WORLD_SIZE")
        else:
            world_size = 1
    if rank is None:
        if group is not None:
            rank = dist.get_rank(group)
        elif "RANK" in os.environ:
            rank = _env_int("RANK")
        else:
            rank = 0
    world_size = _convert.check_int(f"{who}: world_size", world_size, 1)
    rank = _convert.check_int(f"{who}: rank", rank)
    if not 0 <= rank < world_size:
        raise ValueError(f"{who}: rank must be in [0, world_size={world_size}), got {rank}")
    return rank, world_size


def _env_int(name):
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {value!r}") from None


def group_name(group):
    """The name c10d registered a process group under (C++ resolves it)."""
    return group.group_name


def covers(group, rank, world_size):
    """Whether (rank, world_size) is this process's place in the group, so the
    group's ranks are exactly the ranks of the dataset."""
    return group is not None and dist.get_world_size(group) == world_size and dist.get_rank(group) == rank


def resolve_seed(seed=None, group=None, who="ShardedDataset"):
    """A seed in [-2**63, 2**63). None draws one; with a process group, rank 0's
    draw is broadcast over it (from C++) so all ranks agree."""
    if seed is not None:
        seed = _convert.check_int(f"{who}: seed", seed)
        if not -(2**63) <= seed < 2**64:
            raise ValueError(f"{who}: seed must fit in 64 bits, got {seed}")
        return seed - 2**64 if seed >= 2**63 else seed
    drawn = int.from_bytes(os.urandom(8), "little") >> 1
    if group is not None:
        drawn = ops.broadcast_seed(drawn, group_name(group))
    return drawn


def check_same_on_all_ranks(fingerprint, group, who):
    """Fails on every rank, naming the first difference, unless all ranks of
    the group pass the same fingerprint."""
    ops.check_same_on_all_ranks(fingerprint, group_name(group), who)
