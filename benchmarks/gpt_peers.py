"""The GPT bench's peers on the same weights: transformers' GPT2LMHeadModel, a KV-cache greedy loop in PyTorch over
the book's GPTModel state_dict, and onnxruntime-genai on the folder's gpt.onnx.

Every peer runs batch 1, greedy, and returns a Timed: the new ids, the time to the first new token (the
prefill's) and the whole call's seconds, so that decode tokens/s is (new - 1) / (seconds - first) for all alike.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from mha_export.decoder.archs.gpt2.config import LAYER_NORM_EPS, GPTConfig
from mha_runtime.decoder.contract import CONCAT_FORM, GENAI_CONFIG, WEIGHTS_FILE

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Timed:
    """One batch-1 greedy call: the new ids, seconds to the first of them, seconds in all."""

    ids: list[int]
    first_s: float
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        """Decode speed: the tokens after the first over the seconds after it."""
        rest = self.seconds - self.first_s
        return (len(self.ids) - 1) / rest if rest > 0 and len(self.ids) > 1 else 0.0


def book_state(folder: Path) -> Tensors:
    """gpt.safetensors as the book's GPTModel state_dict; a tied head (stored once) is the token embedding."""
    state = load_file(str(folder / WEIGHTS_FILE))
    state.setdefault("out_head.weight", state["tok_emb.weight"])
    return state


def _qkv(state: Tensors, p: str, cfg: GPTConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """W_query, W_key, W_value stacked as one (3E, E) nn.Linear weight, and their bias (zeros without qkv_bias)."""
    names = ("W_query", "W_key", "W_value")
    weight = torch.cat([state[f"{p}att.{w}.weight"] for w in names])
    bias = (torch.cat([state[f"{p}att.{w}.bias"] for w in names]) if cfg.qkv_bias
            else torch.zeros(3 * cfg.emb_dim))
    return weight, bias


def hf_model(state: Tensors, cfg: GPTConfig) -> Any:
    """transformers' GPT2LMHeadModel holding the book weights: Conv1D weights are [in, out] (nn.Linear's transposed);
    c_attn is W_query, W_key, W_value side by side; the head is its own matrix (tie_word_embeddings false), so
    that an untied book model maps exactly."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=cfg.vocab_size, n_positions=cfg.context_length, n_embd=cfg.emb_dim,
                        n_layer=cfg.n_layers, n_head=cfg.n_heads, activation_function="gelu_new",
                        layer_norm_epsilon=LAYER_NORM_EPS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        tie_word_embeddings=False)
    hf: dict[str, torch.Tensor] = {"transformer.wte.weight": state["tok_emb.weight"],
                                   "transformer.wpe.weight": state["pos_emb.weight"],
                                   "transformer.ln_f.weight": state["final_norm.scale"],
                                   "transformer.ln_f.bias": state["final_norm.shift"],
                                   "lm_head.weight": state["out_head.weight"]}
    for i in range(cfg.n_layers):
        p, h = f"trf_blocks.{i}.", f"transformer.h.{i}."
        weight, bias = _qkv(state, p, cfg)
        hf |= {f"{h}ln_1.weight": state[f"{p}norm1.scale"], f"{h}ln_1.bias": state[f"{p}norm1.shift"],
               f"{h}ln_2.weight": state[f"{p}norm2.scale"], f"{h}ln_2.bias": state[f"{p}norm2.shift"],
               f"{h}attn.c_attn.weight": weight.T, f"{h}attn.c_attn.bias": bias,
               f"{h}attn.c_proj.weight": state[f"{p}att.out_proj.weight"].T,
               f"{h}attn.c_proj.bias": state[f"{p}att.out_proj.bias"],
               f"{h}mlp.c_fc.weight": state[f"{p}ff.layers.0.weight"].T,
               f"{h}mlp.c_fc.bias": state[f"{p}ff.layers.0.bias"],
               f"{h}mlp.c_proj.weight": state[f"{p}ff.layers.2.weight"].T,
               f"{h}mlp.c_proj.bias": state[f"{p}ff.layers.2.bias"]}
    model = GPT2LMHeadModel(config).eval()
    model.load_state_dict({k: v.contiguous() for k, v in hf.items()}, strict=True)
    model.generation_config.eos_token_id = None  # never stop early: every runner makes the same count
    model.generation_config.pad_token_id = 0
    return model


class _Clock:
    """A generate() streamer that notes when the first new token arrives (its first put is the prompt)."""

    def __init__(self) -> None:
        self.puts, self.first = 0, 0.0

    def put(self, value: torch.Tensor) -> None:
        self.puts += 1
        if self.puts == 2:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def hf_generate(model: Any, prompt: list[int], new: int) -> Timed:
    """GPT2LMHeadModel.generate, greedy with its KV cache, exactly `new` tokens."""
    clock = _Clock()
    ids = torch.tensor([prompt])
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                             do_sample=False, use_cache=True, streamer=clock)
    seconds = time.perf_counter() - start
    return Timed(out[0, len(prompt):].tolist(), clock.first - start, seconds)


class BookKVCache:
    """The book's GPTModel forward over its state_dict with a preallocated (1, H, C, D) cache per layer.

    The same math as the book's modules (LayerNorm with the biased variance, the tanh GELU, scores scaled by
    sqrt(D)), in torch's fused ops: F.layer_norm, F.gelu(approximate="tanh"), F.scaled_dot_product_attention
    (causal for the prefill from an empty cache; a single new query attends to every cached key unmasked).
    """

    def __init__(self, state: Tensors, cfg: GPTConfig) -> None:
        self.cfg = cfg
        self.tok, self.pos, self.head = state["tok_emb.weight"], state["pos_emb.weight"], state["out_head.weight"]
        self.final = (state["final_norm.scale"], state["final_norm.shift"])
        self.layers = []
        for i in range(cfg.n_layers):
            p = f"trf_blocks.{i}."
            self.layers.append({"qkv": _qkv(state, p, cfg), "norm1": (state[f"{p}norm1.scale"],
                                                                      state[f"{p}norm1.shift"]),
                                "norm2": (state[f"{p}norm2.scale"], state[f"{p}norm2.shift"]),
                                "proj": (state[f"{p}att.out_proj.weight"], state[f"{p}att.out_proj.bias"]),
                                "fc": (state[f"{p}ff.layers.0.weight"], state[f"{p}ff.layers.0.bias"]),
                                "out": (state[f"{p}ff.layers.2.weight"], state[f"{p}ff.layers.2.bias"])})

    def _norm(self, x: torch.Tensor, scale_shift: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return F.layer_norm(x, (self.cfg.emb_dim,), *scale_shift, eps=LAYER_NORM_EPS)

    def forward(self, ids: torch.Tensor, past: int) -> torch.Tensor:
        """ids (1, T) at positions past .. past + T - 1 -> the last token's logits (1, V); T > 1 only at past 0."""
        c = self.cfg
        b, t = ids.shape
        h, d = c.n_heads, c.head_dim
        x = self.tok[ids] + self.pos[past:past + t]  # (B, T, E)
        for layer, (keys, values) in zip(self.layers, self.cache, strict=True):
            q, k, v = F.linear(self._norm(x, layer["norm1"]), *layer["qkv"]).view(b, t, 3, h, d).permute(2, 0, 3, 1, 4)
            keys[:, :, past:past + t], values[:, :, past:past + t] = k, v  # (B, H, T, D) each
            att = F.scaled_dot_product_attention(q, keys[:, :, :past + t], values[:, :, :past + t], is_causal=t > 1)
            x = x + F.linear(att.transpose(1, 2).reshape(b, t, c.emb_dim), *layer["proj"])
            x = x + F.linear(F.gelu(F.linear(self._norm(x, layer["norm2"]), *layer["fc"]), approximate="tanh"),
                             *layer["out"])
        return F.linear(self._norm(x[:, -1], self.final), self.head)

    def generate(self, prompt: list[int], new: int) -> Timed:
        """Greedy: prefill the prompt, then one token a step; exactly `new` tokens."""
        c = self.cfg
        start = time.perf_counter()
        with torch.inference_mode():
            self.cache = [(torch.empty(1, c.n_heads, c.context_length, c.head_dim),
                           torch.empty(1, c.n_heads, c.context_length, c.head_dim)) for _ in self.layers]
            token = int(self.forward(torch.tensor([prompt]), 0).argmax(-1))
            first, ids = time.perf_counter() - start, [token]
            for past in range(len(prompt), len(prompt) + new - 1):
                token = int(self.forward(torch.tensor([[token]]), past).argmax(-1))
                ids.append(token)
        return Timed(ids, first, time.perf_counter() - start)


