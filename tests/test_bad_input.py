"""Every invalid argument raises an exception naming the parameter and the
value; nothing crashes or hangs."""

import math
import os

import numpy as np
import pytest
import torch
from conftest import rows_source

import torch_shards as ts

SOURCE = rows_source(20)


def dataset(**kwargs):
    arguments = dict(batch_size=4, seed=0)
    arguments.update(kwargs)
    strategy = arguments.pop("strategy", ts.Streaming())
    source = arguments.pop("source", SOURCE)
    return ts.ShardedDataset(source, strategy, **arguments)


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        (dict(batch_size=0), ValueError, "batch_size must be >= 1, got 0"),
        (dict(batch_size=-3), ValueError, "batch_size must be >= 1, got -3"),
        (dict(batch_size=2.5), TypeError, "batch_size must be an int, got 2.5"),
        (dict(batch_size=True), TypeError, "batch_size must be an int, got True"),
        (dict(fetch_factor=0), ValueError, "fetch_factor must be >= 1, got 0"),
        (dict(batch_size=2**20, fetch_factor=2**12), ValueError, r"batch_size \* fetch_factor must be < 2\*\*31"),
        (dict(rank=2, world_size=2), ValueError, r"rank must be in \[0, world_size=2\), got 2"),
        (dict(rank=-1, world_size=2), ValueError, r"rank must be in \[0, world_size=2\), got -1"),
        (dict(world_size=0, rank=0), ValueError, r"world_size must be in \[1, 2\*\*20\], got 0"),
        (dict(even_batches="equal"), ValueError, "even_batches must be 'pad', 'drop' or None, got 'equal'"),
        (dict(even_batches=True), ValueError, "even_batches must be 'pad', 'drop' or None, got True"),
        (dict(drop_last="yes"), TypeError, "drop_last must be a bool"),
        (dict(seed=2**64), ValueError, "seed must fit in 64 bits"),
        (dict(seed="1"), TypeError, "seed must be an int"),
        (dict(fetch_transform=3), TypeError, "fetch_transform must be callable"),
        (dict(source=3), TypeError, "source must be a torch_shards source"),
        (dict(strategy="shuffle"), TypeError, "strategy must be a torch_shards strategy"),
    ],
)
def test_dataset_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        dataset(**kwargs)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: ts.BlockShuffling(0), "BlockShuffling: block_size must be >= 1, got 0"),
        (lambda: ts.BlockShuffling(-2), "BlockShuffling: block_size must be >= 1, got -2"),
        (lambda: ts.Streaming(indices=[3, 1, 3]), "Streaming: indices must be unique, got row 3 more than once"),
        (lambda: ts.Streaming(indices=[0, -1]), r"Streaming: indices must be >= 0, got indices\[1\] = -1"),
        (lambda: ts.Streaming(indices=[]), "Streaming: indices must not be empty"),
        (lambda: ts.Streaming(indices=[[1, 2]]), r"Streaming: indices must be 1-D, got shape \(1, 2\)"),
        (lambda: ts.Streaming(indices=[0.5, 1.0]), "Streaming: indices must contain integers, got dtype float64"),
        (lambda: ts.BlockWeightedSampling([1.0, -0.5]), r"weights must be finite and >= 0, got weights\[1\] = -0.5"),
        (lambda: ts.BlockWeightedSampling([1.0, math.nan]), r"weights must be finite and >= 0, got weights\[1\] = nan"),
        (lambda: ts.BlockWeightedSampling([math.inf]), r"weights must be finite and >= 0, got weights\[0\] = inf"),
        (lambda: ts.BlockWeightedSampling([0.0, 0.0]), "BlockWeightedSampling: weights must not all be zero"),
        (lambda: ts.BlockWeightedSampling([]), "BlockWeightedSampling: weights must not be empty"),
        (lambda: ts.BlockWeightedSampling(["a"]), "weights must contain numbers"),
        (lambda: ts.BlockWeightedSampling([1.0], total_size=0), "total_size must be >= 1, got 0"),
        (lambda: ts.BlockWeightedSampling([1.0], block_size=0), "block_size must be >= 1, got 0"),
        (lambda: ts.ClassBalancedSampling([]), "ClassBalancedSampling: labels must not be empty"),
        (lambda: ts.ClassBalancedSampling([1, 2], total_size=-1), "ClassBalancedSampling: total_size must be >= 1"),
        (lambda: ts.ClassBalancedSampling([1.0, math.nan]), "labels must not contain NaN"),
        (
            lambda: ts.ClassBalancedSampling([0, 1, -2]),
            "labels must be class codes >= 0, or -1 for a missing label; got -2 at position 2",
        ),
    ],
)
def test_strategy_arguments(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    "strategy,message",
    [
        (
            ts.Streaming(indices=[0, 25]),
            r"Streaming: indices must be < the number of rows \(20\), got indices\[1\] = 25",
        ),
        (ts.BlockWeightedSampling([1.0] * 7), r"weights must have one entry per row \(20\), got 7"),
        (
            ts.BlockWeightedSampling([1.0] * 7, indices=[1, 2]),
            r"one entry per row \(20\) or one per entry of indices \(2\), got 7",
        ),
        (
            ts.BlockWeightedSampling([1.0] + [0.0] * 19, total_size=5, replacement=False),
            r"total_size \(5\) must not exceed the number of rows with positive weight \(1\)",
        ),
        (
            ts.BlockWeightedSampling([0.0] * 19 + [1.0], indices=[0, 1]),
            "the weights of the sampled rows must not all be zero",
        ),
        (
            ts.ClassBalancedSampling([1, 2, 3]),
            r"ClassBalancedSampling: labels must have one entry per row \(20\), got 3",
        ),
    ],
)
def test_strategy_against_source(strategy, message):
    with pytest.raises(ValueError, match=message):
        dataset(strategy=strategy)


