"""Rotary positions of the Llama family, in numpy: the inverse frequencies (with Llama 3's frequency scaling) and
the (C, D / 2) cos/sin caches both ONNX forms read (the portable form gathers rows by position_ids;
GroupQueryAttention's do_rotary reads them as its cos_cache/sin_cache).

Written from the formulas, not imported from the book's compute_rope_params (the reference the tests hold it to).
Computed in float64 and stored as float32: the angle position * inv_freq loses nothing in float64 at any context
length, where float32 would lose up to context * 2^-24 radians.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def inv_freq(head_dim: int, base: float, rope_freq: Mapping[str, float] | None = None) -> np.ndarray:
    """(D / 2,) float64: base ** (-2i / D), then Llama 3's scaling where `rope_freq` gives it: wavelengths longer
    than original_context_length / low_freq_factor are divided by factor, shorter than original_context_length /
    high_freq_factor kept, those between interpolated by (original_context_length / wavelength - low) / (high - low)."""
    freq = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if rope_freq is None:
        return freq
    factor, low, high = rope_freq["factor"], rope_freq["low_freq_factor"], rope_freq["high_freq_factor"]
    original = rope_freq["original_context_length"]
    wavelength = 2 * np.pi / freq
    smooth = (original / wavelength - low) / (high - low)
    scaled = np.where(wavelength > original / low, freq / factor, freq)
    medium = (wavelength <= original / low) & (wavelength >= original / high)
    return np.where(medium, (1 - smooth) * freq / factor + smooth * freq, scaled)


def rope_caches(head_dim: int, base: float, context_length: int, rope_freq: Mapping[str, float] | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of position * inv_freq: (C, D / 2) float32 each (the rotate-half form: one angle per pair
    (i, i + D / 2))."""
    angles = np.arange(context_length, dtype=np.float64)[:, None] * inv_freq(head_dim, base, rope_freq)[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