class GenAIRunner:
    """onnxruntime-genai on the folder's gpt.onnx, from a temporary folder: the artifact's genai_config.json with
    the session's thread count set, beside links to its files (the artifact itself is never edited)."""

    def __init__(self, folder: Path, *, threads: int) -> None:
        import onnxruntime_genai as og

        self.og = og
        self.tmp = tempfile.TemporaryDirectory(prefix="mha-genai-")
        here = Path(self.tmp.name)
        for f in folder.iterdir():
            if f.is_file() and f.name != GENAI_CONFIG:
                os.symlink(f.resolve(), here / f.name)
        config = json.loads((folder / GENAI_CONFIG).read_text())
        config["model"]["decoder"]["session_options"] = {"intra_op_num_threads": threads,
                                                         "inter_op_num_threads": 1}
        (here / GENAI_CONFIG).write_text(json.dumps(config, indent=2))
        assert (here / CONCAT_FORM).exists()
        self.model = og.Model(str(here))

    def generate(self, prompt: list[int], new: int) -> Timed:
        """Greedy; min_length = max_length, so an eos id never ends it early."""
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=len(prompt) + new, min_length=len(prompt) + new, do_sample=False)
        start = time.perf_counter()
        generator = self.og.Generator(self.model, params)
        generator.append_tokens(prompt)
        ids: list[int] = []
        first = 0.0
        while not generator.is_done():
            generator.generate_next_token()
            ids.append(int(generator.get_next_tokens()[0]))
            if len(ids) == 1:
                first = time.perf_counter() - start
        return Timed(ids, first, time.perf_counter() - start)

    def close(self) -> None:
        del self.model
        self.tmp.cleanup()
