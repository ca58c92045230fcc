"""Sources: row-addressable datasets read by the native core.

A source pickles by its parameters and builds its native object lazily in
each process, so no handle ever crosses a fork.
"""

import concurrent.futures
import json
import multiprocessing.context
import os
import warnings

import numpy as np
import torch

from . import _convert
from ._library import ops
from ._native import NativeBacked, native_call

# Threads opening a collection's datasets behind URLs at most (C++'s torch_shards::open starts as many:
# core::kMaxWaitingThreads).
_MAX_OPENING_THREADS = 32


class Source(NativeBacked):
    """Base class of every source: a row-addressable dataset read by the native core.

    A source holds only its parameters; its native object
    (``torch.classes.torch_shards.Source``, ``source.native``) is built from them
    in the constructor (so bad arguments fail there) and again, lazily, in each
    process the source is pickled to (DataLoader workers, spawned processes), so
    no file handle crosses a fork. A source pickled for a spawned process checks
    there that it opens the same files (unchanged since this process opened
    them), and raises otherwise.

    ``len(source)`` is its number of rows; ``repr(source)`` describes its files,
    fields and shapes.

    Not made directly: use ``torch_shards.open`` or one of the subclasses
    (``TensorSource``, ``HDF5Source``, ``ZarrSource``, ``AnnDataSource``,
    ``Collection``, ``RowsSource``).
    """

    def __len__(self):
        """The number of rows."""
        return self.native.num_rows()

    @property
    def fields(self):
        """list[str]: Names of the fields each batch carries (besides ``"index"``), in batch order."""
        return list(self.native.field_names())

    @property
    def field_specs(self):
        """list[str]: One line per field: name, dtype, row shape and whether it is sparse, e.g.
        ``"X: Float[2000] (sparse CSR)"``."""
        return list(self.native.field_specs())

    def read(self, rows, num_threads=1):
        """Reads rows directly, outside any dataset (for inspection and tests).

        Args:
            rows: one row index, or a 1-D sequence, numpy array or tensor of row
                indices, in any order, repeats allowed.
            num_threads: native threads reading, in [1, 256]. Default 1.

        Returns:
            dict[str, torch.Tensor]: one tensor per field (``fields``) holding the
            rows in the order given (a sparse CSR tensor for a CSR matrix). No
            ``"index"`` field: that one is added by a ``ShardedDataset``.

        Raises:
            ValueError: ``rows`` is not 1-D, not integers, or holds a row outside
                ``[0, len(source))``; ``num_threads`` is outside [1, 256].
            TypeError: ``num_threads`` is not an int.
            RuntimeError: the native reader failed (an unreadable or changed file).
        """
        who = f"{type(self).__name__}.read"
        rows = _convert.index_tensor(f"{who}: rows", [rows] if np.ndim(rows) == 0 else rows)
        return dict(self.native.read(rows, _convert.check_int(f"{who}: num_threads", num_threads)))

    def __repr__(self):
        return self.native.describe()

    def __getstate__(self):
        state = super().__getstate__()
        # Pickled for a process being spawned (a DataLoader worker under spawn or forkserver): it opens the
        # files again, and must find them as this process opened them, or raise (a file replaced or written
        # in between would hand its rows to that worker alone).
        if self._native_object is not None and multiprocessing.context.get_spawning_popen() is not None:
            state["_opened_stamps"] = dict(self._native_object.opened_stamps())
        else:
            state.pop("_opened_stamps", None)
        return state

    storage = None  # the storage= of a source reading a URL (sources pickled before it existed have none)

    def _apply_storage(self):
        """Registers this source's storage options for its URL in this process (before anything is read)."""
        if self.storage:
            native_call(type(self).__name__, ops.set_storage_options, self.path, json.dumps(self.storage))

    @property
    def native(self):
        """The native object of this process (checked against the files the spawning process opened)."""
        if self._native_object is None:
            self._apply_storage()
            native = native_call(type(self).__name__, self._build)
            stamps = self.__dict__.get("_opened_stamps")
            if stamps:
                native.check_same_files(stamps)  # raises again at each use while the files differ
            self.__dict__.pop("_opened_stamps", None)
            self._native_object = native
        return self._native_object


