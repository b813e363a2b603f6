"""`make serve-bench` for the whole GPT: `mha serve` on a GPT folder under generation loads; gpt_serve.json.

One server (`--max-batch`, `--threads` passed through) takes two loads in turn, each round in the other order:
concurrency 1 and concurrency 8, prompts of 8..128 random ids, 64 new tokens, greedy, every request streamed
(so every request has a client-side time to first token and inter-token gaps). Between the loads this process
times a solo prefill with the Generator (the same decoder file and thread count as the server's replica, the
server idle meanwhile). Every answer is checked against that Generator after its load (`gen_loadtest`).
Targets, judged here and never in tests: new tokens/s at c8 over c1 >= 3x (batching pays), time to first token
at c8 within 2x a solo prefill (a new request is not kept waiting behind the others), and no error or wrong
answer. The time to first token is judged request by request: each request's over the solo prefill of its own
prompt length, p50 over the requests of each round, median over the rounds. (The p50 of the whole mix over the
median solo prefill, the earlier figure, is reported too: it moves with how many long prompts a round drew, by up
to the 64-token prefill's 1.8x of the median's even when no request waits; docs/serving.md.)
`make serve-bench` runs it through each ingress, Serve's proxy and HAProxy, one after the other, and judges each.
"""
from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import numpy as np

from benchmarks.process import ServerProcess
from mha_runtime.artifact.atomic import write_file_atomic
from mha_runtime.artifact.errors import MHAError
from mha_runtime.cli.tables import table
from mha_runtime.decoder.decoder import InPlaceDecoder
from mha_runtime.decoder.generate import Generator
from mha_runtime.infer.cpu_features import load_average, machine
from mha_runtime.serve.decoder.loadtest import gen_loadtest

PROMPT_TOKENS = (8, 16, 32, 64, 128)
NEW_TOKENS = 64
# name -> (concurrency, requests per round)
LOADS = {"c1": (1, 8), "c8": (8, 32)}
ROUNDS = 2
SOLO_REPEATS = 3  # solo prefills of each prompt length, per measurement
TARGET_SPEEDUP, TARGET_TTFT_RATIO = 3.0, 2.0


def solo_prefill_ms(gen: Generator, *, repeats: int, seed: int) -> dict[int, list[float]]:
    """Prefill alone, as the server's engine runs it for a new request: one prompt into row 0 of a cache made
    (and bound, by one untimed call) before the clock starts; `repeats` prompts of each length of
    PROMPT_TOKENS, random ids as the loads send. -> {prompt length: its samples in ms}"""
    decoder = gen.decoder()
    if not isinstance(decoder, InPlaceDecoder):
        raise MHAError(f"{gen.folder / gen.form}: the solo prefill times the in-place form the server runs; "
                       f"this folder's default form is {gen.form}")
    decoder.allocate(1)
    decoder.prefill_row(0, [0])
    rng = np.random.default_rng(seed)
    samples: dict[int, list[float]] = {length: [] for length in PROMPT_TOKENS}
    for _ in range(repeats):
        for length in PROMPT_TOKENS:
            ids = [int(t) for t in rng.integers(0, gen.shapes.vocab_size, length)]
            start = time.perf_counter()
            decoder.prefill_row(0, ids)
            samples[length].append(1e3 * (time.perf_counter() - start))
    return samples


class GPTBenchServer(ServerProcess):
    """The bench's server, whose exit is checked: status 0 and nothing of Ray left behind."""

    def stop(self, timeout_s: float = 90.0) -> int | None:
        returncode = super().stop(timeout_s)
        if returncode != 0 or self.leftovers:
            raise MHAError(f"mha serve {self.command[4]}: exit status {returncode}, left processes {self.leftovers}")
        return returncode


