"""The one form vocabulary (mha_runtime.artifact.forms): every row of both kinds resolves to what it names (its needs,
its builder, its quantizer method), and the one reader of `--variants` refuses both kinds' hostile inputs in one
line; the shared selection rules on a table of its own; the lossy methods' search order."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import onnx
import pytest

from mha_export.attention.graphs.table import BUILDERS
from mha_export.decoder.graphs.table import GRAPHS
from mha_export.decoder.lossy import methods
from mha_export.decoder.lossy.methods import METHODS, QUANTIZERS, ROLES, Method, Quantizer, role_weights
from mha_export.decoder.lossy.quantize import FAST, FINE, HEAD, lossy_source, matmul_weights, quantize_to
from mha_runtime.artifact.errors import BadValueError
from mha_runtime.artifact.forms import ALL, Chosen, FormRow, Table, parse, select
from mha_runtime.attention import registry
from mha_runtime.decoder import forms as decoder

KINDS = {"attention": registry.TABLE, "decoder": decoder.TABLE}
DECODER_ROWS = (*decoder.TABLE.rows, *decoder.GGUF_ROWS[1:])  # with the GGUF quant types no name selects alone


@pytest.mark.parametrize("rows", [registry.TABLE.rows, DECODER_ROWS], ids=["attention", "decoder"])
def test_every_row_names_existing_rows_and_files_no_other_row_has(rows: tuple[FormRow, ...]) -> None:
    names = [r.name for r in rows]
    assert len(set(names)) == len(names)
    assert {n for r in rows for n in r.needs} <= set(names)
    files = [a.file for r in rows for a in r.artifacts] if rows is registry.TABLE.rows else [r.file for r in rows]
    assert len(set(files)) == len(files)
    assert all(r.tolerance is not None or not r.lossy for r in rows)  # a bar of one kind or the other


def test_every_attention_variant_has_its_builder_and_tolerance_rows() -> None:
    assert set(BUILDERS) == {r.name for r in registry.TABLE.rows}
    for row in registry.TABLE.rows:
        for spec in row.artifacts:
            assert registry.tolerance_for(spec.kind) is not None  # raises KeyError for a kind without a row
            assert registry.spec_for(spec.file) == spec


def test_every_exact_decoder_form_has_its_graph_and_every_lossy_form_its_method() -> None:
    exact = {f.file for f in decoder.FORMS.values() if not f.lossy}
    assert set(GRAPHS) == exact
    lossy = [f for f in decoder.FORMS.values() if f.lossy]
    assert lossy and all(f.method in METHODS and METHODS[f.method].bits == f.bits for f in lossy)
    assert all(f.file not in exact for f in lossy) and all(n in decoder.TABLE.choices for f in lossy for n in f.needs)


def test_every_gguf_quant_type_is_one_llama_cpp_writes_judged_by_its_onnx_forms_bar() -> None:
    from mha_export.gguf.write import TYPES

    for row in decoder.GGUF_ROWS[1:]:
        assert row.dtype in TYPES and row.lossy and row.needs[0] == decoder.GGUF_VARIANT
        onnx_form = decoder.TABLE[row.needs[1]]
        assert (onnx_form.max_mean_kl, onnx_form.bits) == (row.max_mean_kl, row.bits)
        assert decoder.GGUF_QUANTS[onnx_form.file] == row.file


def test_every_method_names_its_quantizer_and_roles() -> None:
    for method in METHODS.values():
        quantizer = QUANTIZERS[method.quantizer]
        assert callable(quantizer.quantize) and quantizer.label
        assert set(method.finer) | set(method.stays_higher) <= set(ROLES)
        assert method.higher in ("fp32", "int8") and method.bits in (4, 8)
    # the legacy views by width are the forms' methods' plans
    for form in (f for f in decoder.FORMS.values() if f.lossy):
        assert form.bits is not None and form.method is not None
        assert (FAST[form.bits], FINE[form.bits]) == (METHODS[form.method].fast(), METHODS[form.method].fine())


# ---- the one parser, both kinds

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("text", ["x" * 5000, "all,bogus", "ALL", "Fused", "fused\nbogus", "\u0663", "all;pte",
                                  "q8_0", "--variants"])
def test_a_name_the_kind_lacks_is_one_line(kind: str, text: str) -> None:
    with pytest.raises(BadValueError) as refused:
        parse(text, KINDS[kind])
    line = str(refused.value)
    assert "\n" not in line and len(line) < 400, line
    assert all(name in line for name in KINDS[kind].choices)  # the line names the choices
    if kind == "attention":
        assert line.startswith("unknown variant '")
    else:
        assert line.startswith("--variants: expected 'all' or some of ") and "(and 'all,pte,gguf')" in line


@pytest.mark.parametrize("text", ["", " ", ",", " , ", "none"])
def test_nothing_is_the_core_alone_where_the_kind_allows_it(text: str) -> None:
    assert parse(text, registry.TABLE) == Chosen(False, ())
    with pytest.raises(BadValueError, match=r"^--variants: expected"):
        parse(text, decoder.TABLE)


def test_names_come_back_once_in_table_order_and_on_request_names_add_to_all() -> None:
    assert parse(" decode ,fused,fused", registry.TABLE) == Chosen(False, ("fused", "decode"))
    assert parse(["int8", "fused"], registry.TABLE) == Chosen(False, ("fused", "int8"))
    assert parse("gguf,all,pte", decoder.TABLE) == Chosen(True, ("pte", "gguf"))
    assert parse("all", decoder.TABLE) == Chosen(True, ())
    assert parse("pte", decoder.TABLE) == Chosen(False, ("pte",))  # on request: not 'all' with it
    assert set(decoder.TABLE.default) == set(decoder.GPT_VARIANTS)  # pte and gguf only when named
    assert set(registry.TABLE.default) == set(registry.CHOICES)
    with pytest.raises(BadValueError, match="variant 'int8-attention' cannot be built: int8 dynamic"):
        parse("fused,int8-attention", registry.TABLE)
    with pytest.raises(BadValueError, match=r"^unknown variant 'none'"):
        parse("none,fused", registry.TABLE)  # 'none' stands alone


# ---- the shared selection, on a table of its own

def _odd(cfg: int) -> str | None:
    return f"{cfg} is odd" if cfg % 2 else None


ROWS = (FormRow(name="a", file="a", core=True), FormRow(name="b", file="b", needs=("a",)),
        FormRow(name="c", file="c", refuses=_odd), FormRow(name="d", file="d", needs=("c",)),
        FormRow(name="e", file="e", on_request=True))


@pytest.mark.parametrize("pull", [True, False])
def test_all_leaves_out_what_a_config_refuses_and_what_is_built_from_it(pull: bool) -> None:
    table = Table(ROWS, unknown="unknown {name}", pull_needs=pull)
    chosen = select(table, Chosen(True, ()), 3)
    assert [r.name for r in chosen.rows] == ["a", "b"]  # the core always
    assert [(r.name, why) for r, why in chosen.left_out] == [("c", "3 is odd"), ("d", "3 is odd")]
    assert chosen.refused == () and [r.name for r in select(table, Chosen(True, ()), 2).rows][-2:] == ["c", "d"]


def test_a_named_form_is_refused_with_the_reason_of_what_it_is_built_from() -> None:
    pulled = select(Table(ROWS, unknown=""), Chosen(True, ("d", "e")), 3)
    assert [(r.name, why, shape) for r, why, shape in pulled.refused] == [("c", "3 is odd", True),
                                                                         ("d", "3 is odd", True)]
    assert [r.name for r in pulled.rows] == ["a", "b", "e"]
    named = select(Table(ROWS, unknown="", pull_needs=False), Chosen(False, ("b", "d")), 2)
    assert [(r.name, need) for r, need in named.unmet] == [("d", "c")]  # asked for, not pulled in; the core is built


def test_a_table_whose_needs_name_no_row_is_refused_when_declared() -> None:
    with pytest.raises(ValueError, match=r"needs \['z'\] name no row"):
        Table((*ROWS, FormRow(name="f", file="f", needs=("z",))), unknown="")
    with pytest.raises(ValueError, match="a name twice"):
        Table((*ROWS, ROWS[1]), unknown="")


def test_the_environment_refuses_as_the_config_does_but_is_not_a_usage_error() -> None:
    class Lacking(FormRow):
        def missing(self) -> str | None:
            return "needs a module"

    rows = (*ROWS, Lacking(name="x", file="x"), FormRow(name="y", file="y", needs=("x",)))
    table = Table(rows, unknown="")
    assert [(r.name, why, shape) for r, why, shape in select(table, Chosen(False, ("y",)), 2).refused] == [
        ("x", "needs a module", False), ("y", "needs a module", False)]
    assert [r.name for r, _ in select(table, Chosen(True, ()), 2).left_out] == ["x", "y"]


def test_a_reason_besides_the_rows_own_refuses_it_and_what_is_built_from_it() -> None:
    """select's `also` (a decoder architecture's refusal): as a row's own rule, after it, for the config."""
    table = Table(ROWS, unknown="", pull_needs=False)
    also = {"b": "b is not ours", "c": "never said"}.get
    chosen = select(table, Chosen(True, ("b",)), 3, also=lambda row: also(row.name))
    assert [(r.name, why, shape) for r, why, shape in chosen.refused] == [("b", "b is not ours", True)]
    assert [(r.name, why) for r, why in chosen.left_out] == [("c", "3 is odd"), ("d", "3 is odd")]  # its own first
    assert [(r.name, why) for r, why in select(table, Chosen(True, ()), 2, also=lambda row: also(row.name)
                                               ).left_out] == [("b", "b is not ours"), ("c", "never said"),
                                                               ("d", "never said")]


