"""Fuzzing harness of torch_shards' readers.

    python tests/fuzz/run.py --cases 3000            # the full run (see CONTRIBUTING.md)
    python tests/fuzz/run.py --quick                 # the fixed-seed run of the test suite
    python tests/fuzz/run.py --case 1234 --keep DIR  # one case, its files kept, both results shown

Seed files are written by h5py, anndata and zarr (seeds.py); each case copies
one seed (case i uses seed i mod the number of seeds, so every seed gets the
same share), mutates it (mutators.py) and reads every row of it twice, each
in a forked child under a time limit and an address-space limit: once with
torch_shards and once with the reference library (readers.py). The case is
classified:

  same data          both read the same values
  original data      torch_shards reads the seed's original values; the
                     reference refuses or differs (the mutation hit a part
                     torch_shards does not read, or one the reference misreads)
  both refuse        torch_shards raises a clean error naming the file and
                     the reference refuses too
  refused, listed    torch_shards refuses a file the reference reads, for a
                     reason listed in KNOWN_REFUSALS
  -- failures --
  refused            torch_shards refuses a file the reference reads, for no
                     listed reason
  silent difference  torch_shards returns data that is neither the
                     reference's nor the original's
  crash              killed by a signal
  hang               still running at the time limit
  memory blow-up     allocated beyond the limit (MemoryError, bad_alloc) or
                     grew its resident memory past --rss-mb
  unclear error      an exception that is not a ValueError/RuntimeError, or
                     whose message does not name the file

The exit status is 1 when any failure occurred. --report writes every case
as JSON.
"""

import argparse
import json
import os
import pickle
import re
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import mutators  # noqa: E402
import readers  # noqa: E402
import seeds as seed_files  # noqa: E402

FAILURES = ["refused", "silent difference", "crash", "hang", "memory blow-up", "unclear error"]
CLASSES = ["same data", "original data", "both refuse", "refused, listed"] + FAILURES

# Refusals of files the reference reads, each with why torch_shards is right
# to refuse: (regular expression on torch_shards' message, when: "altered"
# if the refusal is right only when the reference returns data that differs
# from the seed's (the file is corrupt and the reference does not notice),
# "any" if it is right whatever the reference returns, reason).
KNOWN_REFUSALS = [
    (
        r"corrupt zstd data|zstd data decompresses to|invalid zstd frame|zstd data is truncated",
        "altered",
        "libzstd rejects the chunk's stream; the reference returns values that were never written",
    ),
    (
        r"corrupt (zlib|gzip) stream|(zlib|gzip) stream (is truncated|decompresses to more)",
        "altered",
        "zlib rejects the chunk's stream; the reference returns values that were never written",
    ),
    (
        r"blosc (header|frame)|invalid blosc",
        "any",
        "the blosc header claims more bytes than the chunk holds: numcodecs decodes it anyway, reading past the "
        "chunk (original values only when the bytes it needs happen to be there)",
    ),
    (
        r"chunks, \d+ of them at positions of the chunk grid|is not on the chunk grid|two chunks at the same grid",
        "altered",
        "a chunk's coordinates in the HDF5 chunk index are corrupt: HDF5 2.0 reads that chunk as never written",
    ),
    (
        r"claims \d+ bytes at address \d+, outside the file|two of its chunks overlap in the file",
        "altered",
        "a chunk index entry pointing outside the file or into another chunk: the reference returns other bytes",
    ),
    (
        r"shard index entry \d+ \(offset \d+, nbytes \d+\) lies outside the shard",
        "altered",
        "a shard index entry pointing outside its shard: zarr-python reads that inner chunk as never written",
    ),
    (
        r"scale-offset chunk (holds \d+ bytes, too few|packs \d+ bits into)",
        "altered",
        "a scale-offset chunk that cannot hold its values: HDF5 unpacks them from past the chunk's end",
    ),
    (
        r"stored chunk holds \d+ bytes, expected \d+",
        "altered",
        "a chunk marked unfiltered whose size is not the chunk's: HDF5 reads its first bytes as the values",
    ),
    (
        r"the shard has 0 bytes",
        "altered",
        "an empty shard file: zarr-python reads it as never written, but the sharding specification gives every "
        "shard an index",
    ),
    (
        r"must run from 0 to the number of stored values",
        "any",
        "indptr ends below the number of stored values: scipy ignores the values past it, torch_shards takes CSR "
        "arrays that disagree as corrupt",
    ),
    (
        r"unsupported element type \(HDF5 (bitfield|opaque|time|reference|array|string|compound|variable-length"
        r"|integer, \d+ bytes; \d+ significant bits|float, \d+ bytes; not an IEEE)",
        "any",
        "the mutation made the dataset's type one torch_shards does not read as numbers (h5py returns raw values)",
    ),
    (
        r"is not an array of strings|not a string array \(data type",
        "any",
        "obs/var names from a column that is not a string array (the AnnData format stores names as strings; "
        "anndata converts numbers)",
    ),
    (
        r"above 2\^63 - 1|more than 2\^63|is not an integer: -?[0-9.]+e\+",
        "any",
        "a size of 2^63 or more, which numpy, h5py and zarr cannot address either",
    ),
    (
        r'"(shape|chunks|chunk_shape)" is not an integer: (true|false)$',
        "any",
        "zarr-python takes JSON true/false as the integers 1/0 (a Python bool is an int); the specification's "
        "shapes hold integers",
    ),
    (
        r"unsupported column encoding ''",
        "any",
        "an obs column group without encoding-type: anndata reads it as something else (issue 12's reader, "
        "anndata.*, refuses it)",
    ),
    (
        r'"(shape|chunks|chunk_shape)" is not a list: -?\d+$',
        "any",
        "zarr-python accepts a bare integer where the zarr specification requires a list of integers",
    ),
]