@pytest.mark.parametrize(
    "make,error,message",
    [
        (
            lambda: ts.ShardedDataset(ts.TensorSource(torch.zeros(0, 3)), ts.Streaming(), batch_size=2),
            ValueError,
            r"ShardedDataset: the source has no rows \(TensorSource\(rows=0, X=Float\[0, 3\]\)\)",
        ),
        (lambda: ts.TensorSource({}), ValueError, "needs at least one tensor"),
        (lambda: ts.TensorSource(torch.tensor(1.0)), ValueError, "must have at least one dimension"),
        (
            lambda: ts.TensorSource({"a": torch.zeros(3), "b": torch.zeros(4)}),
            ValueError,
            "field 'b' has 4 but the first field has 3",
        ),
        (lambda: ts.TensorSource({"index": torch.zeros(3)}), ValueError, "'index' is reserved"),
        (lambda: ts.TensorSource({"a": [1, 2]}), TypeError, "field 'a' must be a tensor"),
        (lambda: ts.TensorSource(torch.zeros(3, 3).to_sparse()), ValueError, "must be a dense"),
        (lambda: ts.TensorSource("x"), TypeError, "expected a tensor, a numpy array or a dict of them"),
        (
            lambda: ts.TensorSource({"q": torch.quantize_per_tensor(torch.rand(4, 2), 0.1, 0, torch.quint8)}),
            ValueError,
            "field 'q' is a quantized tensor",
        ),
        (
            lambda: ts.TensorSource({"n": torch.nested.nested_tensor([torch.rand(2, 3), torch.rand(3, 3)])}),
            ValueError,
            "field 'n' is a nested tensor",
        ),
        (
            lambda: ts.TensorSource({"b": np.arange(4, dtype=">f4")}),
            ValueError,
            "field 'b' is a numpy array of non-native byte order",
        ),
        (
            lambda: ts.TensorSource({"r": np.arange(8.0).reshape(4, 2)[::-1]}),
            ValueError,
            r"field 'r' is a numpy array with negative strides \(-16, 8\)",
        ),
    ],
)
@pytest.mark.filterwarnings("ignore::UserWarning")  # quantized and nested tensors' deprecation and prototype notes
def test_source_arguments(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_numpy_bools_are_bools_and_ints_are_not():
    x = torch.arange(8.0)
    dataset = ts.ShardedDataset(x, ts.Streaming(shuffle=np.bool_(True)), batch_size=3, drop_last=np.True_, seed=0)
    assert dataset.drop_last is True and len(dataset) == 2
    assert ts.BlockWeightedSampling(np.ones(8), replacement=np.False_).replacement is False
    with pytest.raises(TypeError, match="ShardedDataset: cycle must be a bool, got 1"):
        ts.ShardedDataset(x, ts.Streaming(), batch_size=3, cycle=1)
    with pytest.raises(TypeError, match="Streaming: shuffle must be a bool, got 0"):
        ts.Streaming(shuffle=0)


def test_world_size_without_rank_is_refused(monkeypatch):
    # No rank from arguments, a process group or RANK: every process would read rank 0's rows.
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="ShardedDataset: world_size=2 but no rank: pass rank="):
        dataset(world_size=2)
    with pytest.raises(ValueError, match="DistributedSampler: num_replicas=3 but no rank: pass rank="):
        ts.DistributedSampler(range(10), num_replicas=3)
    assert len(dataset(world_size=1)) == len(dataset())  # one rank: rank 0 is the only one
    monkeypatch.setenv("RANK", "1")  # torchrun's RANK with an explicit world size
    assert dataset(world_size=2).rank == 1
    assert ts.DistributedSampler(range(10), num_replicas=2).rank == 1


