"""The gloo teardown abort with torch alone (no torch_shards anywhere): evidence that it is torch's.

A CPU training script of the usual shape (DistributedDataParallel over gloo, an all_gather_object at the end,
destroy_process_group, return) sometimes dies at exit, in one rank, with

    terminate called without an active exception

and SIGABRT. The rank's core shows where (gdb -batch -ex 'thread apply all bt' python core):

    main thread:  Py_FinalizeEx -> finalize_modules -> ...
    gloo thread:  c10d::ProcessGroupGloo::runLoop
                  -> c10d::AsyncAllreduceWork::~AsyncAllreduceWork -> at::ThreadLocalState::~ThreadLocalState
                     -> SafePyObject (the contextvars.Context autograd stashes in TLS during backward)
                  or -> AsyncAllgatherWork::~AsyncAllgatherWork -> c10::TensorImpl::decref_pyobject
                  -> ConcretePyInterpreterVTable::decref -> pybind11::gil_scoped_acquire -> PyEval_AcquireThread
                  -> take_gil -> PyThread_exit_thread -> pthread_exit -> _Unwind_ForcedUnwind
                  -> __gxx_personality_v0 -> std::terminate

DDP keeps the gloo group (and its worker threads) alive after destroy_process_group. A worker thread that
drops the last reference to a finished collective's work frees Python objects, which takes the GIL. When that
happens after the main thread has started finalizing, Python before 3.14 ends the thread with pthread_exit,
and the forced unwind through torch's noexcept destructors is std::terminate. The worker is late only when
the machine deschedules it at that moment, hence "rare, under load".

    python tests/gloo_teardown/torch_only.py --runs 40                     # the natural race
    python tests/gloo_teardown/torch_only.py --runs 10 --stall             # gloo threads held up (stall_gloo.c)
    python tests/gloo_teardown/torch_only.py --runs 10 --stall --exit os   # the ranks leave with os._exit

--stall preloads stall_gloo.c (built with the system C compiler), which holds up only torch's gloo worker
threads, where a loaded machine would: most runs then abort. --exit os leaves each rank with os._exit(0) once
its results are printed and its group destroyed, as tests/distributed_run.py and examples/ddp_train.py do:
no run aborts, since no finalization runs while the gloo threads may still need the GIL.
"""

import argparse
import datetime
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MESSAGE = "terminate called without an active exception"
# What stall_gloo.c holds gloo worker threads up by, in microseconds: after waking a collective's waiter, so
# that the waiter drops its references first, and before taking the GIL, so that the main thread is finalizing.
STALL = {"GLOO_STALL_NOTIFY_US": "50000", "GLOO_STALL_GIL_US": "300000"}


def build_stall_library(directory):
    """Compiles stall_gloo.c into directory; returns the library's path."""
    library = os.path.join(directory, "libstall_gloo.so")
    compiler = os.environ.get("CC", "cc")
    command = [compiler, "-shared", "-fPIC", "-O2", "-o", library, os.path.join(HERE, "stall_gloo.c"), "-ldl"]
    subprocess.run(command, check=True, capture_output=True)
    return library


def stall_environment(library):
    """The environment variables that hold the ranks' gloo worker threads up."""
    preload = os.pathsep.join(filter(None, [library, os.environ.get("LD_PRELOAD")]))
    return dict(STALL, LD_PRELOAD=preload)


def rank_main(steps, exit_mode):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(dist.get_rank())
    model = DistributedDataParallel(torch.nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        loss = model(torch.randn(8, 16)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, steps)
    print(f"rank {dist.get_rank()}: {sum(gathered)} steps in all", flush=True)
    dist.destroy_process_group()
    if exit_mode == "os":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(world_size, steps, exit_mode, extra_environment, timeout):
    """One job of world_size ranks; returns [(returncode, stderr)] per rank."""
    port = free_port()
    ranks = []
    for rank in range(world_size):
        environment = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            **extra_environment,
        )
        command = [sys.executable, os.path.abspath(__file__), "--rank-main", "--steps", str(steps), "--exit", exit_mode]
        ranks.append(subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    deadline = time.monotonic() + timeout
    outcomes = []
    for process in ranks:
        try:
            _, err = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            _, err = process.communicate()
        outcomes.append((process.returncode, err.decode(errors="replace")))
    return outcomes


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="DDP steps per rank")
    parser.add_argument("--exit", choices=["interpreter", "os"], default="interpreter", dest="exit_mode")
    parser.add_argument("--stall", action="store_true", help="hold torch's gloo worker threads up (stall_gloo.c)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run")
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        rank_main(args.steps, args.exit_mode)
        return

    with tempfile.TemporaryDirectory() as directory:
        extra = stall_environment(build_stall_library(directory)) if args.stall else {}
        aborted_runs = aborted_ranks = with_message = other_failures = 0
        for run in range(args.runs):
            outcomes = run_once(args.world_size, args.steps, args.exit_mode, extra, args.timeout)
            aborted = [rank for rank, (code, _) in enumerate(outcomes) if code == -signal.SIGABRT]
            others = [(rank, code) for rank, (code, _) in enumerate(outcomes) if code not in (0, -signal.SIGABRT)]
            aborted_runs += bool(aborted)
            aborted_ranks += len(aborted)
            with_message += sum(MESSAGE in outcomes[rank][1] for rank in aborted)
            other_failures += len(others)
            if aborted or others:
                print(f"run {run}: ranks {aborted} aborted (SIGABRT); other failures {others}", flush=True)
    print(
        f"{args.runs} runs of {args.world_size} ranks (exit: {args.exit_mode}, stall: {args.stall}): "
        f"{aborted_runs} runs with an aborted rank, {aborted_ranks} ranks aborted, {with_message} of them printing "
        f"{MESSAGE!r}; {other_failures} ranks failed otherwise"
    )


if __name__ == "__main__":
    main()
