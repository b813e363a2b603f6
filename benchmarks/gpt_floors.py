"""What the GPT bench sets its figures against, measured in the same run and at the same thread count: memory
bandwidth, the MatMul peak, the prefill FLOP count, a child's peak memory, and ORT's per-op decode profile."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from mha_export.decoder.archs.gpt2.config import GPTConfig
from mha_runtime.artifact.errors import MHAError
from mha_runtime.decoder.decoder import decoder_for
from mha_runtime.decoder.forms import FORMS
from mha_runtime.decoder.shapes import DecoderShapes

COPY_MIB, COPY_REPEATS = 256, 5
MATMUL_N, MATMUL_REPEATS = 2048, 5
PREFILL_FORMULA = ("2*N*T + 2*2*L*T*T*E/2 + 2*E*V: N non-embedding parameters (blocks and final norm), T prompt "
                   "tokens, L layers, E emb_dim, V vocab; attention QK^T and AV over the causal half; the head for "
                   "the last token only (the in-place form's next_token_logits)")
FLOOR_FORMULA = "bandwidth / (4 * weights.parameters): every fp32 weight read once per token"
STREAMED_FORMULA = ("bandwidth / (4 * (L*12*E^2 + V*E)): the weight matrices a step reads (blocks and head); the "
                    "embeddings give one row each")


def options(threads: int) -> ort.SessionOptions:
    """ORT session options at `threads` intra-op threads, one inter-op."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.log_severity_level = 3
    return opts


def _threads_seconds(work: Callable[[int, int], None], size: int, threads: int) -> float:
    """Seconds for `threads` threads started together, each running work(lo, hi) on its share of range(size)."""
    edges = np.linspace(0, size, threads + 1).astype(int)
    gate = threading.Barrier(threads + 1)

    def run(lo: int, hi: int) -> None:
        gate.wait()
        work(lo, hi)

    workers = [threading.Thread(target=run, args=(int(a), int(b))) for a, b in pairwise(edges)]
    for w in workers:
        w.start()
    gate.wait()
    start = time.perf_counter()
    for w in workers:
        w.join()
    return time.perf_counter() - start


def copy_bandwidth(*, threads: int, mib: int = COPY_MIB, repeats: int = COPY_REPEATS) -> dict[str, Any]:
    """Bytes read plus written per second by np.copyto of a `mib` MiB float32 array, split over `threads` at once
    (numpy releases the GIL), best of `repeats`."""
    src = np.ones(mib << 18, np.float32)  # mib * 2**20 bytes
    dst = np.zeros_like(src)  # touched: no page faults in the timed copies
    samples = [2 * src.nbytes / _threads_seconds(lambda lo, hi: np.copyto(dst[lo:hi], src[lo:hi]), src.size, threads)
               for _ in range(repeats)]
    return {"bytes_per_s": max(samples), "samples": samples, "array_bytes": src.nbytes, "threads": threads,
            "method": f"np.copyto of a {mib} MiB float32 array, {threads} thread(s) at once, read + write bytes, "
                      f"best of {repeats}"}


READ_MIB = 1024
READ_FORMULA = ("read bandwidth / bytes of the weights a decode step reads (each form's own: its initializers but "
                "the embedding tables, which give one row a token)")


def read_bandwidth(*, threads: int, mib: int = READ_MIB, repeats: int = COPY_REPEATS) -> dict[str, Any]:
    """Bytes read per second by np.max over a `mib` MiB float32 array split over `threads` at once (a reduction
    reads each byte once and writes nothing; numpy releases the GIL), best of `repeats`. Batch-1 decode reads
    every weight once a token, so this, not a copy, is its floor: a copy's read + write figure was beaten by the
    fp32 decode (docs/measurements/gpt.md)."""
    data = np.ones(mib << 18, np.float32)  # touched: no page faults in the timed reads
    samples = [data.nbytes / _threads_seconds(lambda lo, hi: data[lo:hi].max(), data.size, threads)
               for _ in range(repeats)]
    return {"bytes_per_s": max(samples), "samples": samples, "array_bytes": data.nbytes, "threads": threads,
            "method": f"np.max over a {mib} MiB float32 array, {threads} thread(s) at once, bytes read, best of "
                      f"{repeats}"}


def step_bytes(path: Path) -> int:
    """Bytes of the weights one batch-1 decode step of an in-place form reads: every initializer but those only
    gathered from (the embedding tables give one row a token; a tied head reads tok_emb whole). A lossy form's
    packed weights and scales count as stored."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    readers: dict[str, set[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    return sum(len(t.raw_data) or onnx.numpy_helper.to_array(t).nbytes for t in model.graph.initializer
               if readers.get(t.name, set()) != {"Gather"})


class MatMulMeter:
    """ONNX Runtime's float32 MatMul (n x n by n x n) at `threads`, one session kept so that it can be sampled
    again later in the run (beside the figures set against it): the library and thread pool the decoders run on."""

    def __init__(self, *, threads: int, n: int = MATMUL_N) -> None:
        from onnx import TensorProto, helper

        spec = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [n, n]) for name in ("a", "b", "c")]
        graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "matmul", spec[:2], spec[2:])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        self.session = ort.InferenceSession(model.SerializeToString(), options(threads),
                                            providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        self.feeds = {"a": rng.standard_normal((n, n), np.float32), "b": rng.standard_normal((n, n), np.float32)}
        self.n = n
        self.session.run(None, self.feeds)

    def sample(self) -> float:
        """FLOP/s of one timed MatMul."""
        start = time.perf_counter()
        self.session.run(None, self.feeds)
        return 2 * self.n ** 3 / (time.perf_counter() - start)


def matmul_peak(*, threads: int, n: int = MATMUL_N, repeats: int = MATMUL_REPEATS) -> dict[str, Any]:
    """FLOP/s of ONNX Runtime's float32 MatMul (n x n by n x n) at `threads`, best of `repeats`."""
    meter = MatMulMeter(threads=threads, n=n)
    samples = [meter.sample() for _ in range(repeats)]
    return {"flop_per_s": max(samples), "samples": samples, "n": n, "threads": threads,
            "method": f"onnxruntime float32 MatMul {n}x{n}x{n}, best of {repeats}"}


