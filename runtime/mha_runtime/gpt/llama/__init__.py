"""GGUF files of the GPT, run by llama.cpp itself."""
