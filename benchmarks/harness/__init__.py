"""What the benchmark scripts share, one job per module:

    cli       the common flags (--rounds, --seconds, --out) and where results go
    rounds    alternated rounds, medians, per-round ratios
    timing    epoch-after-epoch reading for a time budget, CPU seconds, peak memory
    machine   the machine and CPU description, core pinning, memory and page faults
    results   the txt/json writers, markdown tables, plots (when matplotlib is installed)
    data      the shared data files (.h5ad, HDF5, annbatch collections), where they live
    page_cache  the page cache of data files: warming, evicting (a first epoch from the disk), what is held
    annbatch  annbatch's side, run in its own Python (benchmarks/annbatch_side.py)
    native    building the C++ programs (decode_limit, the CMake package's iterate)
    limits    the read, decode and copy limits the readers are compared with

Importing the package imports nothing heavy: annbatch_side.py runs it in a Python without torch.
"""
