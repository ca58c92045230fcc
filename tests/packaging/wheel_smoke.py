"""Runs inside the brand-new venv test_wheel.py makes (torch, numpy and the installed wheel, nothing
else: no h5py, zarr or pytest), with the system's HDF5, c-blosc, lz4, zstd and libaec hidden.

    python wheel_smoke.py formats CASES.json     every file read back, value by value, in-process and
                                                 through DataLoader workers (fork, spawn, forkserver)
    python wheel_smoke.py rank CASES.json OUT    one gloo rank (RANK, WORLD_SIZE, MASTER_ADDR/PORT in
                                                 the environment): the rows it reads, one line per epoch

CASES.json (written by test_wheel.py): [{name, path, kwargs, field, expected (.npy), sparse}].
Exits non-zero with the case named on any difference.
"""

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import torch_shards as ts


def read_all(case):
    source = ts.open(case["path"], **case["kwargs"])
    expected = np.load(case["expected"])
    got = source.read(list(range(expected.shape[0])), num_threads=2)[case["field"]]
    if case["sparse"]:
        assert got.layout == torch.sparse_csr, f"{case['name']}: {got.layout} batch, expected sparse CSR"
        got = got.to_dense()
    assert torch.equal(got, torch.from_numpy(expected)), f"{case['name']}: values differ"
    return source, expected


def through_workers(case, source, expected, context):
    dataset = ts.ShardedDataset(source, ts.BlockShuffling(4), batch_size=8, seed=3)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context=context)
    seen = []
    for batch in loader:
        values = batch[case["field"]]
        if case["sparse"]:
            values = values.to_dense()
        index = batch["index"]
        assert torch.equal(values, torch.from_numpy(expected[index.numpy()])), f"{case['name']}/{context}: values"
        seen += index.tolist()
    assert sorted(seen) == list(range(expected.shape[0])), f"{case['name']}/{context}: rows not exactly once"


def formats(cases_path):
    cases = json.load(open(cases_path))
    read = []
    for case in cases:
        read.append(read_all(case))
        print(f"{case['name']}: {read[-1][1].shape[0]} rows read back exactly", flush=True)
    # DataLoader workers under every start method, over the formats' two kinds of reader.
    for case, (source, expected) in ((cases[0], read[0]), (cases[-1], read[-1])):
        for context in ("fork", "spawn", "forkserver"):
            through_workers(case, source, expected, context)
            print(f"{case['name']}: exactly once through 2 {context} workers", flush=True)


def rank(cases_path, out_path):
    dist.init_process_group("gloo")
    case = json.load(open(cases_path))[0]
    source = ts.open(case["path"], **case["kwargs"])
    dataset = ts.ShardedDataset(source, ts.BlockShuffling(4), batch_size=8, seed=3)
    with open(out_path, "w") as out:
        for _ in range(2):  # the epoch advances by itself
            rows = [row for batch in DataLoader(dataset, batch_size=None, num_workers=1) for row in batch["index"]]
            out.write(" ".join(str(int(row)) for row in rows) + "\n")
    dist.barrier()
    # Not destroy_process_group(): torch's gloo threads may take the GIL during finalization and abort
    # (tests/gloo_teardown); the rows are written.
    os._exit(0)


if __name__ == "__main__":
    command, *arguments = sys.argv[1:]
    {"formats": formats, "rank": rank}[command](*arguments)
