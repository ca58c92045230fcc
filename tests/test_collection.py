"""Collection (many files as one row space) and torch_shards.open."""

import random

import anndata as ad
import h5py
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
import zarr
from conftest import (
    PER_CELL_FIELDS_ACROSS_FILES,
    STRATEGIES,
    assert_field_rows,
    decoded,
    element_of,
    make_strategy,
    per_cell_anndata,
    random_anndata,
    read_anndata,
    write_anndata,
)
from torch.utils.data import DataLoader

import torch_shards as ts


def write_plate(path, rows, seed, fmt="h5ad", density=0.3):
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((rows, 9)).astype(np.float32)
    dense[rng.random(dense.shape) > density] = 0
    obs = pd.DataFrame(
        {"label": pd.Categorical(rng.choice(["a", "b"], size=rows), categories=["a", "b"])},
        index=[f"p{seed}c{i}" for i in range(rows)],
    )
    adata = ad.AnnData(sp.csr_matrix(dense), obs=obs, var=pd.DataFrame(index=[f"g{j}" for j in range(9)]))
    if fmt == "h5ad":
        adata.write_h5ad(path)
    else:
        adata.write_zarr(path)
    return dense, adata.obs["label"].cat.codes.to_numpy()


@pytest.fixture
def plates(tmp_path):
    sizes = [13, 40, 1, 27]
    paths, dense, codes = [], [], []
    for i, size in enumerate(sizes):
        path = tmp_path / f"plate{i}.{'h5ad' if i % 2 == 0 else 'zarr'}"
        d, c = write_plate(path, size, i, "h5ad" if i % 2 == 0 else "zarr")
        paths.append(path)
        dense.append(d)
        codes.append(c)
    return paths, np.concatenate(dense), np.concatenate(codes)


def test_global_rows_span_the_files(plates):
    paths, dense, codes = plates
    collection = ts.Collection([ts.AnnDataSource(p, obs=["label"]) for p in paths])
    assert len(collection) == 81 and collection.offsets == [0, 13, 53, 54]
    rows = [80, 0, 13, 53, 12, 54, 54, 30]
    batch = collection.read(rows)
    assert torch.equal(batch["X"].to_dense(), torch.from_numpy(dense[rows]))
    assert batch["label"].tolist() == codes[rows].tolist()
    dense_batch = ts.Collection([ts.AnnDataSource(p, dense=True) for p in paths]).read(rows)
    assert torch.equal(dense_batch["X"], torch.from_numpy(dense[rows]))


def test_a_collection_of_one_source_reads_as_that_source(plates):
    paths, dense, codes = plates
    path, rows_of_it = paths[1], 40  # plate 1: rows 13..52 of the plates
    for as_dense in (False, True):
        single = ts.Collection([ts.AnnDataSource(path, obs=["label"], dense=as_dense)])
        assert len(single) == rows_of_it and single.offsets == [0]
        rows = [39, 0, 7, 7, 38, 39, 1]
        batch = single.read(rows)
        x = batch["X"] if as_dense else batch["X"].to_dense()
        assert torch.equal(x, torch.from_numpy(dense[13:53][rows]))
        assert batch["label"].tolist() == codes[13:53][rows].tolist()
    dataset = ts.ShardedDataset(ts.open([path]), ts.BlockShuffling(4), batch_size=6, fetch_factor=2, seed=1)
    seen = []
    for batch in dataset:
        index = batch["index"].numpy()
        assert torch.equal(batch["X"].to_dense(), torch.from_numpy(dense[13:53][index]))
        seen.extend(index.tolist())
    assert sorted(seen) == list(range(rows_of_it))


def write_csr_part(path, rows, seed, index_dtype, columns=6):
    """A CSR AnnData of `rows` rows (many of them empty) with column indices stored as index_dtype."""
    rng = np.random.default_rng(seed)
    x = sp.random(rows, columns, density=0.2, format="csr", dtype=np.float32, random_state=rng)
    x.indices = x.indices.astype(index_dtype)
    adata = ad.AnnData(x)
    if str(path).endswith(".h5ad"):
        adata.write_h5ad(path)
    else:
        adata.write_zarr(path)
    return x.toarray()


