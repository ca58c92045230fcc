"""Is a DataLoader that hangs after one of its workers was SIGKILLed torch_shards' doing?

Runs trials, each in a fresh process: an epoch of a DataLoader with 2 workers (fork, spawn or
forkserver, persistent or not), one worker SIGKILLed at a random batch, then the iterator dropped
and a new epoch read. A trial that does not finish in --timeout seconds is a hang; its Python stacks
are printed (faulthandler). The same trials run over a ShardedDataset and over a plain
torch IterableDataset that yields tensors of the same shapes (no torch_shards at all), alternated.

    .venv/bin/python tests/stress/killed_worker_hang.py --trials 150

What it showed (2026-11-29, this 2-core VM, 25 trials per process): every hang, with either
dataset, waits in torch's DataLoader._shutdown_workers -> multiprocessing.Event.set(). The Event's
lock is shared with the workers, which take it in done_event.is_set() each time they get an index;
a worker killed while holding it leaves it locked, and set() waits forever. torch_shards takes no
part in it (its own cross-process lock, the epoch state's, is taken over from a killed owner, a
zombie included). With workers as busy as a ShardedDataset's (the Plain dataset reads ahead on a
thread): 1 hang in 188 trials over a ShardedDataset, 1 in 197 over Plain. With Plain's workers
idle between batches (an earlier version of this script), hangs were rarer with Plain (1 in 190
against 4 in 154): how often a killed worker holds the lock depends on how often it is descheduled
inside it.
"""

import argparse
import contextlib
import faulthandler
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

ROWS, BATCH = 20000, 32


def trials(kind, seed, count):
    """`count` trials in this process (as a training job would run them), printing each one's end."""
    for t in range(count):
        trial(kind, seed + t)
        print(f"done {t}", flush=True)
    faulthandler.cancel_dump_traceback_later()


class Plain(IterableDataset):
    """Batches of the same shapes as the ShardedDataset's, split among the workers: no torch_shards.
    Like a ShardedDataset's worker, each worker reads ahead on a thread of its own that works without
    the GIL (here: torch matrix products) and hands over batches that are ready: the workers keep the
    cores as busy, so that torch's code in them is descheduled as often."""

    def __iter__(self):
        info = get_worker_info()
        ready = queue.Queue(maxsize=8)
        stop = threading.Event()

        def read_ahead():
            work = torch.randn(192, 192)
            for start in range(info.id * BATCH, ROWS, info.num_workers * BATCH):
                index = torch.arange(start, min(start + BATCH, ROWS))
                torch.mm(work, work)  # the read's CPU time, without the GIL
                batch = {"X": index.float().reshape(-1, 1), "y": index, "index": index}
                while not stop.is_set():
                    with contextlib.suppress(queue.Full):
                        ready.put(batch, timeout=0.1)
                        break
            ready.put(None)

        thread = threading.Thread(target=read_ahead, daemon=True)
        thread.start()
        try:
            while (batch := ready.get()) is not None:
                yield batch
        finally:
            stop.set()


def trial(kind, seed):
    if kind == "torch_shards":
        import torch_shards as ts

        source = ts.TensorSource({"X": torch.arange(ROWS).float().reshape(-1, 1), "y": torch.arange(ROWS)})
        dataset = ts.ShardedDataset(source, ts.BlockShuffling(16), batch_size=BATCH, fetch_factor=2, seed=1)
    else:
        dataset = Plain()
    rng = random.Random(seed)
    faulthandler.dump_traceback_later(TIMEOUT - 5, exit=True)
    context = rng.choice(["fork", "spawn", "forkserver"])
    loader = DataLoader(
        dataset, batch_size=None, num_workers=2, multiprocessing_context=context, persistent_workers=rng.random() < 0.5
    )
    kill_at = rng.randrange(0, 30)
    try:
        iterator = iter(loader)
        for i, _ in enumerate(iterator):
            if i == kill_at:
                worker = iterator._workers[rng.randrange(2)]
                if rng.random() < 0.5:
                    time.sleep(rng.random() * 0.01)
                os.kill(worker.pid, signal.SIGKILL)
        del iterator
    except WORKER_GONE:
        pass  # "DataLoader worker (pid ...) is killed by signal", or its shared memory's connection reset
    for _ in range(3):  # the next epoch (the killed worker's error may still arrive: retry)
        try:
            sum(1 for _ in DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork"))
            break
        except WORKER_GONE:
            pass


TIMEOUT = 60
# How torch's DataLoader reports a killed worker: its SIGCHLD handler's RuntimeError, or the reset
# connection of torch's resource sharer when a batch's shared memory was on its way.
WORKER_GONE = (RuntimeError, ConnectionError, EOFError)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=150, help="trials per dataset")
    parser.add_argument("--timeout", type=int, default=TIMEOUT)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--per-process", type=int, default=10, help="trials one process runs in a row (a hang ends the process)"
    )
    parser.add_argument("--trial", nargs=3, metavar=("KIND", "SEED", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trial:
        trials(args.trial[0], int(args.trial[1]), int(args.trial[2]))
        return
    hangs = {"torch_shards": 0, "plain": 0}
    done_trials = {kind: 0 for kind in hangs}
    seed = args.seed * 1000000
    while min(done_trials.values()) < args.trials:
        for kind in hangs:  # alternated, so that both see the machine alike
            count = min(args.per_process, args.trials - done_trials[kind])
            if count <= 0:
                continue
            command = [sys.executable, __file__, "--timeout", str(args.timeout), "--trial", kind, str(seed), str(count)]
            seed += count
            # Files, not pipes: the workers a hung trial leaves behind (a forkserver's) would hold pipes open.
            with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
                process = subprocess.Popen(command, stdout=out, stderr=err, text=True, start_new_session=True)
                try:
                    process.wait(timeout=count * (args.timeout + 30))
                except subprocess.TimeoutExpired:
                    pass
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)  # the trial and every process it left
                process.wait()
                out.seek(0), err.seek(0)
                output, stacks = out.read(), err.read()
                if process.returncode == -signal.SIGKILL and "Timeout (" not in stacks:
                    stacks = "(killed by the runner)"
            finished = output.count("done ")
            if finished < count and "Timeout (" in stacks or stacks == "(killed by the runner)":
                hangs[kind] += 1
                where = "_shutdown_workers" if "_shutdown_workers" in stacks else "elsewhere"
                print(f"{kind}: trial {done_trials[kind] + finished} hung ({where})", flush=True)
                print(stacks[-2500:], flush=True)
                finished += 1
            elif finished < count:
                print(f"{kind}: trial {done_trials[kind] + finished} failed:\n{stacks[-2500:]}", flush=True)
                finished += 1
            done_trials[kind] += finished
        print(f"trials {done_trials}, hangs {hangs}", flush=True)


if __name__ == "__main__":
    TIMEOUT = int(sys.argv[sys.argv.index("--timeout") + 1]) if "--timeout" in sys.argv else TIMEOUT
    main()