class TensorSource(Source):
    """Rows of in-memory tensors or numpy arrays, first dimension the rows.

    ``TensorSource(x)`` gives the field ``"X"``; ``TensorSource({"X": x, "y": y})``
    one field per key. Rows are gathered with ATen. Numpy arrays are shared, not
    copied; tensors that require grad are read detached.

    Args:
        tensors: a tensor or numpy array (the field ``"X"``), or a dict of field
            name -> tensor or numpy array, all with the same first dimension.
            Numpy arrays must hold numbers or bools, in native byte order,
            without negative strides.

    Raises:
        TypeError: ``tensors`` is a path (use ``torch_shards.open``), not a
            tensor, array or dict; a field name is not a str; a numpy array holds
            other than numbers or bools.
        ValueError: the dict is empty; the fields differ in their number of rows;
            a field is 0-d, on the meta device, a numpy array of non-native byte
            order or with negative strides; a field is named ``"index"``
            (reserved for row indices); a field name holds a NUL character or is
            not valid UTF-8.

    Example:
        ```python
        import torch
        import torch_shards as ts

        source = ts.TensorSource({"X": torch.randn(100, 8), "y": torch.arange(100)})
        assert len(source) == 100 and source.fields == ["X", "y"]
        ```
    """

    def __init__(self, tensors):
        if isinstance(tensors, (torch.Tensor, np.ndarray)):
            tensors = {"X": tensors}
        if isinstance(tensors, (str, bytes, os.PathLike)):
            raise TypeError(
                f"TensorSource: expected a tensor, a numpy array or a dict of them, got a path ({tensors!r}): did you "
                "mean torch_shards.open(path)?"
            )
        if not isinstance(tensors, dict):
            raise TypeError(
                f"TensorSource: expected a tensor, a numpy array or a dict of them, got {type(tensors).__name__}"
            )
        self.tensors = {}
        for name, value in tensors.items():
            if not isinstance(name, str):
                raise TypeError(f"TensorSource: field names must be str, got {name!r}")
            _convert.native_text("TensorSource", "field name", name)
            self.tensors[name] = _as_tensor(name, value)
        self._build_now()

    def _build(self):
        return ops.tensor_source(self.tensors)


def _as_tensor(name, value):
    if isinstance(value, torch.Tensor):
        if value.is_meta:
            raise ValueError(f"TensorSource: field {name!r} is on the meta device (it has no data to read)")
        return value.detach()
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biufc":
            raise TypeError(
                f"TensorSource: field {name!r} is a numpy array of dtype {value.dtype}; only numbers and bools can "
                "be read (pass other data as the collection of a ShardedDataset, with fetch_callback)"
            )
        if not value.dtype.isnative:
            raise ValueError(
                f"TensorSource: field {name!r} is a numpy array of non-native byte order ({value.dtype.str}): "
                f"convert it first, e.g. value.astype(value.dtype.newbyteorder('='))"
            )
        if any(stride < 0 for stride in value.strides):
            raise ValueError(
                f"TensorSource: field {name!r} is a numpy array with negative strides {value.strides} (a reversed "
                "view), which tensors cannot share: pass np.ascontiguousarray(value) (a copy)"
            )
        with warnings.catch_warnings():  # read-only arrays (memmaps): sources never write into their data
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            return torch.from_numpy(value)
    raise TypeError(f"TensorSource: field {name!r} must be a tensor or a numpy array, got {type(value).__name__}")


class RowsSource(Source):
    """``num_rows`` rows without fields: its batches carry only ``"index"``.

    A ``ShardedDataset`` uses it for a collection it cannot read natively
    (scDataset's ``data_collection``: an AnnData object, a list, ...) and fetches
    the rows it deals from the collection in Python; there is rarely a reason to
    make one yourself.

    Args:
        num_rows: the number of rows (converted with ``int()``).
        description: what the rows are, shown in ``repr()``. Default ``""``.
    """

    def __init__(self, num_rows, description=""):
        self.num_rows = int(num_rows)
        self.description = str(description)
        self._build_now()

    def _build(self):
        return ops.rows_source(self.num_rows, self.description)


def _field_map(who, value, field, what):
    """{field: path} from a path (one field) or a dict of them."""
    mapping = {field: value} if isinstance(value, (str, os.PathLike)) else value
    if not isinstance(mapping, dict):
        raise TypeError(f"{who}: {what} must be a path inside the file or a dict of field -> path, got {value!r}")
    if not mapping:  # as the native door says it
        raise ValueError(f"{who}: needs at least one {what} (an empty dict was given)")
    out = {}
    for name, inner in mapping.items():
        if not isinstance(name, str) or not isinstance(inner, (str, bytes, os.PathLike)):
            raise TypeError(f"{who}: {what} must map field names to paths, got {name!r}: {inner!r}")
        _convert.native_text(who, "field name", name)
        inner = os.fspath(inner)
        out[name] = _convert.native_text(
            who, f"{what} {name!r}", os.fsdecode(inner) if isinstance(inner, bytes) else inner
        )
    return out


