"""The C++ package from a user's side: find_package(TorchShards) from clean
build directories, the C++ training example run as 2 gloo ranks,
TorchScript modules saved from Python run by a C++ program, and AnnData
fields read through the C++ options."""

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import (
    PER_CELL_FIELDS,
    PER_CELL_FIELDS_ACROSS_FILES,
    cmake_build,
    element_of,
    per_cell_anndata,
    read_anndata,
    rows_source,
    write_anndata,
)
from remote_servers import RangeHTTPServer

import torch_shards as ts

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    build = tmp_path_factory.mktemp("example_build")
    cmake_build(os.path.join(ROOT, "examples", "cpp"), build)
    return build / "train"


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    build = tmp_path_factory.mktemp("package_build")
    cmake_build(os.path.join(HERE, "cpp_package"), build)
    return build


@pytest.fixture(scope="module")
def loader(package):
    return package / "load_scripted"


@pytest.mark.timeout(1200)
def test_cpp_example_trains_two_gloo_ranks_on_disjoint_shares(example, tmp_path):
    model, data = tmp_path / "model.pt", tmp_path / "cells.h5ad"
    rows = 300
    subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "examples", "cpp", "make_model.py"),
            "--model",
            str(model),
            "--inputs",
            "40",
            "--classes",
            "4",
            "--h5ad",
            str(data),
            "--rows",
            str(rows),
        ],
        check=True,
        capture_output=True,
    )
    ranks = [
        subprocess.Popen(
            [str(example), "--data", str(data), "--model", str(model), "--rank", str(rank), "--world-size", "2",
             "--store", str(tmp_path / "store"), "--epochs", "2", "--batch-size", "16",
             "--rows-out", str(tmp_path / f"rows{rank}.txt")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]  # fmt: skip
    outputs = []
    for process in ranks:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
        outputs.append(out)
    steps = [[int(n) for n in re.findall(r"epoch \d+: (\d+) steps", out)] for out in outputs]
    assert len(steps[0]) == 2 and steps[0] == steps[1], outputs  # equal step counts: DDP never hangs
    epochs = [[line.split() for line in (tmp_path / f"rows{rank}.txt").read_text().splitlines()] for rank in range(2)]
    for epoch in range(2):
        mine, theirs = (set(map(int, epochs[rank][epoch])) for rank in range(2))
        assert mine | theirs == set(range(rows))
        # Disjoint but for padding: 300 rows in batches of 16 leave one short rank one batch behind.
        assert len(mine & theirs) <= 16
    assert epochs[0][0] != epochs[0][1]  # a new order every epoch


class RowsPerEpoch(torch.nn.Module):
    """A scripted loop over a dataset held as a module attribute."""

    def __init__(self, dataset):
        super().__init__()
        self.dataset = dataset

    def forward(self, epochs: int) -> list[list[int]]:
        out: list[list[int]] = []
        for _ in range(epochs):
            iterator = self.dataset.iter()  # starts the next epoch by itself
            rows: list[int] = []
            while True:
                batch = iterator.next()
                if batch is None:
                    break
                else:
                    index: list[int] = batch["index"].tolist()
                    rows.extend(index)
            out.append(rows)
        return out


def python_epochs(make, first, count):
    dataset = make()
    dataset.set_epoch(first)
    return [[row for batch in dataset for row in batch["index"].tolist()] for _ in range(count)]


@pytest.mark.timeout(900)
def test_scripted_loop_saved_in_python_runs_in_cpp(loader, tmp_path):
    path = tmp_path / "x.h5"
    import h5py

    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=torch.arange(90 * 2, dtype=torch.float32).reshape(90, 2).numpy(), chunks=(8, 2))
    sources = {
        "tensor": lambda: rows_source(90),
        "hdf5": lambda: ts.HDF5Source(path, "/x"),
        "collection": lambda: ts.Collection([ts.TensorSource(torch.ones(40, 2)), ts.HDF5Source(path, "/x")]),
    }
    for name, source in sources.items():

        def make(source=source):
            return ts.ShardedDataset(source(), ts.BlockShuffling(3), batch_size=7, fetch_factor=2, seed=21)

        dataset = make()
        module = torch.jit.script(RowsPerEpoch(dataset.native))
        assert module(1) == python_epochs(make, 0, 1)  # epoch 0, run in Python
        saved = tmp_path / f"{name}.pt"
        module.save(str(saved))  # the dataset is saved at its next epoch, 1
        done = subprocess.run([str(loader), str(saved), "2"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        from_cpp = [[int(row) for row in line.split()] for line in done.stdout.splitlines()]
        assert from_cpp == python_epochs(make, 1, 2), name


def test_a_missing_file_fails_the_cpp_load_naming_it(loader, tmp_path):
    path = tmp_path / "gone.h5"
    import h5py

    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=torch.zeros(10, 2).numpy())
    dataset = ts.ShardedDataset(ts.HDF5Source(path, "/x"), ts.Streaming(), batch_size=4, seed=0)
    saved = tmp_path / "module.pt"
    torch.jit.script(RowsPerEpoch(dataset.native)).save(str(saved))
    os.remove(path)
    done = subprocess.run([str(loader), str(saved), "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert str(path) in done.stderr


def cpp_rows(program, path, obs, fields, environment=None):
    """{(row, field): values} of one epoch read_fields printed, each row of each field once."""
    arguments = [str(program), str(path), *obs, *(f"{name}={element}" for name, element in fields.items())]
    env = {**os.environ, **(environment or {})}
    done = subprocess.run(arguments, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    rows = {}
    for line in done.stdout.splitlines():
        row, field, *values = line.split()
        assert (int(row), field) not in rows, line
        rows[int(row), field] = np.array([float(v) for v in values])
    return rows


def expected_rows(adatas, obs, fields):
    """The same, from what anndata reads of each file (rows numbered across them, in order)."""
    rows, offset = {}, 0
    for adata in adatas:
        arrays = {name: element_of(adata, element) for name, element in fields.items()}
        arrays.update({column: adata.obs[column].cat.codes.to_numpy() for column in obs})
        for name, array in arrays.items():
            for row in range(adata.n_obs):
                rows[offset + row, name] = array[row].astype(np.float64).reshape(-1)
        offset += adata.n_obs
    return rows


def assert_same_rows(got, want):
    assert got.keys() == want.keys()
    for key, values in want.items():
        np.testing.assert_array_equal(got[key], values, err_msg=str(key))


def test_cpp_options_read_every_field_of_a_file_and_of_an_annbatch_collection(package, tmp_path):
    import anndata as ad
    import zarr

    program = package / "read_fields"
    path = write_anndata(per_cell_anndata(23, 0), tmp_path / "cells.h5ad")
    fields = {"X": "X", **PER_CELL_FIELDS}
    assert_same_rows(
        cpp_rows(program, path, ["cell_type"], fields), expected_rows([read_anndata(path)], ["cell_type"], fields)
    )
    # An annbatch DatasetCollection's layout (a zarr group marked annbatch-preshuffled, datasets dataset_<i>):
    # AnnbatchCollection(path, {.obs, .fields}).
    collection = tmp_path / "collection.zarr"
    group = zarr.open_group(collection, mode="w", zarr_format=3)
    group.attrs.update({"encoding-type": "annbatch-preshuffled", "encoding-version": "0.1.0"})
    parts = [per_cell_anndata(rows, seed) for seed, rows in enumerate((9, 14), start=1)]
    for i, part in enumerate(parts):
        ad.io.write_elem(group, f"dataset_{i}", part)
    read_back = [ad.io.read_elem(zarr.open_group(collection, mode="r")[f"dataset_{i}"]) for i in range(2)]
    fields = {"expression": "X", **PER_CELL_FIELDS_ACROSS_FILES}
    assert_same_rows(cpp_rows(program, collection, [], fields), expected_rows(read_back, [], fields))
    # The same collection in object storage (the tests' server as an unsigned S3 endpoint, set as a C++
    # program's user sets it: the environment), its datasets opened together.
    served = tmp_path / "served"
    shutil.copytree(collection, served / "public" / "collection.zarr")
    with RangeHTTPServer(served, s3_listing=True) as server:
        environment = {"AWS_ENDPOINT_URL": server.url, "AWS_NO_SIGN_REQUEST": "true"}
        got = cpp_rows(program, "s3://public/collection.zarr", [], fields, environment)
    assert_same_rows(got, expected_rows(read_back, [], fields))
