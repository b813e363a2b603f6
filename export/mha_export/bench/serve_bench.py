"""`make serve-bench`: `mha serve` on gpt2-small under bounded loads; JSON and a plot (torch-free).

Servers (each started, loaded and stopped by this process):
  batch16   --max-batch 16, 1 replica   (batching on, the default)
  batch1    --max-batch 1,  1 replica   (batching off)
  batch16 x2 replicas
batch16 and batch1 run side by side and take the loads in turn (A B, then B A), so that the load other
programs put on a shared machine falls on both alike. Loads: concurrency 16 at tokens 16,64 (the batching
target) and 16,64,256 (mixed lengths); concurrency 1 at T=16 on batch16, against the runner called directly
in this process (the server's overhead). The replicas run after, alone, and are compared with batch16 for
information. Every answer is checked against a local runner; targets are judged here, never in tests.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click
import numpy as np

from mha_export.bench.plots import save_png
from mha_runtime.artifact.atomic import write_file_atomic
from mha_runtime.artifact.errors import MHAError
from mha_runtime.cli.tables import table
from mha_runtime.infer.runner import OnnxRunner
from mha_runtime.serve.loadtest import loadtest
from mha_runtime.serve.process import ServerProcess

SERVERS = {"batch16": ["--max-batch", "16"], "batch1": ["--max-batch", "1"],
           "batch16 x2 replicas": ["--max-batch", "16", "--replicas", "2"]}
PAIRED, REPLICAS = ("batch16", "batch1"), "batch16 x2 replicas"
# name -> (concurrency, tokens, requests per round)
LOADS = {"c16 T16-64": (16, (16, 64), 400), "c16 T16-256": (16, (16, 64, 256), 200), "c1 T16": (1, (16,), 200)}
THROUGHPUT_LOADS = ("c16 T16-64", "c16 T16-256")
ROUNDS = 2
TARGET_SPEEDUP, TARGET_OVERHEAD_MS = 1.5, 5.0


def direct_latency(artifact: Path, *, tokens: int, calls: int, threads: int = 1) -> dict[str, float]:
    """The runner called in this process, batch 1, as the server's replica calls it (one thread)."""
    runner = OnnxRunner(artifact, provider="cpu", threads=threads)
    x = np.random.default_rng(0).standard_normal((1, tokens, runner.config.d_in), dtype=np.float32)
    for _ in range(10):
        runner.run(x)
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        runner.run(x)
        samples.append(time.perf_counter() - start)
    return {"p50": 1e3 * statistics.median(samples), "p90": 1e3 * float(np.percentile(samples, 90)),
            "calls": calls}


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "system": platform.platform(), "python": platform.python_version()}


def load_average() -> float | None:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except OSError:
        return None


def run_serve_bench(artifact: Path, *, log_dir: Path, scale: float = 1.0) -> dict[str, Any]:
    """Every server and load of the bench; `scale` multiplies the request counts."""
    home = Path(tempfile.mkdtemp(prefix="mha-bench-", dir="/tmp"))  # Ray's files; short for its socket paths
    runs: list[dict[str, Any]] = []
    direct: list[dict[str, float]] = []
    started = time.time()

    def load(process: ServerProcess, server: str, name: str, round_: int) -> None:
        concurrency, tokens, requests = LOADS[name]
        click.echo(f"round {round_ + 1}: {server}, {name} ...", err=True)
        before = load_average()
        summary = loadtest(process.url, artifact, requests=max(10, int(requests * scale)), concurrency=concurrency,
                           tokens=tokens, seed=len(runs))
        runs.append({"server": server, "args": SERVERS[server], "load": name, "round": round_ + 1,
                     "load_average_before": before, "load_average_after": load_average(), **summary})

    try:
        with ExitStack() as stack:
            processes = {name: stack.enter_context(BenchServer(artifact, log_dir, name, home)) for name in PAIRED}
            for round_ in range(ROUNDS):
                order = PAIRED if round_ % 2 == 0 else PAIRED[::-1]
                for name in THROUGHPUT_LOADS:
                    for server in order:
                        load(processes[server], server, name, round_)
                load(processes["batch16"], "batch16", "c1 T16", round_)
                direct.append(direct_latency(artifact, tokens=16, calls=max(30, int(200 * scale))))
        with BenchServer(artifact, log_dir, REPLICAS, home) as process:
            for round_ in range(ROUNDS):
                for name in THROUGHPUT_LOADS:
                    load(process, REPLICAS, name, round_)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    result = {"artifact": str(artifact), "machine": machine(), "seconds": time.time() - started, "rounds": ROUNDS,
              "runs": runs, "direct": {"tokens": 16, "rounds": direct,
                                       "p50": statistics.median(d["p50"] for d in direct),
                                       "p90": statistics.median(d["p90"] for d in direct)}}
    result["targets"] = judge(result)
    return result


