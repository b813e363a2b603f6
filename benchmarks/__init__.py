"""The repository's benchmarks, run by `make bench` and `make serve-bench` from a checkout (not packaged): the whole
GPT beside its peers (transformers, ONNX Runtime GenAI, llama.cpp) and its floors, every runtime's tokens/s, and
the serving benchmarks. `process.py` is the harness that starts a real `mha serve` (the tests use it too)."""