def test_bad_environment_rank_is_named(monkeypatch):
    monkeypatch.setenv("RANK", "zero")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="environment variable RANK must be an integer, got 'zero'"):
        dataset()
    monkeypatch.setenv("RANK", "5")
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\), got 5"):
        dataset()


def test_source_read_rejects_out_of_range_rows():
    with pytest.raises(ValueError, match=r"row 20 out of range \[0, 20\)"):
        SOURCE.read([3, 20])


# ---- the API audit's table: every case raises TypeError / ValueError / FileNotFoundError naming the
# parameter or file (no other type, no crash, no silent acceptance) ---------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    import h5py

    root = tmp_path_factory.mktemp("audit")
    with h5py.File(root / "x.h5", "w") as f:
        f["x"] = np.arange(40, dtype=np.float32).reshape(10, 4)
    bad = root / "not_utf8.zarr"
    bad.mkdir()
    (bad / ".zarray").write_bytes(b'{"zarr_format": 2, "shape": [4], "chunks": [2], "dtype": "<f4\xff\xfe"}')
    return root


def _sampler(**kwargs):
    return ts.DistributedSampler(range(10), **{"num_replicas": 1, "rank": 0, **kwargs})


AUDIT = [
    # source.read
    (
        "read float rows",
        lambda f: ts.HDF5Source(f / "x.h5", "/x").read([1.5, 2.0]),
        ValueError,
        "rows must contain integers",
    ),
    (
        "read bool rows",
        lambda f: ts.HDF5Source(f / "x.h5", "/x").read([True, False]),
        ValueError,
        "rows must contain integers, got dtype bool",
    ),
    ("read bool tensor", lambda f: SOURCE.read(torch.tensor([True, False])), ValueError, "rows must contain integers"),
    ("read 2-D rows", lambda f: SOURCE.read([[1, 2], [3, 4]]), ValueError, r"rows must be 1-D, got shape \(2, 2\)"),
    (
        "read num_threads -1",
        lambda f: SOURCE.read([1], num_threads=-1),
        ValueError,
        r"num_threads must be in \[1, 256\], got -1",
    ),
    ("read num_threads huge", lambda f: SOURCE.read([1], num_threads=10**6), ValueError, "num_threads must be in"),
    (
        "read num_threads 2**64",
        lambda f: SOURCE.read([1], num_threads=2**64),
        ValueError,
        "num_threads must be < 2\\*\\*63",
    ),
    (
        "read rows 2**63",
        lambda f: SOURCE.read(np.array([2**63], dtype=np.uint64)),
        ValueError,
        "rows must be < 2\\*\\*63",
    ),
    # paths with a NUL character would be cut there by the C libraries
    ("NUL in HDF5 path", lambda f: ts.HDF5Source(f"{f}/x.h5\x00zz", "/x"), ValueError, "path contains a NUL character"),
    ("NUL in HDF5 dataset", lambda f: ts.HDF5Source(f / "x.h5", "/x\x00zz"), ValueError, "dataset 'X' contains a NUL"),
    ("NUL in zarr path", lambda f: ts.ZarrSource(f"{f}/a.zarr\x00z"), ValueError, "path contains a NUL character"),
    ("no hdf5 dataset", lambda f: ts.HDF5Source(f / "x.h5", {}), ValueError, "HDF5Source: needs at least one dataset"),
    ("no zarr array", lambda f: ts.ZarrSource(f / "a.zarr", {}), ValueError, "ZarrSource: needs at least one array"),
    ("class balance, neither", lambda f: ts.ClassBalancedSampling(), ValueError, "one of them, got neither"),
    (
        "NUL in AnnData path",
        lambda f: ts.AnnDataSource(f"{f}/a.h5ad\x00z"),
        ValueError,
        "path contains a NUL character",
    ),
    ("NUL in open", lambda f: ts.open(f"{f}/x.h5\x00zz"), ValueError, "path contains a NUL character"),
    (
        "NUL via the native door",
        lambda f: torch.ops.torch_shards.hdf5_source(f"{f}/x.h5\x00z", {"X": "/x"}),
        ValueError,
        "contains a NUL character",
    ),
    # strategies
    (
        "complex weights",
        lambda f: ts.BlockWeightedSampling(np.array([1 + 1j, 2])),
        TypeError,
        "weights must be real numbers",
    ),
    ("mixed labels", lambda f: ts.ClassBalancedSampling([1, "a", 2.5]), TypeError, "labels must all be of one kind"),
    ("block_size 2**63", lambda f: ts.BlockShuffling(2**63), ValueError, "block_size must be < 2\\*\\*63"),
    (
        "total_size 2**64",
        lambda f: ts.BlockWeightedSampling([1.0], total_size=2**64),
        ValueError,
        "total_size must be < 2\\*\\*63",
    ),
    # datasets
    ("set_epoch 2**63", lambda f: dataset().set_epoch(2**63), ValueError, "epoch must be < 2\\*\\*63"),
    ("batch_size 2**63", lambda f: dataset(batch_size=2**63), ValueError, "batch_size must be < 2\\*\\*63"),
    (
        "process_group str",
        lambda f: dataset(process_group="x"),
        TypeError,
        "process_group must be a torch.distributed ProcessGroup",
    ),
    ("process_group int", lambda f: dataset(process_group=3), TypeError, "process_group must be"),
    (
        "prefetch huge",
        lambda f: dataset(prefetch=10**9),
        ValueError,
        r"prefetch must be in \[0, 1024\], got 1000000000",
    ),
    (
        "num_threads huge",
        lambda f: dataset(num_threads=5000),
        ValueError,
        r"num_threads must be in \[1, 256\], got 5000",
    ),
    ("prefetch_bytes 2**70", lambda f: dataset(prefetch_bytes=2**70), ValueError, "prefetch_bytes must be < 2\\*\\*63"),
    (
        "fetch_transform drops rows",
        lambda f: list(dataset(fetch_transform=lambda u: {k: v[:1] for k, v in u.items()})),
        ValueError,
        "fetch_transform must keep the rows",
    ),
    (
        "fetch_transform adds rows",
        lambda f: list(dataset(fetch_transform=lambda u: {k: torch.cat([v, v]) for k, v in u.items()})),
        ValueError,
        "fetch_transform must keep the rows",
    ),
    (
        "fetch_transform not a dict",
        lambda f: list(dataset(fetch_transform=lambda u: 3)),
        TypeError,
        "fetch_transform must return a dict of tensors",
    ),
    (
        "fetch_transform returns sparse COO",
        lambda f: list(
            dataset(fetch_transform=lambda u: {k: v if k == "index" else v.to_sparse() for k, v in u.items()})
        ),
        ValueError,
        r"fetch_transform's result: field '\w+' must be a dense \(strided\) or sparse CSR tensor, got layout Sparse",
    ),
    ("meta tensor", lambda f: ts.TensorSource(torch.empty(10, device="meta")), ValueError, "meta device"),
    (
        "plan epoch float",
        lambda f: ts.BlockShuffling(4).plan(20, epoch=1.5),
        TypeError,
        "epoch must be an int, got 1.5",
    ),
    ("plan epoch negative", lambda f: ts.Streaming().plan(20, epoch=-1), ValueError, "epoch must be >= 0, got -1"),
    # samplers
    ("sampler seed 2**70", lambda f: _sampler(seed=2**70), ValueError, "seed must fit in 64 bits"),
    ("sampler set_epoch 2**63", lambda f: _sampler().set_epoch(2**63), ValueError, "epoch must be < 2\\*\\*63"),
    (
        "sampler process_group",
        lambda f: ts.DistributedSampler(range(10), process_group="x"),
        TypeError,
        "process_group must be",
    ),
    # files
    (
        "metadata not UTF-8",
        lambda f: ts.ZarrSource(f / "not_utf8.zarr"),
        ValueError,  # unparseable metadata, as zarr-python's json.JSONDecodeError; a message Python can hold
        r"not_utf8\.zarr.*\\xff",
    ),
    ("missing file", lambda f: ts.HDF5Source(f / "nope.h5", "/x"), FileNotFoundError, "nope.h5"),
]


