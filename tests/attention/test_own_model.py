"""Your own model: checkpoints made by the libraries that define each layout go through `mha export --config`,
and every artifact, the decode form and each native runner equal the original module's output."""
from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from llms_from_scratch.ch03 import MultiHeadAttention
from llms_from_scratch.ch04 import GPTModel

from helpers import REPO
from mha_export.attention.pipeline.validate import artifact_runner
from mha_runtime.artifact.tolerance import compare
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.decode_session import DecodeSession, golden_schedule, run_chunked
from mha_runtime.attention.golden import iter_cases, load_cases
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.attention.registry import CHOICES, DECODE, DECODE_RUNTIME, artifact_specs, tolerance_for
from mha_runtime.cli.main import cli

# A GPT-2-shaped layer, small: 4 heads of 16, context 32.
GPT2_CONFIG = MHAConfig(d_in=64, d_out=16, num_heads=4, context_length=32, qkv_bias=True, out_proj=True)
BOOK_CONFIG = MHAConfig(d_in=64, d_out=16, num_heads=4, context_length=32, qkv_bias=False, out_proj=True)
BOOK_GPT = {"vocab_size": 50, "context_length": 32, "emb_dim": 64, "n_heads": 4, "n_layers": 2, "drop_rate": 0.0,
            "qkv_bias": False}
SHAPES = [(1, 1), (3, 1), (1, 16), (3, 16), (1, 32), (3, 32)]  # tokens 1, a middle one and context_length
FILES = [spec for spec in artifact_specs(CHOICES) if spec.runtime != DECODE_RUNTIME]
SOURCES = ["hf-gpt2-safetensors", "hf-gpt2-lmhead-bin", "book-gptmodel", "book-mha"]
# Every form on one source with biases and one without (the default export, mha.pte included). The other two
# sources have hf-gpt2-safetensors' config (q/k/v biases, out_proj) and differ from it only in how the weights are
# found (a GPT2LMHeadModel's .bin, a lone MultiHeadAttention): they are loaded into the same module before any form
# is built, so their own loading is proven by the plain forms and the decode form; each form's building on that
# config, by hf-gpt2-safetensors. Every form on all four was about 60% of this file's time (docs/measurements/).
EVERY_FORM = ("hf-gpt2-safetensors", "book-gptmodel")
PLAIN = ("mha.onnx", "mha.pt")  # built by every export, whatever the variants
CASES = [pytest.param(source, spec, id=f"{spec.file}-{source}") for spec in FILES for source in SOURCES
         if source in EVERY_FORM or spec.file in PLAIN]
NATIVE = REPO / "runtime" / "native"


@dataclass(frozen=True)
class Source:
    """A checkpoint made by the original implementation, and that implementation's module as the reference."""

    config: MHAConfig
    weights: Path
    layer: int | None
    reference: Callable[[torch.Tensor], torch.Tensor]