def _path(who, path):
    """A path as sources keep it: absolute (as the native sources store it), so that every process
    rebuilding the source (spawned DataLoader workers, a loaded pickle) opens the same file."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"{who}: path must be a str, bytes or os.PathLike, got {type(path).__name__}")
    path = os.fspath(path)
    if isinstance(path, bytes):
        path = os.fsdecode(path)  # bytes that are not UTF-8 become surrogate escapes, refused below
    if _is_url(path):
        return _convert.native_text(who, "path", path)
    return os.path.abspath(_convert.native_text(who, "path", path)) if path else path


def _is_url(path):
    return isinstance(path, str) and path.startswith(("s3://", "http://", "https://"))


# How URLs are read (torch_shards.open's keyword arguments of the same names, a source's storage=).
STORAGE_OPTIONS = (
    "endpoint_url",
    "region",
    "profile",
    "anonymous",
    "max_requests",
    "timeout",
    "retries",
    "cache_dir",
    "cache_bytes",
    "cache_whole_bytes",
    "consolidated",
)


def _storage(who, path, storage):
    """A source's storage= checked: None, or a dict of STORAGE_OPTIONS for a URL."""
    if storage is None:
        return None
    if not isinstance(storage, dict):
        raise TypeError(f"{who}: storage must be a dict of {', '.join(STORAGE_OPTIONS)}, got {storage!r}")
    unknown = sorted(set(storage) - set(STORAGE_OPTIONS))
    if unknown:
        raise ValueError(f"{who}: unknown storage option(s) {unknown} (known: {', '.join(STORAGE_OPTIONS)})")
    storage = {key: value for key, value in storage.items() if value is not None}
    if storage and not _is_url(path):
        raise ValueError(f"{who}: storage options apply to URLs (s3://, http://, https://), not to {path!r}")
    if "cache_dir" in storage:
        storage["cache_dir"] = os.path.abspath(os.fspath(storage["cache_dir"]))
    return storage or None


class HDF5Source(Source):
    """Datasets of an HDF5 file, rows along the first axis.

    ``HDF5Source(path, "/images")`` gives the field ``"X"``;
    ``HDF5Source(path, {"X": "/images", "y": "/labels"})`` one field per dataset
    (same number of rows). Every numeric dtype and bool; contiguous datasets
    are read with pread, chunked ones (shuffle, deflate, blosc, zstd) by
    decoding chunks in parallel, others through HDF5's own read path.
    AnnData ``.h5ad`` files are read with ``AnnDataSource``.

    Args:
        path: the file (str, bytes or ``os.PathLike``, kept as an absolute path),
            or a URL (``s3://``, ``http://``, ``https://``).
        dataset: the path of a dataset inside the file (the field named
            ``field``), or a dict of field name -> dataset path.
        field: the field name of a single ``dataset``. Default ``"X"``.
        storage: for a URL, a dict of storage options (the keyword arguments
            of ``torch_shards.open`` that configure URLs: ``endpoint_url``,
            ``region``, ...). Default None (the environment's settings).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        TypeError: ``path`` or ``dataset`` is of the wrong type; ``storage`` is
            not a dict.
        ValueError: ``dataset`` is an empty dict; the datasets differ in their
            number of rows; a dataset holds strings or another unsupported
            type; ``storage`` has an unknown key or is given for a local path;
            a path or field name holds a NUL character or is not valid UTF-8.
        RuntimeError: the file cannot be read as HDF5, or a dataset does not
            exist (the message names the file and the dataset).
    """

    def __init__(self, path, dataset, *, field="X", storage=None):
        self.path = _path("HDF5Source", path)
        self.storage = _storage("HDF5Source", self.path, storage)
        self.datasets = _field_map("HDF5Source", dataset, field, "dataset")
        self._build_now()

    def _build(self):
        return ops.hdf5_source(self.path, self.datasets)