def prefill_flops(cfg: GPTConfig, tokens: int) -> int:
    """PREFILL_FORMULA for a prompt of `tokens`."""
    e, v, t = cfg.emb_dim, cfg.vocab_size, tokens
    non_embedding = cfg.parameters(tied=True) - v * e - cfg.context_length * e
    return 2 * non_embedding * t + 2 * 2 * cfg.n_layers * t * t * e // 2 + 2 * e * v


def streamed_bytes(cfg: GPTConfig) -> int:
    """fp32 bytes of the weight matrices one decode step reads (STREAMED_FORMULA)."""
    return 4 * (cfg.n_layers * 12 * cfg.emb_dim ** 2 + cfg.vocab_size * cfg.emb_dim)


# Runs the command and prints its exit code and wait4's ru_maxrss. The measuring process must be small: Linux
# carries a process's RSS high-water mark across exec, and a child forked (or vforked) from the bench inherits the
# bench's own peak (measured: `python -c pass` read 2 GiB after a 2 GiB array). This shim is that small parent.
_SHIM = """import os, subprocess, sys
with open(sys.argv[1], "wb") as log:
    child = subprocess.Popen(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(child.pid, 0)
child.returncode = os.waitstatus_to_exitcode(status)
print(child.returncode, usage.ru_maxrss)
"""


def child_peak(command: list[str], *, log: Path) -> dict[str, Any]:
    """Run `command` (output to `log`) under a small Python parent: its seconds and peak RSS (wait4's ru_maxrss
    of that child: its own and that of the children it waited for; KiB on Linux)."""
    start = time.perf_counter()
    shim = subprocess.run([sys.executable, "-c", _SHIM, str(log), *command], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    try:
        code, kib = (int(x) for x in shim.stdout.split())
    except ValueError:
        raise MHAError(f"{' '.join(command)}: not measured ({shim.stderr.strip()[-300:]})") from None
    if code != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise MHAError(f"{' '.join(command)}: exit status {code}: {' | '.join(tail)}")
    return {"peak_rss_bytes": kib * 1024, "seconds": seconds}


def decode_profile(folder: Path, form: str, cfg: GPTConfig, *, threads: int, steps: int = 32) -> dict[str, Any]:
    """ORT's per-op kernel time over `steps` batch-1 decode steps of `form` after a 32-token prefill, in a
    profiling session of its own (the prefill's run left out); and the rate its MatMul/Gemm kernels read the
    weight matrices at (streamed_bytes over their time per step)."""
    with tempfile.TemporaryDirectory(prefix="mha-profile-") as tmp:
        opts = options(threads)
        opts.enable_profiling, opts.profile_file_prefix = True, str(Path(tmp) / "decode")
        session = ort.InferenceSession(str(folder / form), opts, providers=["CPUExecutionProvider"])
        decoder = decoder_for(FORMS[form].kind, session, DecoderShapes.of(cfg), folder / form)
        token = int(decoder.prefill([np.random.default_rng(0).integers(0, cfg.vocab_size, 32).tolist()])[0].argmax())
        for _ in range(steps):
            token = int(decoder.step([token], [True])[0].argmax())
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    prefill_end = runs[0]["ts"] + runs[0]["dur"]
    per_op: Counter[str] = Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] > prefill_end:
            per_op[e["args"]["op_name"]] += e["dur"]
    total = sum(per_op.values())
    ms = {op: us / 1e3 / steps for op, us in per_op.most_common()}
    dense_s = (per_op["MatMul"] + per_op["Gemm"]) / 1e6 / steps
    return {"form": form, "steps": steps, "step_ms": sum(r["dur"] for r in runs[1:]) / 1e3 / steps,
            "kernel_ms_per_step": ms, "share": {op: us / total for op, us in per_op.most_common()},
            "matmul_gemm_weight_bytes_per_s": streamed_bytes(cfg) / dense_s if dense_s else None}


class OtherCPU:
    """Cores kept busy by other processes over an interval: the machine's busy time (/proc/stat) less this
    process's and its children's CPU time. The noise, stated: a shared machine's figures compare within a run."""

    def __init__(self) -> None:
        self.start = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float] | None:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        busy = (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
        own = os.times()
        return time.perf_counter(), busy, own.user + own.system + own.children_user + own.children_system

    def cores(self) -> float | None:
        """Mean cores used by others since the start (None without /proc/stat)."""
        end = self._read()
        if self.start is None or end is None or end[0] <= self.start[0]:
            return None
        (t0, busy0, own0), (t1, busy1, own1) = self.start, end
        return max(0.0, ((busy1 - busy0) - (own1 - own0)) / (t1 - t0))
