"""Driving the two decoder files with ONNX Runtime: prefill rows, then step them together (torch-free).

Both forms prefill each prompt alone at batch 1, so a row's cache and first logits are exactly what that prompt
gives alone; steps then run all rows at once:
- InPlaceDecoder (gpt.inplace.onnx): one (B, KV, C, D) buffer per layer and per key/value (C: context_length, or
  the layer's window where it keeps only that, contract.shapes.cache_lengths), bound as both past and present; a
  row's prefill binds that row's slice of the buffers (no copy), a step binds the whole buffers with each row's own
  past_tokens.
- ConcatDecoder (gpt.onnx): each row's cache is left-padded to the longest with attention_mask 0 at the pads and
  position_ids counting each row's real tokens (Optimum's convention); every step returns the grown cache.
Every shape is the manifest's contract.shapes (KV: its kv_heads, fewer than the query heads under grouped-query
attention); a session whose inputs or outputs are not the contract's for them is refused in one line before a
buffer is sized (check_signature), and its config metadata must be the manifest's config
(artifact.config_fields.check_own_config).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from mha_runtime.artifact.errors import ArtifactError, ContractError, first_line
from mha_runtime.decoder.contract import (
    ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    META_GPT_CONFIG,
    NEXT_LOGITS,
    PAST_TOKENS,
    POSITION_IDS,
    Signed,
    concat_signature,
    inplace_signature,
    past_key,
    past_value,
    present_key,
    present_value,
)
from mha_runtime.decoder.shapes import DecoderShapes, cache_rows
from mha_runtime.infer.pick_copy import session_options
from mha_runtime.infer.providers import resolve_provider, session_providers


class Decoder(Protocol):
    lengths: list[int]

    def prefill(self, prompts: list[list[int]]) -> np.ndarray: ...  # (B, V) logits of each prompt's last token

    def step(self, tokens: list[int], active: list[bool]) -> np.ndarray: ...  # one token per row -> (B, V)


def make_session(model: bytes | str, *, provider: str = "cpu", threads: int | None = None,
                 where: str = "decoder") -> ort.InferenceSession:
    """A session from already verified bytes (the file is never re-read after its sha256 check), or from a path
    the caller has just written (the export's validation)."""
    provider = resolve_provider(provider)  # CUDA asked for where there is none: one line, not ORT's fallback
    options = session_options(threads, preoptimized=False)
    try:
        return ort.InferenceSession(model, options, providers=session_providers(provider))
    except Exception as exc:  # ONNX Runtime's own error types
        raise ArtifactError(f"{where}: ONNX Runtime cannot load it ({first_line(exc)})") from None


def own_config(session: ort.InferenceSession) -> Any:
    """The config the model was exported with (its metadata), or None where it holds none that parses."""
    raw = session.get_modelmeta().custom_metadata_map.get(META_GPT_CONFIG)
    try:
        return json.loads(raw) if raw is not None else None
    except ValueError:
        return None


def _shown(signed: Signed) -> str:
    dtype, shape = signed
    return f"{dtype} [{', '.join(str(a) for a in shape)}]"


def check_signature(session: ort.InferenceSession, kind: str, shapes: DecoderShapes, where: str) -> None:
    """Every input and output of the session is the contract's for `shapes`: the same names in order, dtypes,
    ranks and fixed axes (a symbolic axis only where the contract has one). One line for the first that is not,
    before any buffer is sized from the manifest."""
    want = (inplace_signature if kind == "inplace" else concat_signature)(shapes)
    types = {"tensor(float)": "float32", "tensor(int64)": "int64", "tensor(int32)": "int32"}
    have = {a.name: (types.get(a.type, a.type), list(a.shape)) for a in [*session.get_inputs(),
                                                                       *session.get_outputs()]}
    if list(have) != list(want):
        extra = [n for n in have if n not in want] + [f"no {n}" for n in want if n not in have]
        raise ContractError(f"{where}: expected the {kind} contract's {len(want)} inputs and outputs for "
                            f"n_layers={shapes.n_layers} (the manifest's contract.shapes), the model has "
                            f"{len(have)}: {(extra or ['another order'])[0]}")
    for name, (dtype, shape) in want.items():
        got = have[name]
        fits = got[0] == dtype and len(got[1]) == len(shape) and all(
            (a == b) if isinstance(a, int) else not isinstance(b, int) for a, b in zip(shape, got[1], strict=True))
        if not fits:
            raise ContractError(f"{where}: {name!r}: expected {_shown((dtype, shape))} (the manifest's "
                                f"contract.shapes), the model has {_shown(got)}")


class InPlaceDecoder:
    def __init__(self, session: ort.InferenceSession, shapes: DecoderShapes, where: str = "gpt.inplace.onnx") -> None:
        self.session, self.shapes, self.where = session, shapes, where
        self.lengths: list[int] = []
        names = [i.name for i in session.get_inputs()]
        if names[:2] != [INPUT_IDS, PAST_TOKENS]:
            raise ContractError(f"{where}: expected the in-place GPT form (inputs input_ids, past_tokens, ...), "
                                f"got {names[:3]}")

    def allocate(self, rows: int) -> None:
        """The cache: per layer one (rows, KV, C, D) buffer each for keys and values, zeroed (C: the layer's
        cache_rows, context_length or its window)."""
        c = self.shapes
        shapes = [(rows, c.kv_heads, n, c.head_dim) for n in cache_rows(c)]
        self.keys = [np.zeros(shape, np.float32) for shape in shapes]
        self.values = [np.zeros(shape, np.float32) for shape in shapes]
        self._bindings: dict[tuple[int, int], ort.IOBinding] = {}

    def _bind(self, start: int, stop: int) -> ort.IOBinding:
        """A binding of rows start..stop-1 of every cache buffer as both past and present (views: no copy), made
        once per row range."""
        binding = self._bindings.get((start, stop))
        if binding is None:
            binding = self.session.io_binding()
            for i in range(self.shapes.n_layers):
                for past, present, buf in ((past_key(i), present_key(i), self.keys[i]),
                                           (past_value(i), present_value(i), self.values[i])):
                    value = ort.OrtValue.ortvalue_from_numpy(buf[start:stop])  # the kernel writes into buf
                    binding.bind_ortvalue_input(past, value)
                    binding.bind_ortvalue_output(present, value)
            self._bindings[(start, stop)] = binding
        return binding

    def _call(self, binding: ort.IOBinding, ids: np.ndarray, past: np.ndarray) -> np.ndarray:
        out = np.empty((ids.shape[0], self.shapes.vocab_size), np.float32)
        binding.bind_cpu_input(INPUT_IDS, ids)
        binding.bind_cpu_input(PAST_TOKENS, past)
        binding.bind_ortvalue_output(NEXT_LOGITS, ort.OrtValue.ortvalue_from_numpy(out))
        try:
            self.session.run_with_iobinding(binding)
        except Exception as exc:
            raise ArtifactError(f"{self.where}: ONNX Runtime failed ({first_line(exc)})") from None
        return out

    def prefill_row(self, row: int, prompt: list[int]) -> np.ndarray:
        """Prompt (T,) alone at batch 1 into cache row `row` from position 0 -> (V,) logits of its last token."""
        ids = np.asarray([prompt], np.int64)  # (1, T)
        return self._call(self._bind(row, row + 1), ids, np.zeros(1, np.int32))[0]

    def step_rows(self, tokens: list[int], past: list[int]) -> np.ndarray:
        """One token for each of rows 0..n-1 at its own past length -> (n, V) logits."""
        ids = np.asarray(tokens, np.int64)[:, None]  # (n, 1)
        return self._call(self._bind(0, len(tokens)), ids, np.asarray(past, np.int32))

    def prefill(self, prompts: list[list[int]]) -> np.ndarray:
        self.allocate(len(prompts))
        logits = np.stack([self.prefill_row(row, prompt) for row, prompt in enumerate(prompts)])  # (B, V)
        self.lengths = [len(p) for p in prompts]
        return logits

    def step(self, tokens: list[int], active: list[bool]) -> np.ndarray:
        """Rows not active (stopped) write their token into the same free slot again and do not advance."""
        logits = self.step_rows(tokens, self.lengths)
        self.lengths = [n + 1 if a else n for n, a in zip(self.lengths, active, strict=True)]
        return logits


class ConcatDecoder:
    def __init__(self, session: ort.InferenceSession, shapes: DecoderShapes, where: str = "gpt.onnx") -> None:
        self.session, self.shapes, self.where = session, shapes, where
        self.lengths: list[int] = []
        self.outputs = [o.name for o in session.get_outputs()]
        names = [i.name for i in session.get_inputs()]
        if names[:3] != [INPUT_IDS, ATTENTION_MASK, POSITION_IDS]:
            raise ContractError(f"{where}: expected the Optimum-named GPT form (inputs input_ids, attention_mask, "
                                f"position_ids, ...), got {names[:3]}")

    def _run(self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray,
             cache: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run on `cache` (named as the present outputs) -> every output by name."""
        feeds = {INPUT_IDS: ids, ATTENTION_MASK: mask, POSITION_IDS: positions}
        for i in range(self.shapes.n_layers):
            feeds[past_key(i)], feeds[past_value(i)] = cache[present_key(i)], cache[present_value(i)]
        try:
            out = self.session.run(None, feeds)
        except Exception as exc:
            raise ArtifactError(f"{self.where}: ONNX Runtime failed ({first_line(exc)})") from None
        return dict(zip(self.outputs, out, strict=True))

    def _zeros(self, batch: int, tokens: int) -> dict[str, np.ndarray]:
        """A zeroed (batch, KV, tokens, D) cache per layer for keys and values, named as the present outputs."""
        c = self.shapes
        return {n: np.zeros((batch, c.kv_heads, tokens, c.head_dim), np.float32)
                for i in range(c.n_layers) for n in (present_key(i), present_value(i))}

    def prefill(self, prompts: list[list[int]]) -> np.ndarray:
        longest = max(len(p) for p in prompts)
        self.cache = self._zeros(len(prompts), longest)
        self.mask = np.zeros((len(prompts), longest), np.int64)
        logits = np.empty((len(prompts), self.shapes.vocab_size), np.float32)
        for row, prompt in enumerate(prompts):
            n = len(prompt)
            ids = np.asarray([prompt], np.int64)
            named = self._run(ids, np.ones((1, n), np.int64), np.arange(n)[None], self._zeros(1, 0))
            logits[row] = named[LOGITS][0, -1]
            for name in self.cache:
                self.cache[name][row, :, longest - n:] = named[name][0]  # left padding
            self.mask[row, longest - n:] = 1
        self.lengths = [len(p) for p in prompts]
        return logits

    def step(self, tokens: list[int], active: list[bool]) -> np.ndarray:
        """Rows not active (stopped) get a masked-out key and keep their position."""
        ids = np.asarray(tokens, np.int64)[:, None]
        column = np.asarray(active, np.int64)[:, None]  # (B, 1): 0 hides a stopped row's new key
        self.mask = np.concatenate([self.mask, column], axis=1)
        positions = np.asarray(self.lengths, np.int64)[:, None]
        named = self._run(ids, self.mask, positions, self.cache)
        self.cache = {n: named[n] for n in self.cache}
        self.lengths = [n + 1 if a else n for n, a in zip(self.lengths, active, strict=True)]
        return named[LOGITS][:, -1]


def decoder_for(kind: str, session: ort.InferenceSession, shapes: DecoderShapes, where: str | Path) -> Decoder:
    return (InPlaceDecoder if kind == "inplace" else ConcatDecoder)(session, shapes, str(where))
