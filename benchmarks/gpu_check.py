"""The GPU check (make gpu-check): one prepared run on a machine with a CUDA GPU that builds the
extension, runs every GPU test and the GPU benchmarks, and writes every table, within a wall-time budget
(8 minutes by default), each step timed and bounded.

    make gpu-check                                   # on the GPU machine (.gpu/ unpacked first)
    python -m benchmarks.gpu_check --no-build        # the build done already
    python -m benchmarks.gpu_check --quick --no-build --out /tmp/check/   # the CPU steps, small, anywhere

Steps, in order:
  machine     the GPU, the CPU, the NUMA nodes (and the GPU's), torch
  build       pip install -e . (incremental: build/native is reused)
  gpu tests   tests/test_device.py, tests/test_device_decode.py, the NCCL group test, the
              pinned-recycling tests under fork and spawn DataLoader workers            (GPU)
  decode      benchmarks/gpu_decode: zarr chunks decoded on the GPU (nvCOMP) against the host path and the
              pinned H2D limit, dense and CSR                                            (GPU)
  device      benchmarks/device_throughput: dense at each batch size beside the pinned H2D limit of each
              round (min / median / max), CSR on the device against the host only, the loop's waiting
              with 5 ms and 1 ms steps                                                  (GPU)
  paths       benchmarks/h2d_paths: ways rows in random blocks reach the GPU (host gather + copy, block copies
              from a pinned source or a registered mapping, a GPU gather over the bus) beside the pinned limit
                                                                                         (GPU)
  host path   benchmarks/host_path with every core (16 on the GPU machine): torch_shards against a
              hand-written torch gather at batch 256 and 4096, page faults after epoch 1

Results: benchmarks/results/<name>_<gpu>.{txt,json} (gpu_decode_<gpu>, device_throughput_<gpu>, h2d_paths_<gpu>,
host_path_<gpu>, and
gpu_check_<gpu> with every step's status, time and output tail); <gpu> is the GPU's name as a file name
part, "cpu" without one. Without a CUDA GPU each GPU step prints "no CUDA GPU: skipping <step>", the
others run, and the exit status is 0 if they passed. Exit status 1 if a step failed or ran out of time.
"""

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time

try:
    from benchmarks.harness import cli, machine
except ImportError:  # run as a file: benchmarks/ is on sys.path
    from harness import cli, machine

GPU_TESTS = [
    "tests/test_device.py",
    "tests/test_device_decode.py",
    "tests/test_ddp.py::test_nccl_world_size_one",
    "tests/test_host_path.py::test_pinned_batches_from_workers_are_never_overwritten",
    "tests/test_host_path.py::test_pinned_batches_in_process_are_recycled_and_never_overwritten",
    "tests/test_pipeline.py::test_pin_memory_gives_pinned_batches",
    "tests/test_coming_from.py::test_monitored_loader_reports_device_memory",
]


