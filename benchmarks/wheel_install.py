"""What installing the binary wheel costs (issue targets: native part <= 10 MB, pip install <= 10 s
once torch is there), beside the floor of the same run: pip installing a pure-Python wheel of
nearly no size (the resolver, the metadata, the venv's own startup).

    python benchmarks/wheel_install.py [--wheel dist/torch_shards-*.whl] [--rounds 5]

Makes one brand-new venv with this torch and numpy (not timed), then alternates, round by round,
`pip install --no-deps <floor wheel>` and `pip install <torch_shards wheel>` (dependencies resolved
against the installed torch), uninstalling both between rounds. Prints a table and writes
results/wheel_install.{txt,json}.
"""

import argparse
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def floor_wheel(directory):
    """A pure-Python wheel holding one empty module: what any pip install costs."""
    path = os.path.join(directory, "floor_probe-1.0-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("floor_probe.py", "")
        info = "floor_probe-1.0.dist-info/"
        wheel.writestr(info + "METADATA", "Metadata-Version: 2.1\nName: floor_probe\nVersion: 1.0\n")
        wheel.writestr(
            info + "WHEEL", "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        wheel.writestr(info + "RECORD", "")
    return path


def timed(command):
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheel", default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "wheel_install"))
    args = parser.parse_args()
    wheel = args.wheel or max(glob.glob(os.path.join(ROOT, "dist", "torch_shards-*.whl")), key=os.path.getmtime)
    with tempfile.TemporaryDirectory() as directory:
        venv = os.path.join(directory, "venv")
        subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", venv], check=True)
        python = os.path.join(venv, "bin", "python")
        pip = [python, "-m", "pip", "--disable-pip-version-check", "-q"]
        subprocess.run([*pip, "install", f"torch=={torch.__version__}", "numpy"], check=True)
        floor = floor_wheel(directory)
        floors, installs = [], []
        for _ in range(args.rounds):
            floors.append(timed([*pip, "install", "--no-deps", floor]))
            installs.append(timed([*pip, "install", wheel]))
            subprocess.run([*pip, "uninstall", "-y", "floor_probe", "torch_shards"], check=True)
        subprocess.run([*pip, "install", wheel], check=True)
        package = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "torch_shards"))[0]
        objects = sorted(glob.glob(os.path.join(package, "**", "*.so*"), recursive=True))
        sizes = {os.path.relpath(path, package): os.path.getsize(path) for path in objects}
    result = {
        "wheel": os.path.basename(wheel),
        "wheel_bytes": os.path.getsize(wheel),
        "native_bytes": sum(sizes.values()),
        "native_files": sizes,
        "install_seconds": installs,
        "floor_seconds": floors,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}",
    }
    lines = [
        f"{result['wheel']} on {result['machine']}",
        f"{'':<34}{'median':>10}{'min':>10}{'max':>10}",
        f"{'pip install <wheel> (s)':<34}" + "".join(f"{f(installs):>10.2f}" for f in (statistics.median, min, max)),
        f"{'pip install <empty wheel> (s)':<34}"
        + "".join(f"{f(floors):>10.2f}" for f in (statistics.median, min, max)),
        f"{'ratio to the empty wheel':<34}{statistics.median(installs) / statistics.median(floors):>10.2f}",
        f"wheel file: {result['wheel_bytes'] / 1e6:.2f} MB; "
        f"installed native part: {result['native_bytes'] / 1e6:.2f} MB",
    ]
    lines += [f"  {name}: {size / 1e6:.2f} MB" for name, size in sizes.items()]
    text = "\n".join(lines)
    print(text)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".txt", "w") as out:
        out.write(text + "\n")
    with open(args.out + ".json", "w") as out:
        json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