def run_gpt_serve_bench(artifact: Path, *, log_dir: Path, max_batch: int, threads: int, scale: float = 1.0,
                        rounds: int = ROUNDS, new_tokens: int = NEW_TOKENS, ingress: str = "proxy") -> dict[str, Any]:
    """Both loads for `rounds` rounds on one server, solo prefills between them; the figures and the targets."""
    home = Path(tempfile.mkdtemp(prefix="mha-gbench-", dir="/tmp"))  # Ray's files; short for its socket paths
    gen = Generator(artifact, threads=threads)
    runs: list[dict[str, Any]] = []
    solo: dict[int, list[float]] = {length: [] for length in PROMPT_TOKENS}

    def time_solo() -> None:
        for length, samples in solo_prefill_ms(gen, repeats=SOLO_REPEATS, seed=sum(map(len, solo.values()))).items():
            solo[length] += samples
    started = time.time()
    args = ["--max-batch", str(max_batch), "--threads", str(threads), "--ingress", ingress]

    def load(url: str, name: str, round_: int) -> None:
        concurrency, requests = LOADS[name]
        click.echo(f"round {round_ + 1}: {name} ...", err=True)
        before = load_average()
        summary = gen_loadtest(url, artifact, requests=max(concurrency, int(requests * scale)),
                               concurrency=concurrency, prompt_tokens=PROMPT_TOKENS, max_new_tokens=(new_tokens,),
                               stream_share=1.0, sample_share=0.0, seed=len(runs), max_seconds=900.0,
                               generator=gen)
        runs.append({"load": name, "round": round_ + 1, "load_average_before": before,
                     "load_average_after": load_average(), **summary})

    try:
        with GPTBenchServer(artifact, log_dir, *args, home=home) as server:
            for round_ in range(rounds):
                for name in (LOADS if round_ % 2 == 0 else list(LOADS)[::-1]):
                    time_solo()
                    load(server.url, name, round_)
                time_solo()
    finally:
        shutil.rmtree(home, ignore_errors=True)
    every = [ms for samples in solo.values() for ms in samples]
    result = {"artifact": str(artifact), "form": gen.form, "server_args": args, "machine": machine(),
              "seconds": time.time() - started, "rounds": rounds, "prompt_tokens": list(PROMPT_TOKENS),
              "new_tokens": new_tokens, "runs": runs,
              "solo_prefill_ms": {"p50": statistics.median(every), "p90": float(np.percentile(every, 90)),
                                  "samples": len(every),
                                  "p50_by_prompt_tokens": {str(n): statistics.median(v) for n, v in solo.items()}}}
    result["targets"] = judge(result)
    return result


def tokens_per_s(result: dict[str, Any], load: str) -> float:
    """New tokens per second over the rounds: all checked new tokens over all their wall seconds."""
    runs = [r for r in result["runs"] if r["load"] == load]
    return sum(r["new_tokens"] for r in runs) / sum(r["seconds"] for r in runs)


def median_of(result: dict[str, Any], load: str, figure: str) -> float:
    """The median over the rounds of one load's p50 of `figure` (ttft_ms, server_ttft_ms, inter_token_ms)."""
    values = [r[figure]["p50"] for r in result["runs"] if r["load"] == load and r[figure]["p50"] is not None]
    return statistics.median(values) if values else float("nan")


def own_prompt_ratio(result: dict[str, Any], load: str, column: int) -> float:
    """Each answered request's time to first token over the solo prefill of its prompt length (column 1: the
    client's, streamed requests; 2: the replica's), p50 per round, median over the rounds."""
    solo = result["solo_prefill_ms"]["p50_by_prompt_tokens"]
    per_round = []
    for r in (r for r in result["runs"] if r["load"] == load):
        ratios = [row[column] / solo[str(row[0])] for row in r["first_token_ms"] if row[column] is not None]
        if ratios:
            per_round.append(statistics.median(ratios))
    return statistics.median(per_round) if per_round else float("nan")