@pytest.mark.parametrize("make,error,message", [case[1:] for case in AUDIT], ids=[case[0] for case in AUDIT])
def test_audit_table(files, make, error, message):
    with pytest.raises(error, match=message):
        make(files)


def test_missing_labels_are_never_drawn():
    labels = [0, 1, -1, 1, -1, 0]  # -1: a missing category, as pandas and anndata code it
    draws = ts.ClassBalancedSampling(labels, total_size=600).plan(6, seed=3).tolist()
    assert not {2, 4} & set(draws) and {0, 1, 3, 5} == set(draws)


def test_sizes_that_would_overflow_or_exhaust_memory_are_refused():
    with pytest.raises(
        ValueError, match=r"ShardedDataset: world_size must be in \[1, 2\*\*20\], got 2305843009213693952"
    ):
        dataset(rank=0, world_size=2**61)
    with pytest.raises(
        ValueError, match=r"DistributedSampler: num_replicas must be in \[1, 2\*\*20\], got 9223372036854775807"
    ):
        ts.DistributedSampler(list(range(5)), num_replicas=2**63 - 1, rank=5)
    weighted = ts.BlockWeightedSampling([1.0] * 20, total_size=2**63 - 1)
    with pytest.raises(ValueError, match=r"DistributedSampler: the strategy's plan has 9223372036854775807 entries"):
        ts.DistributedSampler(list(range(20)), num_replicas=3, rank=2, strategy=weighted)
    for target in (dataset(), ts.DistributedSampler(list(range(20)), num_replicas=1, rank=0)):
        with pytest.raises(ValueError, match=r"epoch must be in \[0, 2\*\*62\], got 9223372036854775807"):
            target.set_epoch(2**63 - 1)
    state = dataset().state_dict()
    state["segments"] = [[2**40, 1, 0]]
    with pytest.raises(ValueError, match=r"world_size must be in \[1, 2\*\*20\], got 1099511627776"):
        dataset().load_state_dict(state)
    state["segments"] = [[2, 1000, 0]]
    with pytest.raises(ValueError, match=r"world_size in \[1, 2\*\*20\] and num_workers in \[1, 256\], got 2 and 1000"):
        dataset().load_state_dict(state)