@pytest.fixture(params=["mixed", "uint16"])
def csr_parts(tmp_path, request):
    """Parts whose indices are stored uint16, int32 and int64 (read as int32 columns), h5ad and zarr; or
    all uint16, as annbatch stores them: placed as stored, then widened in one pass."""
    layout = [(37, np.int32, "h5ad"), (50, np.int64, "zarr"), (3, np.uint16, "h5ad"), (64, np.int64, "h5ad")]
    if request.param == "uint16":
        layout = [(rows, np.uint16, fmt) for rows, _, fmt in layout]
    paths, dense = [], []
    for i, (rows, index_dtype, fmt) in enumerate(layout):
        paths.append(tmp_path / f"part{i}.{fmt}")
        dense.append(write_csr_part(paths[-1], rows, i, index_dtype))
    return paths, np.concatenate(dense)


def test_shuffled_rows_of_csr_parts_land_in_their_places(csr_parts):
    """The parts write their rows straight into the collection's CSR arrays (an inner collection whose
    rows come from one source too); one nested in another with rows from several of its sources has
    them staged and merged. Rows shuffled, repeated, empty, all in order."""
    paths, dense = csr_parts
    rng = np.random.default_rng(2)
    flat = ts.Collection([ts.AnnDataSource(p) for p in paths])

    def nested(densify=False):
        def source(i):
            return ts.AnnDataSource(paths[i], dense=densify)

        return ts.Collection([ts.Collection([source(0), source(1)]), ts.Collection([source(2)]), source(3)])

    everything = list(range(len(dense)))
    for rows in (
        rng.permutation(everything).tolist(),
        rng.permutation(everything + everything[30:90]).tolist(),
        everything,
        [150, 3, 36, 90, 0, 120],  # of the nested collection's first part, only its first source
    ):
        for collection in (flat, nested()):
            x = collection.read(rows, num_threads=2)["X"]
            assert x.col_indices().dtype == torch.int32
            lengths = (dense[rows] != 0).sum(axis=1)
            assert torch.equal(x.crow_indices().diff().long(), torch.from_numpy(lengths).long())
            assert torch.equal(x.to_dense(), torch.from_numpy(dense[rows]))
        # Dense rows land in their rows of the outputs, through each level's destinations.
        assert torch.equal(nested(densify=True).read(rows, num_threads=2)["X"], torch.from_numpy(dense[rows]))


