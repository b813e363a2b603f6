"""`make bench`'s quantized part: our fp32, int8 and int4 forms beside llama.cpp's F32, Q8_0 and Q4_0 on the same
weights, in one run: decode and prefill speed, and quality on the same text, as llama.cpp measures it.

- Weights: the folder's, written as a Hugging Face GPT-2 folder, converted by llama.cpp's own converter and
  quantized by llama-quantize (benchmarks.llama_peer).
- Speed, taking turns each round (the order rotated): ours through mha_runtime's Generator, batch 1, a 32-token
  prompt then 128 greedy tokens (tokens/s after the first) and a 128-token prefill (tokens / time to the first
  token); llama.cpp's llama-bench at one repetition per round (its decode: 128 steps on a cache of 32 tokens; its
  prefill: 128 tokens). Medians over the rounds.
- Floors: a read-only pass over 1 GiB on the bench's threads (gpt_floors.read_bandwidth) over the bytes each form
  reads per step (gpt_floors.step_bytes): batch-1 decode reads every weight once a token. The bandwidth is sampled
  in every round beside the runners (a shared host's memory speed moves within minutes: docs/measurements/gpt.md,
  "The fast plans"); the floor is the best sample of the run, and the median of each round's decode over that
  round's own floor is information.
- Quality: the windows `llama-perplexity --kl-divergence -c 128 --chunks 16` scores on the held-out pydoc text
  (llama_peer.llama_windows): ours measured there by mha_runtime.decoder.quality against gpt.inplace.onnx, llama.cpp's
  by llama-perplexity against its F32 GGUF (the same windows; it scores 63 of each window's 64 positions).
- Targets (the issue's, judged here, never asserted): tokens/s ratios int4 / Q4_0 >= 1.2, int8 / Q8_0 >= 1.1,
  fp32 / F32 >= 1.05, each with a mean KL no worse than the peer's; fp32 >= 0.9 of its floor, the lossy forms >= 0.7.
Without llama.cpp's tools built (`make llama-tools`) our figures are still taken and the peer's are named as missing.
"""
from __future__ import annotations

import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.gpt_floors import READ_FORMULA, read_bandwidth, step_bytes
from benchmarks.llama_peer import (
    llama_bench,
    llama_bin,
    llama_kl,
    llama_windows,
    plain_encoder,
    to_gguf,
    write_hf_folder,
    write_text,
)
from mha_runtime.decoder.contract import INPLACE_FORM, INT4_FORM, INT8_FORM, TOKENIZER_FILE
from mha_runtime.decoder.forms import FORMS
from mha_runtime.decoder.generate import Generator
from mha_runtime.decoder.quality import Windows, measure
from mha_runtime.infer.cpu_features import machine

PAIRS = {INPLACE_FORM: "F32", INT8_FORM: "Q8_0", INT4_FORM: "Q4_0"}
SPEED_TARGET = {"F32": 1.05, "Q8_0": 1.1, "Q4_0": 1.2}
FLOOR_TARGET = {"fp32": 0.9, "int8": 0.7, "int4": 0.7}
PROMPT, NEW, PREFILL = 32, 128, 128
CTX, CHUNKS = 128, 16
READ = "read bandwidth"
NOT_BUILT = ("llama.cpp's tools are not built: run `make llama-tools` (tools/llama_cpp.sh --tools, about 9 minutes on "
             "2 cores)")


def _ours(g: Generator, cfg_vocab: int) -> dict[str, float]:
    """One round of ours: decode tokens/s after a PROMPT-token prompt, and prefill tokens/s of PREFILL tokens."""
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, cfg_vocab, PROMPT).tolist()
    long = rng.integers(0, cfg_vocab, PREFILL).tolist()
    decode = g.generate([prompt], max_new_tokens=NEW).tokens_per_s
    prefill = PREFILL / g.generate([long], max_new_tokens=1).time_to_first_token_s
    return {"decode": decode, "prefill": prefill}