def test_labels_that_would_wrap_to_missing_are_refused():
    labels = np.array([0, 2**64 - 1] * 10, dtype=np.uint64)  # as int64, -1: "missing", never drawn
    with pytest.raises(ValueError, match=r"ClassBalancedSampling: labels must be < 2\*\*63, got 18446744073709551615"):
        ts.ClassBalancedSampling(labels)


def test_field_names_with_a_nul_are_refused():
    with pytest.raises(ValueError, match=r"TensorSource: field name contains a NUL character: 'a\\x00x'"):
        ts.TensorSource({"a\0x": torch.zeros(8), "a\0y": torch.ones(8)})


@pytest.fixture
def non_utf8_files(tmp_path):
    """An HDF5 file, a zarr array and an .h5ad whose names on disk are not UTF-8 (Latin-1 bytes)."""
    import anndata as ad
    import h5py
    import zarr

    directory = os.fsencode(tmp_path)
    names = {kind: directory + b"/caf\xe9." + kind.encode() for kind in ("h5", "zarr", "h5ad")}
    with h5py.File(names["h5"], "w") as f:
        f["x"] = np.arange(12, dtype=np.float32).reshape(4, 3)
    zarr.create_array(os.fsdecode(names["zarr"]), shape=(4, 3), chunks=(2, 3), dtype="f4")[...] = 1
    ad.AnnData(np.ones((4, 3), dtype=np.float32)).write_h5ad(os.fsdecode(names["h5ad"]))
    assert sorted(os.listdir(directory)) == sorted(os.path.basename(name) for name in names.values())
    return names


