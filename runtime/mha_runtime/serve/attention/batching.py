"""Exact dynamic batching of mixed lengths: right-pad to the longest, stack on the batch axis, slice back.

This is exact because the attention is causal: the output at position t is computed from positions <= t
only, so the zeros appended after a request's last token never reach its real positions. (Each row of the
batch is independent of the others for the same reason it always was: attention mixes tokens, not rows.)

Padding is not free: a 16-token request padded to 64 costs what a 64-token one does. So a batch is first
split into length groups (`length_groups`): sorted by length, a request joins the group before it only when
padding it there costs less work than one more ONNX Runtime call. On CPU the cost per row hardly falls with
the batch size, so for a large model only near-equal lengths share a call; for a tiny one everything does.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from mha_runtime.artifact.errors import ContractError
from mha_runtime.attention.config import MHAConfig

# What one more ONNX Runtime call costs, in FLOPs of work: ORT's fixed cost per run plus the Python around it,
# as an estimate (docs/serving.md, "Dynamic batching"); it only decides near-ties.
CALL_FLOPS = 1e7
Cost = Callable[[int, int], float]


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


def run_padded(run: Callable[[np.ndarray], np.ndarray], xs: Sequence[np.ndarray]) -> list[np.ndarray | ContractError]:
    """One call of `run` for every request of the batch; each answer equals `run` on that request alone. Where `run`
    refuses the batch's output (NaN/inf from one request's overflowing input), each request runs again alone, so
    that only the one at fault gets the refusal, in its place in the list; a lone request's refusal is raised."""
    try:
        return list(split_batch(run(pad_batch(xs)), xs))
    except ContractError:
        if len(xs) == 1:
            raise
    return [_alone(run, x) for x in xs]


def _alone(run: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray | ContractError:
    try:
        return run(x)
    except ContractError as exc:
        return exc


def work(config: MHAConfig) -> Cost:
    """(rows, tokens) -> dense FLOPs of one padded call: Q/K/V projections, full T x T scores and context (the
    faithful graph computes the masked half too), the output projection where the config has one."""
    per_token = 2 * config.d_in * 3 * config.d_model + (2 * config.d_model ** 2 if config.out_proj else 0)
    return lambda rows, tokens: float(rows * (tokens * per_token + 4 * tokens * tokens * config.d_model))


def length_groups(xs: Sequence[np.ndarray], cost: Cost, call: float = CALL_FLOPS) -> list[list[int]]:
    """Indices of `xs` grouped for one padded call each, shortest first."""
    groups: list[list[int]] = []
    rows = tokens = 0
    for i in sorted(range(len(xs)), key=lambda i: xs[i].shape[1]):
        r, t = xs[i].shape[:2]
        if groups and cost(rows + r, t) <= cost(rows, tokens) + cost(r, t) + call:
            groups[-1].append(i)
            rows += r
        else:
            groups.append([i])
            rows = r
        tokens = t
    return groups


def run_grouped(run: Callable[[np.ndarray], np.ndarray], xs: Sequence[np.ndarray],
                cost: Cost) -> list[tuple[np.ndarray | ContractError, int, int]]:
    """Each request's answer (or its own refusal, as run_padded gives it), in order, with the size and padded
    length of the call it rode in."""
    answers: list[tuple[np.ndarray | ContractError, int, int]] = [None] * len(xs)  # type: ignore[list-item]
    for group in length_groups(xs, cost):
        members = [xs[i] for i in group]
        tokens = max(x.shape[1] for x in members)
        for i, answer in zip(group, run_padded(run, members), strict=True):
            answers[i] = (answer, len(group), tokens)
    return answers