def _quality(folder: Path, forms: list[str], windows: list[list[int]], *, threads: int) -> dict[str, Any]:
    reference = Generator(folder, form=INPLACE_FORM, threads=threads)
    text = Windows(windows, text=True, source=f"llama-perplexity -c {CTX} --chunks {CHUNKS}")
    return {f: measure(reference.decoder(), Generator(folder, form=f, threads=threads).decoder(), text).to_dict()
            for f in forms if FORMS[f].lossy}


def run_quant_bench(folder: Path, *, threads: int, rounds: int, vocab_dir: Path, peers: bool = True
                    ) -> dict[str, Any]:
    """Every figure of the module docstring; `peers` False (or llama.cpp not built): ours only."""
    from benchmarks.gpt_bench import take_turns

    manifest = Generator(folder, form=INPLACE_FORM, threads=threads).manifest
    forms = [f for f in PAIRS if f in manifest.artifacts]
    built = peers and llama_bin("llama-bench") is not None and llama_bin("llama-perplexity") is not None
    if manifest.tokenizer is None:
        return {"skipped": f"{folder} has no tokenizer: the quality windows are text (export with --tokenizer)"}
    with tempfile.TemporaryDirectory(prefix="mha-quant-bench-") as tmp:
        work = Path(tmp)
        text_file = write_text(work / "text.txt")
        windows = llama_windows(text_file.read_text(encoding="utf-8"), plain_encoder(folder / TOKENIZER_FILE), CTX,
                                CHUNKS)
        ggufs = to_gguf(write_hf_folder(folder, work / "hf", vocab_dir), work / "gguf") if built else {}
        generators = {f: Generator(folder, form=f, threads=threads) for f in forms}
        calls: dict[str, Any] = {f: (lambda g=g: _ours(g, manifest.shapes.vocab_size)) for f, g in generators.items()}
        for form in forms if built else []:
            gguf = ggufs[PAIRS[form]]
            calls[PAIRS[form]] = lambda gguf=gguf: llama_bench(gguf, threads=threads, prompt=PROMPT, gen=NEW,
                                                               prefill=PREFILL, reps=1)
        # ours warm up on a short generation; llama-bench runs its own warm-up before each measured repetition
        warm: dict[str, Any] = {n: (lambda: None) for n in calls}
        warm |= {f: (lambda g=g: g.generate([[1]], max_new_tokens=4)) for f, g in generators.items()}
        calls[READ] = warm[READ] = lambda: read_bandwidth(threads=threads)
        samples = take_turns(calls, rounds, warm=warm)
        quality = _quality(folder, forms, windows, threads=threads)
        peer_quality = {}
        for form in forms if built else []:
            if FORMS[form].lossy:
                peer_quality[PAIRS[form]] = llama_kl(ggufs["F32"], ggufs[PAIRS[form]], text_file, threads=threads,
                                                     ctx=CTX, chunks=CHUNKS, base_logits=work / "base.kld")
    reads = [r["bytes_per_s"] for r in samples[READ]]
    first = samples[READ][0]
    read = {"bytes_per_s": max(reads), "round_samples": reads, "array_bytes": first["array_bytes"],
            "threads": threads, "method": f"{first['method']}; one such sample a round, the best of the run"}
    rows = []
    for form in forms:
        ours = samples[form]
        decode = statistics.median(s["decode"] for s in ours)
        own = step_bytes(folder / form)
        floor = read["bytes_per_s"] / own
        row: dict[str, Any] = {
            "form": form, "dtype": FORMS[form].dtype, "decode_tokens_per_s": decode,
            "decode_samples": [s["decode"] for s in ours],
            "prefill_tokens_per_s": statistics.median(s["prefill"] for s in ours), "step_bytes": own,
            "floor_tokens_per_s": floor, "ratio_to_floor": decode / floor,
            "paired_ratio_to_floor_median": statistics.median(
                s["decode"] * own / r for s, r in zip(ours, reads, strict=True)),
            "floor_target": FLOOR_TARGET[FORMS[form].dtype], "quality": quality.get(form)}
        peer = PAIRS[form]
        if built:
            theirs = samples[peer]
            peer_decode = statistics.median(s["decode_tokens_per_s"] for s in theirs)
            row["peer"] = {"name": f"llama.cpp {peer}", "decode_tokens_per_s": peer_decode,
                           "decode_samples": [s["decode_tokens_per_s"] for s in theirs],
                           "prefill_tokens_per_s": statistics.median(s["prefill_tokens_per_s"] for s in theirs),
                           "quality": peer_quality.get(peer)}
            row["decode_ratio"] = decode / peer_decode
            row["paired_decode_ratio_median"] = statistics.median(
                a["decode"] / b["decode_tokens_per_s"] for a, b in zip(ours, theirs, strict=True))
            row["speed_target"] = SPEED_TARGET[peer]
            if row["quality"] is not None and row["peer"]["quality"] is not None:
                row["kl_no_worse"] = row["quality"]["mean_kl"] <= row["peer"]["quality"]["mean_kl"]
        rows.append(row)
    return {"machine": machine(), "read_bandwidth": read, "floor_formula": READ_FORMULA, "threads": threads,
            "rounds": rounds,
            "peers": "llama.cpp (llama-cpp-python 0.3.36's bundled tree)" if built else
            ("not run (--no-peers)" if not peers else NOT_BUILT),
            "quality_windows": {"ctx": CTX, "chunks": CHUNKS, "text": "pydoc_data.topics from character 200,000",
                                "scored": "ours: 64 positions a window; llama-perplexity: 63 (one fewer)"},
            "forms": rows}


