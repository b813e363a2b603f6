"""What one decoder architecture decides, so that everything else knows none: the Architecture protocol.

An architecture is a module (a module satisfies a typing.Protocol, PEP 544): `gpt2.py` is the first, and the table
in `__init__.py` rows each name one. What the others taught (DESIGN.md section 6):
- Optimum keys a family by Hugging Face's `model_type` and declares it in a few attributes over one shared
  text-decoder config; gguf-py keeps families as data (MODEL_ARCH, MODEL_TENSORS, TensorNameMap); onnxruntime-genai's
  builder writes every decoder with one node builder (make_layernorm, make_rotary_embedding, make_attention,
  make_mlp) that a family's subclass configures.
- Here the book's state_dict keys are the canonical weights (its GPTModel, Llama3Model and Qwen3Model share
  tok_emb, trf_blocks.N, final_norm and out_head); Hugging Face's and GGUF's names map onto them.
- The graph builders (decoder/graphs/) own the decoder's skeleton, the contract's inputs and outputs, the attention
  core (the cache, the mask, softmax; GroupQueryAttention in the in-place form) and its head counts (n_heads,
  kv_heads, head_dim), and the head (a Linear on the token embedding or its own matrix). An architecture writes
  the rest into the graph through `Pieces`: its weights as initializers, the embedding (positions included), the
  norms, what happens to q and k per head (rotary positions, q/k norms), and the MLP.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from mha_runtime.decoder.shapes import Shaped

if TYPE_CHECKING:
    import numpy as np
    import torch
    from gguf import GGUFWriter

    from mha_export.attention.weights.load import WeightFile
    from mha_export.decoder.graphs.shared import Graph, Layer, Projected

Tensors = dict[str, "torch.Tensor"]


class DecoderConfig(Shaped, Protocol):
    """An architecture's config: the contract's shapes, the width, its JSON (in every file's metadata, byte for
    byte) and its parameter count (the memory budget)."""

    @property
    def emb_dim(self) -> int: ...
    def parameters(self, *, tied: bool) -> int: ...
    def to_dict(self) -> dict[str, Any]: ...
    def to_json(self) -> str: ...


@dataclass(frozen=True)
class AttentionInputs:
    """What an architecture gives the in-place form's GroupQueryAttention: its query, key and value inputs (one
    packed q|k|v and two empty names, or three), its rotary caches (cos, sin) and their attributes, if any."""

    qkv: tuple[str, str, str]
    rotary: tuple[str, ...] = ()
    attrs: Mapping[str, Any] = field(default_factory=dict)


class Pieces(Protocol):
    """One ONNX graph's architecture-specific ops, written into its Graph in the order called. `graph_pieces` makes
    them for one graph; `fused` is the in-place form, whose pieces may use ONNX Runtime's contrib ops (the portable
    form is standard ONNX at opset 20)."""

    def add_weights(self) -> list[Layer]:
        """Every block's weights as initializers (matrices (in, out) for MatMul, q|k|v fused on the output axis:
        all q heads, all k, all v)."""
        ...

    def embed(self, input_ids: str, positions: str) -> str:
        """(B, T) ids and (B, T) positions -> the first block's input (B, T, E)."""
        ...

    def norm(self, x: str, params: tuple[str, ...]) -> str:
        """The architecture's norm of x (B, T, E) with a block's (or final_norm's) parameters."""
        ...

    def skip_norm(self, x: str, skip: Projected, params: tuple[str, ...], *, summed: bool = True
                  ) -> tuple[str, str | None]:
        """The fused form's residual and norm in one op: (norm(x + skip + bias), x + skip + bias), the sum only
        where `summed`."""
        ...

    def final_norm(self) -> tuple[str, ...]:
        """The final norm's parameters as initializers (made when the builder reaches it)."""
        ...

    def heads(self, q: str, k: str, layer: Layer, positions: str) -> tuple[str, str]:
        """The portable form's q (B, H, T, D) and k (B, K, T, D) before the cache: rotated, normed, or as they
        are."""
        ...

    def attention_inputs(self, qkv: str, layer: Layer) -> AttentionInputs:
        """The in-place form's GroupQueryAttention inputs from the q|k|v projection (B, T, (H + 2K) * D)."""
        ...

    def mlp(self, x: str, layer: Layer) -> Projected:
        """The feed-forward of x (B, T, E): its last MatMul's output and that projection's bias, not yet added."""
        ...


