"""The streamed writer (export/mha_export/onnx_file/save.py) writes exactly protobuf's own serialization."""
from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

from mha_export.decoder.archs.gpt2.config import GPTConfig
from mha_export.decoder.eager import seeded_gpt
from mha_export.decoder.graphs.concat import concat_model
from mha_export.decoder.graphs.inplace import inplace_model
from mha_export.decoder.lossy.quantize import (
    ACCURACY_LEVEL,
    BLOCK,
    FAST,
    HEAD,
    QuantPlan,
    fit,
    fitted_block,
    lossy_source,
    matmul_weights,
    quantize_to,
)

CFG = GPTConfig(vocab_size=97, context_length=16, emb_dim=16, n_heads=2, n_layers=2, qkv_bias=True)


def test_streamed_files_equal_onnx_save(tmp_path: Path) -> None:
    state = {k: v for k, v in seeded_gpt(CFG).state_dict().items() if not k.endswith(".mask")}
    for name, built in (("concat", concat_model(state, CFG, tied=False)),
                        ("inplace", inplace_model(state, CFG, tied=True))):
        built.save(tmp_path / f"{name}.onnx")
        onnx.save(built.full(), str(tmp_path / f"{name}.ref.onnx"))
        assert (tmp_path / f"{name}.onnx").read_bytes() == (tmp_path / f"{name}.ref.onnx").read_bytes(), name
        onnx.checker.check_model(str(tmp_path / f"{name}.onnx"))


@pytest.mark.parametrize("bits", [8, 4])
def test_lossy_file_is_protobufs_serialization_of_the_quantizers_matmuls(tmp_path: Path, bits: int) -> None:
    """quantize_to streams the quantized model (its serialized copy was the export's peak): the file is exactly
    protobuf's serialization of what it holds (onnx.save of it read back), and its MatMulNBits nodes and weights are
    onnxruntime's quantizer's own (the token embedding is then replaced: test_gpt_embedding.py)."""
    state = {k: v for k, v in seeded_gpt(CFG).state_dict().items() if not k.endswith(".mask")}
    quantize_to(lossy_source(state, CFG, tied=False), tmp_path / "q.onnx", QuantPlan(bits), tied=False)
    written = onnx.load(str(tmp_path / "q.onnx"))
    onnx.save(written, str(tmp_path / "q.ref.onnx"))
    assert (tmp_path / "q.onnx").read_bytes() == (tmp_path / "q.ref.onnx").read_bytes()
    reference = lossy_source(state, CFG, tied=False)
    quantizer = MatMulNBitsQuantizer(reference, bits=bits, block_size=BLOCK, is_symmetric=True,
                                     accuracy_level=ACCURACY_LEVEL)
    quantizer.process()
    ref = quantizer.model.model
    ours, theirs = ([n for n in m.graph.node if n.op_type == "MatMulNBits"] for m in (written, ref))
    assert ours and ours == theirs
    inits = {t.name: t for t in written.graph.initializer}
    assert all(inits[t.name] == t for t in ref.graph.initializer if t.name != "tok_emb")
    assert all(onnx.helper.get_attribute_value(a) == bits for n in ours for a in n.attribute if a.name == "bits")


def test_a_plan_keeps_its_matrices_at_the_higher_precision(tmp_path: Path) -> None:
    """An 8-bit plan keeping the head leaves it a plain fp32 MatMul; a 4-bit plan keeping it makes it 8 bits."""
    state = {k: v for k, v in seeded_gpt(CFG).state_dict().items() if not k.endswith(".mask")}
    names = matmul_weights(lossy_source(state, CFG, tied=False))
    assert "head.weight_t" in names and len(names) == 4 * CFG.n_layers + 1
    for bits, kept, want in ((8, "fp32", None), (4, "int8", 8)):
        quantize_to(lossy_source(state, CFG, tied=False), tmp_path / "q.onnx", QuantPlan(bits, {"head.weight_t": kept}),
                    tied=False)
        graph = onnx.load(str(tmp_path / "q.onnx")).graph
        head = next(n for n in graph.node if n.output and any("head" in i for i in n.input))
        bits_of = {n.name: next(onnx.helper.get_attribute_value(a) for a in n.attribute if a.name == "bits")
                   for n in graph.node if n.op_type == "MatMulNBits"}
        if want is None:
            assert head.op_type == "MatMul" and len(bits_of) == 4 * CFG.n_layers
        else:
            assert head.op_type == "MatMulNBits" and bits_of.pop(head.name) == want
        assert set(bits_of.values()) == {bits}


