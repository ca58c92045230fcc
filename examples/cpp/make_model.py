"""Saves the small TorchScript classifier that train.cpp trains, and (with
--h5ad) a synthetic AnnData file to train it on.

    python examples/cpp/make_model.py --model model.pt --inputs 500 --classes 5 --h5ad cells.h5ad
"""

import argparse
import os
import sys

import torch
from torch import nn


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="where to save the TorchScript model")
    parser.add_argument("--inputs", type=int, default=500, help="features per row (the AnnData's n_vars)")
    parser.add_argument("--classes", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--h5ad", help="also write a synthetic .h5ad with this many --rows")
    parser.add_argument("--rows", type=int, default=2000)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.inputs, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.classes))
    torch.jit.script(model).save(args.model)
    print(f"{args.model}: {args.inputs} -> {args.hidden} -> {args.classes}")
    if args.h5ad:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from synthetic import write_h5ad

        write_h5ad(args.h5ad, args.rows, args.inputs, args.classes)
        print(f"{args.h5ad}: {args.rows} x {args.inputs}, {args.classes} classes")


if __name__ == "__main__":
    main()
