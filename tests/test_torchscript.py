"""The TorchScript door: scripted loops over the native dataset (epochs that
advance by themselves), modules holding torch_shards objects saved and
loaded, every class pickled, the registered ops checked by opcheck."""

import io
import json
from pathlib import Path

import anndata as ad
import h5py
import numpy as np
import pandas as pd
import pytest
import torch
import zarr
from conftest import rows_source

import torch_shards as ts

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.[a-z]+` is deprecated:DeprecationWarning")


class Holder(torch.nn.Module):
    """A module whose only content is one torch_shards object."""

    def __init__(self, value):
        super().__init__()
        self.value = value

    def forward(self) -> int:
        return 0


def save_and_load(value):
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(Holder(value)), buffer)
    buffer.seek(0)
    return torch.jit.load(buffer).value


class EpochLoop(torch.nn.Module):
    """Every batch's rows, epoch after epoch, the way a scripted training loop reads them."""

    def __init__(self, dataset):
        super().__init__()
        self.dataset = dataset

    def forward(self, epochs: int) -> list[list[list[int]]]:
        out: list[list[list[int]]] = []
        for _ in range(epochs):
            iterator = self.dataset.iter()
            batches: list[list[int]] = []
            for _ in range(iterator.num_batches()):  # exact
                batch = iterator.next()
                assert batch is not None
                index: list[int] = batch["index"].tolist()
                batches.append(index)
            assert iterator.next() is None
            out.append(batches)
        return out


def make_dataset(**kwargs):
    arguments = dict(batch_size=6, fetch_factor=2, seed=13)
    arguments.update(kwargs)
    return ts.ShardedDataset(rows_source(75), ts.BlockShuffling(4), **arguments)


def python_batches(dataset, epochs):
    return [[batch["index"].tolist() for batch in dataset] for _ in range(epochs)]


def test_scripted_loop_yields_pythons_batches_and_advances_the_epoch():
    scripted = torch.jit.script(EpochLoop(make_dataset().native))
    assert scripted(3) == python_batches(make_dataset(), 3)
    assert scripted.dataset.epoch() == 2


def test_saved_and_loaded_loop_continues_at_the_next_epoch():
    dataset = make_dataset()
    scripted = torch.jit.script(EpochLoop(dataset.native))
    first = scripted(2)
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    reference = python_batches(make_dataset(), 4)
    assert first == reference[:2]
    assert loaded(2) == reference[2:]


@torch.jit.script
def epochs_from_ops(rows: int, epochs: int) -> list[int]:
    """Builds a dataset from the registered ops; the epoch advances at every iter()."""
    source = torch.ops.torch_shards.tensor_source({"X": torch.arange(rows)})
    strategy = torch.ops.torch_shards.block_shuffling(3, None)
    dataset = torch.ops.torch_shards.sharded_dataset(source, strategy, 4, seed=5)
    seen: list[int] = []
    for _ in range(epochs):
        iterator = dataset.iter()
        rows_read = 0
        while True:
            batch = iterator.next()
            if batch is None:
                break
            else:
                rows_read += batch["index"].shape[0]
        seen.append(rows_read * 1000 + iterator.epoch())
    return seen


def test_scripted_function_builds_a_dataset_and_counts_epochs():
    assert epochs_from_ops(30, 3) == [30_000, 30_001, 30_002]


def test_scripted_dataset_reads_the_same_rows_as_python_at_the_same_seed_and_epoch():
    dataset = make_dataset()
    native = dataset.native
    native.set_epoch(7)
    iterator = native.iter()
    scripted = [batch["index"].tolist() for batch in iter(iterator.next, None)]
    dataset.set_epoch(7)
    assert scripted == [batch["index"].tolist() for batch in dataset]


def strategies():
    weights = torch.arange(50, dtype=torch.float64) % 3 + 0.5
    return [
        ts.Streaming(),
        ts.Streaming(shuffle=True, indices=[1, 5, 9, 30]),
        ts.BlockShuffling(6),
        ts.BlockWeightedSampling(weights, total_size=70, block_size=2, replacement=True),
        ts.BlockWeightedSampling(weights, block_size=3, replacement=False),
        ts.ClassBalancedSampling(torch.arange(50) % 4, total_size=60, block_size=2, indices=range(10, 50)),
    ]


@pytest.mark.parametrize("strategy", strategies(), ids=repr)
def test_every_strategy_pickles(strategy):
    loaded = save_and_load(strategy.native)
    assert loaded.describe() == strategy.native.describe()
    assert torch.equal(loaded.plan(50, 3, 2), strategy.plan(50, seed=3, epoch=2))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    import scipy.sparse as sp

    root = tmp_path_factory.mktemp("script")
    data = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
    with h5py.File(root / "x.h5", "w") as f:
        f.create_dataset("x", data=data, chunks=(8, 3), compression="gzip")
        f.create_dataset("y", data=np.arange(40))
    zarr.create_array(root / "x.zarr", shape=data.shape, chunks=(16, 3), dtype=data.dtype)[:] = data
    x = sp.random(40, 6, density=0.4, format="csr", dtype=np.float32, random_state=0)
    obs = {"n": np.arange(40), "kind": pd.Categorical(np.array(["b", "a"])[np.arange(40) % 2], categories=["b", "a"])}
    adata = ad.AnnData(x, obs=obs)
    adata.layers["counts"] = sp.random(40, 6, density=0.3, format="csr", dtype=np.float64, random_state=1)
    adata.obsm["X_pca"] = np.arange(40 * 4, dtype=np.float32).reshape(40, 4)
    adata.write_h5ad(root / "cells.h5ad")
    return root


def sources(files):
    return {
        "tensor": lambda: ts.TensorSource({"X": torch.randn(40, 3, generator=torch.Generator().manual_seed(0))}),
        "hdf5": lambda: ts.HDF5Source(files / "x.h5", {"X": "/x", "y": "/y"}),
        "zarr": lambda: ts.ZarrSource(files / "x.zarr"),
        "anndata": lambda: ts.AnnDataSource(files / "cells.h5ad", obs=["n"]),
        "anndata-dense": lambda: ts.AnnDataSource(files / "cells.h5ad", dense=True),
        "anndata-fields": lambda: ts.AnnDataSource(files / "cells.h5ad", fields=FIELDS, obs=["n"]),
        "collection-fields": lambda: ts.Collection([ts.AnnDataSource(files / "cells.h5ad", fields=FIELDS)] * 2),
        "collection": lambda: ts.Collection([ts.HDF5Source(files / "x.h5", "/x"), ts.ZarrSource(files / "x.zarr")]),
    }


FIELDS = {"counts": "layers/counts", "pca": "obsm/X_pca"}
SOURCE_KINDS = [
    "tensor",
    "hdf5",
    "zarr",
    "anndata",
    "anndata-dense",
    "anndata-fields",
    "collection-fields",
    "collection",
]


@pytest.mark.parametrize("kind", SOURCE_KINDS)
def test_every_source_pickles_and_reads_the_same_rows(files, kind):
    source = sources(files)[kind]()
    loaded = save_and_load(source.native)
    assert loaded.describe() == source.native.describe()
    rows = torch.tensor([5, 0, 39, 5])
    expected, got = source.read(rows), dict(loaded.read(rows, 1))
    assert expected.keys() == got.keys()
    for key, value in expected.items():
        if value.layout == torch.sparse_csr:
            value, got[key] = value.to_dense(), got[key].to_dense()
        assert torch.equal(value, got[key]), key


@pytest.mark.parametrize("kind", ["hdf5", "zarr", "anndata", "collection"])
def test_a_module_saved_with_relative_paths_loads_from_another_directory(files, kind, tmp_path, monkeypatch):
    # Paths are stored absolute when a source is made: a saved module opened its files relative to the
    # directory it was loaded in.
    monkeypatch.chdir(files)
    relative = {
        "hdf5": lambda: ts.HDF5Source("x.h5", "/x"),
        "zarr": lambda: ts.ZarrSource("./x.zarr"),
        "anndata": lambda: ts.AnnDataSource("cells.h5ad", obs=["n"]),
        "collection": lambda: ts.open(["cells.h5ad", "../" + files.name + "/cells.h5ad"]),
    }[kind]()
    dataset = ts.ShardedDataset(relative, ts.BlockShuffling(4), batch_size=8, seed=3)
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(Holder(dataset.native)), buffer)
    monkeypatch.chdir(tmp_path)
    buffer.seek(0)
    loaded = torch.jit.load(buffer).value
    assert str(files) in loaded.describe() and loaded.describe() == dataset.native.describe()
    batches = loaded.iter()
    expected = iter(dataset)
    while (batch := batches.next()) is not None:
        assert torch.equal(batch["index"], next(expected)["index"])


def test_anndata_source_states_keep_fields_and_stay_as_they_were_without_them(files):
    path = str(files / "cells.h5ad")
    with_fields = json.loads(ts.AnnDataSource(path, fields=FIELDS, obs=["n"]).native.__getstate__()[0][1])
    assert with_fields["fields"] == [["counts", "layers/counts"], ["pca", "obsm/X_pca"]]
    # A state without fields is the state every release before fields= wrote, and loads as one.
    without = ts.AnnDataSource(path, obs=["n"], layer="counts").native
    assert json.loads(without.__getstate__()[0][1]) == {"path": path, "obs": ["n"], "layer": "counts", "dense": False}
    assert save_and_load(without).field_names() == ["X", "n"]


def test_the_op_and_a_scripted_function_read_fields(files):
    path = str(files / "cells.h5ad")
    expected = ts.AnnDataSource(path, fields=FIELDS, obs=["n"], dense=True).read([3, 0, 3])

    @torch.jit.script
    def read(path: str, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        fields = {"counts": "layers/counts", "pca": "obsm/X_pca"}
        source = torch.ops.torch_shards.anndata_source(path, ["n"], None, True, fields)
        return source.read(rows, 2)

    got = read(path, torch.tensor([3, 0, 3]))
    assert list(got) == ["X", "counts", "pca", "n"] == list(expected)
    for name, value in expected.items():
        assert torch.equal(got[name], value), name
    # The AnnData class makes them too, and refuses what the Python door refuses.
    anndata = torch.ops.torch_shards.anndata(path)
    assert anndata.source(["n"], None, False, {"expression": "X"}).field_names() == ["expression", "n"]
    with pytest.raises(ValueError, match=r"cells.h5ad:/obsm/X_umap: no such element \(obsm: X_pca\)"):
        torch.ops.torch_shards.anndata_source(path, None, None, False, {"umap": "obsm/X_umap"})


def test_anndata_object_pickles(files):
    source = ts.AnnDataSource(files / "cells.h5ad")
    loaded = save_and_load(source.anndata)
    assert loaded.n_obs() == 40 and loaded.var_names() == source.var_names


def test_a_loaded_collection_names_what_its_codes_mean(files):
    parts = [ts.AnnDataSource(files / "cells.h5ad", obs=["kind", "n"]) for _ in range(2)]
    loaded = save_and_load(ts.Collection(parts).native)
    assert json.loads(loaded.categories_json("kind")) == ["b", "a"]
    assert dict(loaded.read(torch.tensor([0, 41]), 1))["kind"].tolist() == [0, 1]
    with pytest.raises(ValueError, match="obs column 'n' is not categorical"):
        loaded.categories_json("n")
    with pytest.raises(ValueError, match=r"is not a Collection \(an AnnDataSource's categories are its AnnData's\)"):
        parts[0].native.categories_json("kind")


def test_a_loaded_collection_names_the_union_of_its_parts_categories(tmp_path):
    """Per-file categoricals of different categories: the loaded collection's codes index their union."""
    parts = []
    for name, values in (("a", ["x", "z", "x"]), ("b", ["y", "z"])):  # categories x, z and y, z
        obs = pd.DataFrame({"kind": values}, index=[f"{name}{i}" for i in range(len(values))])
        ad.AnnData(np.ones((len(values), 2), np.float32), obs=obs).write_h5ad(tmp_path / f"{name}.h5ad")
        parts.append(ts.AnnDataSource(tmp_path / f"{name}.h5ad", obs=["kind"]))
    loaded = save_and_load(ts.Collection(parts).native)
    assert json.loads(loaded.categories_json("kind")) == ["x", "z", "y"]
    assert dict(loaded.read(torch.tensor([4, 0, 3, 1]), 1))["kind"].tolist() == [1, 0, 2, 1]


def test_dataset_pickles_with_its_arguments_and_epoch(files):
    dataset = ts.ShardedDataset(
        ts.HDF5Source(files / "x.h5", "/x"), ts.BlockShuffling(3), batch_size=5, fetch_factor=3, even_batches="drop",
        drop_last=True, seed=99, rank=1, world_size=2, prefetch=1,
    )  # fmt: skip
    dataset.set_epoch(4)
    loaded = save_and_load(dataset.native)
    assert loaded.fingerprint() == dataset.native.fingerprint()
    assert (loaded.rank(), loaded.world_size(), loaded.next_epoch()) == (1, 2, 4)
    assert [b["index"].tolist() for b in iter(loaded.iter().next, None)] == [b["index"].tolist() for b in dataset]


def test_a_loaded_checkpoint_not_yet_resumed_travels_with_the_pickled_dataset():
    def make():
        return ts.ShardedDataset(torch.arange(40), ts.BlockShuffling(4), batch_size=5, fetch_factor=2, seed=7)

    whole = [b["index"].tolist() for b in make()]
    consumed = make()
    iterator = iter(consumed)
    taken = [next(iterator)["index"].tolist() for _ in range(3)]
    state = consumed.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    loaded = save_and_load(resumed.native)
    assert loaded.num_batches() == len(resumed) == 5
    rest = [b["index"].tolist() for b in iter(loaded.iter().next, None)]
    assert taken + rest == whole  # the rest of the epoch, not the epoch again
    # Then epochs go on as in the Python dataset it was saved from.
    assert rest == [b["index"].tolist() for b in resumed]
    assert [b["index"].tolist() for b in iter(loaded.iter().next, None)] == [b["index"].tolist() for b in resumed]


def test_sampler_pickles():
    sampler = ts.DistributedSampler(range(30), num_replicas=3, rank=2, seed=4, strategy=ts.BlockShuffling(2))
    sampler.set_epoch(3)
    loaded = save_and_load(sampler.native)
    assert loaded.fingerprint() == sampler.native.fingerprint()
    iterator = loaded.iter()
    assert iterator.epoch() == 3 and iterator.next(100).tolist() == list(sampler)


def test_loading_a_module_whose_file_is_gone_names_the_file(tmp_path):
    path = tmp_path / "gone.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=np.zeros((10, 2), np.float32))
    dataset = ts.ShardedDataset(ts.HDF5Source(path, "/x"), ts.Streaming(), batch_size=4, seed=0)
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(Holder(dataset.native)), buffer)
    path.unlink()
    buffer.seek(0)
    with pytest.raises(Exception, match=str(path)):
        torch.jit.load(buffer)


def test_iterator_protocol_errors_are_clear():
    iterator = make_dataset().native.iter()
    with pytest.raises(RuntimeError, match=r"push_unit\(\) without next_unit\(\)"):
        iterator.push_unit({"X": torch.zeros(1)})
    unit = iterator.next_unit()
    with pytest.raises(RuntimeError, match=r"push_unit\(\) must follow next_unit\(\) before next\(\)"):
        iterator.next()
    with pytest.raises(ValueError, match="fetch_transform must keep the rows it is given"):
        iterator.push_unit({"X": unit["X"][:2]})


ANNBATCH_COLLECTION = Path(__file__).parent / "data" / "anndata" / "annbatch-0.3.1" / "collection.zarr"


def op_arguments(files):
    source = ts.TensorSource(torch.zeros(3, 1)).native
    return {
        "streaming": (True, torch.tensor([0, 2])),
        "block_shuffling": (4, None),
        "block_weighted_sampling": (torch.ones(6), 9, 2, None, True),
        "class_balanced_sampling": (torch.tensor([0, 1, 1, 0]), None, 1, None),
        "custom_strategy": (torch.tensor([2, 0, 1]), None, True, "a plan"),
        "rows_source": (7, "rows of a collection"),
        "tensor_source": ({"X": torch.zeros(4, 2)},),
        "hdf5_source": (str(files / "x.h5"), {"X": "/x"}),
        "zarr_source": (str(files / "x.zarr"), {"X": "/"}),
        "anndata": (str(files / "cells.h5ad"),),
        "anndata_source": (str(files / "cells.h5ad"), ["n"], None, True, {"pca": "obsm/X_pca"}),
        "collection": ([source, ts.TensorSource(torch.ones(2, 1)).native],),
        "probe": (str(files / "x.h5"),),
        "set_storage_options": ("s3://bucket/prefix", json.dumps({"max_requests": 8, "cache_bytes": 1 << 30})),
        "annbatch_datasets": (str(ANNBATCH_COLLECTION),),
        "open_plan": (str(files / "x.h5"), True, False),
        "sharded_dataset": (source, ts.Streaming().native, 2),
        "distributed_sampler": (10, 2, 1),
        "merge_state_dicts": ([dict(make_dataset().native.state_dict(None))],),
        "build_info": (),
    }


REGISTERED_OPS = sorted(
    {
        schema.name.split("::")[1]
        for schema in torch._C._jit_get_all_schemas()
        if schema.name.startswith("torch_shards::")
    }
)


def test_every_registered_op_has_opcheck_arguments(files):
    assert set(op_arguments(files)) == set(REGISTERED_OPS)


@pytest.mark.parametrize("name", REGISTERED_OPS)
def test_registered_ops_pass_opcheck(files, name):
    # The ops are factories of script objects: schema (no undeclared mutation
    # or aliasing), autograd registration and fake tensors apply; torch.compile
    # tracing (aot_dispatch) does not, as none of them is a traceable kernel.
    # sharded_dataset takes script objects as direct arguments, which torch's
    # schema check cannot (it calls len() on them), and allocates the
    # dataset's shared state, which fake tensors cannot: autograd only.
    checks = ("test_schema", "test_autograd_registration", "test_faketensor")
    if name == "sharded_dataset":
        checks = ("test_autograd_registration",)
    results = torch.library.opcheck(
        getattr(torch.ops.torch_shards, name).default, op_arguments(files)[name], test_utils=checks
    )
    assert set(results.values()) == {"SUCCESS"}


def test_a_python_source_made_from_a_relative_path_reopens_the_same_file_anywhere(files, tmp_path, monkeypatch):
    # What a spawned DataLoader worker does: unpickle the Python source and build it again.
    import pickle

    monkeypatch.chdir(files)
    source = ts.AnnDataSource("cells.h5ad", obs=["n"])
    assert source.path == str(files / "cells.h5ad")
    pickled = pickle.dumps(source)
    monkeypatch.chdir(tmp_path)
    assert pickle.loads(pickled).read([7])["n"].tolist() == [7]
