"""Exact dynamic batching of mixed lengths: right-pad to the longest, stack on the batch axis, slice back.

This is exact because the attention is causal: the output at position t is computed from positions <= t
only, so the zeros appended after a request's last token never reach its real positions. (Each row of the
batch is independent of the others for the same reason it always was: attention mixes tokens, not rows.)
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def pad_batch(xs: Sequence[np.ndarray]) -> np.ndarray:
    """[(b_i, t_i, d_in)] -> (sum b_i, max t_i, d_in): each input right-padded with zeros, stacked in order."""
    if len(xs) == 1:
        return xs[0]
    tokens = max(x.shape[1] for x in xs)
    rows = sum(x.shape[0] for x in xs)
    padded = np.zeros((rows, tokens, xs[0].shape[2]), dtype=xs[0].dtype)
    row = 0
    for x in xs:
        padded[row:row + x.shape[0], :x.shape[1]] = x
        row += x.shape[0]
    return padded


def split_batch(out: np.ndarray, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The batch output (sum b_i, max t_i, d_model) -> each request's own (b_i, t_i, d_model), in order."""
    if len(xs) == 1:
        return [out]
    answers, row = [], 0
    for x in xs:
        answers.append(np.ascontiguousarray(out[row:row + x.shape[0], :x.shape[1]]))
        row += x.shape[0]
    return answers


def run_padded(run: Callable[[np.ndarray], np.ndarray], xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """One call of `run` for every request of the batch; each answer equals `run` on that request alone."""
    return split_batch(run(pad_batch(xs)), xs)