def test_a_bad_column_index_in_a_part_names_its_file(csr_parts):
    paths, _ = csr_parts
    with h5py.File(paths[3], "r+") as f:
        indices = f["X/indices"][...]
        indices[indices.size // 2] = 99
        f["X/indices"][...] = indices
    collection = ts.Collection([ts.AnnDataSource(p) for p in paths])
    rows = np.random.default_rng(0).permutation(len(collection)).tolist()
    with pytest.raises(RuntimeError, match=r"part3\.h5ad.*X/indices: column index 99 out of range \[0, 6\)"):
        collection.read(rows)


def test_every_row_once_across_files_ranks_and_workers(plates):
    paths, dense, _ = plates
    seen = []
    for rank in range(2):
        collection = ts.open(paths)
        dataset = ts.ShardedDataset(
            collection,
            ts.BlockShuffling(4),
            batch_size=6,
            fetch_factor=2,
            seed=3,
            rank=rank,
            world_size=2,
            even_batches=None,
        )
        for batch in DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork"):
            index = batch["index"].numpy()
            assert torch.equal(batch["X"].to_dense(), torch.from_numpy(dense[index]))
            seen.extend(index.tolist())
    assert sorted(seen) == list(range(81))


@pytest.mark.parametrize("fmt", ["h5ad", "zarr"])
def test_an_empty_file_is_a_part_with_no_rows(tmp_path, fmt):
    # A sample left with no cells after filtering: anndata writes it (its categorical column has no
    # categories at all); a collection reads the other files' rows, and only a dataset over no row
    # at all is refused.
    first, first_codes = write_plate(tmp_path / f"a.{fmt}", 7, 0, fmt)
    empty = ad.AnnData(
        sp.csr_matrix((0, 9), dtype=np.float32),
        obs=pd.DataFrame({"label": pd.Categorical([])}, index=pd.Index([], dtype=object)),
    )
    getattr(empty, "write_h5ad" if fmt == "h5ad" else "write_zarr")(tmp_path / f"empty.{fmt}")
    last, last_codes = write_plate(tmp_path / f"b.{fmt}", 5, 1, fmt)
    paths = [tmp_path / f"a.{fmt}", tmp_path / f"empty.{fmt}", tmp_path / f"b.{fmt}"]
    assert len(ts.AnnDataSource(paths[1], obs=["label"])) == 0
    dense, codes = np.concatenate([first, last]), np.concatenate([first_codes, last_codes])
    collection = ts.Collection([ts.AnnDataSource(p, obs=["label"]) for p in paths])
    assert len(collection) == 12 and collection.offsets == [0, 7, 7]
    assert collection.categories("label") == ["a", "b"]
    seen = []
    for rank in range(2):
        dataset = ts.ShardedDataset(collection, ts.BlockShuffling(3), batch_size=4, seed=1, rank=rank, world_size=2)
        for batch in dataset:
            index = batch["index"].numpy()
            assert torch.equal(batch["X"].to_dense(), torch.from_numpy(dense[index]))
            assert batch["label"].tolist() == codes[index].tolist()
            seen.extend(index.tolist())
    assert sorted(set(seen)) == list(range(12))
    with pytest.raises(ValueError, match=r"ShardedDataset: the source has no rows \(AnnDataSource\(.*empty"):
        ts.ShardedDataset(ts.open(paths[1]), ts.Streaming(), batch_size=4)
    with pytest.raises(ValueError, match=r"ShardedDataset: the source has no rows"):
        ts.ShardedDataset(ts.Collection([ts.open(paths[1])] * 2), ts.Streaming(), batch_size=4)


def test_files_that_disagree_are_named(tmp_path):
    write_plate(tmp_path / "a.h5ad", 5, 0)
    adata = ad.AnnData(np.zeros((4, 3), np.float32))
    adata.write_h5ad(tmp_path / "b.h5ad")
    with pytest.raises(
        ValueError,
        match=r"Collection: source 1 \(.*b.h5ad.*\) has fields \{X: Float\[3\]\} but source 0 \(.*a.h5ad.*\) has \{",
    ):
        ts.Collection([ts.AnnDataSource(tmp_path / "a.h5ad"), ts.AnnDataSource(tmp_path / "b.h5ad")])
    with pytest.raises(ValueError, match="Collection: needs at least one source"):
        ts.Collection([])


def write_labels(path, values, categories):
    obs = pd.DataFrame(
        {"label": pd.Categorical(values, categories=categories)}, index=[f"c{i}" for i in range(len(values))]
    )
    ad.AnnData(sp.csr_matrix(np.ones((len(values), 2), np.float32)), obs=obs).write_h5ad(path)


def write_sample(path, **columns):
    """One sample's file as anndata writes it by default: a string column with repeated values as a
    categorical of the values in this file (sorted), one of unique values as a string array."""
    rows = len(next(iter(columns.values())))
    adata = ad.AnnData(
        sp.csr_matrix(np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)),
        obs=pd.DataFrame(columns, index=[f"{path.stem}-{i}" for i in range(rows)]),
    )
    if path.suffix == ".h5ad":
        adata.write_h5ad(path)
    else:
        adata.write_zarr(path)


