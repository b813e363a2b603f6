"""What `mha bench` times: every runner of a folder, the decode forms, cold starts, the wasm check's medians."""
from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx.helper as oh
import onnxruntime as ort
import torch
from onnx import TensorProto

from mha_export.attention.weights.load import load_artifact_model
from mha_export.infer.torchscript_runner import load_torchscript
from mha_export.model.fused import fuse
from mha_runtime.attention.config import MHAConfig
from mha_runtime.attention.decode_session import DecodeSession
from mha_runtime.attention.inplace_session import InPlaceDecodeSession
from mha_runtime.attention.manifest import Manifest
from mha_runtime.attention.registry import (
    ALL,
    DECODE,
    DECODE_INPLACE,
    EXECUTORCH_RUNTIME,
    ONNX_RUNTIME,
    TORCHSCRIPT_RUNTIME,
    VARIANTS,
    buildable,
)
from mha_runtime.attention.runner import OnnxRunner
from mha_runtime.infer.pick_copy import choose

PEAK_N = 2048
# Idle time before each timed call: each ONNX Runtime session and torch's OpenMP pool slow the next runner
# down right after a call (docs/bench.md has the measurements behind 0.3 s).
SETTLE_S = 0.3
# Decode steps are timed as a generation loop runs them: bursts of back-to-back steps from the same cache at
# past_tokens = context_length - 1, the first reported apart as "first step after idle" (docs/bench.md).
DECODE_BURST = 32
# runtime/native/web/check.mjs --json writes <artifacts>/web/<name>.json (`make web-test`): onnxruntime-web's wasm
# backend in Node.js on one thread, median ms per golden case; bench reports it beside its own figures.
WASM_CHECK = Path("web")
EAGER, FUSED = "eager wrapper", "eager fused"



def _matmul_session(threads: int) -> Callable[[], Any]:
    graph = oh.make_graph([oh.make_node("MatMul", ["a", "b"], ["c"])], "peak",
                          [oh.make_tensor_value_info(n, TensorProto.FLOAT, [PEAK_N, PEAK_N]) for n in ("a", "b")],
                          [oh.make_tensor_value_info("c", TensorProto.FLOAT, [PEAK_N, PEAK_N])])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    a = np.random.default_rng(0).standard_normal((PEAK_N, PEAK_N)).astype(np.float32)
    return lambda: session.run(None, {"a": a, "b": a})


@dataclass
class Runner:
    name: str
    kind: str  # eager | torchscript | onnxruntime | executorch
    fn: Callable[[np.ndarray], Any]
    file: str | None = None
    batch_max: int | None = None  # the ExecuTorch program's planned maximum batch


@dataclass
class DecodeForm:
    file: str
    session: str  # the class that runs it
    step: Callable[[], Any]  # one step from past_tokens = context_length - 1


def runner_names(manifest: Manifest) -> list[str]:
    """What `--only` may name: the eager pair, every full-sequence artifact and the decode forms present."""
    timed = (ONNX_RUNTIME, TORCHSCRIPT_RUNTIME, EXECUTORCH_RUNTIME)
    return [EAGER, FUSED] + [f for f, i in manifest.artifacts.items() if i.runtime in timed] + \
        [f for f in (DECODE.file, DECODE_INPLACE.file) if f in manifest.artifacts]


def build_runners(folder: Path, manifest: Manifest, threads: int) -> list[Runner]:
    """Eager wrapper, eager fused module (torch SDPA), TorchScript, every ONNX artifact through OnnxRunner and the
    ExecuTorch program; not the decode forms."""
    model, config = load_artifact_model(folder, manifest)
    fused = fuse(model, config)

    def torch_fn(module: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[np.ndarray], Any]:
        def run(x: np.ndarray) -> Any:
            with torch.inference_mode():
                return module(torch.from_numpy(x))
        return run

    runners = [Runner(EAGER, "eager", torch_fn(model)), Runner(FUSED, "eager", torch_fn(fused))]
    for file, info in manifest.artifacts.items():
        if info.runtime == TORCHSCRIPT_RUNTIME:
            script, _ = load_torchscript(Path(folder) / file)
            runners.append(Runner(file, "torchscript", torch_fn(script), file))
        elif info.runtime == ONNX_RUNTIME:
            runner = OnnxRunner(folder, model=file, provider="cpu", threads=threads)
            runners.append(Runner(file, "onnxruntime", runner.run, file))
        elif info.runtime == EXECUTORCH_RUNTIME:
            from mha_export.infer.pte_runner import PteRunner

            pte = PteRunner(folder, model=file, threads=threads)
            runners.append(Runner(file, "executorch", pte.run, file, batch_max=int(pte.batch_max)))
    return runners


