"""Torch side of mha-export: the tutorial's model, the exporters, fixtures, manifest, validation and CLI."""
