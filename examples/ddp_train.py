"""Train a small classifier with DistributedDataParallel on an .h5ad streamed by torch_shards.

    torchrun --standalone --nproc_per_node=2 examples/ddp_train.py            # CPU (gloo)
    torchrun --standalone --nproc_per_node=8 examples/ddp_train.py --data my.h5ad --label cell_type

Without --data, rank 0 writes a synthetic AnnData file (CSR X, a categorical
"cell_type" column) and the other ranks wait for it. Every rank reads its own
disjoint share through DataLoader workers; after each epoch the ranks gather
the row indices they consumed and rank 0 checks that every row was delivered
exactly once (padding aside).
"""

import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from synthetic import write_h5ad
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

import torch_shards as ts


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help=".h5ad file or AnnData zarr store (default: a synthetic one)")
    parser.add_argument("--label", default="cell_type", help="categorical obs column to predict")
    parser.add_argument("--rows", type=int, default=20_000, help="rows of the synthetic file")
    parser.add_argument("--genes", type=int, default=500, help="columns of the synthetic file")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)  # before any CUDA work: every rank on its own GPU

    path = args.data
    if path is None:
        path = os.path.join(tempfile.gettempdir(), f"torch_shards_demo_{args.rows}x{args.genes}.h5ad")
        if rank == 0 and not os.path.exists(path):
            write_h5ad(path + ".partial", args.rows, args.genes)
            os.replace(path + ".partial", path)
        dist.barrier()

    # dense=True: the model takes dense rows; the CSR -> dense conversion runs natively in the readers.
    source = ts.AnnDataSource(path, obs=[args.label], dense=True)
    classes = len(source.categories(args.label))
    dataset = ts.ShardedDataset(source, ts.BlockShuffling(block_size=64), batch_size=args.batch_size)
    loader = DataLoader(dataset, batch_size=None, num_workers=args.workers, persistent_workers=args.workers > 0)
    if rank == 0:
        print(
            f"{path}: {source.n_obs} cells x {source.n_vars} genes, {classes} classes; {world_size} ranks x "
            f"{args.workers} workers, {len(loader)} steps per epoch per rank",
            flush=True,
        )

    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(source.n_vars, 128), nn.ReLU(), nn.Linear(128, classes)).to(device),
        device_ids=[local_rank] if use_cuda else None,
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        seen, total_loss, correct, start = [], 0.0, 0, time.perf_counter()
        for batch in loader:
            x = batch["X"].to(device, non_blocking=True)
            y = batch[args.label].to(device, non_blocking=True)
            logits = model(x)
            loss = loss_fn(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
            correct += (logits.argmax(dim=1) == y).sum().item()
            seen.append(batch["index"])
        seen = torch.cat(seen)
        elapsed = time.perf_counter() - start
        print(
            f"[rank {rank}/{world_size}] epoch {dataset.epoch}: {len(loader)} steps, {seen.numel()} rows streamed "
            f"({seen.numel() / elapsed:.0f} rows/s), loss {total_loss / len(loader):.3f}, "
            f"accuracy {correct / seen.numel():.3f}",
            flush=True,
        )
        gathered = [None] * world_size
        dist.all_gather_object(gathered, seen.tolist())
        if rank == 0:
            rows = [row for part in gathered for row in part]
            unique = set(rows)
            repeats = len(rows) - len(unique)
            ok = unique == set(range(source.n_obs)) and repeats < world_size * args.batch_size
            print(
                f"exactly-once check, epoch {epoch}: {len(unique)}/{source.n_obs} rows delivered, "
                f"{repeats} padded repeats: {'OK' if ok else 'FAILED'}",
                flush=True,
            )
            if not ok:
                raise SystemExit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()  # a failed check or an error leaves through the interpreter, with its exit status and traceback
    # Everything is printed and checked: leave without the interpreter's teardown. DDP keeps torch's gloo group
    # alive after destroy_process_group, and a gloo worker thread that frees a finished collective's tensors takes
    # the GIL; if that happens while Python finalizes, Python before 3.14 ends the thread and the rank aborts
    # ("terminate called without an active exception"; torch's, see tests/gloo_teardown/torch_only.py).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