@pytest.mark.parametrize("form", ["bytes", "str"])
def test_paths_that_are_not_utf8_are_refused_naming_the_parameter_and_path(non_utf8_files, form):
    def path(kind):
        name = non_utf8_files[kind]
        return name if form == "bytes" else os.fsdecode(name)  # os.listdir's str: surrogate escapes

    cases = [
        ("HDF5Source", lambda: ts.HDF5Source(path("h5"), "x")),
        ("ZarrSource", lambda: ts.ZarrSource(path("zarr"))),
        ("AnnDataSource", lambda: ts.AnnDataSource(path("h5ad"))),
        ("torch_shards.open", lambda: ts.open(path("h5ad"))),
        ("torch_shards.open", lambda: ts.open([path("zarr")])),
    ]
    for who, make in cases:
        with pytest.raises(ValueError) as caught:
            make()
        message = str(caught.value)
        assert message.startswith(f"{who}: path is not valid UTF-8: ")
        assert repr(os.fsdecode(path("h5")).rsplit(".", 1)[0])[1:-1] in message  # the path, as repr shows it
        assert "symlink with a UTF-8 name" in message
    # The way around it: a symlink with a UTF-8 name.
    link = os.fsdecode(os.path.dirname(non_utf8_files["h5"])) + "/cafe.h5"
    os.symlink(non_utf8_files["h5"], link)
    assert ts.HDF5Source(link, "x").read([3])["X"].tolist() == [[9, 10, 11]]
    assert ts.HDF5Source(os.fsencode(link), "x").read([3])["X"].tolist() == [[9, 10, 11]]  # bytes that are UTF-8


def test_names_inside_files_that_are_not_utf8_are_refused_naming_the_parameter(non_utf8_files, tmp_path):
    h5 = tmp_path / "x.h5"
    import h5py

    with h5py.File(h5, "w") as f:
        f["x"] = np.zeros((4, 3), dtype=np.float32)
    latin = os.fsdecode(b"caf\xe9")
    cases = [
        (lambda: ts.HDF5Source(h5, latin), r"HDF5Source: dataset 'X' is not valid UTF-8: 'caf\\udce9'"),
        (lambda: ts.HDF5Source(h5, {latin: "x"}), r"HDF5Source: field name is not valid UTF-8: 'caf\\udce9'"),
        (lambda: ts.HDF5Source(h5, "x", field=latin), r"HDF5Source: field name is not valid UTF-8"),
        (lambda: ts.ZarrSource(tmp_path, {"X": latin}), r"ZarrSource: array 'X' is not valid UTF-8"),
        (lambda: ts.TensorSource({latin: torch.zeros(4)}), r"TensorSource: field name is not valid UTF-8"),
        (lambda: ts.open(h5, dataset=latin), r"HDF5Source: dataset 'X' is not valid UTF-8"),
    ]
    h5ad = non_utf8_files["h5ad"]
    link = tmp_path / "cafe.h5ad"
    os.symlink(h5ad, link)
    cases += [
        (lambda: ts.AnnDataSource(link, obs=[latin]), r"AnnDataSource: obs column is not valid UTF-8"),
        (lambda: ts.AnnDataSource(link, layer=latin), r"AnnDataSource: layer is not valid UTF-8"),
        (lambda: ts.AnnDataSource(link).categories(latin), r"AnnDataSource.categories: column is not valid UTF-8"),
        (
            lambda: ts.Collection([ts.AnnDataSource(link)]).categories(latin),
            r"Collection.categories: column is not valid UTF-8",
        ),
        (lambda: ts.AnnDataSource(link, fields={latin: "X"}), r"AnnDataSource: field name is not valid UTF-8"),
        (
            lambda: ts.AnnDataSource(link, fields={"pca": "obsm/" + latin}),
            r"AnnDataSource: element of field 'pca' is not valid UTF-8",
        ),
        (lambda: ts.ClassBalancedSampling(label_key=latin), r"ClassBalancedSampling: label_key is not valid UTF-8"),
    ]
    for make, message in cases:
        with pytest.raises(
            ValueError, match=message + r".*rename it in the file or store|" + message + ".*UTF-8 field"
        ):
            make()


