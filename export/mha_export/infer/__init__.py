"""Golden-case runners for the formats that need torch (TorchScript) or ExecuTorch (.pte)."""
