"""The binary wheel from a user's side (make wheel; make test-wheel runs this file): installed into a
brand-new venv that holds only torch and numpy, with the system's HDF5, c-blosc, lz4, zstd and libaec
hidden behind /dev/null in a mount namespace, it reads every format, feeds DataLoader workers, runs
two gloo ranks, and its C++ package builds and runs the C++ example. Files are written here, by the
test environment's h5py, zarr and anndata; the fresh venv only reads them (wheel_smoke.py).

The wheel: TORCH_SHARDS_WHEEL, else the newest dist/torch_shards-<version>-*.whl. Without one the
tests skip, unless TORCH_SHARDS_WHEEL_REQUIRED=1 (make test-wheel), where they fail.
"""

import functools
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time

import anndata as ad
import h5py
import numcodecs
import numpy as np
import pytest
import scipy.sparse as sp
import torch
import zarr
from conftest import cmake_build
from remote_servers import RangeHTTPServer
from zarr.codecs import BloscCodec, GzipCodec, ZstdCodec

import torch_shards as ts

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SMOKE = os.path.join(HERE, "wheel_smoke.py")


def find_wheel():
    if os.environ.get("TORCH_SHARDS_WHEEL"):
        return os.path.abspath(os.environ["TORCH_SHARDS_WHEEL"])
    wheels = glob.glob(os.path.join(ROOT, "dist", f"torch_shards-{ts.__version__}-*.whl"))
    return max(wheels, key=os.path.getmtime) if wheels else None


WHEEL = find_wheel()
if WHEEL is None and os.environ.get("TORCH_SHARDS_WHEEL_REQUIRED") == "1":
    raise RuntimeError("no wheel in dist/: run make wheel (or set TORCH_SHARDS_WHEEL)")
pytestmark = pytest.mark.skipif(WHEEL is None, reason="no wheel in dist/ (make wheel)")

# The libraries the wheel carries inside itself, hidden from it while it runs: zlib stays visible
# (Python's own zlib module needs it), and test_only_torch_and_the_base_system_are_linked proves the
# wheel does not use it.
HIDDEN_LIBRARIES = ["libhdf5*.so*", "hdf5/serial/*.so*", "libblosc*.so*", "liblz4.so*", "libzstd.so*", "libsz.so*",
                    "libaec.so*"]  # fmt: skip
SYSTEM_LIBRARY_DIR = "/usr/lib/x86_64-linux-gnu"
# What a manylinux wheel may take from the system (PEP 600) and what we use of it.
BASE_SYSTEM = {"libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2", "libpthread.so.0",
               "libdl.so.2", "librt.so.1", "linux-vdso.so.1"}  # fmt: skip


@functools.cache
def can_hide():
    """Whether this process may make a mount namespace (root, or unprivileged user namespaces)."""
    return (
        shutil.which("unshare") is not None
        and subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0
    )


def hidden_files(keep=()):
    files = []
    for pattern in HIDDEN_LIBRARIES:
        if pattern in keep:
            continue
        files += glob.glob(os.path.join(SYSTEM_LIBRARY_DIR, pattern))
    return sorted(set(files))


def hidden(command, keep=()):
    """command, run with the system's copies of the bundled libraries replaced by /dev/null (but those of
    the HIDDEN_LIBRARIES patterns in keep)."""
    if can_hide():
        mounts = "".join(f"mount --bind /dev/null {path} && " for path in hidden_files(keep))
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", mounts + 'exec "$@"', "sh", *command]
    if os.environ.get("TORCH_SHARDS_WHEEL_REQUIRED") == "1":
        pytest.fail("cannot make a mount namespace to hide the system's libraries (needs root or user namespaces)")
    return command


# The fresh venv's Python runs from "/", so that neither this source tree nor its build is importable.
OUTSIDE = "/"


