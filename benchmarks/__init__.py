"""The benchmarks: each script runs as `python -m benchmarks.<name>` from the repository root (or as
`python benchmarks/<name>.py`), on the shared harness in benchmarks/harness. See benchmarks/README.md."""