# ---- the decoder's plan reads the rows

def test_the_decoders_refusals_come_from_its_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    import mha_export.decoder.plan as plan
    from mha_export.decoder.archs.gpt2.config import GPTConfig

    monkeypatch.setattr(plan, "program", lambda: Path("/bin/true"))  # as if llama.cpp were built
    monkeypatch.setattr(plan, "available_memory", lambda: None)
    twelve = GPTConfig(vocab_size=50, context_length=8, emb_dim=48, n_heads=4, n_layers=1)
    made = plan.plan_gpt(twelve, (ALL, "gguf"))
    assert made.files == (decoder.DECODER.file,) and made.gguf and made.lenient
    assert [n.split(":")[0] for n in made.notes] == [decoder.INPLACE.file, decoder.INT8.file, decoder.INT4.file]
    with pytest.raises(BadValueError, match=r"^--variants inplace,int4: head size 12 .*gpt\.onnx\) alone$"):
        plan.plan_gpt(twelve, ("inplace", "int4"))
    with pytest.raises(BadValueError, match=r"^--variants: int8 and int4 quantize .* add inplace$"):
        plan.plan_gpt(replace(twelve, emb_dim=64), ("decoder", "int4"))
    one = GPTConfig(vocab_size=50, context_length=8, emb_dim=4, n_heads=4, n_layers=1)
    with pytest.raises(BadValueError, match=r"^--variants gguf: head size 1 .*aborts\)$"):
        plan.plan_gpt(one, ("decoder", "gguf"))