def judge(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets from one run's figures."""
    speedup = tokens_per_s(result, "c8") / tokens_per_s(result, "c1")
    solo = result["solo_prefill_ms"]["p50"]
    ttft_ratio = own_prompt_ratio(result, "c8", 1)
    bad = sum(r["errors"] + r["not_sent"] for r in result["runs"])
    wrong = sum(r["wrong"] for r in result["runs"])
    return [
        {"target": "new tokens/s, c8 over c1", "value": speedup, "unit": "x", "goal": f">= {TARGET_SPEEDUP:g}",
         "met": speedup >= TARGET_SPEEDUP},
        {"target": "time to first token at c8 over the solo prefill of the same prompt length (p50 of requests)",
         "value": ttft_ratio, "unit": "x", "goal": f"<= {TARGET_TTFT_RATIO:g}", "met": ttft_ratio <= TARGET_TTFT_RATIO},
        {"target": "errors (lost, wrong, unexpected, not sent) over the bench", "value": bad, "unit": "",
         "goal": "0", "met": bad == 0},
        {"target": "wrong answers over the bench", "value": wrong, "unit": "", "goal": "0", "met": wrong == 0},
        {"target": "time to first token at c1 over the solo prefill of the same prompt length (information)",
         "value": own_prompt_ratio(result, "c1", 1), "unit": "x", "goal": "-", "met": None},
        {"target": "time to first token p50 at c8 over the median solo prefill of all lengths (information: the "
                   "earlier figure, which moves with the rounds' draw of prompt lengths)",
         "value": median_of(result, "c8", "ttft_ms") / solo, "unit": "x", "goal": "-", "met": None},
        {"target": "server-reported time to first token at c8 over the solo prefill of the same prompt length "
                   "(information: the replica's own clock, from the request's arrival there)",
         "value": own_prompt_ratio(result, "c8", 2), "unit": "x", "goal": "-", "met": None},
    ]


SUMMARY_HEADERS = ["load", "round", "answered", "new tokens/s", "ttft p50 ms", "ttft p90 ms", "itl p50 ms",
                   "itl p90 ms", "errors", "load avg"]


def summary_rows(result: dict[str, Any]) -> list[list[Any]]:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    rows = [[r["load"], r["round"], r["answered"], f"{r['tokens_per_s']:.1f}", ms(r["ttft_ms"]["p50"]),
             ms(r["ttft_ms"]["p90"]), ms(r["inter_token_ms"]["p50"]), ms(r["inter_token_ms"]["p90"]), r["errors"],
             "-" if r["load_average_before"] is None else f"{r['load_average_before']:.1f}"] for r in result["runs"]]
    solo = result["solo_prefill_ms"]
    rows.append(["solo prefill", "all", solo["samples"], "-", ms(solo["p50"]), ms(solo["p90"]), "-", "-", 0, "-"])
    return rows


@click.command()
@click.option("--artifact", type=click.Path(path_type=Path), default=Path("artifacts/gpt-124m"), show_default=True,
              help="A GPT folder (mha export --gpt).")
@click.option("--out", type=click.Path(path_type=Path), default=Path("artifacts/bench"), show_default=True)
@click.option("--max-batch", type=click.IntRange(min=1), default=8, show_default=True,
              help="Passed to mha serve: the generations stepped together.")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True,
              help="Passed to mha serve (intra-op threads per replica); the solo prefill uses as many.")
@click.option("--scale", type=click.FloatRange(min=0.01), default=1.0, show_default=True,
              help="Multiply every load's request count (at least one request per connection).")
@click.option("--rounds", type=click.IntRange(min=1), default=ROUNDS, show_default=True)
@click.option("--new-tokens", type=click.IntRange(min=1), default=NEW_TOKENS, show_default=True,
              help="max_new_tokens of every request.")
@click.option("--ingress", type=click.Choice(["proxy", "haproxy"]), default="proxy", show_default=True,
              help="Passed to mha serve.")
def main(artifact: Path, out: Path, max_batch: int, threads: int, scale: float, rounds: int,
         new_tokens: int, ingress: str) -> None:
    """Run the GPT serve bench and write gpt_serve.json (gpt_serve_haproxy.json behind HAProxy)."""
    try:
        result = run_gpt_serve_bench(artifact, log_dir=out / "gpt-serve-logs", max_batch=max_batch, threads=threads,
                                     scale=scale, rounds=rounds, new_tokens=new_tokens, ingress=ingress)
    except MHAError as exc:
        raise click.ClickException(str(exc)) from None
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / ("gpt_serve.json" if ingress == "proxy" else f"gpt_serve_{ingress}.json")
    write_file_atomic(json_path, (json.dumps(result, indent=2) + "\n").encode())
    click.echo(table(SUMMARY_HEADERS, summary_rows(result)) + "\n")
    click.echo(table(["target", "value", "goal", "met"],
                     [[t["target"], f"{t['value']:.2f} {t['unit']}".strip(), t["goal"],
                       {True: "yes", False: "NO", None: "-"}[t["met"]]] for t in result["targets"]]))
    click.echo(f"\nwrote {json_path} ({result['seconds']:.0f} s; a shared machine: figures are noisy)")


if __name__ == "__main__":
    main()