class Architecture(Protocol):
    """A decoder architecture: one package (archs/gpt2/), its members by concern, the package's own module holding
    them. `cfg` is the architecture's own config type (GPT-2's GPTConfig), which satisfies DecoderConfig; its `arch`
    is NAME."""

    # Names: the table's key and config.arch (contract.shapes records it), and how others name the family.
    NAME: str
    HF_MODEL_TYPE: str  # config.json's model_type
    HF_CONFIG_KEY: str  # a key only this family's config.json has (one written without model_type)
    GGUF_ARCH: str  # general.architecture
    GENAI_TYPE: str  # genai_config.json's model.type
    BOOK_MODEL: str  # the book's model class, as errors name it ("the book's GPTModel")
    REFERENCE: str  # the eager reference, as golden/generations.json names it

    # Config: from the book's config dict (its keys), a Hugging Face config.json, a GGUF's metadata.
    BOOK_KEYS: frozenset[str]

    def config_from_book(self, data: dict[str, Any]) -> DecoderConfig: ...
    def config_from_hf(self, data: dict[str, Any]) -> DecoderConfig: ...
    def config_from_gguf(self, fields: Mapping[str, Any]) -> DecoderConfig: ...
    def describe(self, cfg: Any) -> str: ...  # the config's deciding fields, for a weights error

    # Weights: the book's state_dict (canonical), Hugging Face's names onto it, GGUF's tensors from it.
    BOOK_LAYOUT: str  # the manifest's weights.layout of each source
    HF_LAYOUT: str
    HF_KEYS: str  # the Hugging Face checkpoint's family and key names, as errors name them
    HF_SIGNATURE: re.Pattern[str]  # a key that says a checkpoint is this family's Hugging Face one; group 1: prefix
    BUFFERS: re.Pattern[str]  # keys of buffers, not parameters, in either layout (ignored)

    def book_shapes(self, cfg: Any) -> dict[str, tuple[int, ...]]: ...
    def hf_names(self, cfg: Any, prefix: str) -> dict[str, str]: ...  # book key -> Hugging Face key
    def read_hf(self, source: WeightFile, cfg: Any, prefix: str) -> tuple[Tensors, bool]: ...  # state, tied
    def gguf_tensors(self, state: Tensors, cfg: Any, *, tied: bool) -> dict[str, np.ndarray]: ...
    def gguf_metadata(self, writer: GGUFWriter, cfg: Any) -> None: ...
    # A GGUF file's tensors (GGUF name -> float32 array, dequantized, rows first as gguf_tensors writes them) onto
    # the book's keys: the inverse of gguf_tensors, undoing what llama.cpp's converter did (Llama's q/k row
    # permutation); the state and whether the head is the token embedding (no output.weight).
    def read_gguf(self, tensors: Mapping[str, np.ndarray], cfg: Any) -> tuple[Tensors, bool]: ...

    # The model: its eager reference (seeded by the caller), its ONNX pieces, its ExecuTorch program's module.
    def eager(self, cfg: Any) -> torch.nn.Module: ...
    def graph_pieces(self, g: Graph, w: dict[str, np.ndarray], cfg: Any, *, fused: bool) -> Pieces: ...
    def pte_module(self, model: torch.nn.Module, cfg: Any) -> torch.nn.Module: ...
    def refusal(self, cfg: Any, file: str) -> str | None: ...  # why cfg cannot have the form `file` (gpt.pte, ...)

    # Hugging Face's clients: the folder's config.json.
    HF_CARRIED: tuple[str, ...]  # a checkpoint's config.json fields the folder's carries as said
    # The config fields a checkpoint's own config.json decides (a --config beside it must agree), each with its
    # Hugging Face name as a refusal names it (its first word; the rest says why).
    HF_DECIDED: Mapping[str, str]
    HF_DEFAULTS: Mapping[str, int]  # bos_token_id and eos_token_id where a config.json (or nothing) names none

    def hf_config(self, cfg: Any, *, tied: bool, eos_id: int | None) -> dict[str, Any]: ...

    # Lossy forms: the family's mean-KL bar by width (8, 4), measured beside llama.cpp on its real model, at most
    # mha_runtime.decoder.forms.BAR_CEILING; a width it does not name keeps the forms' own bar.
    LOSSY_BARS: Mapping[int, float]
    # The lossy forms' block scales: "fp32" (onnxruntime's quantizer's own) or "fp16" (as llama.cpp stores its d,
    # 8-bit blocks rounded as its Q8_0: mha_export.decoder.lossy.scales).
    LOSSY_SCALES: str
