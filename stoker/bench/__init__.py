"""Benchmarks a user can run on their own machine: ``stoker bench loader``."""
