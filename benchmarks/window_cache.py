"""What keeping only the window costs and saves: Gemma 3's in-place form with its local layers' caches at the
window (as the export makes it) beside the same graph with every cache at context_length (as before issue 59's
windowed cache), from one GGUF at one context.

    python -m benchmarks.window_cache .cache/gemma3/gemma-3-270m-q4_k_m.gguf --context 8192 --at 600,4000

Per variant: the cache's bytes for one sequence (keys and values of every layer), and the median decode step
(ms, batch 1, greedy) after prompts of each `--at` length, the two variants interleaved step by step; the ids of
both must agree (the window is the same; only where its keys are kept differs). The results go to stdout as JSON
(docs/measurements/gemma3.md, "The windowed cache").
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import time
from pathlib import Path

import click
import numpy as np
import onnx
import onnxruntime as ort

from mha_export.decoder.archs import by_gguf_arch
from mha_export.decoder.graphs.table import GRAPHS
from mha_export.gguf.source import metadata, read_gguf_weights
from mha_runtime.decoder.contract import INPLACE_FORM
from mha_runtime.decoder.decoder import InPlaceDecoder
from mha_runtime.decoder.shapes import DecoderShapes, cache_bytes, cache_rows


def every_cache_at_context(model: onnx.ModelProto, context: int) -> onnx.ModelProto:
    """The same graph with every layer's cache at `context` rows, no layer evicting (the cache before the window)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for v in [*out.graph.input, *out.graph.output]:
        if v.name.startswith(("past_key_values.", "present.")):
            v.type.tensor_type.shape.dim[2].dim_value = context
    for node in out.graph.node:
        if node.op_type == "GroupQueryAttention":
            kept = [a for a in node.attribute if a.name != "sliding_window_cache"]
            del node.attribute[:]
            node.attribute.extend(kept)
    return out


def step_times(decoders: dict[str, InPlaceDecoder], prompt: list[int], steps: int) -> dict[str, list[float]]:
    """Prefill `prompt` in each, then `steps` greedy steps, the variants interleaved; each step's seconds."""
    logits = {name: d.prefill([prompt]) for name, d in decoders.items()}
    times: dict[str, list[float]] = {name: [] for name in decoders}
    for _ in range(steps):
        ids = {name: int(np.argmax(lg[0])) for name, lg in logits.items()}
        if len(set(ids.values())) != 1:
            raise click.ClickException(f"the variants chose different ids: {ids}")
        for name, d in decoders.items():
            start = time.perf_counter()
            logits[name] = d.step([ids[name]], [True])
            times[name].append(time.perf_counter() - start)
    return times


@click.command()
@click.argument("gguf", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--context", default=8192, show_default=True, help="context_length of both graphs")
@click.option("--at", "at", default="600,4000", show_default=True, help="prompt lengths, comma-separated")
@click.option("--steps", default=32, show_default=True)
@click.option("--threads", default=2, show_default=True)
def main(gguf: Path, context: int, at: str, steps: int, threads: int) -> None:
    fields = metadata(gguf)
    arch = by_gguf_arch(str(fields["general.architecture"]))
    cfg = dataclasses.replace(arch.config_from_gguf(fields), context_length=context)  # type: ignore[type-var]
    state, tied, _ = read_gguf_weights(gguf, cfg)
    windowed = GRAPHS[INPLACE_FORM](state, cfg, tied=tied).full()
    del state
    shapes = DecoderShapes.of(cfg)
    full = dataclasses.replace(shapes, cache_lengths=None)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    decoders = {name: InPlaceDecoder(ort.InferenceSession(m.SerializeToString(), options), s)
                for name, m, s in (("window", windowed, shapes),
                                   ("context", every_cache_at_context(windowed, context), full))}
    row_bytes = {"window": cache_bytes(shapes), "context": cache_bytes(full)}
    rng = np.random.default_rng(0)
    decode: dict[str, dict[str, float]] = {}
    for n in (int(v) for v in at.split(",")):
        prompt = [2, *(int(i) for i in rng.integers(3, cfg.vocab_size, n - 1))]
        times = step_times(decoders, prompt, steps)
        decode[str(n)] = {name: round(1e3 * statistics.median(t), 2) for name, t in times.items()}
    report = {"gguf": gguf.name, "context_length": context, "cache_lengths": cache_rows(shapes),
              "cache_bytes_per_sequence": row_bytes, "decode_ms": decode, "threads": threads, "steps": steps,
              "onnxruntime": ort.__version__}
    click.echo(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