def read_back(paths, column):
    """What anndata reads for every row of the files, None where missing."""
    values = []
    for path in paths:
        adata = ad.read_h5ad(path) if path.suffix == ".h5ad" else ad.read_zarr(path)
        values += [None if pd.isna(value) else value for value in adata.obs[column].astype(object)]
    return values


COLUMNS = ["cell_type", "plate", "barcode"]


@pytest.fixture
def samples(tmp_path):
    """Per-sample files whose categoricals (and string arrays) have different categories, as anndata
    writes them; one has no rows (its categories, none of them in the others', do not count)."""
    paths = [tmp_path / name for name in ("s0.h5ad", "empty.h5ad", "s1.zarr", "s2.h5ad", "s3.h5ad")]
    write_sample(
        paths[0],
        cell_type=["T", "B", "T", "NK", "B"],  # categories B, NK, T
        plate=pd.Categorical([3, 1, 3, 1, 1]),  # 1, 3
        barcode=["AAC", "AAA", "TTT", "GGG", "CCC"],  # a string array: AAA, AAC, CCC, GGG, TTT
    )
    write_sample(
        paths[1],
        cell_type=pd.Categorical([], categories=["zzz"]),
        plate=pd.Categorical([], categories=[99]),
        barcode=pd.Categorical([], categories=["zzz"]),
    )
    write_sample(
        paths[2], cell_type=["Mono", "T", "Mono"], plate=pd.Categorical([5, 2, 5]), barcode=["CAT", "AAA", "ZZZ"]
    )
    write_sample(paths[3], cell_type=["B", "NK", "B", "B"], plate=pd.Categorical([1, 1, 1, 3]), barcode=list("wxyz"))
    write_sample(
        paths[4],
        cell_type=pd.Categorical(["T", None, "DC"]),  # DC, T; one missing
        plate=pd.Categorical([2, 2, 1], categories=[2, 1], ordered=True),
        barcode=["x", "AAC", "q"],
    )
    return paths


# The union: the parts in order, each part's categories in its own order, each at its first appearance.
UNION = {
    "cell_type": ["B", "NK", "T", "Mono", "DC"],
    "plate": [1, 3, 2, 5],
    "barcode": ["AAA", "AAC", "CCC", "GGG", "TTT", "CAT", "ZZZ", "w", "x", "y", "z", "q"],
}


def test_per_sample_categories_read_as_one_categorical_over_their_union(samples):
    collection = ts.open(samples, obs=COLUMNS)
    assert len(collection) == 15 and collection.offsets == [0, 5, 5, 8, 12]
    expected = {column: read_back(samples, column) for column in COLUMNS}
    for column in COLUMNS:
        assert collection.categories(column) == UNION[column]
    everything = list(range(15))
    for rows in (
        np.random.default_rng(0).permutation(everything + everything[3:11]).tolist(),
        [9, 8, 10, 9],  # rows of one part: read as that part's
        [13, 12, 14],
        everything,
    ):
        batch = collection.read(rows, num_threads=2)
        for column in COLUMNS:
            assert decoded(batch[column], UNION[column]) == [expected[column][r] for r in rows], (column, rows)
    # The first part's codes are its own.
    first = ts.AnnDataSource(samples[0], obs=COLUMNS).read(list(range(5)))
    batch = collection.read(list(range(5)))
    for column in COLUMNS:
        assert torch.equal(batch[column], first[column]), column
    # A collection of one part reads its codes as they are.
    alone = ts.Collection([ts.AnnDataSource(samples[2], obs=COLUMNS)])
    assert alone.categories("cell_type") == ["Mono", "T"]
    assert alone.read([0, 1, 2])["cell_type"].tolist() == [0, 1, 0]


