"""Train a small model with DistributedDataParallel on data streamed by torch_shards.

    torchrun --standalone --nproc_per_node=2 examples/ddp_train.py

Each rank reads its own disjoint share through DataLoader workers; at the end
the ranks gather the row indices they consumed and check that every row of
the epoch was delivered exactly once (padding aside).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

import torch_shards as ts


def synthetic_source(num_rows, num_features, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_rows, num_features, generator=generator)
    y = (x[:, :4].sum(dim=1) > 0).long()
    return ts.TensorSource({"X": x, "y": y})


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    source = synthetic_source(args.rows, args.features)
    dataset = ts.ShardedDataset(source, ts.BlockShuffling(block_size=64), batch_size=args.batch_size)
    loader = DataLoader(dataset, batch_size=None, num_workers=args.workers, persistent_workers=args.workers > 0)

    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(args.features, 64), nn.ReLU(), nn.Linear(64, 2)).to(device),
        device_ids=[local_rank] if use_cuda else None,
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        seen = []
        total_loss = 0.0
        for batch in loader:
            x, y = batch["X"].to(device, non_blocking=True), batch["y"].to(device, non_blocking=True)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
            seen.append(batch["index"])
        seen = torch.cat(seen)
        print(
            f"[rank {rank}/{world_size}] epoch {dataset.epoch}: {len(loader)} steps, "
            f"{seen.numel()} rows streamed, mean loss {total_loss / max(len(loader), 1):.4f}",
            flush=True,
        )
        gathered = [None] * world_size
        dist.all_gather_object(gathered, seen.tolist())
        if rank == 0:
            rows = [row for part in gathered for row in part]
            unique = set(rows)
            padding = len(rows) - len(unique)
            status = "OK" if unique == set(range(args.rows)) and padding < world_size * args.batch_size else "FAILED"
            print(
                f"exactly-once check, epoch {epoch}: {len(unique)}/{args.rows} rows delivered, "
                f"{padding} padded repeats: {status}",
                flush=True,
            )
            if status != "OK":
                raise SystemExit(1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
