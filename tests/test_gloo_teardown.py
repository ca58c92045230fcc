"""Gloo ranks end cleanly even when torch's gloo worker threads take the GIL at teardown.

A gloo worker thread that frees a finished collective's Python objects takes the GIL; during interpreter
finalization Python before 3.14 ends such a thread with pthread_exit and the process aborts ("terminate called
without an active exception"). It is torch's (tests/gloo_teardown/torch_only.py shows it with torch alone) and
rare, as it needs the thread descheduled at that moment: stall_gloo.c holds torch's gloo threads up there, so
that a rank that finalizes after its last collective aborts in most runs. The guard the ranks use, os._exit
once results are written and the group destroyed, leaves no finalization for the threads to run into."""

import os
import shutil
import subprocess
import sys

import pytest
import torch
from distributed_run import run_ranks
from gloo_teardown.torch_only import MESSAGE, build_stall_library, stall_environment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def stall(tmp_path_factory):
    """The environment variables that hold torch's gloo worker threads up in processes started with them."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("needs a C compiler to build tests/gloo_teardown/stall_gloo.c")
    return stall_environment(build_stall_library(str(tmp_path_factory.mktemp("stall"))))


def _train_then_gather(rank, world_size, steps):
    """A DDP loop ending as training scripts do: an all_gather_object, then the rank's teardown."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(torch.nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        loss = model(torch.randn(8, 16)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    gathered = [None] * world_size
    dist.all_gather_object(gathered, steps)
    return sum(gathered)


@pytest.mark.timeout(600)
def test_run_ranks_ranks_survive_gloo_threads_taking_the_gil_at_teardown(stall, monkeypatch):
    for name, value in stall.items():  # inherited by the spawned ranks
        monkeypatch.setenv(name, value)
    for _ in range(2):
        assert run_ranks(_train_then_gather, 2, 5, timeout=300) == [("ok", 10), ("ok", 10)]


@pytest.mark.timeout(600)
def test_ddp_example_ranks_exit_cleanly_when_gloo_threads_take_the_gil_at_teardown(stall, tmp_path):
    # As `make demo` runs it (torchrun, DataLoader workers, the synthetic file), smaller.
    environment = dict(os.environ, **stall, TMPDIR=str(tmp_path), PYTHONPATH=os.pathsep.join(sys.path))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               os.path.join(ROOT, "examples", "ddp_train.py"), "--rows", "2000", "--genes", "40", "--epochs", "1",
               "--batch-size", "128"]  # fmt: skip
    for _ in range(2):
        done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and MESSAGE not in done.stderr, done.stderr[-4000:]
        assert "exactly-once check, epoch 0: 2000/2000 rows delivered" in done.stdout, done.stdout