@pytest.mark.parametrize(
    "transform,message",
    [
        (lambda unit: {name: value.flip(0) for name, value in unit.items()}, "in their order"),
        (lambda unit: {**unit, "index": torch.zeros_like(unit["index"])}, "differs from the unit's"),
    ],
    ids=["reversed", "index-zeroed"],
)
def test_a_fetch_transform_that_reorders_or_renames_rows_is_refused(transform, message):
    with pytest.raises(ValueError, match=f"fetch_transform must keep .*{message}"):
        list(dataset(fetch_transform=transform))
    kept = dataset(fetch_transform=lambda unit: {**unit, "X": unit["X"] * 2})  # values may change, rows may not
    assert sorted(i for batch in kept for i in batch["index"].tolist()) == list(range(20))
    # A transform that returns only its data (as scDataset's do) gets the rows' index put back.
    data_only = dataset(fetch_transform=lambda unit: {"X": unit["X"] * 2})
    assert all(torch.equal(batch["X"], 2 * SOURCE.read(batch["index"].tolist())["X"]) for batch in data_only)


def test_misused_entry_points_say_what_is_wrong():
    with pytest.raises(
        TypeError, match=r"ShardedDataset: a list cannot be indexed by an array of rows: pass np.asarray"
    ):
        next(iter(ts.ShardedDataset([0, 1, 2, 3], ts.Streaming(), batch_size=2, seed=0)))
    with pytest.raises(
        TypeError, match=r"DistributedSampler: seed must be an int \(the same on every replica\), got None"
    ):
        ts.DistributedSampler(list(range(4)), num_replicas=1, rank=0, seed=None)
    with pytest.raises(ValueError, match=r"load_state_dict: the state's 'segments' must be a list .* got 'none'"):
        dataset().load_state_dict({"epoch": 0})


@pytest.mark.parametrize("path", ["cells.h5ad", b"cells.h5ad", __import__("pathlib").Path("data/cells.h5ad")])
def test_a_path_where_a_source_is_expected_points_at_torch_shards_open(path):
    # A str has len() and indexing: it was read as a collection of its characters (len(ds) == 3 for
    # "cells.h5ad" at batch 4), and failed later in numpy.
    with pytest.raises(TypeError, match=r"source is a path .*did you mean torch_shards\.open\(path\)"):
        ts.ShardedDataset(path, ts.Streaming(), batch_size=4)
    with pytest.raises(TypeError, match=r"sources\[1\] is a path .*did you mean torch_shards\.open\(paths\)"):
        ts.Collection([SOURCE, path])
    with pytest.raises(TypeError, match=r"did you mean torch_shards\.open\(path\)"):
        ts.TensorSource(path)


@pytest.mark.parametrize(
    "fields,message",
    [
        ({"X": np.zeros((5, 2)), "y": [1, 2, 3, 4, 5]}, "'y' is a list"),
        ({"X": np.zeros((5, 2)), "y": 3}, "'y' is a int"),
        ({"X": [[1, 2], [3, 4]]}, "'X' is a list"),
    ],
)
def test_a_dict_source_of_other_values_than_arrays_is_refused_naming_the_key(fields, message):
    # A dict with a list in it was taken as a collection of len(dict) rows (its keys).
    with pytest.raises(TypeError, match=f"source is a dict of fields.*{message}"):
        ts.ShardedDataset(fields, ts.Streaming(), batch_size=2)


def test_a_dict_source_of_arrays_of_different_lengths_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="field 'y' has 4 but the first field has 5"):
        ts.ShardedDataset({"X": np.zeros((5, 2)), "y": torch.zeros(4)}, ts.Streaming(), batch_size=2)
