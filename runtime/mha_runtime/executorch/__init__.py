"""ExecuTorch programs in the torch-free runtime: the decoder's gpt.pte, found through the runner the export package
registers (mha.runners), its bounds checked before the program runs."""
