"""Benchmarks (not tests): ``make bench`` prints figures next to a baseline measured in the same run."""
