"""The causal decoder kind, torch-free: its shapes, contract, forms, manifest, sessions, generation and checks. It
knows no architecture: every shape comes from the folder's contract."""