MEMORY_MESSAGES = re.compile(r"bad_alloc|MemoryError|out of memory|memory allocation failed|Cannot allocate", re.I)


def _status():
    values = {}
    with open("/proc/self/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmSize", "VmRSS", "VmHWM"):
                values[key] = int(value.split()[0]) * 1024
    return values


def _child(role, seed, path, result_path, rows_seed, headroom):
    """Runs in the forked child: read, write the result, exit without cleanup."""
    code = 0
    try:
        start = _status()
        resource.setrlimit(resource.RLIMIT_AS, (start["VmSize"] + headroom, resource.RLIM_INFINITY))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        rng = np.random.default_rng(rows_seed)
        try:
            reader = readers.read_ours if role == "ours" else readers.read_reference
            outcome = {"result": reader(seed, path, rng)}
        except BaseException as error:  # noqa: BLE001 - every exception is an outcome
            outcome = {
                "error": type(error).__name__,
                "message": str(error),
                "traceback": traceback.format_exc(limit=-4),
            }
        end = _status()
        outcome["rss_growth"] = end["VmHWM"] - start["VmRSS"]
        with open(result_path, "wb") as out:
            pickle.dump(outcome, out)
    except BaseException:  # noqa: BLE001
        code = 3
    os._exit(code)


class Runner:
    def __init__(self, args, seeds, seed_dir, work_dir):
        self.args = args
        self.seeds = seeds
        self.seed_dir = seed_dir
        self.work_dir = work_dir
        self.originals = {}

    def launch(self, role, seed, case_dir, rows_seed):
        result_path = os.path.join(case_dir, f"{role}.pkl")
        path = os.path.join(case_dir, seed["path"])
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            # The children's stderr (HDF5's own diagnostics, warnings) is not the report.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.dup2(devnull, 1)
            _child(role, seed, path, result_path, rows_seed, self.args.memory_mb << 20)
        return pid, result_path

    def run_children(self, jobs):
        """jobs: [(key, role, seed, case_dir, rows_seed)] -> {(key, role): outcome}; at most --jobs at once."""
        pending = list(jobs)
        running = {}
        outcomes = {}
        while pending or running:
            while pending and len(running) < self.args.jobs:
                key, role, seed, case_dir, rows_seed = pending.pop(0)
                pid, result_path = self.launch(role, seed, case_dir, rows_seed)
                running[pid] = (key, role, result_path, time.monotonic())
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                now = time.monotonic()
                for child, (key, role, _, started) in list(running.items()):
                    if now - started > self.args.timeout:
                        os.kill(child, signal.SIGKILL)
                        os.waitpid(child, 0)
                        del running[child]
                        outcomes[(key, role)] = {"hang": True}
                time.sleep(0.002)
                continue
            if pid not in running:
                continue
            key, role, result_path, _ = running.pop(pid)
            if os.WIFSIGNALED(status):
                outcomes[(key, role)] = {"signal": signal.Signals(os.WTERMSIG(status)).name}
            elif os.path.exists(result_path):
                with open(result_path, "rb") as result:
                    outcomes[(key, role)] = pickle.load(result)
            else:
                outcomes[(key, role)] = {"signal": f"exit status {os.WEXITSTATUS(status)} without a result"}
        return outcomes

    # ------------------------------------------------------------------ cases

    def prepare(self, index):
        rng = np.random.default_rng([self.args.seed, index])
        seed = self.seeds[index % len(self.seeds)]
        case_dir = os.path.join(self.work_dir, f"case-{index}")
        shutil.rmtree(case_dir, ignore_errors=True)
        os.makedirs(case_dir)
        source = os.path.join(self.seed_dir, seed["path"])
        target = os.path.join(case_dir, seed["path"])
        if os.path.isdir(source):
            shutil.copytree(source, target)
        else:
            shutil.copy(source, target)
        mutator = mutators.pick_mutator(seed, rng)
        try:
            mutation = f"{mutator.__name__}: {mutator(case_dir, seed, rng)}"
        except Exception as error:  # noqa: BLE001 - a mutation that cannot apply leaves the copy as it was
            mutation = f"{mutator.__name__}: not applied ({type(error).__name__}: {error})"
        return seed, case_dir, mutation, int(rng.integers(2**31))

    def check_seeds(self):
        """Both readers read every pristine seed, and agree: else the harness itself is wrong."""
        jobs = []
        for seed in self.seeds:
            case_dir = os.path.join(self.work_dir, "pristine-" + seed["name"])
            os.makedirs(case_dir, exist_ok=True)
            target = os.path.join(case_dir, seed["path"])
            source = os.path.join(self.seed_dir, seed["path"])
            if os.path.isdir(source):
                shutil.copytree(source, target, dirs_exist_ok=True)
            else:
                shutil.copy(source, target)
            jobs += [(seed["name"], role, seed, case_dir, 0) for role in ("ours", "reference")]
        outcomes = self.run_children(jobs)
        problems = []
        for seed in self.seeds:
            ours, reference = outcomes[(seed["name"], "ours")], outcomes[(seed["name"], "reference")]
            if "result" not in ours or "result" not in reference:
                problems.append(f"{seed['name']}: ours {_brief(ours)}; reference {_brief(reference)}")
                continue
            difference = readers.difference(ours["result"], reference["result"])
            if reference["result"]["refused"]:
                problems.append(f"{seed['name']}: the reference refuses parts: {reference['result']['refused']}")
            elif difference:
                problems.append(f"{seed['name']}: pristine seed read differently: {difference}")
            self.originals[seed["name"]] = reference["result"]
            shutil.rmtree(os.path.join(self.work_dir, "pristine-" + seed["name"]), ignore_errors=True)
        if problems:
            raise SystemExit("the harness is broken, seeds do not read alike:\n  " + "\n  ".join(problems))

    def classify(self, seed, case_dir, ours, reference):
        original = self.originals[seed["name"]]
        if "signal" in ours:
            return "crash", ours["signal"]
        if ours.get("hang"):
            return "hang", f"no result after {self.args.timeout} s"
        if ours.get("rss_growth", 0) > self.args.rss_mb << 20:
            return "memory blow-up", f"resident memory grew by {ours['rss_growth'] >> 20} MiB"
        reference_reads = "result" in reference and reference.get("rss_growth", 0) <= self.args.rss_mb << 20
        if "error" in ours:
            message = ours["message"]
            if ours["error"] == "MemoryError" or MEMORY_MESSAGES.search(message):
                return "memory blow-up", f"{ours['error']}: {message}"
            named = os.path.join(case_dir, seed["path"])
            if ours["error"] not in ("ValueError", "RuntimeError") or named not in message:
                return "unclear error", f"{ours['error']}: {message}"
            if not reference_reads or reference["result"]["refused"]:
                return "both refuse", message
            altered = readers.difference(reference["result"], original) is not None
            for pattern, when, reason in KNOWN_REFUSALS:
                if re.search(pattern, message) and (when == "any" or altered):
                    return "refused, listed", f"{message} [{reason}]"
            return "refused", f"{message} (the reference reads {'altered' if altered else 'the original'} data)"
        result = ours["result"]
        refused = reference["result"]["refused"] if reference_reads else {}
        if reference_reads and not refused:
            difference = readers.difference(result, reference["result"])
            if difference is None:
                return "same data", ""
            if readers.difference(result, original) is None:
                return "original data", f"the reference differs: {difference}"
            return "silent difference", f"from the reference: {difference}"
        if readers.difference(result, original) is None:
            return "original data", f"the reference refuses: {_brief(reference)}"
        if refused:
            # The reference refuses some parts: torch_shards must read the
            # others as the reference does, and those as they were written.
            read = readers.parts_of(reference["result"])
            elsewhere = readers.parts_of(result) - read
            as_reference = readers.difference(result, reference["result"], read)
            as_written = readers.difference(result, original, elsewhere)
            if as_reference is None and as_written is None:
                return "original data", f"the reference refuses {sorted(refused)}; the rest reads alike"
            return "silent difference", f"the reference refuses {refused}; {as_reference or as_written}"
        return "silent difference", f"the reference refuses ({_brief(reference)}) but torch_shards returns altered data"

    def run(self, indices):
        records = []
        batch_size = max(self.args.jobs * 4, 8)
        for start in range(0, len(indices), batch_size):
            prepared = {index: self.prepare(index) for index in indices[start : start + batch_size]}
            jobs = []
            for index, (seed, case_dir, _, rows_seed) in prepared.items():
                jobs += [(index, role, seed, case_dir, rows_seed) for role in ("ours", "reference")]
            outcomes = self.run_children(jobs)
            for index, (seed, case_dir, mutation, _) in prepared.items():
                ours, reference = outcomes[(index, "ours")], outcomes[(index, "reference")]
                kind, detail = self.classify(seed, case_dir, ours, reference)
                record = {
                    "case": index,
                    "seed": seed["name"],
                    "mutation": mutation,
                    "class": kind,
                    "detail": detail,
                    "reference": _brief(reference),
                }
                if kind in FAILURES and "traceback" in ours:
                    record["traceback"] = ours["traceback"]
                records.append(record)
                if self.args.keep and kind in FAILURES:
                    shutil.copytree(case_dir, os.path.join(self.args.keep, f"case-{index}"), dirs_exist_ok=True)
                if self.args.verbose or kind in FAILURES:
                    print(f"[{index}] {seed['name']}: {kind}: {mutation}\n    {detail[:400]}", flush=True)
                shutil.rmtree(case_dir, ignore_errors=True)
        return records


