"""`mha bench` and `make serve-bench`: timings, FLOP counts, reports and plots."""