class ZarrSource(Source):
    """A zarr array (v2 or v3, sharded or not; blosc, zstd, gzip, zlib or no
    compression), rows along the first axis.

    ``ZarrSource(path)`` reads the array stored at ``path`` as the field ``"X"``;
    ``ZarrSource(store, "/X")`` an array inside a group store, and
    ``ZarrSource(store, {"X": "/X", "y": "/y"})`` several arrays of one store.
    AnnData zarr stores are read with ``AnnDataSource``.

    Args:
        path: the store (a directory; str, bytes or ``os.PathLike``, kept as an
            absolute path), or a URL (``s3://``, ``http://``, ``https://``).
        array: the path of the array inside the store (the field named
            ``field``), or a dict of field name -> array path. Default ``"/"``:
            the store is the array.
        field: the field name of a single ``array``. Default ``"X"``.
        storage: for a URL, a dict of storage options (as for
            ``HDF5Source``). Default None.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        TypeError: ``path`` or ``array`` is of the wrong type; ``storage`` is
            not a dict.
        ValueError: ``array`` is an empty dict; the arrays differ in their
            number of rows; ``storage`` has an unknown key or is given for a
            local path; a path or field name holds a NUL character or is not
            valid UTF-8.
        RuntimeError: there is no zarr array at ``array`` (a group, or nothing),
            or its metadata or codecs cannot be read (the message names the
            store and the array).
    """

    def __init__(self, path, array="/", *, field="X", storage=None):
        self.path = _path("ZarrSource", path)
        self.storage = _storage("ZarrSource", self.path, storage)
        self.arrays = _field_map("ZarrSource", array, field, "array")
        self._build_now()

    def _build(self):
        return ops.zarr_source(self.path, self.arrays)