def simd(m: dict[str, Any]) -> str:
    """The host in a few words: its CPU and the widest x86 vector its kernels can take (the ratios to llama.cpp
    differ between AVX-512 and AVX2 hosts: docs/measurements/gpt.md)."""
    flags = set(m.get("cpu_flags") or [])
    widest = next((name for name, flag in (("AVX-512", "avx512f"), ("AVX2", "avx2"), ("AVX", "avx")) if flag in flags),
                  None)
    return m["cpu"] if widest is None else f"{m['cpu']} ({widest})"


def format_quant(q: dict[str, Any]) -> str:
    """The part as a table and a line on the floor."""
    if "skipped" in q:
        return f"quantized forms beside llama.cpp: skipped ({q['skipped']})"
    from mha_runtime.cli.tables import table

    def kl(x: dict[str, Any] | None) -> str:
        return "-" if x is None else f"{x['mean_kl']:.2e} / {100 * x['same_top']:.1f}%"

    rows = []
    for r in q["forms"]:
        p = r.get("peer")
        rows.append([r["form"], f"{r['decode_tokens_per_s']:.1f}", f"{r['prefill_tokens_per_s']:.0f}",
                     f"{r['ratio_to_floor']:.2f} (>= {r['floor_target']})", kl(r["quality"]),
                     "-" if p is None else p["name"], "-" if p is None else f"{p['decode_tokens_per_s']:.1f}",
                     "-" if p is None else f"{p['prefill_tokens_per_s']:.0f}", "-" if p is None else kl(p["quality"]),
                     "-" if p is None else f"{r['decode_ratio']:.2f} (>= {r['speed_target']})"])
    bw = q["read_bandwidth"]
    return "\n".join([
        f"quantized forms beside {q['peers']}, {q['threads']} threads, medians of {q['rounds']} rounds taking turns, "
        f"on {simd(q['machine'])}",
        table(["ours", "decode tok/s", "prefill tok/s", "/ own floor", "mean KL / same top", "peer",
               "decode tok/s", "prefill tok/s", "mean KL / same top", "ours / peer"], rows),
        f"read bandwidth {bw['bytes_per_s'] / 1e9:.1f} GB/s, rounds {min(bw['round_samples']) / 1e9:.1f}-"
        f"{max(bw['round_samples']) / 1e9:.1f} ({bw['method']}); floor = {q['floor_formula']}; each round's decode "
        "over its own round's floor, median: " + ", ".join(f"{r['dtype']} {r['paired_ratio_to_floor_median']:.2f}"
                                                          for r in q["forms"])])