class BenchServer(ServerProcess):
    """A bench server whose exit is checked: status 0 and nothing of Ray left behind."""

    def __init__(self, artifact: Path, log_dir: Path, name: str, home: Path) -> None:
        super().__init__(artifact, log_dir / name.replace(" ", "-"), *SERVERS[name], home=home)
        self.name = name

    def stop(self, timeout_s: float = 90.0) -> int | None:
        returncode = super().stop(timeout_s)
        if returncode != 0 or self.leftovers:
            raise MHAError(f"server {self.name}: exit status {returncode}, left processes {self.leftovers}")
        return returncode


def mean_rps(result: dict[str, Any], server: str, load: str) -> float:
    """Requests per second over the rounds: all answered requests over all their seconds."""
    runs = [r for r in result["runs"] if r["server"] == server and r["load"] == load]
    return sum(r["answered"] for r in runs) / sum(r["seconds"] for r in runs)


def judge(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets from one run's figures."""
    speedup = mean_rps(result, "batch16", "c16 T16-64") / mean_rps(result, "batch1", "c16 T16-64")
    mixed = mean_rps(result, "batch16", "c16 T16-256") / mean_rps(result, "batch1", "c16 T16-256")
    server_p50 = statistics.median(r["latency_ms"]["p50"] for r in result["runs"] if r["load"] == "c1 T16")
    overhead = server_p50 - result["direct"]["p50"]
    replicas = mean_rps(result, REPLICAS, "c16 T16-256") / mean_rps(result, "batch16", "c16 T16-256")
    bad = sum(r["errors"] + r["not_sent"] for r in result["runs"])
    wrong = sum(r["wrong"] for r in result["runs"])
    return [
        {"target": "batching vs --max-batch 1, c16, T16-64 (throughput)", "value": speedup, "unit": "x",
         "goal": f">= {TARGET_SPEEDUP}", "met": speedup >= TARGET_SPEEDUP},
        {"target": "server overhead vs direct runner, c1, T=16 (median)", "value": overhead, "unit": "ms",
         "goal": f"<= {TARGET_OVERHEAD_MS}", "met": overhead <= TARGET_OVERHEAD_MS},
        {"target": "errors (lost, wrong, unexpected, not sent) over the bench", "value": bad, "unit": "",
         "goal": "0", "met": bad == 0},
        {"target": "wrong answers over the bench", "value": wrong, "unit": "", "goal": "0", "met": wrong == 0},
        {"target": "batching vs --max-batch 1, c16, T16-256 (information)", "value": mixed, "unit": "x",
         "goal": "-", "met": None},
        {"target": "2 replicas vs 1, c16, T16-256 (information; not side by side)", "value": replicas, "unit": "x",
         "goal": "-", "met": None},
    ]


def summary_rows(result: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for r in result["runs"]:
        lat, batches = r["latency_ms"], r["batches"]
        rows.append([r["server"], r["load"], r["round"], r["answered"], f"{r['requests_per_s']:.1f}",
                     f"{r['tokens_per_s']:.0f}",
                     f"{lat['p50']:.1f}", f"{lat['p90']:.1f}", f"{lat['p99']:.1f}",
                     "-" if batches["mean_requests"] is None else f"{batches['mean_requests']:.2f}", r["errors"],
                     f"{r['load_average_before']:.1f}" if r["load_average_before"] is not None else "-"])
    for round_, d in enumerate(result["direct"]["rounds"], 1):
        rows.append(["direct runner", "c1 T16", round_, d["calls"], "-", "-", f"{d['p50']:.2f}", f"{d['p90']:.2f}",
                     "-", "-", 0, "-"])
    return rows


SUMMARY_HEADERS = ["server", "load", "round", "answered", "req/s", "tokens/s", "p50 ms", "p90 ms", "p99 ms",
                   "batch mean", "errors", "load avg"]


def write_outputs(result: dict[str, Any], out_dir: Path) -> tuple[Path, Path | None]:
    """serve.json first, then serve.png (throughput per server and load; latency at concurrency 1 against direct);
    without matplotlib the plot is skipped (None) and the JSON is kept."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out_dir / "serve.json", out_dir / "serve.png"
    write_file_atomic(json_path, (json.dumps(result, indent=2) + "\n").encode())
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return json_path, None
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    width = 0.8 / len(SERVERS)
    for i, server in enumerate(SERVERS):
        values = [mean_rps(result, server, load) for load in THROUGHPUT_LOADS]
        left.bar([j + i * width for j in range(len(THROUGHPUT_LOADS))], values, width, label=server)
    left.set_xticks([j + width * (len(SERVERS) - 1) / 2 for j in range(len(THROUGHPUT_LOADS))], THROUGHPUT_LOADS)
    left.set_ylabel(f"requests/s (answered, all checked; {result['rounds']} rounds)")
    left.set_title("throughput at concurrency 16", fontsize=9)
    left.legend(fontsize=8)
    c1 = [r["latency_ms"] for r in result["runs"] if r["load"] == "c1 T16"]
    server_run = {k: statistics.median(lat[k] for lat in c1) for k in ("p50", "p90")}
    direct = result["direct"]
    right.bar(["direct runner", "mha serve"], [direct["p50"], server_run["p50"]],
              yerr=[[0, 0], [direct["p90"] - direct["p50"], server_run["p90"] - server_run["p50"]]], capsize=4)
    right.set_ylabel("latency ms (median, bar to p90)")
    right.set_title("concurrency 1, T=16", fontsize=9)
    fig.suptitle(f"gpt2-small, {result['machine']['cores']} cores ({result['machine']['cpu']}); shared machine",
                 fontsize=9)
    fig.tight_layout()
    save_png(fig, png_path)
    return json_path, png_path


@click.command()
@click.option("--artifact", type=click.Path(path_type=Path), default=Path("artifacts/gpt2-small"), show_default=True)
@click.option("--out", type=click.Path(path_type=Path), default=Path("artifacts/bench"), show_default=True)
@click.option("--scale", type=click.FloatRange(min=0.01), default=1.0, show_default=True,
              help="Multiply every load's request count.")
def main(artifact: Path, out: Path, scale: float) -> None:
    """Run the serve bench and write serve.json and serve.png."""
    try:
        result = run_serve_bench(artifact, log_dir=out / "serve-logs", scale=scale)
    except MHAError as exc:
        raise click.ClickException(str(exc)) from None
    json_path, png_path = write_outputs(result, out)
    click.echo(table(SUMMARY_HEADERS, summary_rows(result)) + "\n")
    click.echo(table(["target", "value", "goal", "met"],
                     [[t["target"], f"{t['value']:.2f} {t['unit']}".strip(), t["goal"],
                       {True: "yes", False: "NO", None: "-"}[t["met"]]] for t in result["targets"]]))
    wrote = f"{json_path} and {png_path}" if png_path else f"{json_path} (serve.png not written: matplotlib is not " \
        "installed: pip install './export[bench]')"
    click.echo(f"\nwrote {wrote} ({result['seconds']:.0f} s; a shared machine: figures are noisy)")


if __name__ == "__main__":
    main()