def _brief(outcome):
    if "result" in outcome:
        refused = outcome["result"]["refused"]
        return f"refuses {'; '.join(f'{k}: {v[:120]}' for k, v in refused.items())}" if refused else "reads"
    if "signal" in outcome:
        return f"crash ({outcome['signal']})"
    if outcome.get("hang"):
        return "hang"
    return f"{outcome.get('error')}: {outcome.get('message', '')[:200]}"


def summarise(records, seeds):
    counts = Counter(record["class"] for record in records)
    lines = [f"{len(records)} cases over {len(seeds)} seed files"]
    for kind in CLASSES:
        lines.append(f"  {kind:<18} {counts.get(kind, 0)}")
    by_seed = Counter((record["seed"], record["class"]) for record in records)
    lines.append(
        "per seed: " + ", ".join(f"{s['name']} {sum(by_seed[(s['name'], k)] for k in CLASSES)}" for s in seeds)
    )
    return "\n".join(lines), counts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--quick", action="store_true", help="the test suite's run: 340 cases, seed 0")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the mutations")
    parser.add_argument("--case", type=int, action="append", help="run only these cases (repeatable)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="children at once")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per read before it counts as a hang")
    parser.add_argument("--memory-mb", type=int, default=2048, help="address space a child may add")
    parser.add_argument("--rss-mb", type=int, default=512, help="resident growth that counts as a blow-up")
    parser.add_argument("--keep", help="copy the files of failing cases here")
    parser.add_argument("--report", help="write every case as JSON here")
    parser.add_argument("--verbose", action="store_true", help="print every case")
    args = parser.parse_args(argv)
    if args.quick:
        args.cases = 340
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    indices = args.case if args.case else list(range(args.cases))
    started = time.monotonic()
    readers.preload()  # once here, not in every forked child
    with tempfile.TemporaryDirectory(prefix="torch_shards_fuzz_") as scratch:
        seed_dir = os.path.join(scratch, "seeds")
        work_dir = os.path.join(scratch, "cases")
        os.makedirs(work_dir)
        seeds = seed_files.write_seeds(seed_dir)
        runner = Runner(args, seeds, seed_dir, work_dir)
        runner.check_seeds()
        records = runner.run(indices)
    text, counts = summarise(records, seeds)
    print(text)
    print(f"{time.monotonic() - started:.0f} s")
    if args.report:
        with open(args.report, "w") as out:
            summary = {k: counts.get(k, 0) for k in CLASSES}
            json.dump({"summary": summary, "seeds": [seed["name"] for seed in seeds], "cases": records}, out, indent=1)
    return 1 if any(counts.get(kind, 0) for kind in FAILURES) else 0


if __name__ == "__main__":
    sys.exit(main())
