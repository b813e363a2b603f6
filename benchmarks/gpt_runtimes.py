"""The GPT's decode speed in every runtime beside Python's: `python -m benchmarks.gpt_runtimes --artifact DIR`.

Each runner generates the same greedy tokens from the same prompt (eos off) and reports its own tokens/s over the
tokens after the first (each measures inside its process, so process and session start are not counted): Python
(`Generator`, gpt.inplace.onnx), C (`mha_check generate --json`), Node (`cli.js generate --json`), wasm in Node
(`check.mjs generate --json`) and ExecuTorch (gpt.pte, when the folder has it). Each runner first makes WARMUP
untimed generations of the same request in its own process (`--warmup`): V8 runs onnxruntime-web's wasm on its
baseline compiler until its optimizing tier is done, so a fresh process's first generation says how long V8
compiles, not how fast the runtime decodes (docs/measurements/gpt.md, "Tokens/s in every runtime"). Rounds
interleave the runners with a settle pause; the figures are medians, and every runner's ids must equal Python's.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import click

from mha_runtime.artifact.atomic import write_file_atomic
from mha_runtime.cli.tables import table
from mha_runtime.decoder.contract import PTE_FORM
from mha_runtime.decoder.generate import Generator

REPO = Path(__file__).resolve().parents[1]
NATIVE = REPO / "runtime" / "native"
PROMPT = [6109, 3626, 6100, 345]  # "Every effort moves you"
SETTLE_S = 0.5
WARMUP = 3  # untimed generations before the timed one, in every runner
TARGETS = {"c": 1.1, "wasm": 4.0}  # the most Python's tokens/s may be of each runner's


def external(name: str, folder: Path, new: int, threads: int) -> list[str]:
    ids = ",".join(map(str, PROMPT))
    common = [str(folder), "--prompt-ids", ids, "--max-new-tokens", str(new), "--no-eos", "--json",
              "--warmup", str(WARMUP)]
    if name == "c":
        return [str(NATIVE / "c" / "build" / "mha_check"), "generate", *common, "--threads", str(threads)]
    if name == "node":
        return ["node", str(NATIVE / "node" / "cli.js"), "generate", *common, "--threads", str(threads)]
    return ["node", str(NATIVE / "web" / "check.mjs"), "generate", *common]  # wasm: one thread


def run_once(name: str, folder: Path, new: int, threads: int, gens: dict[str, Generator]) -> tuple[float, list[int]]:
    """(tokens/s, ids) of one generation by runner `name`."""
    if name in gens:
        for _ in range(WARMUP):
            gens[name].generate([PROMPT], max_new_tokens=new, eos_id=None)
        g = gens[name].generate([PROMPT], max_new_tokens=new, eos_id=None)
        return g.tokens_per_s, g.ids[0]
    out = subprocess.run(external(name, folder, new, threads), capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise click.ClickException(f"{name}: {out.stderr.strip()[-300:]}")
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    return float(doc["tokens_per_s"]), list(doc["ids"])


def bench(folder: Path, *, new: int, rounds: int, threads: int) -> dict[str, Any]:
    gens = {"python": Generator(folder, threads=threads)}
    names = ["python", "c", "node", "wasm"]
    if PTE_FORM in gens["python"].manifest.artifacts:
        gens["executorch"] = Generator(folder, form=PTE_FORM, threads=threads)
        names.append("executorch")
    samples: dict[str, list[float]] = {n: [] for n in names}
    reference: list[int] | None = None
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            time.sleep(SETTLE_S)
            speed, ids = run_once(name, folder, new, threads, gens)
            reference = ids if reference is None and name == "python" else reference
            if reference is not None and ids != reference:
                raise click.ClickException(f"{name}: its ids differ from Python's")
            samples[name].append(speed)
    medians = {n: statistics.median(v) for n, v in samples.items()}
    ratios = {n: medians["python"] / medians[n] for n in names if n != "python"}
    targets = [{"target": f"Python's tokens/s over {n}'s", "value": ratios[n], "goal": f"<= {goal:g}",
                "met": ratios[n] <= goal} for n, goal in TARGETS.items()]
    return {"artifact": str(folder), "prompt": PROMPT, "new_tokens": new, "rounds": rounds, "threads": threads,
            "warmup": WARMUP,
            "tokens_per_s": samples, "median_tokens_per_s": medians, "python_over": ratios, "targets": targets}


@click.command()
@click.option("--artifact", "folders", type=click.Path(path_type=Path), multiple=True, required=True)
@click.option("--out", type=click.Path(path_type=Path), default=Path("artifacts/bench"), show_default=True)
@click.option("--new-tokens", type=click.IntRange(min=2), default=64, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="Intra-op threads of every runner that takes them (wasm runs one).")
def main(folders: tuple[Path, ...], out: Path, new_tokens: int, rounds: int, threads: int) -> None:
    """Tokens/s of every runtime on each GPT folder; writes gpt_runtimes.json."""
    results = [bench(f, new=new_tokens, rounds=rounds, threads=threads) for f in folders]
    out.mkdir(parents=True, exist_ok=True)
    write_file_atomic(out / "gpt_runtimes.json", (json.dumps(results, indent=2) + "\n").encode())
    for r in results:
        click.echo(f"{r['artifact']}: {r['new_tokens']} new tokens, {r['threads']} thread(s), median of {r['rounds']}")
        click.echo(table(["runtime", "tokens/s", "Python's over it"],
                         [[n, f"{v:.1f}", "-" if n == "python" else f"{r['python_over'][n]:.2f}x"]
                          for n, v in r["median_tokens_per_s"].items()]))
        click.echo(table(["target", "value", "goal", "met"], [[t["target"], f"{t['value']:.2f}x", t["goal"],
                                                               "yes" if t["met"] else "NO"] for t in r["targets"]]))


if __name__ == "__main__":
    main()
