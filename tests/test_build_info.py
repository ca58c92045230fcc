"""What an installation says about itself (python -m torch_shards info, torch_shards::build_info()),
and the import-time refusal of a torch release other than the one the library was built for."""

import json
import os
import subprocess
import sys

import pytest
import torch

import torch_shards as ts
from torch_shards._library import check_torch


def test_build_info_names_every_library_with_its_version_and_the_file_it_runs_from():
    info = ts.build_info()
    assert info["version"] == ts.__version__
    assert info["torch"] == torch.__version__.split("+")[0]
    assert info["running"]["torch"] == torch.__version__
    assert os.path.samefile(info["library"], ts.LIBRARY_PATH)
    libraries = {entry["name"]: entry for entry in info["libraries"]}
    assert set(libraries) == {"hdf5", "blosc", "lz4", "zstd", "zlib"}
    for entry in libraries.values():
        assert entry["version"][0].isdigit(), entry
        assert os.path.exists(entry["location"]), entry
    # The source build runs the system's libraries; the wheel carries them inside the library.
    inside = [os.path.samefile(entry["location"], ts.LIBRARY_PATH) for entry in libraries.values()]
    assert inside == [info["bundled_dependencies"]] * len(inside)
    assert "szip filter" in libraries["hdf5"]["detail"]
    assert info["url_reader"].startswith("libcurl "), info["url_reader"]  # the system's, loaded for URLs
    assert info["cpu"]["architecture"] in ("x86_64", "aarch64", "unknown")
    assert info["compiler"]


def test_the_torchscript_door_answers_the_same():
    assert json.loads(torch.ops.torch_shards.build_info())["libraries"] == ts.build_info()["libraries"]


def test_python_m_torch_shards_info_prints_a_report_and_json():
    text = subprocess.run([sys.executable, "-m", "torch_shards", "info"], capture_output=True, text=True, check=True)
    assert f"torch_shards {ts.__version__}" in text.stdout and "hdf5" in text.stdout and "cpu:" in text.stdout
    dumped = subprocess.run(
        [sys.executable, "-m", "torch_shards", "info", "--json"], capture_output=True, text=True, check=True
    )
    assert json.loads(dumped.stdout)["version"] == ts.__version__


def test_another_torch_release_is_refused_with_the_ways_out():
    problem = check_torch("2.13.0+cpu", None, "2.12.1+cpu", None)
    message = str(problem)
    assert "built for torch 2.13" in message and "torch 2.12.1+cpu is installed" in message
    assert "pip install 'torch==2.13.*'" in message
    assert "make wheel TORCH=torch==2.12.1" in message
    assert check_torch("2.13.0+cpu", None, "2.13.1", "13.0") is None  # same release: same ABI
    assert "no CUDA" in str(check_torch("2.11.0+cu130", "13.0", "2.11.0+cpu", None))


def test_importing_under_another_torch_release_raises_that_message():
    script = "import torch; torch.__version__ = '2.99.0'; import torch_shards"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode != 0
    assert "ImportError: torch_shards was built for torch" in done.stderr
    assert "torch 2.99.0 is installed" in done.stderr


@pytest.mark.parametrize("flag", ["--version", "--cmake-prefix-path"])
def test_the_other_commands_still_answer(flag):
    done = subprocess.run([sys.executable, "-m", "torch_shards", flag], capture_output=True, text=True, check=True)
    assert done.stdout.strip()
