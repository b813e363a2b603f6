"""The attention block (torch-free): its config, I/O contract, variants, golden cases, runner and decode sessions."""
