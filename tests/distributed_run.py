"""Runs a function on W real torch.distributed ranks (gloo, CPU) and gathers
what each rank returns. Used by the multi-process tests."""

import datetime
import faulthandler
import os
import pickle
import socket
import sys
import tempfile
import time
import traceback

import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_group(rank=None, world_size=None):
    """The gloo group of this process (from the environment torchrun would set)."""
    rank = int(os.environ["RANK"]) if rank is None else rank
    world_size = int(os.environ["WORLD_SIZE"]) if world_size is None else world_size
    # A collective that waits this long means ranks stepped unequally: fail instead of hanging.
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=60))


def _rank_main(rank, world_size, port, function, args, out_dir, init):
    faulthandler.enable(all_threads=True)  # a crashing rank prints where each thread was
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    result = None
    try:
        if init:
            init_group(rank, world_size)
        result = ("ok", function(rank, world_size, *args))
    except BaseException as error:  # reported to the parent, with the rank
        result = ("error", f"{type(error).__name__}: {error}\n{traceback.format_exc()}")
    finally:
        try:
            data = pickle.dumps(result)
        except Exception as error:  # an unpicklable result is this rank's error
            data = pickle.dumps(("error", f"the result could not be pickled: {type(error).__name__}: {error}"))
        with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as out:
            out.write(data)
        if dist.is_initialized():
            dist.destroy_process_group()
        # The result is on disk: leave without the interpreter's teardown. DDP keeps torch's gloo group alive
        # after destroy_process_group, and a gloo worker thread that frees a finished collective's Python
        # objects takes the GIL; during finalization Python before 3.14 ends it with pthread_exit, which aborts
        # the rank ("terminate called without an active exception", ProcessGroupGloo::runLoop ->
        # PyEval_AcquireThread). It is torch's (tests/gloo_teardown/torch_only.py); test_gloo_teardown.py
        # holds the gloo threads up so that it happens, and checks that ranks leaving here never abort.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def run_ranks(function, world_size, *args, timeout=120, init=True):
    """function(rank, world_size, *args) on every rank (after init_process_group,
    unless init=False: then RANK / WORLD_SIZE / MASTER_* are set as torchrun sets
    them and the function may call init_group() itself); returns the results in
    rank order as ("ok", value) or ("error", message)."""
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.start_processes(
            _rank_main,
            args=(world_size, free_port(), function, args, out_dir, init),
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