def run_hidden(command, keep=(), **kwargs):
    return subprocess.run(hidden(command, keep), capture_output=True, text=True, cwd=OUTSIDE, **kwargs)


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A brand-new venv from the base interpreter: this torch and numpy, then the wheel (timed)."""
    root = tmp_path_factory.mktemp("fresh") / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(root)], check=True)
    python = str(root / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, f"torch=={torch.__version__}", "numpy"], check=True, timeout=1200)
    start = time.perf_counter()
    subprocess.run([*pip, WHEEL], check=True, timeout=600)
    print(f"\npip install {os.path.basename(WHEEL)}: {time.perf_counter() - start:.1f} s (torch already installed)")
    return root


def venv_python(venv):
    return str(venv / "bin" / "python")


def installed_package(venv):
    return glob.glob(str(venv / "lib" / "python3*" / "site-packages" / "torch_shards"))[0]


def test_the_fresh_venv_holds_only_torch_numpy_and_the_wheel(venv):
    listed = subprocess.run(
        [venv_python(venv), "-m", "pip", "list", "--format=json"], capture_output=True, text=True, cwd=OUTSIDE
    )
    names = {package["name"].lower() for package in json.loads(listed.stdout)}
    assert {"h5py", "zarr", "anndata", "numcodecs", "scipy", "pytest"}.isdisjoint(names)
    assert {"torch", "numpy"} <= names and {"torch_shards", "torch-shards"} & names


def test_the_wheel_requires_exactly_the_torch_release_it_was_built_for(venv):
    shown = subprocess.run(
        [venv_python(venv), "-m", "pip", "show", "torch_shards"], capture_output=True, text=True, cwd=OUTSIDE
    )
    release = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    assert re.search(r"^Requires:.*\btorch\b", shown.stdout, re.M), shown.stdout
    metadata = glob.glob(str(venv / "lib" / "python3*" / "site-packages" / "torch_shards-*.dist-info" / "METADATA"))
    assert f"Requires-Dist: torch=={release}.*" in open(metadata[0]).read()


def test_only_torch_and_the_base_system_are_linked(venv):
    """Every shared object of the installed package needs nothing but torch's libraries (from the torch
    wheel, found through the package's RUNPATH) and the base system; all of them resolve with an
    empty LD_LIBRARY_PATH."""
    package = installed_package(venv)
    torch_lib = glob.glob(str(venv / "lib" / "python3*" / "site-packages" / "torch" / "lib"))[0]
    torch_libraries = set(os.listdir(torch_lib))
    objects = glob.glob(os.path.join(package, "**", "*.so*"), recursive=True)
    objects += glob.glob(os.path.join(os.path.dirname(package), "torch_shards.libs", "*"))
    assert objects
    for path in objects:
        dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
        needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[(.+)\]", dynamic))
        assert needed - torch_libraries - BASE_SYSTEM <= {"libtorch_shards.so", "libtorch_python.so"}, (path, needed)
        resolved = subprocess.run(["ldd", path], capture_output=True, text=True, env={"LD_LIBRARY_PATH": ""}).stdout
        assert "not found" not in resolved, resolved
        for name, where in re.findall(r"^\s*(\S+) => (\S+)", resolved, re.M):
            assert name in BASE_SYSTEM or where.startswith(str(venv)), (path, name, where)


def test_the_native_part_is_at_most_10_mb(venv):
    package = installed_package(venv)
    native = sum(os.path.getsize(path) for path in glob.glob(os.path.join(package, "**", "*.so*"), recursive=True))
    print(f"\ninstalled native part: {native / 1e6:.2f} MB")
    assert native <= 10e6


def test_info_names_the_bundled_libraries(venv):
    done = run_hidden([venv_python(venv), "-m", "torch_shards", "info", "--json"], timeout=120)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["bundled_dependencies"] is True
    assert info["torch"] == torch.__version__.split("+")[0]
    library = os.path.join(installed_package(venv), "lib", "libtorch_shards.so")
    versions = {entry["name"]: entry for entry in info["libraries"]}
    assert set(versions) == {"hdf5", "blosc", "lz4", "zstd", "zlib"}
    for entry in versions.values():  # every one inside the library itself, none from the system
        assert os.path.realpath(entry["location"]) == os.path.realpath(library), entry
    assert versions["hdf5"]["version"] == "1.10.8" and "decode" in versions["hdf5"]["detail"]
    assert "zstd" in versions["blosc"]["detail"] and "lz4" in versions["blosc"]["detail"]
    text = run_hidden([venv_python(venv), "-m", "torch_shards", "info"], timeout=120)
    assert "bundled in the library" in text.stdout and "hdf5" in text.stdout


# The files the fresh venv reads: one per format and codec, written by the reference libraries.
def write_cases(directory):
    rng = np.random.default_rng(5)
    cases = []

    def case(name, path, expected, field="X", sparse=False, **kwargs):
        np.save(directory / f"{name}.npy", expected)
        cases.append({"name": name, "path": str(path), "kwargs": kwargs, "field": field,
                      "expected": str(directory / f"{name}.npy"), "sparse": sparse})  # fmt: skip

    counts = sp.random(120, 30, density=0.1, format="csr", dtype=np.float32, random_state=7)
    counts.data = np.round(counts.data * 10)
    ad.AnnData(X=counts).write_h5ad(directory / "csr.h5ad", compression="gzip")
    case("h5ad-csr", directory / "csr.h5ad", counts.toarray(), sparse=True)
    case("h5ad-csr-dense", directory / "csr.h5ad", counts.toarray(), dense=True)
    dense = rng.standard_normal((120, 12)).astype(np.float32)
    ad.AnnData(X=dense).write_h5ad(directory / "dense.h5ad")
    case("h5ad-dense", directory / "dense.h5ad", dense)
    values = rng.integers(0, 1000, (120, 9)).astype(np.int32)
    with h5py.File(directory / "plain.h5", "w") as f:
        f.create_dataset("gzip", data=values, chunks=(16, 9), compression="gzip", shuffle=True)
        f.create_dataset("lzf", data=values, chunks=(16, 9), compression="lzf")
        f.create_dataset("contiguous", data=values)
        if h5py.h5z.get_filter_info(h5py.h5z.FILTER_SZIP) & h5py.h5z.FILTER_CONFIG_ENCODE_ENABLED:
            f.create_dataset("szip", data=values, chunks=(16, 9), compression="szip")
        szip = "szip" in f
    for name in ["gzip", "lzf", "contiguous"] + (["szip"] if szip else []):
        case(f"hdf5-{name}", directory / "plain.h5", values, dataset=f"/{name}")
    v2 = {
        "blosc-lz4": numcodecs.Blosc(cname="lz4", shuffle=numcodecs.Blosc.SHUFFLE),
        "blosc-zstd": numcodecs.Blosc(cname="zstd", shuffle=numcodecs.Blosc.BITSHUFFLE),
        "zstd": numcodecs.Zstd(level=3),
        "gzip": numcodecs.GZip(level=5),
    }
    for name, compressor in v2.items():
        path = directory / f"v2-{name}.zarr"
        array = zarr.create_array(path, shape=dense.shape, chunks=(16, 6), dtype=dense.dtype, zarr_format=2,
                                  compressors=compressor)  # fmt: skip
        array[:] = dense
        case(f"zarr-v2-{name}", path, dense)
    v3 = {"blosc-lz4": BloscCodec(cname="lz4", shuffle="shuffle"), "zstd": ZstdCodec(level=3), "gzip": GzipCodec()}
    for name, codec in v3.items():
        path = directory / f"v3-{name}.zarr"
        array = zarr.create_array(path, shape=dense.shape, chunks=(16, 6), dtype=dense.dtype, zarr_format=3,
                                  compressors=[codec])  # fmt: skip
        array[:] = dense
        case(f"zarr-v3-{name}", path, dense)
    path = directory / "v3-sharded.zarr"
    array = zarr.create_array(path, shape=dense.shape, chunks=(8, 6), shards=(32, 12), dtype=dense.dtype,
                              zarr_format=3, compressors=[BloscCodec(cname="zstd", shuffle="bitshuffle")])  # fmt: skip
    array[:] = dense
    case("zarr-v3-sharded", path, dense)
    with open(directory / "cases.json", "w") as out:
        json.dump(cases, out)
    return directory / "cases.json", cases


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return write_cases(tmp_path_factory.mktemp("files"))


def test_every_format_reads_back_exactly_and_feeds_dataloader_workers(venv, cases):
    cases_path, written = cases
    done = run_hidden([venv_python(venv), SMOKE, "formats", str(cases_path)], timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    for case in written:
        assert f"{case['name']}: " in done.stdout
    for context in ("fork", "spawn", "forkserver"):
        assert f"exactly once through 2 {context} workers" in done.stdout


def test_the_installed_wheel_reads_urls_over_http_and_s3(venv, cases):
    # The wheel's storage layer (libcurl loaded from the system at the first URL, SigV4, the cache) from a
    # user's side: the same files served by the tests' HTTP server on 127.0.0.1, read plainly over http://
    # and as an unsigned s3:// endpoint, value by value and through fork / spawn / forkserver workers. The
    # system's libcurl links its libzstd (a machine with libcurl has it): kept, beside the wheel's own zstd.
    cases_path, written = cases
    directory = os.path.dirname(str(cases_path))
    root, bucket = os.path.split(directory)
    chosen = [case for case in written if case["name"] in ("h5ad-csr", "zarr-v2-blosc-lz4", "zarr-v3-sharded")]
    assert len(chosen) == 3
    with RangeHTTPServer(root, s3_listing=True) as server:
        remote = []
        for case in chosen:
            name = os.path.relpath(case["path"], directory)
            remote.append(dict(case, name=case["name"] + " over http", path=f"{server.url}/{bucket}/{name}"))
            s3 = {"endpoint_url": server.url, "anonymous": True}
            remote.append(dict(case, name=case["name"] + " over s3", path=f"s3://{bucket}/{name}",
                               kwargs={**case["kwargs"], **s3}))  # fmt: skip
        remote_path = os.path.join(directory, "remote_cases.json")
        with open(remote_path, "w") as out:
            json.dump(remote, out)
        done = run_hidden([venv_python(venv), SMOKE, "formats", remote_path], keep=("libzstd.so*",), timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    for case in remote:
        assert f"{case['name']}: " in done.stdout
    for context in ("fork", "spawn", "forkserver"):
        assert f"exactly once through 2 {context} workers" in done.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_read_disjoint_shares(venv, cases, tmp_path):
    cases_path, written = cases
    env = dict(os.environ, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    ranks = []
    for rank in range(2):
        command = [venv_python(venv), SMOKE, "rank", str(cases_path), str(tmp_path / f"rows{rank}.txt")]
        environment = dict(env, RANK=str(rank))
        ranks.append(subprocess.Popen(hidden(command), env=environment, cwd=OUTSIDE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))  # fmt: skip
    for process in ranks:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
    rows = np.load(written[0]["expected"]).shape[0]
    epochs = [[list(map(int, line.split())) for line in open(tmp_path / f"rows{rank}.txt")] for rank in range(2)]
    for epoch in range(2):
        mine, theirs = epochs[0][epoch], epochs[1][epoch]
        assert len(mine) == len(theirs)  # equal shares: DDP never waits for a missing batch
        assert set(mine) | set(theirs) == set(range(rows))
        # Disjoint but for padding: 15 batches of 8 leave one rank a batch short, padded with 8 repeated rows.
        assert len(set(mine) & set(theirs)) <= 8 and len(mine) + len(theirs) == 128
    assert epochs[0][0] != epochs[0][1]  # the epoch advanced by itself


@pytest.mark.skipif(shutil.which("cmake") is None, reason="needs cmake")
@pytest.mark.timeout(1500)
def test_the_cpp_package_of_the_installed_wheel_builds_and_trains_two_ranks(venv, tmp_path):
    build = tmp_path / "build"
    prefix = cmake_build(os.path.join(ROOT, "examples", "cpp"), build, python=venv_python(venv))
    assert prefix.startswith(str(venv))
    linked = subprocess.run(["ldd", str(build / "train")], capture_output=True, text=True).stdout
    assert re.search(rf"libtorch_shards\.so => {re.escape(str(venv))}", linked), linked
    model, data = tmp_path / "model.pt", tmp_path / "cells.h5ad"
    subprocess.run([sys.executable, os.path.join(ROOT, "examples", "cpp", "make_model.py"), "--model", str(model),
                    "--inputs", "40", "--classes", "4", "--h5ad", str(data), "--rows", "200"],
                   check=True, capture_output=True)  # fmt: skip
    ranks = []
    for rank in range(2):
        command = [str(build / "train"), "--data", str(data), "--model", str(model), "--rank", str(rank),
                   "--world-size", "2", "--store", str(tmp_path / "store"), "--epochs", "1", "--batch-size", "16",
                   "--rows-out", str(tmp_path / f"rows{rank}.txt")]  # fmt: skip
        ranks.append(
            subprocess.Popen(hidden(command), cwd=OUTSIDE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    for process in ranks:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
    rows = [set(map(int, open(tmp_path / f"rows{rank}.txt").read().split())) for rank in range(2)]
    assert rows[0] | rows[1] == set(range(200))