@pytest.mark.parametrize("workers", [0, 2])
def test_every_row_of_per_sample_files_decodes_to_its_value_in_a_dataset(samples, workers):
    collection = ts.open(samples, obs=COLUMNS)
    expected = {column: read_back(samples, column) for column in COLUMNS}
    seen = []
    dataset = ts.ShardedDataset(collection, ts.BlockShuffling(2), batch_size=4, fetch_factor=2, seed=7, num_threads=2)
    loader = DataLoader(
        dataset, batch_size=None, num_workers=workers, multiprocessing_context="fork" if workers else None
    )
    for batch in loader:
        index = batch["index"].tolist()
        for column in COLUMNS:
            assert decoded(batch[column], UNION[column]) == [expected[column][r] for r in index], column
        seen += index
    assert sorted(seen) == list(range(15))


def test_nested_collections_unite_their_unions(samples):
    def source(i):
        return ts.AnnDataSource(samples[i], obs=COLUMNS)

    expected = {column: read_back(samples, column) for column in COLUMNS}
    inner = ts.Collection([source(3), source(4)])
    assert inner.categories("cell_type") == ["B", "NK", "DC", "T"]
    assert inner.categories("plate") == [1, 3, 2]
    # [[s0, empty], s1, [[s2, s3]]]: each inner collection's codes mapped to its union, then to the outer's.
    nested = ts.Collection([ts.Collection([source(0), source(1)]), source(2), ts.Collection([inner])])
    for column in COLUMNS:
        assert nested.categories(column) == UNION[column]
    for rows in (
        np.random.default_rng(1).permutation(15).tolist(),
        [14, 12, 13],  # rows of the innermost collection's second part only
        [11, 6, 8],
    ):
        batch = nested.read(rows, num_threads=2)
        for column in COLUMNS:
            assert decoded(batch[column], UNION[column]) == [expected[column][r] for r in rows], (column, rows)
    # Another order of the parts, another union: the first part's categories first.
    backwards = ts.Collection([inner, source(2), source(0)])
    assert backwards.categories("cell_type") == ["B", "NK", "DC", "T", "Mono"]
    rows = list(range(15))
    reordered = read_back([samples[i] for i in (3, 4, 2, 0)], "cell_type")
    assert decoded(backwards.read(rows)["cell_type"], backwards.categories("cell_type")) == reordered


def test_random_collections_deliver_the_rows_of_their_index(tmp_path):
    # Collections of 1-4 random AnnData parts (seeded: sizes, .h5ad or zarr v2 / v3, categories that differ
    # between parts) through random datasets: every batch holds the concatenation's rows at its "index", and
    # its categorical and string codes name the concatenation's values.
    rng = random.Random(0)
    for trial in range(12):
        paths = []
        for part in range(rng.randint(1, 4)):
            n_obs = rng.choice([1, 7, 64, 300])
            adata = random_anndata(random.Random(trial), n_obs)  # the same fields and dtypes in every part
            categories = ["a", "b", "c", "q"][: rng.randint(1, 4)]
            adata.obs["category"] = pd.Categorical([rng.choice(categories) for _ in range(n_obs)])
            paths.append(
                write_anndata(adata, tmp_path / f"{trial}-{part}{rng.choice(['.h5ad', '.zarr2.zarr', '.zarr'])}")
            )
        whole = ad.concat([read_anndata(path) for path in paths], merge="same")
        source = ts.open(paths, obs=["category", "string"], fields={"counts": "layers/counts"})
        strategy = make_strategy(rng.choice(STRATEGIES), whole.n_obs, block_size=rng.choice([1, 3, 8]))
        dataset = ts.ShardedDataset(
            source, strategy, batch_size=rng.choice([1, 5, 64]), fetch_factor=rng.choice([1, 4]), seed=trial,
            num_threads=rng.randint(1, 3),
        )  # fmt: skip
        names = {column: source.categories(column) for column in ("category", "string")}
        for batch in dataset:
            rows = batch["index"].numpy()
            for field, element in (("X", "X"), ("counts", "layers/counts")):
                assert_field_rows(batch, field, element_of(whole, element), rows)
            for column, values in names.items():
                assert decoded(batch[column], values) == list(whole.obs[column].iloc[rows]), (trial, paths, column)


