"""ExecuTorch programs (.pte) of both model kinds, lowered to XNNPACK."""
