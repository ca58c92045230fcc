"""The torch.distributed process group the native objects agree over.

Only finding the group is Python's job (the default group lives in Python);
rank, world size, seed agreement and the consistency check are native.
"""

import torch.distributed as dist


def resolve_group(process_group=None, who="torch_shards"):
    """The process group to use: the one given, else the initialised default
    group, else None (no torch.distributed in this process)."""
    if process_group is not None:
        if not (dist.is_available() and isinstance(process_group, dist.ProcessGroup)):
            raise TypeError(
                f"{who}: process_group must be a torch.distributed ProcessGroup (e.g. dist.new_group(ranks)), "
                f"got {type(process_group).__name__} {process_group!r}"
            )
        if not dist.is_initialized():
            raise ValueError(f"{who}: process_group was given but torch.distributed is not initialised in this process")
        return process_group
    if dist.is_available() and dist.is_initialized():
        return dist.group.WORLD
    return None


def boxed(group):
    """The group as the script object native methods take (None stays None)."""
    return None if group is None else group.boxed()


def rank_from_dist_info(who, dist_info, rank, world_size):
    """(rank, world_size) as annbatch's ``dist_info`` gives them: "torch" (the
    default: the process group, then RANK / WORLD_SIZE, decided natively, so
    (rank, world_size) come back unchanged), "jax" (jax.process_index() and
    jax.process_count()) or a callable returning (rank, world_size)."""
    if dist_info is None or (isinstance(dist_info, str) and dist_info == "torch"):
        return rank, world_size
    if rank is not None or world_size is not None:
        raise ValueError(f"{who}: pass dist_info= or the rank and world size, not both")
    if isinstance(dist_info, str) and dist_info == "jax":
        try:
            import jax
        except ImportError as error:
            raise ValueError(f"{who}: dist_info='jax' but jax is not installed") from error
        return int(jax.process_index()), int(jax.process_count())
    if not callable(dist_info):
        raise ValueError(
            f"{who}: dist_info must be 'torch', 'jax' or a callable returning (rank, world_size), got {dist_info!r}"
        )
    info = dist_info()
    if not isinstance(info, (tuple, list)) or len(info) != 2:
        raise ValueError(f"{who}: dist_info() must return (rank, world_size), got {info!r}")
    return info[0], info[1]
