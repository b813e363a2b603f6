"""The GPT folders against the models that define them: the book's GPTModel (llms-from-scratch) and transformers'
GPT2LMHeadModel, every decoder form, prompt lengths 1, middle and context_length, batch 1 and 3, prefill and steps."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from gpt_sources import BOOK, BOOK_FORMS, HF, book_model, hf_model, save_book, save_hf
from mha_export.decoder.archs.gpt2.config import GPTConfig
from mha_export.decoder.export import export_gpt
from mha_runtime.artifact.errors import ArtifactError, ConfigError
from mha_runtime.artifact.tolerance import Tolerance, compare
from mha_runtime.decoder.contract import CONCAT_FORM, INPLACE_FORM
from mha_runtime.decoder.forms import FORMS
from mha_runtime.decoder.generate import Generator
from mha_runtime.decoder.manifest import load_gpt_manifest
from mha_runtime.decoder.quality import kl_divergence

STEPS = 3


def reference_logits(model: torch.nn.Module, ids: list[list[int]]) -> np.ndarray:
    """(B, T, V) from the defining library's forward pass."""
    with torch.no_grad():
        out = model(torch.tensor(ids, dtype=torch.int64))
    return (out.logits if hasattr(out, "logits") else out).numpy()


def check_form(folder: Path, form: str, model: torch.nn.Module, cfg: GPTConfig) -> int:
    """Every case of one form against the defining library's logits; returns the number of cases. An fp32 form:
    within its tolerance row. A lossy form: the mean KL divergence of its next-token distributions from the
    library's, over all cases, within the form's bar."""
    gen = Generator(folder, form=form)
    spec = FORMS[form]
    tol = Tolerance.from_dict(gen.manifest.artifacts[form].tolerance)
    rng = np.random.default_rng(11)
    kls: list[float] = []

    def judge(got: np.ndarray, want: np.ndarray, what: str) -> None:
        if spec.lossy:
            kls.extend(kl_divergence(want, got).tolist())
        else:
            result = compare(got, want, tol)
            assert result.ok, f"{form} {what}: {result}"

    for n in (1, cfg.context_length // 2, cfg.context_length):
        for batch in (1, 3):
            ids = rng.integers(0, cfg.vocab_size, (batch, n)).tolist()
            ref = reference_logits(model, ids)
            decoder = gen.decoder()
            judge(decoder.prefill(ids), ref[:, -1], f"prefill B={batch} T={n}")
            if n > 1:
                decoder = gen.decoder()
                split = max(1, n - STEPS)
                decoder.prefill([r[:split] for r in ids])
                for t in range(split, n):
                    judge(decoder.step([r[t] for r in ids], [True] * batch), ref[:, t], f"step B={batch} t={t}")
    cases = 6 + 12
    if spec.lossy:
        assert spec.meets_bar(float(np.mean(kls))), (form, float(np.mean(kls)))
    return cases


@pytest.mark.parametrize("form", list(FORMS))
def test_book_gpt_every_form_equals_the_books_model(book_gpt: tuple[torch.nn.Module, Path], form: str) -> None:
    model, folder = book_gpt
    assert check_form(folder, form, model, BOOK) == 18  # 6 prefills, 12 steps


@pytest.mark.parametrize("form", list(FORMS))
def test_hf_gpt2_every_form_equals_transformers(hf_gpt: tuple[torch.nn.Module, Path], form: str) -> None:
    model, folder = hf_gpt
    assert check_form(folder, form, model, HF) == 18


def test_hf_pytorch_model_bin_and_lm_head_model_keys(tmp_path: Path) -> None:
    """pytorch_model.bin (save_pretrained without safetensors) holds transformer.* keys and the tied lm_head."""
    model = hf_model(seed=9)
    weights = save_hf(model, tmp_path / "hf", safetensors=False)
    folder = export_gpt("bin", tmp_path, config=HF, weights=weights, variants=("decoder",)).folder
    ids = [[5, 17, 300, 9000]]
    gen = Generator(folder, form=CONCAT_FORM)
    got = gen.decoder().prefill(ids)
    assert compare(got, reference_logits(model, ids)[:, -1], FORMS[CONCAT_FORM].tolerance).ok


def test_tied_head_is_stored_once(hf_gpt: tuple[torch.nn.Module, Path]) -> None:
    _, folder = hf_gpt
    manifest = load_gpt_manifest(folder)
    assert manifest.weights["tied"] is True and manifest.weights["layout"] == "hf-gpt2"
    params = HF.parameters(tied=True)
    assert manifest.weights["parameters"] == params
    for form in (CONCAT_FORM, INPLACE_FORM):
        assert (folder / form).stat().st_size <= 1.02 * 4 * params, form


def test_a_tied_folders_own_weights_export_again(tmp_path: Path) -> None:
    """gpt.safetensors of a tied model (GPT-2's) stores the head once, as tok_emb.weight (metadata tied "true"):
    re-exported (docs/gpt.md), it is the same model, not a missing 'out_head.weight'."""
    small = GPTConfig(vocab_size=300, context_length=16, emb_dim=16, n_heads=2, n_layers=1, qkv_bias=True)
    weights = save_hf(hf_model(small, seed=3), tmp_path / "hf", safetensors=True)
    first = export_gpt("first", tmp_path, config=small, weights=weights, variants=("decoder",)).folder
    again = export_gpt("again", tmp_path, config=small, weights=first / "gpt.safetensors", variants=("decoder",))
    assert again.manifest.weights["tied"] is True and again.manifest.weights["layout"] == "book-gpt"
    for name in ("gpt.safetensors", CONCAT_FORM, "golden/generations.json"):
        assert (again.folder / name).read_bytes() == (first / name).read_bytes(), name


def test_book_folder_size_and_untied_head(book_gpt: tuple[torch.nn.Module, Path]) -> None:
    """The book's GPTModel has its own out_head: both matrices are stored, each once."""
    _, folder = book_gpt
    manifest = load_gpt_manifest(folder)
    assert manifest.weights["tied"] is False
    assert (folder / CONCAT_FORM).stat().st_size <= 1.02 * 4 * BOOK.parameters(tied=False)


def test_gpt_onnx_speaks_optimums_names(book_gpt: tuple[torch.nn.Module, Path]) -> None:
    _, folder = book_gpt
    graph = onnx.load(str(folder / CONCAT_FORM), load_external_data=False).graph

    def dims(v: onnx.ValueInfoProto) -> list[object]:
        return [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]

    inputs = {v.name: dims(v) for v in graph.input}
    outputs = {v.name: dims(v) for v in graph.output}
    assert list(inputs)[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert inputs["input_ids"] == ["batch_size", "sequence_length"]
    assert inputs["attention_mask"] == ["batch_size", "past_sequence_length + sequence_length"]
    assert inputs["past_key_values.1.value"] == ["batch_size", 4, "past_sequence_length", 16]
    assert outputs["logits"] == ["batch_size", "sequence_length", BOOK.vocab_size]
    assert outputs["present.0.key"] == ["batch_size", 4, "past_sequence_length + sequence_length", 16]
    assert {n.domain for n in graph.node} <= {"", "ai.onnx"}  # standard ops only: any ONNX runtime runs it


def test_seeded_export_is_the_books_model_under_seed_123(tmp_path: Path) -> None:
    """Without --weights: torch.manual_seed(123), then the book's GPTModel(cfg), as the book does."""
    cfg = GPTConfig(vocab_size=300, context_length=16, emb_dim=32, n_heads=2, n_layers=1)
    folder = export_gpt("seeded", tmp_path, config=cfg, variants=("decoder",)).folder
    book = book_model(cfg, seed=123)
    ids = [[1, 2, 3, 299, 7]]
    got = Generator(folder, form=CONCAT_FORM).decoder().prefill(ids)
    assert compare(got, reference_logits(book, ids)[:, -1], FORMS[CONCAT_FORM].tolerance).ok


def test_manifest_records_every_form_and_file(book_gpt: tuple[torch.nn.Module, Path]) -> None:
    _, folder = book_gpt
    manifest = load_gpt_manifest(folder)
    assert set(manifest.artifacts) == set(BOOK_FORMS)
    for name, record in manifest.artifacts.items():
        assert record.passed and record.cases >= 20
        assert record.tolerance == BOOK_FORMS[name].tolerance.to_dict()
        assert (record.quality is not None) == BOOK_FORMS[name].lossy
        if BOOK_FORMS[name].lossy:
            assert 0.0 <= record.greedy_agreement <= 1.0 and record.quality["bar_mean_kl"] == FORMS[name].max_mean_kl
        else:
            assert record.greedy_agreement == 1.0
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {"manifest.json"}
    assert on_disk == set(manifest.files)
    assert {"tokenizer.json", "tokenizer_config.json", "genai_config.json", "gpt.safetensors"} <= on_disk


def test_tampered_decoder_is_refused_before_it_is_parsed(book_gpt: tuple[torch.nn.Module, Path],
                                                         tmp_path: Path) -> None:
    import shutil

    folder = Path(shutil.copytree(book_gpt[1], tmp_path / "copy"))
    data = bytearray((folder / INPLACE_FORM).read_bytes())
    data[len(data) // 2] ^= 1
    (folder / INPLACE_FORM).write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256"):
        Generator(folder)
    (folder / "tokenizer.json").write_text("{}")
    with pytest.raises(ArtifactError):
        Generator(folder, form=CONCAT_FORM)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda s: s.pop("trf_blocks.1.ff.layers.0.bias"), "missing key 'trf_blocks.1.ff.layers.0.bias'"),
    (lambda s: s.__setitem__("trf_blocks.0.att.W_key.weight", torch.zeros(64, 32)),
     r"'trf_blocks.0.att.W_key.weight' has shape \[64, 32\], expected \[64, 64\]"),
    (lambda s: s.__setitem__("extra.weight", torch.zeros(2)), "unexpected key 'extra.weight'"),
    # finite in float64, inf once cast to float32: it was exported, then every case failed validation with inf
    (lambda s: s.__setitem__("pos_emb.weight", s["pos_emb.weight"].double() * 1e300),
     "'pos_emb.weight' holds values beyond float32's range"),
    # finite weights whose sum overflows in the forward pass (inf - inf in LayerNorm: NaN logits): it was exported,
    # then every case failed validation
    (lambda s: (s["tok_emb.weight"].fill_(3e38)[:, ::2].fill_(-3e38), s["pos_emb.weight"].fill_(3e38)),
     "eager PyTorch's logits are NaN or inf with these weights"),
])
def test_a_checkpoint_that_does_not_fit_is_one_line(tmp_path: Path, edit: object, message: str) -> None:
    state = book_model().state_dict()
    edit(state)  # type: ignore[operator]
    torch.save(state, tmp_path / "model.pth")
    with pytest.raises(ConfigError, match=message):
        export_gpt("bad", tmp_path / "out", config=BOOK, weights=tmp_path / "model.pth")
    assert not (tmp_path / "out" / "bad").exists()


def test_the_books_checkpoint_under_a_config_that_differs_is_refused(tmp_path: Path) -> None:
    weights = save_book(book_model(), tmp_path)
    other = GPTConfig(**(BOOK.to_dict() | {"n_layers": 3}))
    with pytest.raises(ConfigError, match=r"missing key 'trf_blocks\.2"):
        export_gpt("bad", tmp_path / "out", config=other, weights=weights)