def test_parts_that_agree_keep_their_codes(tmp_path):
    write_labels(tmp_path / "a.h5ad", ["y", "x", "y"], ["y", "x"])
    write_labels(tmp_path / "b.h5ad", ["x", "x"], ["y", "x"])
    collection = ts.open([tmp_path / "a.h5ad", tmp_path / "b.h5ad"], obs=["label"])
    assert collection.categories("label") == ["y", "x"]
    assert collection.read(list(range(5)))["label"].tolist() == [0, 1, 0, 1, 1]
    # Categories compare as JSON values: integer and float categories that are equal are one.
    write_sample(tmp_path / "i.h5ad", n=pd.Categorical([2, 1, 2]))
    write_sample(tmp_path / "f.h5ad", n=pd.Categorical([2.0, 2.5]))
    numbers = ts.open([tmp_path / "i.h5ad", tmp_path / "f.h5ad"], obs=["n"])
    assert numbers.categories("n") == [1, 2, 2.5]
    assert decoded(numbers.read(list(range(5)))["n"], [1, 2, 2.5]) == [2, 1, 2, 2, 2.5]


def test_parts_without_rows_unite_their_categories_when_no_part_has_rows(tmp_path):
    write_labels(tmp_path / "a.h5ad", [], ["x", "y"])
    write_labels(tmp_path / "b.h5ad", [], ["z", "x"])
    collection = ts.open([tmp_path / "a.h5ad", tmp_path / "b.h5ad"], obs=["label"])
    assert len(collection) == 0 and collection.categories("label") == ["x", "y", "z"]


def test_a_column_categorical_in_one_part_and_numbers_in_another_is_refused(tmp_path):
    write_labels(tmp_path / "a.h5ad", ["x", "y", "x"], ["x", "y"])
    write_sample(tmp_path / "codes.h5ad", label=np.array([0, 1], dtype=np.int64))  # the same dtype as codes
    write_sample(tmp_path / "floats.h5ad", label=np.array([0.5, 1.5]))

    def source(name):
        return ts.AnnDataSource(tmp_path / name, obs=["label"])

    with pytest.raises(
        ValueError,
        match=r"Collection: obs column 'label' is categorical \(int64 codes into categories\) in sources\[0\] "
        r"\(.*a\.h5ad, encoding-type 'categorical'\) and not categorical \(values as stored\) in sources\[1\]\[0\] "
        r"\(.*codes\.h5ad, encoding-type 'array'\)",
    ):
        ts.Collection([source("a.h5ad"), ts.Collection([source("codes.h5ad")])])
    with pytest.raises(
        ValueError,
        match=r"obs column 'label' is not categorical \(values as stored\) in sources\[0\] \(.*floats\.h5ad, "
        r"encoding-type 'array'\) and categorical \(int64 codes into categories\) in sources\[1\] \(.*a\.h5ad",
    ):
        ts.Collection([source("floats.h5ad"), source("a.h5ad")])
    # A field of another source is no codes either.
    tensors = ts.TensorSource({"X": torch.zeros(2, 2), "label": torch.zeros(2, dtype=torch.long)})
    with pytest.raises(
        ValueError, match=r"in sources\[1\] \(TensorSource.*: a field of that name, not an obs column\)"
    ):
        ts.Collection([source("a.h5ad"), tensors])


def test_categories_of_what_the_collection_does_not_read_are_named(samples):
    collection = ts.open(samples, obs=["cell_type"])
    with pytest.raises(ValueError, match=r"'other' is not an obs column the collection reads \(obs=\['cell_type'\]\)"):
        collection.categories("other")
    with pytest.raises(ValueError, match="Collection.categories: the collection holds no AnnDataSource"):
        ts.Collection([ts.TensorSource({"x": torch.zeros(2, 1)})]).categories("label")


