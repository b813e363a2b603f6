"""Properties over many inputs (hypothesis), and one runner shared by threads."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mha_export.attention.weights.load import load_artifact_model
from mha_runtime.artifact.errors import MHAError
from mha_runtime.artifact.tolerance import compare
from mha_runtime.attention.decode_session import DecodeSession, run_chunked, uneven_schedule
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.attention.registry import tolerance_for
from mha_runtime.attention.runner import OnnxRunner

EXAMPLES = 1000
_STATE: dict[str, object] = {}


def _setup(seed_dir: Path) -> tuple[OnnxRunner, DecodeSession, torch.nn.Module]:
    if not _STATE:
        model, _ = load_artifact_model(seed_dir, load_manifest(seed_dir))
        _STATE.update(runner=OnnxRunner(seed_dir, threads=1), decode=DecodeSession(seed_dir, threads=1), model=model)
    return _STATE["runner"], _STATE["decode"], _STATE["model"]  # type: ignore[return-value]


def _eager(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))).numpy()


# Inputs in [-4, 4]: at [-8, 8] hypothesis found (2026-12-01) an output element of 6.8e-3 made by cancelling terms
# near 8, whose fp32 rounding in ONNX Runtime (1.23e-5 from eager) exceeds the fp32 row's atol 1e-5 + rtol * 6.8e-3.
# That is the conditioning of fp32 arithmetic at large activations, not a dtype, layout or chunking difference,
# which is what this property is about; in [-4, 4] the largest error over 6000 inputs (extremes included) was 1.9e-6.
valid_arrays = st.tuples(st.integers(1, 3), st.integers(1, 6), st.sampled_from(["<f4", ">f4", "<f8", "<f2"]),
                         st.booleans()).flatmap(
    lambda a: hnp.arrays(np.dtype(a[2]), (a[0], a[1], 3),
                         elements=st.floats(-4, 4, width=16 if a[2] == "<f2" else 32)).map(
        lambda x, fortran=a[3]: np.asfortranarray(x) if fortran else x))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(x=valid_arrays, chunking=st.integers(0, 1))
def test_valid_inputs_match_eager_in_any_dtype_layout_and_chunking(seed_dir: Path, x: np.ndarray,
                                                                   chunking: int) -> None:
    runner, decode, model = _setup(seed_dir)
    expected = _eager(model, x.astype(np.float32))
    assert compare(runner.run(x), expected, tolerance_for("onnx")).ok
    schedule = uneven_schedule(x.shape[1], (1, 2)) if chunking else [x.shape[1]]
    assert compare(run_chunked(decode, x, schedule), expected, tolerance_for("decode")).ok


invalid_arrays = st.one_of(
    hnp.arrays(st.sampled_from([np.int32, np.int64, np.bool_, np.complex64, np.uint8]), (1, 2, 3)),
    hnp.arrays(np.float32, st.tuples(st.integers(1, 2), st.integers(7, 9), st.just(3))),  # tokens > context
    hnp.arrays(np.float32, st.tuples(st.integers(1, 2), st.integers(1, 6), st.sampled_from([1, 2, 4, 5]))),
    hnp.arrays(np.float32, hnp.array_shapes(min_dims=0, max_dims=5, max_side=3).filter(lambda s: len(s) != 3)),
    hnp.arrays(np.float32, (1, 2, 3), elements=st.sampled_from([np.nan, np.inf, -np.inf, 1.0])).filter(
        lambda x: not np.isfinite(x).all()),
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(x=invalid_arrays)
def test_invalid_inputs_raise_the_projects_error(seed_dir: Path, x: np.ndarray) -> None:
    runner, decode, _ = _setup(seed_dir)
    with pytest.raises(MHAError):
        runner.run(x)
    decode.reset()
    with pytest.raises(MHAError):
        decode.step(x)
    assert decode.past_tokens == 0  # a refused step leaves the cache as it was


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(x=hnp.arrays(np.float32, st.tuples(st.integers(1, 2), st.integers(1, 6), st.just(3)),
                    elements=st.floats(width=32, allow_nan=False, allow_infinity=False)))
def test_huge_finite_inputs_give_a_finite_output_or_the_projects_error(seed_dir: Path, x: np.ndarray) -> None:
    """Inputs around 1e19 and above overflow float32 attention scores: never a NaN returned silently."""
    runner, _, _ = _setup(seed_dir)
    try:
        out = runner.run(x)
    except MHAError as exc:
        assert "overflow float32 attention scores" in str(exc)
    else:
        assert np.isfinite(out).all()


def test_one_runner_shared_by_8_threads_is_bitwise_sequential(seed_dir: Path) -> None:
    runner = OnnxRunner(seed_dir, model="mha.blocks.onnx")
    inputs = [np.random.default_rng(i).standard_normal((1 + i % 3, 1 + i % 6, 3)).astype(np.float32)
              for i in range(64)]
    sequential = [runner.run(x) for x in inputs]
    with ThreadPoolExecutor(max_workers=8) as pool:
        threaded = list(pool.map(runner.run, inputs))
    assert all(np.array_equal(a, b) for a, b in zip(sequential, threaded, strict=True))