def gpu_name():
    """The CUDA GPU's name, or None (torch without CUDA, or no GPU)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def machine_lines(gpu):
    import torch

    lines = [
        f"GPU: {gpu or 'none (no CUDA GPU)'}",
        f"CPU: {machine.cpu_description()}; {machine.platform_description()}",
        f"cores allowed: {len(os.sched_getaffinity(0))}; memory available: {machine.available_bytes() / 2**30:.1f} GiB",
        f"NUMA nodes: {machine.numa_nodes() or 'unknown'}",
        f"torch {torch.__version__} (CUDA {torch.version.cuda}); Python {platform.python_version()}",
    ]
    if gpu and shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,pci.bus_id,memory.total,clocks.max.sm", "--format=csv,noheader"]
        found = subprocess.run(query, capture_output=True, text=True, timeout=30)
        lines.append(f"nvidia-smi: {found.stdout.strip() or found.stderr.strip()}")
        topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30)
        if topo.returncode == 0:
            lines.append("nvidia-smi topo -m:\n" + topo.stdout.rstrip())
    return lines


class Check:
    """The steps run so far, the deadline, and the summary written at the end."""

    def __init__(self, budget, out_dir, slug):
        self.start = time.monotonic()
        self.deadline = self.start + budget
        self.out_dir = out_dir
        self.slug = slug
        self.steps = []
        self.failed = False

    def left(self):
        return self.deadline - time.monotonic()

    def skip(self, name, why):
        print(f"[gpu-check] {why}: skipping {name}", flush=True)
        self.steps.append({"step": name, "status": "skipped", "why": why, "seconds": 0.0})

    def run(self, name, command, timeout, env=None):
        """Runs command (its output shown as it comes) within min(timeout, the time left)."""
        limit = min(timeout, self.left())
        if self.left() < 5:
            self.failed = True
            self.skip(name, "out of time")
            return False
        print(f"[gpu-check] {name}: {' '.join(command)} (at most {limit:.0f} s)", flush=True)
        begin = time.monotonic()
        tail = []
        process = subprocess.Popen(
            command,
            cwd=cli.ROOT,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

        def show():  # the step's output as it comes, its tail kept
            for line in iter(process.stdout.readline, ""):
                print(line, end="", flush=True)
                tail.append(line.rstrip("\n"))
                del tail[:-40]

        reader = threading.Thread(target=show, daemon=True)
        reader.start()
        try:
            rc = process.wait(timeout=limit)  # a step that hangs, with output or without, is stopped
            status = "ok" if rc == 0 else f"failed (exit status {rc})"
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the step's own process group (start_new_session)
            process.wait()
            status = f"timed out after {limit:.0f} s"
        reader.join(timeout=10)
        seconds = time.monotonic() - begin
        print(f"[gpu-check] {name}: {status} in {seconds:.1f} s", flush=True)
        self.steps.append({"step": name, "status": status, "seconds": seconds, "tail": tail})
        self.failed |= status != "ok"
        return status == "ok"

    def write(self, machine_text):
        total = time.monotonic() - self.start
        rows = [f"| {s['step']} | {s['status']} | {s['seconds']:.1f} |" for s in self.steps]
        text = "\n".join(
            [
                machine_text,
                "",
                "| step | status | seconds |",
                "|---|---|---|",
                *rows,
                "",
                f"total {total:.1f} s",
            ]
        )
        out = os.path.join(self.out_dir, f"gpu_check_{self.slug}")
        os.makedirs(self.out_dir, exist_ok=True)
        with open(out + ".txt", "w") as f:
            f.write(text + "\n")
        with open(out + ".json", "w") as f:
            json.dump({"machine": machine_text, "steps": self.steps, "total_seconds": total}, f, indent=1)
        print("\n" + text)
        print(f"\nwritten: {out}.txt, {out}.json")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=480, help="wall-time budget in seconds (default 8 minutes)")
    parser.add_argument("--no-build", action="store_true", help="the extension is built already")
    parser.add_argument("--quick", action="store_true", help="small benchmark runs (to check the script itself)")
    parser.add_argument("--out", default=cli.RESULTS, help="the results' directory (default benchmarks/results)")
    parser.add_argument(
        "--skip", default="", help="comma-separated steps to leave out: build, tests, decode, device, paths, host"
    )
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    python = sys.executable

    began = time.monotonic()
    gpu = gpu_name()
    slug = machine.gpu_slug(gpu) if gpu else "cpu"
    check = Check(args.budget, os.path.abspath(args.out), slug)
    check.start = began  # the total counts the machine step too
    machine_text = "\n".join(machine_lines(gpu))
    print(machine_text, flush=True)
    print(f"[gpu-check] machine: ok in {time.monotonic() - began:.1f} s", flush=True)

    if args.no_build or "build" in skip:
        check.skip("build", "--no-build")
    else:
        build = [python, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--no-index", "-e", "."]
        # Warnings stay warnings there: the GPU machine's compiler is newer than the one CI builds with.
        cmake_args = os.environ.get("TORCH_SHARDS_CMAKE_ARGS", "") + " -DTORCH_SHARDS_WARNINGS_AS_ERRORS=OFF"
        env = {"MAX_JOBS": str(os.cpu_count()), "TORCH_SHARDS_CMAKE_ARGS": cmake_args.strip()}
        if not check.run("build", build, timeout=300, env=env):
            check.write(machine_text)
            return 1  # nothing after it would test this tree

    quick = args.quick
    if "tests" in skip:
        check.skip("gpu tests", "--skip tests")
    elif not gpu:
        check.skip("gpu tests", "no CUDA GPU")
    else:
        timeout = ["-o", "faulthandler_timeout=120"]
        check.run("gpu tests", [python, "-m", "pytest", "-q", "-rs", *timeout, *GPU_TESTS], timeout=200)

    out = check.out_dir
    if "decode" in skip:
        check.skip("decode benchmark", "--skip decode")
    elif not gpu:
        check.skip("decode benchmark", "no CUDA GPU")
    else:
        sizes = ["--rows", "8192", "--csr-rows", "8192", "--rounds", "1"] if quick else ["--rounds", "3", "--profile"]
        command = [python, "-m", "benchmarks.gpu_decode", *sizes, "--out", os.path.join(out, f"gpu_decode_{slug}")]
        check.run("decode benchmark", command, timeout=120)

    if "device" in skip:
        check.skip("device benchmark", "--skip device")
    elif not gpu:
        check.skip("device benchmark", "no CUDA GPU")
    else:
        sizes = (
            ["--rows", "20000", "--rounds", "2", "--epochs", "1"]
            if quick
            else ["--rows", "100000", "--rounds", "3", "--profile"]
        )
        command = [python, "-m", "benchmarks.device_throughput", *sizes, "--batch-sizes", "1024", "4096"]
        command += ["--steps", "5", "1", "--out", os.path.join(out, f"device_throughput_{slug}")]
        check.run("device benchmark", command, timeout=120)

    if "paths" in skip:
        check.skip("paths benchmark", "--skip paths")
    elif not gpu:
        check.skip("paths benchmark", "no CUDA GPU")
    else:
        sizes = ["--rows", "20000", "--rounds", "1"] if quick else ["--rows", "200000", "--rounds", "3"]
        command = [python, "-m", "benchmarks.h2d_paths", *sizes, "--out", os.path.join(out, f"h2d_paths_{slug}")]
        check.run("paths benchmark", command, timeout=90)

    if "host" in skip:
        check.skip("host path benchmark", "--skip host")
    else:
        cores = len(os.sched_getaffinity(0))
        if quick:
            sizes = ["--rows", "4000", "--epochs", "2", "--batch-sizes", "256", "--sources", "TensorSource"]
        else:
            sizes = ["--rows", "100000", "--epochs", "2", "--batch-sizes", "256", "4096"]
        command = [python, "-m", "benchmarks.host_path", *sizes, "--threads", str(cores)]
        command += ["--out", os.path.join(out, f"host_path_{slug}")]
        check.run("host path benchmark", command, timeout=120)

    check.write(machine_text)
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
