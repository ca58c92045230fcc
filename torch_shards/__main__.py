"""python -m torch_shards info: what this installation is (version, the torch it was built for, its
libraries and the CPU features detected), to paste into a bug report.
python -m torch_shards --cmake-prefix-path: what a C++ project passes to CMake (CMAKE_PREFIX_PATH)
to find_package(TorchShards) and torch."""

import argparse
import json

import torch

from ._library import PACKAGE_DIR


def main():
    parser = argparse.ArgumentParser(prog="python -m torch_shards", description=__doc__)
    parser.add_argument("command", nargs="?", choices=["info"], help="info: describe this installation")
    parser.add_argument("--json", action="store_true", help="with info: print it as JSON")
    parser.add_argument(
        "--cmake-prefix-path",
        action="store_true",
        help="print the CMAKE_PREFIX_PATH of torch_shards and torch (';'-separated)",
    )
    parser.add_argument("--version", action="store_true", help="print the version")
    args = parser.parse_args()
    if args.command == "info":
        from .info import build_info, format_info

        info = build_info()
        print(json.dumps(info, indent=2) if args.json else format_info(info))
    elif args.cmake_prefix_path:
        print(f"{PACKAGE_DIR};{torch.utils.cmake_prefix_path}")
    elif args.version:
        from . import __version__

        print(__version__)
    else:
        parser.print_help()


if __name__ == "__main__":
    main()
