"""The GPT as GGUF files for llama.cpp (gpt.gguf and its quant types), written with gguf-py and validated by
llama.cpp itself."""
