"""Where this process stands in a distributed job: rank, world size, seed."""

import os

import torch.distributed as dist

from . import _convert
from ._library import ops


def _default_group_active():
    return dist.is_available() and dist.is_initialized()


def resolve_rank_and_world_size(rank=None, world_size=None, who="ShardedDataset"):
    """Explicit values first, then the initialised default process group, then
    the RANK / WORLD_SIZE environment variables (torchrun), else 0 and 1."""
    if world_size is None:
        if _default_group_active():
            world_size = dist.get_world_size()
        elif "WORLD_SIZE" in os.environ:
            world_size = _env_int("WORLD_SIZE")
        else:
            world_size = 1
    if rank is None:
        if _default_group_active():
            rank = dist.get_rank()
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


def group_name(process_group=None):
    """The registered name of a process group (the default group if None)."""
    group = process_group if process_group is not None else dist.group.WORLD
    return group.group_name


def resolve_seed(seed=None, process_group=None, who="ShardedDataset"):
    """A seed in [0, 2**63). None draws one; when a process group is active,
    rank 0's draw is broadcast (from C++, over that group) so all ranks agree."""
    if seed is not None:
        seed = _convert.check_int(f"{who}: seed", seed)
        if not -(2**63) <= seed < 2**64:
            raise ValueError(f"{who}: seed must fit in 64 bits, got {seed}")
        return seed - 2**64 if seed >= 2**63 else seed
    drawn = int.from_bytes(os.urandom(8), "little") >> 1
    if process_group is not None or _default_group_active():
        drawn = ops.broadcast_seed(drawn, group_name(process_group))
    return drawn