def _gpt2(cls: type, folder: Path) -> torch.nn.Module:
    from transformers import GPT2Config

    config = GPT2Config(n_embd=64, n_head=4, n_layer=2, n_positions=32, vocab_size=50, bos_token_id=0,
                        eos_token_id=0, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    torch.manual_seed(11)
    return cls(config).eval()


def _gpt2_attention(model: torch.nn.Module, layer: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Layer `layer`'s GPT2Attention called with the causal mask GPT2Model itself passes it for that shape."""
    attn = model.h[layer].attn

    def run(x: torch.Tensor) -> torch.Tensor:
        seen: dict[str, object] = {}
        hook = attn.register_forward_pre_hook(lambda m, a, kw: seen.update(mask=kw.get("attention_mask")),
                                              with_kwargs=True)
        with torch.no_grad():
            model(inputs_embeds=torch.zeros_like(x))
            hook.remove()
            return attn(x, attention_mask=seen["mask"])[0]

    return run


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Source]:
    from transformers import GPT2LMHeadModel, GPT2Model

    root = tmp_path_factory.mktemp("checkpoints")
    hf = _gpt2(GPT2Model, root)
    hf.save_pretrained(root / "gpt2")  # writes model.safetensors, as the Hub holds it
    lm = _gpt2(GPT2LMHeadModel, root)
    torch.save(lm.state_dict(), root / "pytorch_model.bin")  # transformer.h.{N}... keys
    torch.manual_seed(12)
    book = GPTModel(BOOK_GPT).eval()
    torch.save(book.state_dict(), root / "model.pth")  # as chapters 5-7 save it
    torch.manual_seed(13)
    mha = MultiHeadAttention(64, 64, 32, 0.0, num_heads=4, qkv_bias=True).eval()
    torch.save(mha.state_dict(), root / "mha.pth")
    mha_config = MHAConfig(d_in=64, d_out=16, num_heads=4, context_length=32, qkv_bias=True, out_proj=True)

    def book_ref(module: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        def run(x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return module(x)
        return run

    return {
        "hf-gpt2-safetensors": Source(GPT2_CONFIG, root / "gpt2" / "model.safetensors", 1, _gpt2_attention(hf, 1)),
        "hf-gpt2-lmhead-bin": Source(GPT2_CONFIG, root / "pytorch_model.bin", 1,
                                     _gpt2_attention(lm.transformer, 1)),
        "book-gptmodel": Source(BOOK_CONFIG, root / "model.pth", 1, book_ref(book.trf_blocks[1].att)),
        "book-mha": Source(mha_config, root / "mha.pth", None, book_ref(mha)),
    }


@pytest.fixture(scope="module")
def exported(sources: dict[str, Source], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("exports")
    folders = {}
    for name, source in sources.items():
        config_file = out / f"{name}.json"
        config_file.write_text(json.dumps(source.config.to_dict()))
        variants = [] if name in EVERY_FORM else ["--variants", "decode"]
        args = ["export", "--config", str(config_file), "--name", name, "--weights", str(source.weights),
                "--out", str(out), *variants] + ([] if source.layer is None else ["--layer", str(source.layer)])
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        folders[name] = out / name
    return folders


def _inputs(config: MHAConfig, batch: int, tokens: int) -> torch.Tensor:
    return torch.randn(batch, tokens, config.d_in, generator=torch.Generator().manual_seed(100 * batch + tokens))


@pytest.mark.parametrize("source,spec", CASES)
def test_artifact_equals_the_original_module(sources: dict[str, Source], exported: dict[str, Path], source: str,
                                             spec: object) -> None:
    folder, src = exported[source], sources[source]
    run = artifact_runner(folder, spec)  # the runner users use: ONNX Runtime, torch.jit or ExecuTorch
    for batch, tokens in SHAPES:
        x = _inputs(src.config, batch, tokens)
        cmp = compare(run(x.numpy()), src.reference(x).numpy(), tolerance_for(spec.kind))
        assert cmp.ok, f"{spec.file} batch={batch} tokens={tokens}: {cmp}"


@pytest.mark.parametrize("source", SOURCES)
def test_decode_prefill_then_steps_equals_the_original(sources: dict[str, Source], exported: dict[str, Path],
                                                       source: str) -> None:
    src, session = sources[source], DecodeSession(exported[source], provider="cpu")
    for batch, tokens in SHAPES:
        x = _inputs(src.config, batch, tokens)
        got = run_chunked(session, x.numpy(), golden_schedule(tokens))  # a prefill, then one token per step
        cmp = compare(got, src.reference(x).numpy(), tolerance_for(DECODE.kind))
        assert cmp.ok, f"batch={batch} tokens={tokens}: {cmp}"


@pytest.mark.parametrize("source", ["hf-gpt2-safetensors", "book-gptmodel"])
def test_manifest_records_layout_layer_and_source(sources: dict[str, Source], exported: dict[str, Path],
                                                  source: str) -> None:
    from mha_runtime.artifact.manifest import sha256_file

    manifest = load_manifest(exported[source])
    assert manifest.weights.layout == {"hf-gpt2-safetensors": "hf-gpt2", "book-gptmodel": "book-gpt"}[source]
    assert manifest.weights.layer == 1 and manifest.weights.sha256 == sha256_file(sources[source].weights)
    assert manifest.config == sources[source].config


@pytest.mark.parametrize("source", ["hf-gpt2-safetensors", "book-gptmodel"])
@pytest.mark.parametrize("runner", ["c", "node", "cpp"])
def test_native_runners_equal_the_original(sources: dict[str, Source], exported: dict[str, Path], source: str,
                                           runner: str) -> None:
    """The golden outputs equal the original module (checked here), and each runner passes every golden case."""
    folder, src = exported[source], sources[source]
    cases = load_cases(folder)
    for _, x, expected in iter_cases(folder, cases):
        assert compare(expected, src.reference(torch.from_numpy(x)).numpy(), tolerance_for("onnx")).ok
    command = {"c": [NATIVE / "c" / "build" / "mha_check", "check", folder],
               "node": ["node", NATIVE / "node" / "cli.js", "check", folder],
               "cpp": [NATIVE / "cpp-libtorch" / "build" / "mha_ts", "check", folder]}[runner]
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.endswith("passed, 0 failed") and int(last.split()[0]) >= 3


def test_bench_runs_on_a_custom_folder(exported: dict[str, Path], tmp_path: Path) -> None:
    folder = exported["book-mha"]
    result = CliRunner().invoke(cli, ["bench", "--artifacts", str(folder.parent), "--preset", folder.name,
                                      "--rounds", "1", "--threads", "1", "--tokens", "4,32", "--settle", "0",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["name"] == "book-mha" and data["tokens"] == [4, 32]
    assert np.isfinite(data["by_threads"]["1"]["matmul_peak"]["gflops"])


def test_int8_keeps_the_output_projection_in_fp32(exported: dict[str, Path]) -> None:
    """The projection's input (the attention context) loses too much to 8-bit activations on a GPT-2 layer."""
    import onnx

    graph = onnx.load(str(exported["hf-gpt2-safetensors"] / "mha.int8.onnx")).graph
    projection = [n for n in graph.node if n.name == "out_proj_matmul"]
    assert len(projection) == 1 and projection[0].op_type == "MatMul"
    assert any(n.op_type == "MatMulInteger" for n in graph.node)  # the Q/K/V projection is quantized