class AnnDataSource(Source):
    """AnnData as written by the ``anndata`` package (0.7 to 0.13): a ``.h5ad`` file or a zarr
    store (v2 or v3, sharded or not).

    Each batch holds ``"X"`` (or ``layers/<layer>``) as a dense tensor or, for a CSR matrix, a
    ``torch.sparse_csr_tensor`` (``dense=True`` densifies every CSR matrix natively), the
    per-cell elements named in ``fields``, and the ``obs`` columns asked for.

    ``fields`` maps field names to elements whose rows are the cells: ``"layers/<name>"``,
    ``"obsm/<name>"``, ``"obsp/<name>"``, ``"raw/X"`` or ``"X"``, each a dense array of any number
    of dimensions (a row is the rest of its shape) or a CSR matrix::

        AnnDataSource(path, fields={"counts": "layers/counts", "pca": "obsm/X_pca"}, obs=["cell_type"])
        # batch: {"X": ..., "counts": ..., "pca": ..., "cell_type": ..., "index": ...}

    ``source.elements`` is that mapping. ``"X"`` comes first, then ``fields`` in their order, then
    the obs columns. ``X`` stays a field unless ``fields`` names one ``"X"`` or maps one to the
    element ``"X"`` (``fields={"raw": "X"}`` delivers X as ``"raw"`` only); ``layer=`` with such
    ``fields`` is refused as ambiguous, and with any other ``fields`` says what ``"X"`` reads.
    Refused with a ``ValueError`` naming the file, the element and its encoding: elements that do
    not exist (those of its group are listed), CSC matrices, dataframes and awkward arrays
    (``obsm`` can hold them), arrays of strings, arrays whose first dimension is not ``n_obs``,
    paths outside those above (``var``, ``varm``, ``varp`` and ``uns`` have no per-cell rows), and
    field names that clash with each other, with ``obs`` columns (or their ``_mask`` fields) or
    with ``"index"``.

    The ``obs`` columns:

    - numeric and boolean columns as they are stored;
    - categorical columns as int64 codes into ``categories(column)`` (-1: missing); codes
      outside the categories raise, naming the file, the column and the code;
    - string columns (``string-array``, ``nullable-string-array``) as int64 codes into their
      sorted unique values, which ``categories(column)`` returns (-1: missing);
    - nullable columns (``nullable-integer``, ``nullable-boolean``) as two fields: ``<name>``,
      the values with missing entries filled with 0 / False, and ``<name>_mask``, a bool tensor
      that is True where the value is missing (anndata's mask convention).

    Other encodings (``awkward-array``, CSC matrices, ...) raise, naming the element and its
    encoding.

    Args:
        path: a ``.h5ad`` file or an AnnData zarr store (str, bytes or ``os.PathLike``, kept as
            an absolute path), or a URL (``s3://``, ``http://``, ``https://``).
        obs: the obs columns to deliver, a list of names or one name. Default None: none.
        layer: read ``layers/<layer>`` as the field ``"X"`` instead of ``X``. Default None.
        dense: densify every CSR matrix natively (batches hold dense tensors). Default False.
        fields: more per-cell elements, a dict of field name -> element path (see above).
            Default None: none.
        storage: for a URL, a dict of storage options (as for ``HDF5Source``). Default None.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        TypeError: ``obs`` is not a list of str, ``layer`` not a str, ``dense`` not a bool,
            ``fields`` not a dict of str -> str; ``storage`` is not a dict.
        ValueError: an obs column, layer or element that does not exist or cannot be read
            (see above); clashing field names; ``storage`` with an unknown key, or given for
            a local path; a name holding a NUL character or not valid UTF-8.
        RuntimeError: ``path`` is not AnnData (neither an HDF5 file nor a zarr store with
            ``obs`` and ``X`` or ``layers``).
    """

    elements = None  # the fields= of this source (sources pickled before fields= existed have none)

    def __init__(self, path, obs=None, layer=None, *, dense=False, fields=None, storage=None):
        self.path = _path("AnnDataSource", path)
        self.storage = _storage("AnnDataSource", self.path, storage)
        if isinstance(obs, str):
            obs = [obs]
        self.obs = list(obs or [])
        if not all(isinstance(name, str) for name in self.obs):
            raise TypeError(f"AnnDataSource: obs must be a list of column names, got {obs!r}")
        if layer is not None and not isinstance(layer, str):
            raise TypeError(f"AnnDataSource: layer must be a str, got {layer!r}")
        for name in self.obs:
            _convert.native_text("AnnDataSource", "obs column", name)
        if layer is not None:
            _convert.native_text("AnnDataSource", "layer", layer)
        self.layer = layer
        self.dense = _convert.check_bool("AnnDataSource: dense", dense)
        self.elements = _elements(fields)
        self._anndata = None
        self._build_now()

    @property
    def anndata(self):
        """The ``torch.classes.torch_shards.AnnData`` of this process: the opened file or store,
        for lookups (names, categories)."""
        if self._anndata is None:
            self._apply_storage()
            self._anndata = ops.anndata(self.path)
        return self._anndata

    def _build(self):
        return self.anndata.source(self.obs, self.layer, self.dense, self.elements or None)

    @property
    def n_obs(self):
        """int: The number of cells (rows), as stored."""
        return self.anndata.n_obs()

    @property
    def n_vars(self):
        """int: The number of variables (columns of ``X``), as stored."""
        return self.anndata.n_vars()

    @property
    def obs_names(self):
        """list[str]: The obs index (cell names), read from the file."""
        return list(self.anndata.obs_names())

    @property
    def var_names(self):
        """list[str]: The var index (variable names), read from the file."""
        return list(self.anndata.var_names())

    @property
    def obs_columns(self):
        """list[str]: The names of the file's obs columns (those ``obs=`` can deliver)."""
        return list(self.anndata.obs_columns())

    def categories(self, column):
        """What the codes of a categorical or string obs column mean.

        Args:
            column: the obs column's name.

        Returns:
            list: ``categories[i]`` is what code ``i`` stands for (-1: missing). A
            categorical's categories as stored (None for a missing one, whose codes read as
            -1); a string column's sorted unique values.

        Raises:
            ValueError: there is no such obs column, or it is neither categorical nor a string
                column.
        """
        return json.loads(
            self.anndata.categories_json(_convert.native_text("AnnDataSource.categories", "column", column))
        )

    def __getstate__(self):
        state = super().__getstate__()
        state["_anndata"] = None
        return state


def _elements(fields):
    """An AnnDataSource's fields= as {field name: element path}, in its order."""
    if fields is None:
        return {}
    if not isinstance(fields, dict):
        raise TypeError(
            f"AnnDataSource: fields must be a dict of field name -> element path (e.g. {{'pca': 'obsm/X_pca'}}), "
            f"got {type(fields).__name__}"
        )
    for name, element in fields.items():
        if not isinstance(name, str) or not isinstance(element, str):
            raise TypeError(
                f"AnnDataSource: fields must map field names to element paths (str), got {name!r}: {element!r}"
            )
        _convert.native_text("AnnDataSource", "field name", name)
        _convert.native_text("AnnDataSource", f"element of field {name!r}", element)
    return dict(fields)


