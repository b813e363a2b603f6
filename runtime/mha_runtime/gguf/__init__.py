"""GGUF files of a decoder folder, run by llama.cpp itself (torch-free)."""
