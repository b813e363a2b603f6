"""`mha bench`: timings, FLOP counts, reports and plots of the attention runners."""
