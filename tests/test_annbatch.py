"""torch_shards.open on annbatch DatasetCollection stores, written by annbatch itself
(tests/data/anndata/annbatch-*, see tests/data/make_anndata_fixtures.py): one Collection of the
datasets in annbatch's order, obs columns as for any AnnData, every row of every epoch."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import torch_shards as ts

DATA = Path(__file__).parent / "data" / "anndata"
COLLECTIONS = sorted(DATA.glob("annbatch-*"))


def expected_collection(name):
    """The datasets of a fixture collection in annbatch's order, and their expected values."""
    (directory,) = COLLECTIONS
    manifest = json.loads((directory / "manifest.json").read_text())
    datasets = [directory / name / dataset for dataset in manifest["collections"][name]]
    expected = []
    for dataset in datasets:
        values = json.loads(Path(f"{dataset}.json").read_text())
        with np.load(f"{dataset}.npz") as arrays:
            values["X"] = arrays["X"]
        expected.append(values)
    return directory / name, datasets, expected


def concatenated(expected, column):
    return sum((e["obs"][column]["codes"] for e in expected), [])


def test_fixture_collections_were_written_by_annbatch():
    assert len(COLLECTIONS) == 1, "expected one annbatch fixture directory"
    path, datasets, _ = expected_collection("collection.zarr")
    root = json.loads((path / "zarr.json").read_text())
    assert root["attributes"]["encoding-type"] == "annbatch-preshuffled"
    assert len(datasets) == 3
    data = json.loads((path / "dataset_0" / "X" / "data" / "zarr.json").read_text())
    sharding = data["codecs"][0]
    assert sharding["name"] == "sharding_indexed"
    assert data["chunk_grid"]["configuration"]["chunk_shape"][0] > sharding["configuration"]["chunk_shape"][0]
    assert [c["name"] for c in sharding["configuration"]["codecs"]] == ["bytes", "blosc"]


@pytest.mark.parametrize("name", ["collection.zarr", "collection-h5ad"])
def test_open_gives_one_collection_of_the_datasets_in_annbatchs_order(name):
    path, datasets, expected = expected_collection(name)
    collection = ts.open(path, obs=["cell_type", "n_counts", "src_path"])
    assert isinstance(collection, ts.Collection)
    assert [Path(s.path) for s in collection.sources] == datasets
    sizes = [e["n_obs"] for e in expected]
    assert len(collection) == sum(sizes) and collection.offsets == list(np.cumsum([0] + sizes[:-1]))
    x = np.concatenate([e["X"] for e in expected])
    rows = np.random.default_rng(0).permutation(len(collection)).tolist()
    batch = collection.read(rows, num_threads=2)
    assert torch.equal(batch["X"].to_dense(), torch.from_numpy(x[rows]))
    assert batch["cell_type"].tolist() == [concatenated(expected, "cell_type")[r] for r in rows]
    assert collection.sources[0].categories("cell_type") == expected[0]["obs"]["cell_type"]["categories"]
    assert collection.categories("cell_type") == expected[0]["obs"]["cell_type"]["categories"]
    n_counts = sum((e["obs"]["n_counts"]["values"] for e in expected), [])
    assert batch["n_counts"].tolist() == [n_counts[r] for r in rows]
    names = sum((e["obs_names"] for e in expected), [])
    assert sum((s.obs_names for s in collection.sources), []) == names


def test_every_row_of_every_epoch_at_two_ranks():
    path, _, expected = expected_collection("collection.zarr")
    total = sum(e["n_obs"] for e in expected)
    for epoch in range(2):
        seen = []
        for rank in range(2):
            dataset = ts.ShardedDataset(
                ts.open(path, dense=True),
                ts.BlockShuffling(16),
                batch_size=32,
                fetch_factor=2,
                seed=5,
                rank=rank,
                world_size=2,
            )
            dataset.set_epoch(epoch)
            seen += [i for batch in dataset for i in batch["index"].tolist()]
        # padding (even_batches="pad") may repeat a batch; no row is left out
        assert set(seen) == set(range(total))
        assert len(seen) - total <= 32  # at most world_size - 1 = 1 repeated batch


def test_string_columns_whose_values_differ_between_datasets_read_as_codes_into_their_union():
    """Each dataset's barcodes are a string column of its own (codes into its sorted barcodes): the
    collection's codes index the union, the datasets in order, each barcode at its first appearance."""
    path, datasets, expected = expected_collection("collection.zarr")
    collection = ts.open(path, obs=["barcode"])
    union = []
    for dataset in datasets:
        union += [b for b in ts.AnnDataSource(dataset, obs=["barcode"]).categories("barcode") if b not in union]
    assert collection.categories("barcode") == union
    assert union[: len(set(expected[0]["obs"]["barcode"]["values"]))] == sorted(
        set(expected[0]["obs"]["barcode"]["values"])
    )
    rows = np.random.default_rng(1).permutation(len(collection)).tolist()
    barcodes = sum((e["obs"]["barcode"]["values"] for e in expected), [])
    codes = collection.read(rows, num_threads=2)["barcode"].tolist()
    assert [union[code] for code in codes] == [barcodes[r] for r in rows]


def test_collection_without_datasets_and_plain_groups_are_named(tmp_path):
    path, _, _ = expected_collection("collection.zarr")
    empty = tmp_path / "empty.zarr"
    empty.mkdir()
    shutil.copy(path / "zarr.json", empty / "zarr.json")
    with pytest.raises(ValueError, match=r"empty.zarr is an annbatch DatasetCollection without datasets"):
        ts.open(empty)
    # the marker, not the names, makes a zarr group a collection
    plain = tmp_path / "plain.zarr"
    shutil.copytree(path, plain)
    document = json.loads((plain / "zarr.json").read_text())
    document["attributes"] = {}
    (plain / "zarr.json").write_text(json.dumps(document))
    with pytest.raises(ValueError, match="is a zarr group but not AnnData: pass array="):
        ts.open(plain)
    with pytest.raises(ValueError, match="neither an HDF5 file nor a zarr store"):
        ts.open(tmp_path)


@pytest.mark.parametrize("name", ["collection.zarr", "collection-h5ad"])
def test_fields_over_annbatchs_own_collection(name):
    """annbatch's add_adatas keeps layers, obsm and obsp (its writer shards them along the cells); the
    fixture's input had none, so its groups are empty: X read under another name, and an obsm element
    refused listing what obsm holds. Every kind of element over collections: test_collection.py."""
    path, _, expected = expected_collection(name)
    collection = ts.open(path, fields={"expression": "X"}, obs=["cell_type"])
    assert collection.fields == ["expression", "cell_type"]
    rows = np.random.default_rng(1).permutation(len(collection)).tolist()
    x = np.concatenate([e["X"] for e in expected])
    assert torch.equal(collection.read(rows)["expression"].to_dense(), torch.from_numpy(x[rows]))
    with pytest.raises(ValueError, match=r"dataset_0(\.h5ad)?:/obsm/X_pca: no such element \(obsm: none\)"):
        ts.open(path, fields={"pca": "obsm/X_pca"})