def test_label_key_balances_the_union_of_per_sample_categories(samples):
    """ClassBalancedSampling(label_key=) over per-sample files: one class per value across the files
    (the column need not be delivered)."""
    collection = ts.open(samples)
    expected = read_back(samples, "cell_type")
    strategy = ts.ClassBalancedSampling(label_key="cell_type", total_size=5000)
    dataset = ts.ShardedDataset(collection, strategy, batch_size=100, seed=3)
    drawn = pd.Series([expected[r] for batch in dataset for r in batch["index"].tolist()])
    counts = drawn.value_counts(dropna=False)
    assert set(counts.index) == set(UNION["cell_type"])  # the missing label is never drawn
    assert (abs(counts - 1000) < 150).all(), counts.to_dict()


def test_open_picks_the_source_from_the_path(tmp_path):
    write_plate(tmp_path / "a.h5ad", 5, 0)
    write_plate(tmp_path / "a.zarr", 5, 0, fmt="zarr")
    with h5py.File(tmp_path / "plain.h5", "w") as f:
        f["x"] = np.zeros((6, 2))
    zarr.create_array(tmp_path / "arr.zarr", shape=(7, 2), dtype="f4")
    assert isinstance(ts.open(tmp_path / "a.h5ad"), ts.AnnDataSource)
    assert isinstance(ts.open(tmp_path / "a.zarr", obs=["label"]), ts.AnnDataSource)
    assert isinstance(ts.open(tmp_path / "plain.h5", dataset="x"), ts.HDF5Source)
    assert len(ts.open(tmp_path / "arr.zarr")) == 7
    assert isinstance(ts.open([tmp_path / "a.h5ad", tmp_path / "a.zarr"]), ts.Collection)
    with pytest.raises(ValueError, match="is an HDF5 file but not AnnData: pass dataset="):
        ts.open(tmp_path / "plain.h5")
    with pytest.raises(FileNotFoundError, match="torch_shards.open: No such file or directory") as caught:
        ts.open(tmp_path / "nothing.h5ad")
    assert caught.value.filename == str(tmp_path / "nothing.h5ad")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match="notes.txt is neither an HDF5 file nor a zarr store"):
        ts.open(tmp_path / "notes.txt")


def test_the_same_fields_in_another_order_are_named_as_such():
    first = ts.TensorSource({"X": torch.zeros(3, 1), "y": torch.zeros(3, dtype=torch.long)})
    second = ts.TensorSource({"y": torch.zeros(3, dtype=torch.long), "X": torch.zeros(3, 1)})
    with pytest.raises(
        ValueError, match=r"has fields \{y: Long\[\], X: Float\[1\]\} .*: the same fields in another order"
    ):
        ts.Collection([first, second])


# ---- fields: every per-cell element of every part -------------------------------------------------


def fields_parts(tmp_path):
    """Parts that differ: sizes (one of a single row), formats (h5ad, zarr v3, zarr v2) and the dtype their
    CSR fields store column indices in (uint16, int32, int64), with what anndata reads of each field."""
    layout = [(13, "h5ad", np.uint16), (40, "zarr", None), (1, "zarr2.zarr", None), (27, "h5ad", np.int64)]
    paths, adatas = [], []
    for seed, (rows, fmt, index_dtype) in enumerate(layout):
        path = write_anndata(per_cell_anndata(rows, seed), tmp_path / f"part{seed}.{fmt}")
        if index_dtype is not None:
            with h5py.File(path, "r+") as f:
                for element in ("X", "layers/counts", "obsm/topics", "raw/X"):
                    indices = f[element + "/indices"][...]
                    del f[element + "/indices"]
                    f[element + "/indices"] = indices.astype(index_dtype)
        paths.append(path)
        adatas.append(read_anndata(path))
    expected = {
        name: np.concatenate([element_of(adata, element) for adata in adatas])
        for name, element in {"X": "X", **PER_CELL_FIELDS_ACROSS_FILES}.items()
    }
    expected["cell_type"] = np.concatenate([a.obs["cell_type"].cat.codes.to_numpy().astype(np.int64) for a in adatas])
    return paths, expected


