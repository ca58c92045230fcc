"""The flags every benchmark shares: --rounds, --seconds and --out (--json, the older spelling)."""

import argparse
import os

BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(BENCHMARKS)
RESULTS = os.path.join(BENCHMARKS, "results")
DATA = os.path.join(BENCHMARKS, "data")


def parser(doc, name, rounds=None, seconds=None, rounds_aliases=(), rounds_help=None, replot=False):
    """An argument parser with the common flags. name: the results' file name in benchmarks/results
    (a function of the parsed arguments where it depends on them); rounds, seconds: their defaults,
    None where the benchmark has no such thing; replot: the benchmark draws a plot, which --replot redraws
    from the results' .json without measuring."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if rounds is not None:
        p.add_argument(
            "--rounds",
            *rounds_aliases,
            dest="rounds",
            type=int,
            default=rounds,
            help=rounds_help or "alternated rounds; medians are reported",
        )
    if seconds is not None:
        p.add_argument("--seconds", type=float, default=seconds, help="time budget per measurement")
    p.add_argument(
        "--out",
        default=None,
        help="where the results go: PREFIX writes PREFIX.txt and PREFIX.json (and PREFIX.png where there is a "
        "plot); an existing directory (or one ending in /) takes the default names. Default: benchmarks/results/",
    )
    p.add_argument("--json", default=None, help="the results' .json, the .txt beside it (the older spelling of --out)")
    if replot:
        p.add_argument("--replot", action="store_true", help="redraw the plot from the results' .json, measure nothing")
    p.set_defaults(results_name=name)
    return p


def add_cores(p):
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)), help="cores every method gets")


def add_skip(p):
    p.add_argument("--skip", default="", help="comma-separated methods to leave out")


def parse(p, argv=None):
    """Parsed arguments with args.out the results' prefix (no extension) and args.skip a set."""
    args = p.parse_args(argv)
    name = args.results_name(args) if callable(args.results_name) else args.results_name
    if args.json:
        args.out = os.path.splitext(args.json)[0]
    elif args.out is None:
        args.out = os.path.join(RESULTS, name)
    elif args.out.endswith("/") or os.path.isdir(args.out):
        args.out = os.path.join(args.out, name)
    if isinstance(getattr(args, "skip", None), str):
        args.skip = set(filter(None, args.skip.split(",")))
    return args


def shown_path(path):
    """Relative to the repository when inside it, else as given."""
    relative = os.path.relpath(path, ROOT)
    return path if relative.startswith("..") else relative
