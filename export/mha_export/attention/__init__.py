"""The attention block: the book's chapter-3 wrapper, its graphs, weights and export pipeline."""