def test_the_decoders_plan_asks_the_architecture_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """An architecture's refusal of a form's file (archs/protocol.py `refusal`) leaves it and the forms built from
    it out of 'all' with a note, and refuses them named, in the forms' own words."""
    import mha_export.decoder.plan as plan
    from mha_export.decoder.archs import gpt2
    from mha_export.decoder.archs.gpt2.config import GPTConfig

    monkeypatch.setattr(plan, "available_memory", lambda: None)
    seen: list[tuple[object, str]] = []

    def refusal(cfg: object, file: str) -> str | None:
        seen.append((cfg, file))
        return "no cache in place for this family" if file == decoder.INPLACE.file else None

    monkeypatch.setattr(gpt2, "refusal", refusal)
    cfg = GPTConfig(vocab_size=50, context_length=8, emb_dim=64, n_heads=4, n_layers=1)
    made = plan.plan_gpt(cfg, (ALL, "pte"))
    assert made.files == (decoder.DECODER.file,) and made.pte and (cfg, decoder.PTE.file) in seen
    assert made.notes == tuple(f"{f.file}: no cache in place for this family"
                               for f in (decoder.INPLACE, decoder.INT8, decoder.INT4))
    with pytest.raises(BadValueError, match=r"^--variants inplace,int8: no cache in place for this family; export "
                                            r"the decoder variant \(gpt\.onnx\) alone$"):
        plan.plan_gpt(cfg, ("inplace", "int8"))


# ---- the lossy methods

def test_roles_name_the_head_the_embedding_and_the_edge_layers() -> None:
    weights = ["h0.qkv.weight", "h0.fc.weight", "h1.fc.weight", "h2.qkv.weight", "h2.proj.weight", HEAD, "tok_emb"]
    assert role_weights("first", weights) == ["h0.qkv.weight", "h0.fc.weight"]
    assert role_weights("last", weights) == ["h2.qkv.weight", "h2.proj.weight"]
    assert role_weights("head", weights) == [HEAD] and role_weights("embedding", weights) == ["tok_emb"]
    assert role_weights("embedding", weights[:-1]) == []  # tied: no table of its own