def test_every_field_of_differing_parts_lands_in_its_rows(tmp_path):
    """Each CSR field of every part is written straight into the collection's arrays for that field; dense
    fields (and dense=True) into their rows. Rows shuffled, repeated, all in order, from one part only."""
    paths, expected = fields_parts(tmp_path)
    fields = PER_CELL_FIELDS_ACROSS_FILES
    rng = np.random.default_rng(4)
    everything = list(range(81))
    for dense in (False, True):
        flat = ts.open(paths, fields=fields, obs=["cell_type"], dense=dense)
        parts = [ts.AnnDataSource(p, fields=fields, obs=["cell_type"], dense=dense) for p in paths]
        nested = ts.Collection([ts.Collection(parts[:2]), parts[2], ts.Collection(parts[3:])])
        assert flat.fields == nested.fields == ["X", *fields, "cell_type"]
        for rows in (
            rng.permutation(everything).tolist(),
            rng.permutation(everything + everything[10:60]).tolist(),
            everything,
            [20, 14, 52, 14],  # part 1 only
        ):
            for collection in (flat, nested):
                batch = collection.read(rows, num_threads=2)
                assert list(batch) == collection.fields
                for name in collection.fields:
                    assert (batch[name].layout == torch.sparse_csr) == (
                        not dense and name in ("X", "counts", "topics", "raw")
                    ), name
                    assert_field_rows(batch, name, expected[name], rows)


def test_every_field_of_every_row_once_through_workers(tmp_path):
    paths, expected = fields_parts(tmp_path)
    fields = {"counts": "layers/counts", "pca": "obsm/X_pca", "cube": "obsm/cube", "raw": "raw/X"}
    dataset = ts.ShardedDataset(
        ts.open(paths, fields=fields, obs=["cell_type"]), ts.BlockShuffling(4), batch_size=6, fetch_factor=2, seed=3
    )
    seen = []
    for batch in DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork"):
        index = batch["index"].numpy()
        for name in ["X", *fields, "cell_type"]:
            assert_field_rows(batch, name, expected[name], index)
        seen.extend(index.tolist())
    assert sorted(seen) == list(range(81))


@pytest.mark.parametrize("layout", ["zarr", "h5ad"])
def test_fields_over_an_annbatch_collection(tmp_path, layout):
    """A DatasetCollection as annbatch lays it out (datasets dataset_<i> in a zarr group marked
    annbatch-preshuffled, or dataset_<i>.h5ad files in a directory), each dataset written by anndata."""
    adatas = [per_cell_anndata(rows, seed) for seed, rows in enumerate((17, 30, 8))]
    if layout == "zarr":
        path = tmp_path / "collection.zarr"
        group = zarr.open_group(path, mode="w", zarr_format=3)
        group.attrs.update({"encoding-type": "annbatch-preshuffled", "encoding-version": "0.1.0"})
        for i, adata in enumerate(adatas):
            ad.io.write_elem(group, f"dataset_{i}", adata)
        adatas = [ad.io.read_elem(zarr.open_group(path, mode="r")[f"dataset_{i}"]) for i in range(3)]
    else:
        path = tmp_path / "collection"
        path.mkdir()
        adatas = [read_anndata(write_anndata(adata, path / f"dataset_{i}.h5ad")) for i, adata in enumerate(adatas)]
    fields = {"expression": "X", **PER_CELL_FIELDS_ACROSS_FILES}
    collection = ts.open(path, fields=fields, obs=["cell_type"])
    assert isinstance(collection, ts.Collection) and len(collection.sources) == 3
    assert collection.fields == [*fields, "cell_type"]
    rows = np.random.default_rng(0).permutation(len(collection)).tolist()
    batch = collection.read(rows, num_threads=2)
    for name, element in fields.items():
        assert_field_rows(batch, name, np.concatenate([element_of(a, element) for a in adatas]), rows)
