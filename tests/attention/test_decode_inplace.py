"""The in-place decode form: every schedule equals the full-sequence output, the cache is written in place,
and what ONNX Runtime's kernel cannot do is refused before it runs."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from mha_export.attention.weights.load import load_artifact_model
from mha_runtime.artifact.errors import ContractError, MHAError
from mha_runtime.artifact.tolerance import compare
from mha_runtime.attention.decode_session import golden_schedule, run_chunked, uneven_schedule
from mha_runtime.attention.inplace_session import InPlaceDecodeSession
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.attention.registry import DECODE_INPLACE, tolerance_for
from mha_runtime.cli.main import cli

SCHEDULES = {"prefill": lambda t: [t], "token-by-token": lambda t: [1] * t, "golden": golden_schedule,
             "uneven": uneven_schedule}


# Chunks after a past need batch 1 (ONNX Runtime's GroupQueryAttention): uneven at batch 3 is refused (below).
@pytest.mark.parametrize("schedule,batch", [(s, b) for s in SCHEDULES for b in (1, 3) if s != "uneven" or b == 1])
def test_every_schedule_equals_the_full_sequence(mid_dir: Path, schedule: str, batch: int) -> None:
    model, config = load_artifact_model(mid_dir, load_manifest(mid_dir))
    session = InPlaceDecodeSession(mid_dir)
    for tokens in range(1, config.context_length + 1):
        x = torch.randn(batch, tokens, config.d_in, generator=torch.Generator().manual_seed(tokens))
        with torch.no_grad():
            full = model(x).numpy()
        got = run_chunked(session, x.numpy(), SCHEDULES[schedule](tokens))
        assert compare(got, full, tolerance_for(DECODE_INPLACE.kind)).ok, (schedule, batch, tokens)


def test_the_cache_is_one_buffer_written_in_place(mid_dir: Path) -> None:
    session = InPlaceDecodeSession(mid_dir)
    session.step(np.ones((1, 5, 64), np.float32))
    key = session._key
    address = key.data_ptr()
    for _ in range(3):
        session.step(np.ones((1, 1, 64), np.float32))
    assert session._key is key and key.data_ptr() == address and session.past_tokens == 8
    rows = key.numpy()[0, :, :, :]  # (H, context_length, d_out)
    assert np.abs(rows[:, :8]).sum() > 0 and not rows[:, 8:].any()  # the 8 rows in use, nothing beyond


def test_rewind_goes_back_to_an_earlier_past(mid_dir: Path) -> None:
    session = InPlaceDecodeSession(mid_dir)
    x = np.random.default_rng(0).standard_normal((1, 10, 64)).astype(np.float32)
    session.step(x[:, :9])
    want = session.step(x[:, 9:])
    session.rewind(9)
    assert np.array_equal(session.step(x[:, 9:]), want)
    with pytest.raises(ContractError, match="rewind: expected 0 <= past_tokens <= 10"):
        session.rewind(11)


@pytest.mark.parametrize("steps,message", [
    ([(3, 4), (3, 2)], "a chunk of 2 tokens after a past needs batch 1"),
    ([(1, 4), (2, 1)], "expected batch 1 (the cache's)"),
    ([(1, 40), (1, 9)], "<= context_length - past_tokens = 48 - 40 = 8"),
])
def test_refusals_leave_the_cache_as_it_was(mid_dir: Path, steps: list[tuple[int, int]], message: str) -> None:
    session = InPlaceDecodeSession(mid_dir)
    *ok, (batch, tokens) = steps
    for b, t in ok:
        session.step(np.ones((b, t, 64), np.float32))
    before = session.past_tokens
    with pytest.raises(ContractError, match=message.replace("(", r"\(").replace(")", r"\)")):
        session.step(np.ones((batch, tokens, 64), np.float32))
    assert session.past_tokens == before


def test_other_models_are_refused(mid_dir: Path) -> None:
    with pytest.raises(MHAError, match="expected the in-place decode form"):
        InPlaceDecodeSession(mid_dir, model="mha.decode.onnx")


def test_a_config_it_cannot_build_leaves_it_out_of_all_and_refuses_it_by_name(tmp_path: Path) -> None:
    """The seed preset's d_out = 2: GroupQueryAttention needs d_out % 8 == 0."""
    by_name = CliRunner().invoke(cli, ["export", "--preset", "seed", "--variants", "decode-inplace",
                                       "--out", str(tmp_path)])
    assert by_name.exit_code == 2 and "needs d_out % 8 == 0, got d_out=2" in by_name.stderr
    assert not (tmp_path / "seed").exists()


def test_seed_preset_has_no_inplace_form(seed_dir: Path) -> None:
    assert DECODE_INPLACE.file not in load_manifest(seed_dir).artifacts


@pytest.mark.slow
def test_gpt2_small_token_by_token_and_chunked(gpt2_dir: Path) -> None:
    model, config = load_artifact_model(gpt2_dir, load_manifest(gpt2_dir))
    session = InPlaceDecodeSession(gpt2_dir)
    for tokens, chunks in [(1, [1]), (2, [1, 1]), (100, uneven_schedule(100)), (1024, golden_schedule(1024))]:
        x = torch.randn(1, tokens, config.d_in, generator=torch.Generator().manual_seed(tokens))
        with torch.no_grad():
            full = model(x).numpy()
        assert compare(run_chunked(session, x.numpy(), chunks), full, tolerance_for(DECODE_INPLACE.kind)).ok, tokens