class Collection(Source):
    """Many sources as one row space: global row = offset of its source + local
    row (e.g. the plates of a large dataset). All sources must have the same
    fields (names, dtypes, row shapes). Collections nest.

    A categorical or string obs column whose sources have different categories
    (anndata writes each file's categorical with only the values in it) reads as
    one categorical over their union (``categories(column)``): each source's codes
    are mapped to the union's as they are read. A column categorical (or string)
    in one source and not in another raises ValueError naming both files.

    Args:
        sources: an iterable of at least one torch_shards source (collections
            included); ``torch_shards.open(list_of_paths)`` makes one from paths.

    Raises:
        TypeError: an item is a path, or not a torch_shards source.
        ValueError: no sources; the sources' fields differ (names, dtypes, row
            shapes); an obs column is categorical (or string) in one source and
            not in another.
    """

    def __init__(self, sources):
        sources = list(sources)
        if not sources:
            raise ValueError("Collection: needs at least one source")
        for i, source in enumerate(sources):
            if isinstance(source, (str, bytes, os.PathLike)):
                raise TypeError(
                    f"Collection: sources[{i}] is a path ({source!r}), not a source: did you mean "
                    "torch_shards.open(paths), which opens a list of paths as one Collection?"
                )
            if not isinstance(source, Source):
                raise TypeError(f"Collection: sources[{i}] must be a torch_shards source, got {type(source).__name__}")
        self.sources = sources
        self._build_now()  # checks the sources agree (fields, the categories behind obs codes)

    def _build(self):
        return ops.collection([source.native for source in self.sources])

    def categories(self, column):
        """What the codes of a categorical or string obs column mean: code i is categories[i]
        (-1: missing), as a list.

        The union of the sources' categories, in this order: the sources in
        collection order (a nested collection's own union), each source's categories in its
        own order (``AnnDataSource.categories``), each category at its first appearance;
        categories compare as JSON values (2 and 2.0 are one). Sources without rows are
        left out (an empty file's categories are often none), unless none has rows. Where
        the sources agree, these are their categories and their codes; the first source's
        codes never change. For an ordered categorical, the union's order is this order of
        first appearance: an order across files only where they agree. For a string column
        (codes into each file's sorted values) the union is not sorted across files.

        Args:
            column: the obs column's name.

        Raises:
            ValueError: no source reads that column, or the collection holds no
                AnnData source.
        """
        return json.loads(self.native.categories_json(_convert.native_text("Collection.categories", "column", column)))

    @property
    def offsets(self):
        """list[int]: The first global row of each source, in order."""
        offsets, total = [], 0
        for source in self.sources:
            offsets.append(total)
            total += len(source)
        return offsets


def _open_datasets(paths, kwargs):
    """A collection's AnnDataSources. Behind URLs, each opening is a chain of round trips (a dataset of an
    annbatch collection: ~25), so they are opened together, on threads (the native calls let go of the
    GIL); local files one after another."""
    if len(paths) < 2 or not _is_url(paths[0]):
        return [AnnDataSource(dataset, **kwargs) for dataset in paths]
    with concurrent.futures.ThreadPoolExecutor(min(len(paths), _MAX_OPENING_THREADS)) as pool:
        return list(pool.map(lambda dataset: AnnDataSource(dataset, **kwargs), paths))


