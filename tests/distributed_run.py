"""Runs a function on W real torch.distributed ranks (gloo, CPU) and gathers
what each rank returns. Used by the multi-process tests."""

import datetime
import os
import pickle
import socket
import tempfile
import time
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world_size, port, function, args, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    result = None
    try:
        # A collective that waits this long means ranks stepped unequally: fail instead of hanging.
        dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=60))
        result = ("ok", function(rank, world_size, *args))
    except BaseException as error:  # reported to the parent, with the rank
        result = ("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as out:
            pickle.dump(result, out)
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(function, world_size, *args, timeout=120):
    """function(rank, world_size, *args) on every rank; returns the results in
    rank order as ("ok", value) or ("error", message)."""
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.start_processes(
            _rank_main,
            args=(world_size, free_port(), function, args, out_dir),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout
        try:
            while not context.join(timeout=1):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world_size} ranks did not finish within {timeout} s (a hang?)")
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
        results = []
        for rank in range(world_size):
            with open(os.path.join(out_dir, f"rank{rank}.pkl"), "rb") as f:
                results.append(pickle.load(f))
        return results
