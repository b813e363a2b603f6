"""Torch side of mha-export: the book's model, its weights, the graph builders, the export pipeline and the bench."""