def _attrs(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("bits", [8, 4])
def test_the_fast_plan_writes_what_it_records(tmp_path: Path, bits: int) -> None:
    """FAST: every MatMulNBits has the bits and block size the plan names for its weight (the head in blocks of
    32), a zero point exactly where the plan is asymmetric, and each node equals onnxruntime's quantizer's own node
    for that weight at those settings."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    cfg = GPTConfig(vocab_size=97, context_length=16, emb_dim=256, n_heads=2, n_layers=1, qkv_bias=True)
    state = {k: v for k, v in seeded_gpt(cfg).state_dict().items() if not k.endswith(".mask")}
    plan = FAST[bits]
    fitted = fit(plan, lossy_source(state, cfg, tied=False), tied=False)
    assert fitted.finer == plan.finer  # 256 input rows: no block padded
    assert fitted.embedding == {"dtype": f"int{bits}", "block_size": plan.block_size, "symmetric": plan.symmetric,
                                "shared_with_head": False}
    quantize_to(lossy_source(state, cfg, tied=False), tmp_path / "q.onnx", fitted, tied=False)
    graph = onnx.load(str(tmp_path / "q.onnx")).graph
    nodes = {n.input[1].split("_Q")[0]: n for n in graph.node if n.op_type == "MatMulNBits"}
    assert set(nodes) == set(matmul_weights(lossy_source(state, cfg, tied=False)))
    for weight, node in nodes.items():
        want_bits = 8 if plan.kept.get(weight) == "int8" else bits
        block = plan.finer.get(weight, plan.block_size)
        symmetric = plan.symmetric or weight in plan.kept
        got = _attrs(node)
        assert (got["bits"], got["block_size"], got["accuracy_level"]) == (want_bits, block, ACCURACY_LEVEL), weight
        assert (len(node.input) == 3) == symmetric, weight  # a 4th input: the zero points
        alone = MatMulNBitsQuantizer(lossy_source(state, cfg, tied=False), bits=want_bits, block_size=block,
                                     is_symmetric=symmetric, accuracy_level=ACCURACY_LEVEL,
                                     nodes_to_exclude=[n for w, n in matmul_weights(
                                         lossy_source(state, cfg, tied=False)).items() if w != weight])
        alone.process()
        ref = next(n for n in alone.model.model.graph.node if n.op_type == "MatMulNBits")
        inits = {t.name: t for t in graph.initializer}
        ref_inits = {t.name: t for t in alone.model.model.graph.initializer}
        assert [inits[i].raw_data for i in node.input[1:]] == [ref_inits[i].raw_data for i in ref.input[1:]], weight
    assert HEAD in (plan.kept | plan.finer)


def test_a_block_longer_than_a_matrix_is_fitted_to_it() -> None:
    """CFG's matrices have 16 (and 64) input rows: every block of the fast plans is fitted to a power of two that
    divides them, and recorded in the plan (blocks of 128 or 256 would be mostly padding)."""
    state = {k: v for k, v in seeded_gpt(CFG).state_dict().items() if not k.endswith(".mask")}
    source = lossy_source(state, CFG, tied=False)
    rows = {t.name: t.dims[0] for t in source.graph.initializer if t.name in matmul_weights(source)}
    for bits in (8, 4):
        fitted = fit(FAST[bits], source, tied=False)
        # each block: the matrix's rows; the untied embedding's along its width E
        assert sorted(set(rows.values())) == [16, 64] and fitted.finer == rows | {"tok_emb": CFG.emb_dim}
    assert [fitted_block(256, n) for n in (768, 64, 96, 100, 3072)] == [256, 64, 32, 16, 256]


def test_the_weightless_check_still_checks_the_graph() -> None:
    """onnx_file/check.py gives the checker stubs for the weights; a broken graph is still refused."""
    state = {k: v for k, v in seeded_gpt(CFG).state_dict().items() if not k.endswith(".mask")}
    built = inplace_model(state, CFG, tied=True)
    built.check()  # the sound graph passes
    for breakage in ("undefined input", "unknown op", "missing weight"):
        broken = inplace_model(state, CFG, tied=True)
        node = next(n for n in broken.model.graph.node if n.op_type == "MatMul")
        if breakage == "undefined input":
            node.input[0] = "nowhere"
        elif breakage == "unknown op":
            node.op_type = "NoSuchOp"
        else:
            broken.arrays.pop(next(i for i, (name, _) in enumerate(broken.arrays) if name == node.input[1]))
        with pytest.raises(onnx.checker.ValidationError):
            broken.check()
