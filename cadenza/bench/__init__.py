"""Benchmarks behind ``cadenza bench``: each compares side by side in one run and returns a
JSON-ready dict. Results and commands are quoted in docs/benchmarks.md."""
