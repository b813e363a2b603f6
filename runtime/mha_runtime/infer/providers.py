"""Choosing an ONNX Runtime execution provider: auto, cpu or cuda."""
from __future__ import annotations

import onnxruntime as ort

from mha_runtime.artifact.errors import ProviderError

CHOICES = ("auto", "cpu", "cuda")
_ORT_NAMES = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def resolve_provider(provider: str) -> str:
    """Map 'auto' | 'cpu' | 'cuda' to 'cpu' or 'cuda', or raise ProviderError saying what to install."""
    if not isinstance(provider, str):
        raise ProviderError(f"provider: expected one of {', '.join(CHOICES)}, got {provider!r}")
    available = ort.get_available_providers()
    if provider == "auto":
        return "cuda" if _ORT_NAMES["cuda"] in available else "cpu"
    if provider not in _ORT_NAMES:
        raise ProviderError(f"unknown provider {provider!r}; choose one of {', '.join(CHOICES)}")
    if _ORT_NAMES[provider] not in available:
        raise ProviderError(
            f"provider {provider!r} is not available in this onnxruntime (it offers {', '.join(available)}); "
            "install onnxruntime-gpu in place of onnxruntime (`make ORT=gpu ...`) for CUDA"
        )
    return provider


# TF32 off: ONNX Runtime's CUDA provider rounds fp32 MatMul inputs to TF32 by default on Ampere and later, which put
# the fp32 forms 40-80x past their 1e-5 row on an H200 (docs/measurements/cuda.md); the forms promise fp32.
CUDA_OPTIONS = {"use_tf32": "0"}


def session_providers(provider: str) -> list[str | tuple[str, dict[str, str]]]:
    """The provider list for an InferenceSession; CUDA keeps the CPU provider as fallback for unsupported nodes."""
    if provider == "cuda":
        return [(_ORT_NAMES["cuda"], dict(CUDA_OPTIONS)), _ORT_NAMES["cpu"]]
    return [_ORT_NAMES["cpu"]]