def build_decode_forms(folder: Path, manifest: Manifest, threads: int) -> list[DecodeForm]:
    """Each decode form present, its cache filled to past_tokens = context_length - 1; a step goes back there
    first (DecodeSession: restore a snapshot; InPlaceDecodeSession: rewind) and adds one token."""
    config = manifest.config
    past = config.context_length - 1
    prefix = np.random.default_rng(1).standard_normal((1, past, config.d_in)).astype(np.float32)
    one = np.random.default_rng(2).standard_normal((1, 1, config.d_in)).astype(np.float32)
    forms = []
    if DECODE.file in manifest.artifacts:
        session = DecodeSession(folder, provider="cpu", threads=threads)
        if past:
            session.step(prefix)
        cache = session.snapshot()

        def restore_and_step() -> None:
            session.restore(cache)
            session.step(one)
        forms.append(DecodeForm(DECODE.file, "DecodeSession", restore_and_step))
    if DECODE_INPLACE.file in manifest.artifacts:
        inplace = InPlaceDecodeSession(folder, provider="cpu", threads=threads)
        if past:
            inplace.step(prefix)

        def rewind_and_step() -> None:
            inplace.rewind(past)
            inplace.step(one)
        forms.append(DecodeForm(DECODE_INPLACE.file, "InPlaceDecodeSession", rewind_and_step))
    return forms


def missing_variants(manifest: Manifest) -> list[str]:
    """A note when the folder lacks variants its config allows (an export by an older version, or a --variants
    subset): `make bench` reuses an existing folder, and a silently shorter table would look like the whole."""
    allowed, _ = buildable(manifest.config, ALL)
    missing = [v for v in allowed if any(spec.file not in manifest.files for spec in VARIANTS[v].artifacts)]
    if not missing:
        return []
    return [f"{manifest.name}: variants not in this folder, so not timed: {', '.join(missing)} "
            f"(`mha export` builds them)"]


def cold_start(folder: Path, file: str, config: MHAConfig, threads: int) -> float:
    """Median seconds of five session creations (manifest check included) plus a first run on one token, through
    OnnxRunner as users get it: the folder's optimized copy where this machine can use it (cold_start_loads)."""
    x = np.zeros((1, 1, config.d_in), np.float32)
    times = []
    for _ in range(5):
        start = time.perf_counter()
        OnnxRunner(folder, model=file, provider="cpu", threads=threads).run(x)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cold_start_loads(folder: Path, manifest: Manifest, file: str) -> str | None:
    """The file OnnxRunner parses for `file` on this machine (its optimized copy where usable; None: not ONNX)."""
    if manifest.artifacts[file].runtime != ONNX_RUNTIME:
        return None
    return choose(folder, file, manifest, "cpu").file


def wasm_medians(folder: Path, manifest: Manifest) -> dict[str, Any] | None:
    """The wasm check's median ms per golden case of each artifact, when its JSON sits beside the artifact folder;
    an entry whose sha256 is not the manifest's (an older export) is left out."""
    path = Path(folder).parent / WASM_CHECK / f"{Path(folder).name}.json"
    try:
        doc = json.loads(path.read_text())
        current = {a["file"] for a in doc["artifacts"] if a.get("loaded") and a["file"] in manifest.files
                   and a["sha256"] == manifest.files[a["file"]].sha256}
        medians = {a["file"]: {c["name"]: c["median_ms"] for c in a["cases"] if c["ok"]} for a in doc["artifacts"]
                   if a["file"] in current}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {"source": str(path), "onnxruntime_web": doc.get("onnxruntime_web"), "host": doc.get("host"),
            "threads": doc.get("threads"), "repeats": doc.get("repeats"), "median_ms": medians} if medians else None