def test_the_search_tries_fast_then_fine_keeping_more_and_keeps_the_roles_in_every_plan() -> None:
    ranking = ["h1.fc.weight", HEAD, "h0.qkv.weight", "h1.proj.weight"]
    method = METHODS["matmulnbits-4"]
    tried = method.plans(ranking, [0, 1, 2])
    assert tried[0] == method.fast(ranking) and tried[1] == method.offset_plan(ranking)  # the 4-bit row's offsets
    assert tried[2] == method.fine(ranking)
    assert [list(p.kept) for p in tried[2:]] == [[], ["h1.fc.weight"], ["h1.fc.weight", HEAD]]
    assert {p.kept.get("h1.fc.weight") for p in tried[3:]} == {method.higher}
    edges = replace(method, stays_higher=("first", "last"))
    for plan in edges.plans(ranking, [0, 2]):
        assert {w for w, p in plan.kept.items() if p == method.higher} >= {"h0.qkv.weight", "h1.fc.weight",
                                                                           "h1.proj.weight"}
    assert list(edges.plans(ranking, [2])[-1].kept)[-1] == HEAD  # the ranking skips what the roles keep


def test_a_new_quantizer_is_a_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """quantize_to runs the plan's quantizer, one call per pass, and the manifest records its name."""
    from mha_export.decoder.archs.gpt2.config import GPTConfig
    from mha_export.decoder.eager import seeded_gpt

    cfg = GPTConfig(vocab_size=97, context_length=16, emb_dim=32, n_heads=2, n_layers=2, qkv_bias=True)
    calls: list[tuple[int, int, int]] = []

    def spy(model: onnx.ModelProto, **how: Any) -> onnx.ModelProto:
        calls.append((how["bits"], how["block_size"], len(how["exclude"])))
        return QUANTIZERS["matmulnbits"].quantize(model, **how)

    monkeypatch.setattr(methods, "QUANTIZERS", {**QUANTIZERS, "spy": Quantizer("spy quantizer", spy)})
    monkeypatch.setattr("mha_export.decoder.lossy.quantize.QUANTIZERS", methods.QUANTIZERS)
    row = Method("spy-4", "spy", 4, higher="int8", finer=("head",))
    state = {k: v for k, v in seeded_gpt(cfg).state_dict().items() if not k.endswith(".mask")}
    source = lossy_source(state, cfg, tied=True)
    weights = list(matmul_weights(source))
    plan = row.plans(weights, [1])[-1]
    quantize_to(source, tmp_path / "q.onnx", plan, tied=True)
    assert [c[:2] for c in calls] == [(4, 32), (8, 32)]  # the main pass, then the kept matrix at 8 bits
    assert calls[1][2] == len(weights) - 1 and plan.to_dict()["method"] == "spy quantizer"


def test_the_lossy_search_is_the_form_methods_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """build_lossy tries the plans of the row the form names (not a table by width): its fast plan's block size,
    its higher precision, whether it ranks the embedding; its miss line names that row's fast block size."""
    from mha_export.decoder.archs.gpt2.config import GPTConfig
    from mha_export.decoder.eager import seeded_gpt
    from mha_export.decoder.graphs.inplace import inplace_model
    from mha_export.decoder.lossy import build
    from mha_export.decoder.lossy.embedding import TOKENS
    from mha_runtime.decoder.decoder import decoder_for, make_session

    cfg = GPTConfig(vocab_size=97, context_length=16, emb_dim=32, n_heads=2, n_layers=2, qkv_bias=True)
    row = replace(METHODS["matmulnbits-8"], name="wide-8", higher="int8", fast_block_size=64, ranks_embedding=True)
    monkeypatch.setattr(build, "METHODS", {**METHODS, row.name: row})
    state = {k: v for k, v in seeded_gpt(cfg).state_dict().items() if not k.endswith(".mask")}
    inplace_model(state, cfg, tied=False).save(tmp_path / decoder.INPLACE.file)
    ref = make_session(str(tmp_path / decoder.INPLACE.file))
    form = replace(decoder.INT8, method=row.name, max_mean_kl=0.0)  # no plan meets it: every one is tried
    missed = build.build_lossy(form, state, cfg, tmp_path / "q.onnx", tied=False,
                               reference=lambda: decoder_for("inplace", ref, cfg, "ref"),
                               windows=build.quality_windows(cfg, None))
    ranked = build.ranking(lossy_source(state, cfg, tied=False), row, tied=False)
    assert TOKENS in ranked and len(missed.tries) == 1 + len(build._counts(len(ranked)))
    assert str(missed.tries[0]["plan"]).startswith("8 bits in blocks of 64, symmetric")
    assert set(missed.plan.kept.values()) == {"int8"} and "(blocks of 64 and 32," in missed.miss_line()
