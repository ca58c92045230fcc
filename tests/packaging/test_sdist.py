"""The sdist (make sdist): everything the native build needs and no build output, and a build from it
on a machine missing a -dev package stops at once naming the Debian package to install. (make wheel
builds the wheel from this same sdist: test_wheel.py checks what that build makes.)"""

import os
import subprocess
import sys
import tarfile

import pytest

import torch_shards as ts

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    out = tmp_path_factory.mktemp("sdist")
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out), ROOT],
                   check=True, capture_output=True)  # fmt: skip
    return out / f"torch_shards-{ts.__version__}.tar.gz"


def tracked(*paths):
    listed = subprocess.run(["git", "-C", ROOT, "ls-files", *paths], capture_output=True, text=True, check=True)
    return set(listed.stdout.split())


def test_the_sdist_holds_the_native_sources_and_no_build_output(sdist):
    prefix = f"torch_shards-{ts.__version__}/"
    with tarfile.open(sdist) as archive:
        names = {name[len(prefix) :] for name in archive.getnames()}
    needed = tracked("csrc", "include", "cmake", "torch_shards") | {"CMakeLists.txt", "setup.py", "pyproject.toml"}
    assert needed <= names, sorted(needed - names)
    assert not [name for name in names if name.endswith(".so") or name.endswith("_build_info.py")]
    assert not [name for name in names if name.startswith(("torch_shards/lib/", "build/", "tests/"))]


@pytest.mark.parametrize("bundled", ["0", "1"])
def test_a_build_without_the_dev_packages_names_the_packages_to_install(sdist, tmp_path, bundled):
    empty = tmp_path / "no-pkg-config-files"
    empty.mkdir()
    env = dict(os.environ, PKG_CONFIG_LIBDIR=str(empty), PKG_CONFIG_PATH="", TORCH_SHARDS_BUNDLED_DEPENDENCIES=bundled)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(tmp_path), str(sdist)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "torch_shards needs these to build" in output
    assert "apt-get install nlohmann-json3-dev" in output
    for package in ("libhdf5-dev", "libblosc-dev", "liblz4-dev", "libzstd-dev", "zlib1g-dev"):
        # The wheel's build makes these itself.
        assert (f"apt-get install {package}" in output) == (bundled == "0"), package
