"""GGUF for llama.cpp: decoder folders written as GGUF files with gguf-py and validated by llama.cpp itself."""
