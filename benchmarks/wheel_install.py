"""What installing the binary wheel costs (issue targets: native part <= 10 MB, pip install <= 10 s
once torch is there), beside the floor of the same run: pip installing a pure-Python wheel of
nearly no size (the resolver, the metadata, the venv's own startup).

    python -m benchmarks.wheel_install [--wheel dist/torch_shards-*.whl] [--rounds 5]

Makes one brand-new venv with this torch and numpy (not timed), then alternates, round by round,
`pip install --no-deps <floor wheel>` and `pip install <torch_shards wheel>` (dependencies resolved
against the installed torch), uninstalling both between rounds. Prints a table and writes
results/wheel_install.{txt,json}.
"""

import glob
import os
import subprocess
import sys
import tempfile
import time
import zipfile

import torch

try:
    from benchmarks.harness import cli, machine, results, rounds
except ImportError:  # run as a file: benchmarks/ is on sys.path
    from harness import cli, machine, results, rounds


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
    parser = cli.parser(__doc__, "wheel_install", rounds=5)
    parser.add_argument("--wheel", default=None, help="default: the newest dist/torch_shards-*.whl")
    args = cli.parse(parser)
    wheels = glob.glob(os.path.join(cli.ROOT, "dist", "torch_shards-*.whl"))
    if not args.wheel and not wheels:
        print("wheel_install: no wheel in dist/ (make wheel, or --wheel PATH); nothing measured")
        return
    wheel = args.wheel or max(wheels, key=os.path.getmtime)
    with tempfile.TemporaryDirectory() as directory:
        venv = os.path.join(directory, "venv")
        subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", venv], check=True)
        python = os.path.join(venv, "bin", "python")
        pip = [python, "-m", "pip", "--disable-pip-version-check", "-q"]
        subprocess.run([*pip, "install", f"torch=={torch.__version__}", "numpy"], check=True)
        floor = floor_wheel(directory)
        measured = rounds.alternate(
            {
                "floor": lambda: timed([*pip, "install", "--no-deps", floor]),
                "install": lambda: timed([*pip, "install", wheel]),
                "uninstall": lambda: subprocess.run(
                    [*pip, "uninstall", "-y", "floor_probe", "torch_shards"], check=True
                ),
            },
            args.rounds,
        )
        floors, installs = measured["floor"], measured["install"]
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
        "machine": machine.platform_description(),
    }
    lines = [
        f"{result['wheel']} on {result['machine']}",
        f"{'':<34}{'median':>10}{'min':>10}{'max':>10}",
        f"{'pip install <wheel> (s)':<34}" + "".join(f"{f(installs):>10.2f}" for f in (rounds.median, min, max)),
        f"{'pip install <empty wheel> (s)':<34}" + "".join(f"{f(floors):>10.2f}" for f in (rounds.median, min, max)),
        f"{'ratio to the empty wheel':<34}{rounds.median(installs) / rounds.median(floors):>10.2f}",
        f"wheel file: {result['wheel_bytes'] / 1e6:.2f} MB; "
        f"installed native part: {result['native_bytes'] / 1e6:.2f} MB",
    ]
    lines += [f"  {name}: {size / 1e6:.2f} MB" for name, size in sizes.items()]
    text = "\n".join(lines)
    print(text)
    results.write(args.out, text, result)


if __name__ == "__main__":
    main()
