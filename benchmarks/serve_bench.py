"""`make serve-bench`: `mha serve` on gpt2-small under bounded loads, behind Ray Serve's proxy and behind HAProxy,
against Ray Serve's own no-op floor; JSON and a plot (torch-free).

Servers (each started, loaded and stopped by this process; the three of one ingress side by side, the proxy's
first, then HAProxy's: six Ray instances at once failed to start on this machine):
  batch16 / batch1                  --max-batch 16 / 1, 1 replica, Serve's Python HTTP proxy (Ray's default)
  batch16 haproxy / batch1 haproxy  the same behind HAProxy (RAY_SERVE_ENABLE_HA_PROXY=1 in the server's
                                    environment: HAProxy forwards to the replica's own HTTP port)
  floor / floor haproxy             Ray Serve's floor: a no-op deployment with the launcher's settings
                                    (serve_floor.py), through each ingress
  batch16 x2 replicas               after, alone (information)
batch16 and batch1 of one ingress take the concurrency-16 loads in turn, the order reversed every other round, so
that the load other programs put on a shared machine falls on both alike: tokens 16,64 (the batching target) and
16,64,256 (mixed lengths). At concurrency 1, T=16, batch16 and the floor of the ingress take turns, with the
runner called directly in this process (the server's overhead is the server's median minus the runner's; the floor's
median is all Serve path and client, since it runs no model). The floors also take the c16 T16-64 load (the
most requests per second Serve's path carries here). Every model answer is checked against a local runner
after its load; each load records the CPU seconds of every process of the server's session by role, of this
process (the client), and of the whole machine. Targets are judged here, never in tests.
"""
from __future__ import annotations

import dataclasses
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

from benchmarks.process import ServerProcess, session_members
from benchmarks.serve_floor import ECHO, FloorProcess
from mha_export.bench.plots import save_png
from mha_runtime.artifact.atomic import write_file_atomic
from mha_runtime.artifact.errors import MHAError
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.attention.registry import spec_for
from mha_runtime.attention.runner import DEFAULT_MODEL, OnnxRunner
from mha_runtime.cli.tables import table
from mha_runtime.infer.cpu_features import load_average, machine
from mha_runtime.serve.attention.loadtest import Shot, check_answers, good_shots, run_load, summarize
from mha_runtime.serve.haproxy import haproxy_env


@dataclass(frozen=True)
class Spec:
    """One bench server: `mha serve` with `args`, or the floor; through Serve's proxy or HAProxy."""

    kind: str  # "mha" or "floor"
    args: tuple[str, ...]
    ingress: str  # "proxy" or "haproxy"


SERVERS = {
    "batch16": Spec("mha", ("--max-batch", "16"), "proxy"),
    "batch1": Spec("mha", ("--max-batch", "1"), "proxy"),
    "batch16 haproxy": Spec("mha", ("--max-batch", "16", "--ingress", "haproxy"), "haproxy"),
    "batch1 haproxy": Spec("mha", ("--max-batch", "1", "--ingress", "haproxy"), "haproxy"),
    "floor": Spec("floor", (), "proxy"),
    "floor haproxy": Spec("floor", (), "haproxy"),
    "batch16 x2 replicas": Spec("mha", ("--max-batch", "16", "--replicas", "2"), "proxy"),
}
INGRESSES = ("proxy", "haproxy")
BATCHED = {"proxy": "batch16", "haproxy": "batch16 haproxy"}
UNBATCHED = {"proxy": "batch1", "haproxy": "batch1 haproxy"}
FLOORS = {"proxy": "floor", "haproxy": "floor haproxy"}
REPLICAS = "batch16 x2 replicas"
# name -> (concurrency, tokens, requests per round)
LOADS = {"c16 T16-64": (16, (16, 64), 400), "c16 T16-256": (16, (16, 64, 256), 150), "c1 T16": (1, (16,), 200),
         "c1 T16 echo": (1, (16,), 150)}
THROUGHPUT_LOADS = ("c16 T16-64", "c16 T16-256")
ROUNDS = 2
READY_TIMEOUT_S = 300.0  # on two cores shared with other jobs a start took up to a minute
TARGET_SPEEDUP, TARGET_OVERHEAD_MS, TARGET_FLOOR_RATIO = 1.5, 5.0, 1.2


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


TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def role(pid: int) -> str:
    """What a process of a server's session is, from its command line (Ray names its actors' processes)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    line = b" ".join(argv).decode(errors="replace")
    for needle, name in (("ServeReplica", "replica"), ("ProxyActor", "proxy"), ("HAProxyManager", "haproxy manager"),
                         ("ServeController", "controller"), ("mha_runtime serve", "driver"),
                         ("serve_floor", "driver")):
        if needle in line:
            return name
    return "haproxy" if argv[0].endswith(b"/haproxy") else "ray system"


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * TICK_S  # utime, stime


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (all cores; /proc/stat less idle and iowait)."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    except OSError:
        return 0.0
    return (sum(fields) - fields[3] - fields[4]) * TICK_S


def cpu_snapshot(process: ServerProcess) -> dict[str, Any]:
    """CPU seconds so far: each process of the server's session (with its role), this process, the machine."""
    assert process.process is not None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"pids": {pid: (role(pid), cpu_seconds(pid)) for pid in session_members(process.process.pid)},
            "client": usage.ru_utime + usage.ru_stime, "machine": machine_busy_seconds()}


def cpu_used(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """CPU seconds between two snapshots by role; "others" is the machine's busy time that was neither the
    server's session nor this process (other programs, and servers of the bench that were idle)."""
    used: dict[str, float] = {}
    for pid, (name, seconds) in after["pids"].items():
        used[name] = used.get(name, 0.0) + seconds - before["pids"].get(pid, (name, 0.0))[1]
    used["client"] = after["client"] - before["client"]
    used["others"] = max(0.0, after["machine"] - before["machine"] - sum(used.values()))
    return used


class Checker:
    """The local runner and tolerance that every model answer is judged against."""

    def __init__(self, artifact: Path) -> None:
        self.runner = OnnxRunner(artifact, model=DEFAULT_MODEL, provider="cpu")
        record = load_manifest(artifact).artifacts.get(DEFAULT_MODEL)
        self.tolerance = record.tolerance if record is not None else spec_for(DEFAULT_MODEL).tolerance


def measured_load(process: ServerProcess, checker: Checker, *, load: str, requests: int, seed: int,
                  check: bool) -> dict[str, Any]:
    """One load as `mha loadtest` sends it (run_load, then the answers checked when `check`), with the CPU each
    process used while it ran. A floor's answers are not the model's, so they are counted, not checked."""
    concurrency, tokens, _ = LOADS[load]
    shots = good_shots(checker.runner.config, tokens=tokens, batches=(1,), fmt="npy", seed=seed)
    if load.endswith("echo"):
        plain = shots

        def shots(i: int) -> Shot:
            return dataclasses.replace(plain(i), headers={ECHO: "1"})

    before = cpu_snapshot(process)
    outcomes, seconds = run_load(process.url, shots, count=requests, concurrency=concurrency, max_seconds=300.0)
    cpu = cpu_used(before, cpu_snapshot(process))
    if check:
        check_answers(outcomes, shots, checker.runner.run, checker.tolerance)
    else:
        for outcome in outcomes:
            outcome.answer = None
    summary = summarize(outcomes, seconds, count=requests)
    answered = max(1, summary["answered"])
    summary.update(concurrency=concurrency, tokens=list(tokens), checked=check, cpu_s=cpu,
                   cpu_ms_per_request={name: 1e3 * value / answered for name, value in cpu.items()})
    return summary


def run_serve_bench(artifact: Path, *, log_dir: Path, scale: float = 1.0, rounds: int = ROUNDS) -> dict[str, Any]:
    """Every server and load of the bench; `scale` multiplies the request counts."""
    home = Path(tempfile.mkdtemp(prefix="mha-bench-", dir="/tmp"))  # Ray's files; short for its socket paths
    runs: list[dict[str, Any]] = []
    direct: list[dict[str, float]] = []
    checker = Checker(artifact)
    started = time.time()

    def load(process: ServerProcess, server: str, name: str, round_: int) -> None:
        click.echo(f"round {round_ + 1}: {server}, {name} ...", err=True)
        before = load_average()
        summary = measured_load(process, checker, load=name, requests=max(10, int(LOADS[name][2] * scale)),
                                seed=len(runs), check=SERVERS[server].kind == "mha")
        runs.append({"server": server, "ingress": SERVERS[server].ingress, "args": list(SERVERS[server].args),
                     "load": name, "round": round_ + 1, "load_average_before": before,
                     "load_average_after": load_average(), **summary})

    lifetimes: dict[str, dict[str, float]] = {}
    try:
        for ingress in INGRESSES:  # one ingress at a time: six Ray instances at once failed to start here
            names = (BATCHED[ingress], UNBATCHED[ingress], FLOORS[ingress])
            processes = {name: bench_server(artifact, log_dir, name, home) for name in names}
            lifetimes.update(start_all(processes))
            try:
                for round_ in range(rounds):
                    flip = (lambda names: names) if round_ % 2 == 0 else (lambda names: names[::-1])
                    for name in THROUGHPUT_LOADS:
                        for server in flip(names[:2]):
                            load(processes[server], server, name, round_)
                    load(processes[FLOORS[ingress]], FLOORS[ingress], "c16 T16-64", round_)
                    for server in flip((BATCHED[ingress], FLOORS[ingress])):
                        load(processes[server], server, "c1 T16", round_)
                        if SERVERS[server].kind == "floor":
                            load(processes[server], server, "c1 T16 echo", round_)
                    direct.append({**direct_latency(artifact, tokens=16, calls=max(30, int(200 * scale))),
                                   "ingress": ingress})
            finally:
                merge(lifetimes, stop_all(processes))
        replicas = {REPLICAS: bench_server(artifact, log_dir, REPLICAS, home)}
        lifetimes.update(start_all(replicas))
        try:
            for round_ in range(min(rounds, 2)):
                for name in THROUGHPUT_LOADS:
                    load(replicas[REPLICAS], REPLICAS, name, round_)
        finally:
            merge(lifetimes, stop_all(replicas))
    finally:
        shutil.rmtree(home, ignore_errors=True)
    result = {"artifact": str(artifact), "machine": machine(), "seconds": time.time() - started, "rounds": rounds,
              "servers": {name: {"ingress": SERVERS[name].ingress, **lifetimes[name]} for name in lifetimes},
              "runs": runs, "direct": {"tokens": 16, "rounds": direct,
                                       "p50": statistics.median(d["p50"] for d in direct),
                                       "p90": statistics.median(d["p90"] for d in direct)}}
    result["targets"] = judge(result)
    return result


class BenchServer(ServerProcess):
    """A bench server whose exit is checked: status 0 and nothing of Ray left behind."""

    def __init__(self, artifact: Path, log_dir: Path, name: str, home: Path) -> None:
        super().__init__(artifact, log_dir / name.replace(" ", "-"), *SERVERS[name].args, home=home,
                         ready_timeout_s=READY_TIMEOUT_S)
        self.name = name

    def stop(self, timeout_s: float = 90.0) -> int | None:
        return checked_stop(self, super().stop(timeout_s))


class BenchFloor(FloorProcess):
    """The floor, its exit checked as a BenchServer's."""

    def __init__(self, log_dir: Path, name: str, home: Path) -> None:
        super().__init__(log_dir / name.replace(" ", "-"), home=home, ready_timeout_s=READY_TIMEOUT_S,
                         env=haproxy_env(home / "h") if SERVERS[name].ingress == "haproxy" else None)
        self.name = name

    def stop(self, timeout_s: float = 90.0) -> int | None:
        return checked_stop(self, super().stop(timeout_s))


def checked_stop(process: BenchServer | BenchFloor, returncode: int | None) -> int | None:
    if process.process is None:  # never started
        return None
    if returncode != 0 or process.leftovers:
        raise MHAError(f"server {process.name}: exit status {returncode}, left processes {process.leftovers}")
    return returncode


def bench_server(artifact: Path, log_dir: Path, name: str, home: Path) -> ServerProcess:
    if SERVERS[name].kind == "floor":
        return BenchFloor(log_dir, name, home)
    return BenchServer(artifact, log_dir, name, home)


def _timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def start_all(processes: dict[str, ServerProcess]) -> dict[str, dict[str, float]]:
    """Start the servers one after the other (six Ray instances starting at once on two loaded cores time out in
    Ray's own node startup); the seconds each took to be ready. If one fails, those started are stopped."""
    started: dict[str, dict[str, float]] = {}
    try:
        for name, process in processes.items():
            started[name] = {"start_s": _timed(process.start)}
    except BaseException:
        try:
            stop_all({name: processes[name] for name in started})
        except MHAError:
            pass  # the start's own error says more
        raise
    return started


def stop_all(processes: dict[str, ServerProcess]) -> dict[str, dict[str, float]]:
    """Stop every server at once (each drains, then Ray stops); the seconds each took. Every server is stopped
    before the first failure (an exit status other than 0, a process left) is raised."""
    with ThreadPoolExecutor(len(processes)) as pool:
        futures = {name: pool.submit(_timed, process.stop) for name, process in processes.items()}
    failed = [future.exception() for future in futures.values() if future.exception() is not None]
    if failed:
        raise failed[0]  # type: ignore[misc]
    return {name: {"stop_s": future.result()} for name, future in futures.items()}


def merge(into: dict[str, dict[str, float]], more: dict[str, dict[str, float]]) -> None:
    for name, values in more.items():
        into.setdefault(name, {}).update(values)


def mean_rps(result: dict[str, Any], server: str, load: str) -> float:
    """Requests per second over the rounds: all answered requests over all their seconds."""
    runs = [r for r in result["runs"] if r["server"] == server and r["load"] == load]
    return sum(r["answered"] for r in runs) / sum(r["seconds"] for r in runs)


def median_p50(result: dict[str, Any], server: str, load: str = "c1 T16") -> float | None:
    """The median over the rounds of the server's median latency on `load`, None without such runs."""
    values = [r["latency_ms"]["p50"] for r in result["runs"] if r["server"] == server and r["load"] == load]
    return statistics.median(values) if values else None


def overheads(result: dict[str, Any], ingress: str) -> dict[str, float | None]:
    """At c1, T=16: the server's median less the direct runner's (ours plus Serve's), the floor's median (Serve's
    and the client's alone), and their ratio."""
    server, floor = median_p50(result, BATCHED[ingress]), median_p50(result, FLOORS[ingress])
    same = [d["p50"] for d in result["direct"]["rounds"] if d.get("ingress") == ingress]  # its phase's runner
    direct = statistics.median(same) if same else result["direct"]["p50"]
    overhead = None if server is None else server - direct
    ratio = None if overhead is None or floor is None else overhead / floor
    return {"server_p50": server, "direct_p50": direct, "overhead": overhead, "floor_p50": floor, "ratio": ratio,
            "floor_echo_p50": median_p50(result, FLOORS[ingress], "c1 T16 echo")}


def _has(result: dict[str, Any], server: str, load: str) -> bool:
    return any(r["server"] == server and r["load"] == load for r in result["runs"])


def judge(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets from one run's figures, for Serve's proxy (the default) and for HAProxy (named so);
    a target whose servers did not run is left out."""
    targets = []
    for ingress in INGRESSES:
        label = "" if ingress == "proxy" else "HAProxy: "
        if _has(result, BATCHED[ingress], "c16 T16-64") and _has(result, UNBATCHED[ingress], "c16 T16-64"):
            speedup = (mean_rps(result, BATCHED[ingress], "c16 T16-64")
                       / mean_rps(result, UNBATCHED[ingress], "c16 T16-64"))
            targets.append({"target": f"{label}batching vs --max-batch 1, c16, T16-64 (throughput)", "value": speedup,
                            "unit": "x", "goal": f">= {TARGET_SPEEDUP}", "met": speedup >= TARGET_SPEEDUP})
        o = overheads(result, ingress)
        if o["overhead"] is not None:
            within = o["ratio"] is not None and o["ratio"] <= TARGET_FLOOR_RATIO
            targets.append({"target": f"{label}server overhead vs direct runner, c1, T=16 (median)",
                            "value": o["overhead"], "unit": "ms",
                            "goal": f"<= {TARGET_OVERHEAD_MS}, or <= {TARGET_FLOOR_RATIO}x the floor",
                            "met": o["overhead"] <= TARGET_OVERHEAD_MS or within})
        if o["ratio"] is not None:
            targets.append({"target": f"{label}server overhead / Ray Serve's no-op floor, c1, T=16 (median)",
                            "value": o["ratio"], "unit": "x", "goal": f"<= {TARGET_FLOOR_RATIO}",
                            "met": o["ratio"] <= TARGET_FLOOR_RATIO})
            targets.append({"target": f"{label}Ray Serve's no-op floor, c1, T=16 (median; information)",
                            "value": o["floor_p50"], "unit": "ms", "goal": "-", "met": None})
    bad = sum(r["errors"] + r["not_sent"] for r in result["runs"])
    wrong = sum(r["wrong"] for r in result["runs"])
    targets += [
        {"target": "errors (lost, wrong, unexpected, not sent) over the bench", "value": bad, "unit": "",
         "goal": "0", "met": bad == 0},
        {"target": "wrong answers over the bench", "value": wrong, "unit": "", "goal": "0", "met": wrong == 0},
        {"target": "batching vs --max-batch 1, c16, T16-256 (information)",
         "value": mean_rps(result, "batch16", "c16 T16-256") / mean_rps(result, "batch1", "c16 T16-256"),
         "unit": "x", "goal": "-", "met": None},
    ]
    for load in THROUGHPUT_LOADS:
        if _has(result, "batch16 haproxy", load) and _has(result, "batch16", load):
            targets.append({"target": f"HAProxy vs Serve's proxy, batch16, {load} (throughput; information)",
                            "value": mean_rps(result, "batch16 haproxy", load) / mean_rps(result, "batch16", load),
                            "unit": "x", "goal": "-", "met": None})
    proxy, haproxy = median_p50(result, "batch16"), median_p50(result, "batch16 haproxy")
    if proxy is not None and haproxy is not None:
        targets.append({"target": "HAProxy vs Serve's proxy, batch16, c1 T16 (median latency; information)",
                        "value": haproxy / proxy, "unit": "x", "goal": "-", "met": None})
    if _has(result, REPLICAS, "c16 T16-256"):
        targets.append({"target": "2 replicas vs 1, c16, T16-256 (information; not side by side)",
                        "value": mean_rps(result, REPLICAS, "c16 T16-256") / mean_rps(result, "batch16", "c16 T16-256"),
                        "unit": "x", "goal": "-", "met": None})
    return targets


def server_cpu_ms(run: dict[str, Any]) -> float | None:
    """CPU milliseconds per answered request of the server's whole session."""
    per = run.get("cpu_ms_per_request")
    return None if per is None else sum(v for k, v in per.items() if k not in ("client", "others"))


def summary_rows(result: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for r in result["runs"]:
        lat, batches = r["latency_ms"], r["batches"]
        server_ms, per = server_cpu_ms(r), r.get("cpu_ms_per_request") or {}
        rows.append([r["server"], r["load"], r["round"], r["answered"], f"{r['requests_per_s']:.1f}",
                     f"{lat['p50']:.1f}", f"{lat['p90']:.1f}", f"{lat['p99']:.1f}",
                     "-" if batches.get("mean_requests") is None else f"{batches['mean_requests']:.2f}",
                     "-" if server_ms is None else f"{server_ms:.1f}",
                     "-" if "client" not in per else f"{per['client']:.1f}",
                     "-" if "others" not in per else f"{per['others']:.1f}", r["errors"],
                     f"{r['load_average_before']:.1f}" if r["load_average_before"] is not None else "-"])
    for round_, d in enumerate(result["direct"]["rounds"], 1):
        rows.append(["direct runner", "c1 T16", round_, d["calls"], "-", f"{d['p50']:.2f}", f"{d['p90']:.2f}",
                     "-", "-", "-", "-", "-", 0, "-"])
    return rows


SUMMARY_HEADERS = ["server", "load", "round", "answered", "req/s", "p50 ms", "p90 ms", "p99 ms", "batch mean",
                   "server CPU ms/req", "client CPU ms/req", "others ms/req", "errors", "load avg"]


def cpu_rows(result: dict[str, Any]) -> list[list[Any]]:
    """CPU milliseconds per answered request by role, the median over the rounds, per server and load."""
    roles = ("replica", "proxy", "haproxy", "haproxy manager", "controller", "driver", "ray system", "client",
             "others")
    rows = []
    for server in SERVERS:
        for load in LOADS:
            runs = [r for r in result["runs"] if r["server"] == server and r["load"] == load
                    and "cpu_ms_per_request" in r]
            if runs:
                medians = [statistics.median(r["cpu_ms_per_request"].get(k, 0.0) for r in runs) for k in roles]
                rows.append([server, load, *(f"{m:.2f}" for m in medians)])
    return rows


CPU_HEADERS = ["server", "load", "replica", "proxy", "haproxy", "haproxy mgr", "controller", "driver",
               "ray system", "client", "others"]


def write_outputs(result: dict[str, Any], out_dir: Path) -> tuple[Path, Path | None]:
    """serve.json first, then serve.png (throughput per server and load; latency at concurrency 1 against the
    direct runner and the floor); without matplotlib the plot is skipped (None) and the JSON is kept."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out_dir / "serve.json", out_dir / "serve.png"
    write_file_atomic(json_path, (json.dumps(result, indent=2) + "\n").encode())
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return json_path, None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [2, 1]})
    servers = [s for s in SERVERS
               if SERVERS[s].kind == "mha" and all(_has(result, s, load) for load in THROUGHPUT_LOADS)]
    width = 0.8 / max(1, len(servers))
    for i, server in enumerate(servers):
        values = [mean_rps(result, server, load) for load in THROUGHPUT_LOADS]
        left.bar([j + i * width for j in range(len(THROUGHPUT_LOADS))], values, width, label=server)
    left.set_xticks([j + width * (len(servers) - 1) / 2 for j in range(len(THROUGHPUT_LOADS))], THROUGHPUT_LOADS)
    left.set_ylabel(f"requests/s (answered, all checked; {result['rounds']} rounds)")
    left.set_title("throughput at concurrency 16", fontsize=9)
    left.legend(fontsize=8)
    bars = [("direct runner", result["direct"]["p50"], result["direct"]["p90"])]
    for server in ("floor", "batch16", "floor haproxy", "batch16 haproxy"):
        runs = [r["latency_ms"] for r in result["runs"] if r["server"] == server and r["load"] == "c1 T16"]
        if runs:
            bars.append((server if server != "batch16" else "mha serve" + server[7:],
                         statistics.median(lat["p50"] for lat in runs), statistics.median(lat["p90"] for lat in runs)))
    right.bar([b[0] for b in bars], [b[1] for b in bars], yerr=[[0] * len(bars), [b[2] - b[1] for b in bars]],
              capsize=4)
    right.tick_params(axis="x", labelrotation=30, labelsize=7)
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
@click.option("--rounds", type=click.IntRange(min=1), default=ROUNDS, show_default=True)
def main(artifact: Path, out: Path, scale: float, rounds: int) -> None:
    """Run the serve bench and write serve.json and serve.png."""
    try:
        result = run_serve_bench(artifact, log_dir=out / "serve-logs", scale=scale, rounds=rounds)
    except MHAError as exc:
        raise click.ClickException(str(exc)) from None
    json_path, png_path = write_outputs(result, out)
    click.echo(table(SUMMARY_HEADERS, summary_rows(result)) + "\n")
    click.echo("CPU ms per answered request, by process role (median over the rounds):")
    click.echo(table(CPU_HEADERS, cpu_rows(result)) + "\n")
    click.echo(table(["target", "value", "goal", "met"],
                     [[t["target"], f"{t['value']:.2f} {t['unit']}".strip(), t["goal"],
                       {True: "yes", False: "NO", None: "-"}[t["met"]]] for t in result["targets"]]))
    wrote = f"{json_path} and {png_path}" if png_path else f"{json_path} (serve.png not written: matplotlib is not " \
        "installed: pip install './export[bench]')"
    click.echo(f"\nwrote {wrote} ({result['seconds']:.0f} s; a shared machine: figures are noisy)")


if __name__ == "__main__":
    main()