def open(path, **kwargs):  # noqa: A001 - mirrors the builtin for paths
    """Opens a path as the source that reads it, by what the path holds.

    - a ``.h5ad`` file or an AnnData zarr store -> ``AnnDataSource``;
    - another HDF5 file -> ``HDF5Source`` (pass ``dataset=``);
    - a zarr array -> ``ZarrSource``; another zarr group -> ``ZarrSource`` (pass ``array=``);
    - an annbatch DatasetCollection -> a ``Collection`` of its datasets' ``AnnDataSource``
      (in annbatch's order);
    - a list or tuple of paths -> a ``Collection`` of each one opened (with the same keyword
      arguments).

    Paths may be URLs: ``s3://bucket/key``, ``https://host/path``, ``http://...``.

    Args:
        path: a path (str, bytes or ``os.PathLike``), a URL, or a list or tuple of them.
        **kwargs: the source's own arguments (``AnnDataSource``: ``obs``, ``layer``, ``dense``,
            ``fields``; ``HDF5Source``: ``dataset``, ``field``; ``ZarrSource``: ``array``,
            ``field``; ``storage``), and for URLs the storage options below. Each storage
            option is also an entry of a source's ``storage=`` dict; unset ones come from the
            environment (the AWS variables and files, ``TORCH_SHARDS_CACHE_DIR``, ...):

            - ``endpoint_url``: an S3-compatible server (default: AWS_ENDPOINT_URL, else AWS).
            - ``region``: default AWS_REGION, else the profile's, else us-east-1.
            - ``profile``: default AWS_PROFILE, else "default". Named here, the profile's
              credentials are used over AWS_ACCESS_KEY_ID (as ``aws --profile`` does); a
              profile's role, SSO login or credential_process, a web identity, the container's
              and the EC2 instance's credentials are fetched as boto3 fetches them (docs:
              guide/sources.md).
            - ``anonymous``: unsigned requests, for public buckets (default: when no
              credentials are found).
            - ``max_requests``: requests in flight per reading thread, default 64
              (TORCH_SHARDS_MAX_REQUESTS).
            - ``timeout``: seconds per request attempt, default 60.
            - ``retries``: attempts after a transient failure, default 6.
            - ``cache_dir``: a node-local cache shared by every process on the node
              (default TORCH_SHARDS_CACHE_DIR, else none).
            - ``cache_bytes``: the cache's bound, default 64 GiB (TORCH_SHARDS_CACHE_BYTES).
            - ``cache_whole_bytes``: with a cache, objects of at most this many bytes (and at
              most ``cache_bytes / 4``) are fetched whole at their first read and every read of
              them is served from a mapping of that one entry; 0: cache ranges only. Default
              1 GiB (TORCH_SHARDS_CACHE_WHOLE_BYTES).
            - ``consolidated``: a zarr store's consolidated metadata (its root ``zarr.json``'s
              ``consolidated_metadata``, or ``.zmetadata``: anndata writes them) read in place
              of every node's own metadata files, as zarr-python does: opening the store is
              one request, not one per node. Default True; False reads each node's own.

    Returns:
        Source: an ``AnnDataSource``, ``HDF5Source``, ``ZarrSource`` or ``Collection``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        TypeError: ``path`` is not a str, bytes or ``os.PathLike``; a keyword argument is not
            one the chosen source takes.
        ValueError: an HDF5 file that is not AnnData without ``dataset=``; a zarr group that
            is not AnnData without ``array=``; a path that is neither an HDF5 file nor a zarr
            store; storage options for a local path, or an unknown ``storage`` key.
        RuntimeError: a URL cannot be reached or read (the message says why).

    Example:
        ```python
        import os
        import tempfile

        import h5py
        import numpy as np
        import torch_shards as ts

        path = os.path.join(tempfile.mkdtemp(), "images.h5")
        with h5py.File(path, "w") as f:
            f["images"] = np.zeros((10, 4), dtype=np.float32)
        source = ts.open(path, dataset="/images")  # an HDF5Source, field "X"
        assert len(source) == 10
        ```
    """
    if isinstance(path, (list, tuple)):
        return Collection([open(item, **kwargs) for item in path])
    path = _path("torch_shards.open", path)
    storage = dict(kwargs.pop("storage", None) or {})
    for key in STORAGE_OPTIONS:
        if key in kwargs:
            storage[key] = kwargs.pop(key)
    storage = _storage("torch_shards.open", path, storage)
    if storage:
        kwargs["storage"] = storage
        native_call("torch_shards.open", ops.set_storage_options, path, json.dumps(storage))
    # One opening (io/storage/remote_paths.h): what the plan learns of objects in storage, the sources it
    # plans reuse; a later open reads them as they are then.
    opening = torch.classes.torch_shards.Opening()
    try:
        # The decision is native (torch_shards::plan_open, as C++'s torch_shards::open makes it): a missing
        # path raises FileNotFoundError, a path it cannot open as asked ValueError naming it.
        kind, paths = native_call("torch_shards.open", ops.open_plan, path, "dataset" in kwargs, "array" in kwargs)
        if kind == "anndata":
            return AnnDataSource(path, **kwargs)
        if kind == "hdf5":
            return HDF5Source(path, **kwargs)
        if kind == "zarr":
            return ZarrSource(path, **kwargs)
        return Collection(_open_datasets(paths, kwargs))
    finally:
        del opening  # the opening ends with it
