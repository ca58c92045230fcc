"""Opening AnnData over HTTP: how long `ts.open(url, obs=[...])` takes and how many requests it makes,
for the same AnnData written as .h5ad (gzip, as scanpy writes it), zarr v2 and zarr v3 (anndata's
write_zarr: consolidated metadata), served by the tests' HTTP server on 127.0.0.1 with --latency seconds
added to every request. Each opening runs in a fresh process (nothing learnt by an earlier one), in
alternated rounds, beside the same opening of the local file. The floor of a remote opening is its
requests' round trips: `round trips` is its time over the latency (requests sent together count once).

    python -m benchmarks.remote_open [--rows 100000] [--latency 0.02] [--rounds 3]

Writes benchmarks/results/remote_open.{txt,json}; --report prints the table of the .json again.
"""

import json
import os
import subprocess
import sys
import time

try:
    from benchmarks.harness import cli, results, rounds
except ImportError:  # run as a file: benchmarks/ is on sys.path
    from harness import cli, results, rounds

TESTS = os.path.join(cli.ROOT, "tests")
STORES = ["cells.h5ad", "cells_v2.zarr", "cells_v3.zarr"]
OBS = ["cell_type", "batch", "donor"]


def child(path):
    """One opening in this (fresh) process: prints its seconds as JSON."""
    import torch_shards as ts

    start = time.perf_counter()
    source = ts.open(path, obs=OBS)
    seconds = time.perf_counter() - start
    assert len(source) > 0
    print(json.dumps({"seconds": seconds}))


def write_stores(root, rows):
    import anndata as ad
    import numpy as np
    import pandas as pd
    import scipy.sparse as sp

    if all(os.path.exists(os.path.join(root, name)) for name in STORES):
        return
    rng = np.random.default_rng(0)
    X = sp.random(rows, 2000, density=0.05, format="csr", dtype=np.float32, random_state=1)
    adata = ad.AnnData(X=X)
    adata.obs["cell_type"] = pd.Categorical(rng.choice([f"type {i}" for i in range(40)], rows))
    adata.obs["batch"] = rng.integers(0, 12, rows)
    adata.obs["donor"] = pd.Categorical(rng.choice([f"donor {i}" for i in range(200)], rows))
    adata.var_names = [f"gene {i}" for i in range(2000)]
    adata.write_h5ad(os.path.join(root, "cells.h5ad"), compression="gzip")
    with ad.settings.override(zarr_write_format=2):
        adata.write_zarr(os.path.join(root, "cells_v2.zarr"))
    with ad.settings.override(zarr_write_format=3):
        adata.write_zarr(os.path.join(root, "cells_v3.zarr"))


def open_in_child(path):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.remote_open", "--child", path],
        cwd=cli.ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, AWS_EC2_METADATA_DISABLED="true"),
    )
    if done.returncode != 0:
        sys.exit(f"opening {path} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds"]


def report(data):
    header = ["store", "local s", "over HTTP s", "requests", "round trips", "of local"]
    rows = []
    for name in STORES:
        local = rounds.median(data["local"][name])
        remote = rounds.median(data["remote"][name])
        requests = rounds.median(data["requests"][name])
        rows.append(
            [
                name,
                f"{local:.3f}",
                f"{remote:.3f} ({', '.join(f'{s:.2f}' for s in data['remote'][name])})",
                f"{requests:.0f}",
                f"{remote / data['latency']:.1f}",
                f"{remote / local:.1f}x",
            ]
        )
    return (
        f"{data['rows']} rows x 2000 (CSR, 5%), obs {', '.join(OBS)}; HTTP server on 127.0.0.1 with "
        f"{data['latency'] * 1000:.0f} ms per request; fresh process per opening, median of {data['rounds']} "
        f"alternated rounds\n\n" + results.markdown(header, rows)
    )


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    p = cli.parser(__doc__, "remote_open", rounds=3)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--latency", type=float, default=0.02)
    p.add_argument("--report", action="store_true", help="print the table of the .json again, measure nothing")
    args = cli.parse(p)
    if args.report:
        print(report(results.read_json(args.out)))
        return
    sys.path.insert(0, TESTS)
    from remote_servers import RangeHTTPServer

    root = os.path.join(cli.DATA, f"remote_open_{args.rows}")
    os.makedirs(root, exist_ok=True)
    write_stores(root, args.rows)
    data = {"rows": args.rows, "latency": args.latency, "rounds": args.rounds, "local": {}, "remote": {}}
    data["requests"] = {}
    with RangeHTTPServer(root, latency=args.latency) as server:

        def measure(name, remote):
            def run():
                if not remote:
                    return open_in_child(os.path.join(root, name))
                server.reset_log()
                seconds = open_in_child(f"{server.url}/{name}")
                data["requests"].setdefault(name, []).append(len(server.requests))
                return seconds

            return run

        measures = {}
        for name in STORES:
            measures[("local", name)] = measure(name, False)
            measures[("remote", name)] = measure(name, True)
        per_round = rounds.alternate(
            measures, args.rounds, lambda r, key, s: print(f"round {r}: {key[0]} {key[1]}: {s:.3f} s", flush=True)
        )
    for (where, name), values in per_round.items():
        data[where][name] = values
    text = report(data)
    print("\n" + text)
    results.write(args.out, text, data)


if __name__ == "__main__":
    main()
