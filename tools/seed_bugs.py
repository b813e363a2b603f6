"""Mutation testing of the GPT code: seed one plausible bug at a time and see whether the tests that own that
behaviour catch it.

Repository tooling, not part of either package. Each mutant is one exact substring of one file (`old`, found exactly
once, else the mutant is "stale" and skipped) and its replacement (`new`). For each chosen mutant the file is
rewritten, `python -m pytest -x -q -p no:cacheprovider -p no:randomly <tests>` runs under a timeout, and the
original bytes (and mtime) are written back in a `finally`, on Ctrl-C and SIGTERM too. pytest's exit code 1 (a test
failed) is "caught", 0 is "survived", anything else (2 interrupted/collection error, 4 usage, 5 no tests, a timeout,
a failed build) is "error".

A C mutant (runtime/native/c/*.c) is rebuilt with `PYTHON=<python> runtime/native/c/build.sh` before its tests and
again after the restore. That script is not CMake and not incremental: it recompiles every binary under
runtime/native/c/build/ (mha_check, its ASan/UBSan twin, json_fuzz_asan, example, gpt_example) with gcc -Werror,
taking the ONNX Runtime headers it fetched once into build/apt, so each C mutant costs two full builds; a mutant
that does not compile is an "error" (build failed), and a rebuild that fails after the restore stops the run.
JavaScript mutants (runtime/native/common/*.mjs) need no build: Node and the wasm runner import the file itself.

    python3 tools/seed_bugs.py --list                    # the table; whether each `old` is found exactly once
    python3 tools/seed_bugs.py                           # every mutant (about 30-50 minutes on 2 cores)
    python3 tools/seed_bugs.py --only quality-kl-reversed,c-step-position --json out.json --logs /tmp/mutants

Run it on a clean tree and alone: it refuses to start when `git status --porcelain` shows a file it would mutate
already modified (a crashed run is never mistaken for clean code), and a test run sharing the tree meanwhile would
see the seeded bugs.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parents[1]
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
C_BUILD = "runtime/native/c/build.sh"
DEFAULT_TIMEOUT_S = 900
BUILD_TIMEOUT_S = 900
PYTEST_FLAGS = ("-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly")

# Frequently used selections.
EDGES = "tests/decoder/test_gpt_edges.py"
GOLDEN_CHECK = "tests/decoder/test_gpt_golden.py::test_mha_check_passes_every_generation_on_both_forms"
NAMED_LOSSY = "tests/decoder/test_gpt_quality.py::test_named_lossy_form_that_misses_its_bar_fails_in_one_line"
STOPS = "tests/decoder/test_gpt_generate.py::test_generation_stops_at_context_length_and_eos"
STREAM = f"{EDGES}::test_streamed_text_never_shows_half_a_character"
CONTEXT_STOP = f"{EDGES}::test_every_runner_stops_at_context_length_exactly"
GGUF_JUDGE = "tests/decoder/test_gpt_gguf.py::test_a_case_is_judged_on_its_ids_its_prompts_encoding_and_its_logits"
EMB = "tests/decoder/test_gpt_embedding.py"


@dataclass(frozen=True)
class Mutant:
    """One seeded bug: `old` (exactly once in `file`) becomes `new`; `tests` should catch it."""

    name: str
    file: str  # relative to the repository root
    old: str
    new: str
    why: str  # what product behaviour breaks, in one line
    tests: list[str] = field(default_factory=list)  # pytest node ids or test files

    @property
    def native(self) -> bool:
        """A C mutant: the runners must be rebuilt around it."""
        return self.file.endswith(".c")

    def count(self, root: Path = REPO) -> int:
        """How often `old` occurs in the file (-1: no such file)."""
        path = root / self.file
        return path.read_bytes().count(self.old.encode()) if path.is_file() else -1


MUTANTS: list[Mutant] = [
    # ---- runtime/mha_runtime/decoder/sampling.py
    Mutant("sampling-topk-ties-dropped", "runtime/mha_runtime/decoder/sampling.py",
           "return np.where(x < kth, np.float32(-np.inf), x)",
           "return np.where(x <= kth, np.float32(-np.inf), x)",
           "top-k keeps only logits strictly above the k-th: the k-th and its ties are dropped, unlike the book",
           [f"{EDGES}::test_top_k_keeps_every_logit_tied_with_the_kth_as_the_book_does",
            "tests/decoder/test_gpt_generate.py::test_probabilities_equal_the_books_sampling_rule"]),
    Mutant("sampling-one-stream-per-batch", "runtime/mha_runtime/decoder/sampling.py",
           "self.streams = [np.random.Generator(np.random.PCG64(self.seed)) for _ in range(rows)]",
           "self.streams = [np.random.Generator(np.random.PCG64(self.seed))] * rows",
           "rows of a batch share one PCG64 stream: a seeded row samples other tokens in a batch than alone",
           ["tests/decoder/test_gpt_generate.py::test_a_seed_gives_the_same_tokens_and_rows_equal_their_solo_runs"]),
    Mutant("sampling-no-temperature-max", "runtime/mha_runtime/decoder/sampling.py",
           "(temperature == 0 or TEMPERATURE_MIN <= temperature <= TEMPERATURE_MAX)",
           "(temperature == 0 or TEMPERATURE_MIN <= temperature)",
           "a temperature past float32's range (1e39) is accepted: NaN probabilities instead of a refusal",
           ["tests/decoder/test_gpt_generate.py::test_a_temperature_outside_the_range_where_the_books_rule_fails_is_refused"]),
    # ---- runtime/mha_runtime/decoder/generate.py (and the prompt's ids, checked in decoder/contract.py)
    Mutant("generate-negative-id-accepted", "runtime/mha_runtime/decoder/contract.py",
           "outside = [t for t in ids if not 0 <= t < vocab_size]",
           "outside = [t for t in ids if not t < vocab_size]",
           "a negative token id in a prompt is accepted (ONNX Gather wraps it) instead of refused in one line",
           [f"{EDGES}::test_a_negative_token_id_is_refused_before_anything_runs"]),
    Mutant("generate-context-stop-late", "runtime/mha_runtime/decoder/generate.py",
           "if prompt_tokens + len(ids) >= context_length:",
           "if prompt_tokens + len(ids) > context_length:",
           "generation runs one token past context_length (a token the model has no position for)",
           [STOPS]),
    Mutant("generate-eos-in-ids", "runtime/mha_runtime/decoder/generate.py",
           '    if token in stop_set(eos_id):\n        return "eos"\n    ids.append(token)\n',
           '    ids.append(token)\n    if token in stop_set(eos_id):\n        return "eos"\n',
           "the eos id is returned among the new ids (the book's generate leaves it out)",
           [STOPS]),
    Mutant("generate-tokenizer-unverified", "runtime/mha_runtime/decoder/generate.py",
           "data = read_verified(self.folder, TOKENIZER_FILE, self.manifest)",
           "data = (self.folder / TOKENIZER_FILE).read_bytes()",
           "tokenizer.json is read without its sha256 check: an altered but valid tokenizer is used",
           [f"{EDGES}::test_a_valid_but_altered_tokenizer_is_refused_for_its_sha256"]),
    # ---- runtime/mha_runtime/decoder/decoder.py
    Mutant("decoder-concat-position-off-by-one", "runtime/mha_runtime/decoder/decoder.py",
           "positions = np.asarray(self.lengths, np.int64)[:, None]",
           "positions = np.asarray(self.lengths, np.int64)[:, None] + 1",
           "gpt.onnx steps feed position_ids one past each row's length: every token after the prompt is wrong",
           ["tests/decoder/test_gpt_generate.py::test_greedy_ids_equal_the_books_generate_text_simple"]),
    # ---- runtime/mha_runtime/decoder/tokenizer.py
    Mutant("tokenizer-stream-fffd-emitted", "runtime/mha_runtime/decoder/tokenizer.py",
           r'if text.endswith("\ufffd"):', r'if text == "\ufffd":',
           "the streamed text emits a piece ending in U+FFFD when a later character is split across tokens",
           [STREAM]),
    # ---- runtime/mha_runtime/decoder/golden.py
    Mutant("golden-logits-big-endian", "runtime/mha_runtime/decoder/golden.py",
           'return np.frombuffer(data, dtype="<f4").astype(np.float32)',
           'return np.frombuffer(data, dtype=">f4").astype(np.float32)',
           "golden first-step logits are read big-endian: mha check fails every case of a sound folder",
           [GOLDEN_CHECK]),
    # ---- runtime/mha_runtime/decoder/golden_check.py
    Mutant("golden-check-self-compare", "runtime/mha_runtime/decoder/golden_check.py",
           "result = compare(logits, expected, tolerance)",
           "result = compare(logits, logits, tolerance)",
           "mha check compares the logits with themselves: wrong first-step logits pass the golden check",
           [f"{EDGES}::test_mha_check_fails_when_a_golden_logits_file_differs_from_the_model"]),
    # ---- runtime/mha_runtime/decoder/quality.py
    Mutant("quality-kl-reversed", "runtime/mha_runtime/decoder/quality.py",
           "return np.sum(np.exp(lp) * (lp - lq), axis=-1)",
           "return np.sum(np.exp(lq) * (lq - lp), axis=-1)",
           "the lossy forms are judged by KL(Q||P) instead of llama.cpp's KL(P_fp32||Q)",
           ["tests/decoder/test_gpt_quality.py::test_kl_divergence_equals_scipy"]),
    Mutant("quality-first-position-skipped", "runtime/mha_runtime/decoder/quality.py",
           "for t in range(half, width):", "for t in range(half + 1, width):",
           "the quality measure skips a window's first scored token and feeds the rest one position early",
           ["tests/decoder/test_gpt_quality.py::test_recorded_quality_equals_scipy_on_transformers_logits"]),
    # ---- runtime/mha_runtime/decoder/manifest.py
    Mutant("manifest-generations-dropped", "runtime/mha_runtime/decoder/manifest.py",
           'generations=lambda g: plain_name(g, f"{where}: generations")', "generations=lambda g: None",
           "a lossy form's own golden generations are not found: int8/int4 are checked against fp32's ids",
           [GOLDEN_CHECK]),
    # ---- export/mha_export/decoder/archs/gpt2/config.py
    Mutant("config-context-length-1", "export/mha_export/decoder/archs/gpt2/config.py",
           "if self.context_length < 2:", "if self.context_length < 1:",
           "a GPT config with context_length 1 (no room for one new token) is accepted by mha export --gpt",
           ["tests/commands/test_export_refusals.py"]),
    # ---- runtime/mha_runtime/decoder/forms.py (the decoder's form rows: bars, refusals)
    Mutant("contract-int8-bar-10x", "runtime/mha_runtime/decoder/forms.py",
           "INT8_BAR, INT4_BAR = 3e-4, 3e-2", "INT8_BAR, INT4_BAR = 3e-3, 3e-2",
           "the int8 form's quality bar is 10x looser than llama.cpp's Q8_0 figure: a poor int8 form ships",
           [NAMED_LOSSY]),
    Mutant("export-gqa-head-size-check", "runtime/mha_runtime/decoder/forms.py",
           "if cfg.head_dim % 8:", "if cfg.head_dim % 4:",
           "a head size GroupQueryAttention cannot take (12) is not left out of the in-place and lossy forms",
           ["tests/decoder/test_gpt_cli_refusals.py::test_a_head_size_gqa_cannot_take_limits_only_the_in_place_forms"]),
    # ---- runtime/mha_runtime/serve/decoder/engine.py (the batch engine)
    Mutant("engine-cancel-uncounted", "runtime/mha_runtime/serve/decoder/engine.py",
           "self.slots[slot] = None\n                    self.cancelled += 1\n",
           "self.slots[slot] = None\n",
           "a client that leaves mid-generation frees its slot but /v1/health never counts it as cancelled",
           ["tests/serving/test_gpt_serve.py::test_generations_joining_and_leaving_a_running_batch_equal_their_solo_runs"]),
    Mutant("engine-age-limit-inverted", "runtime/mha_runtime/serve/decoder/engine.py",
           "if time.perf_counter() - oldest.arrived >= AGE_LIMIT_S:",
           "if time.perf_counter() - oldest.arrived < AGE_LIMIT_S:",
           "the prefill lanes take the oldest prompt first and the shortest only after the age limit",
           ["tests/serving/test_gpt_serve.py::"
            "test_the_shortest_waiting_prompt_is_prefilled_first_and_the_oldest_after_its_age_limit"]),
    # ---- export/mha_export/decoder/archs/gpt2/__init__.py (GPT-2's protocol members: its weights, HF_DECIDED)
    Mutant("weights-qkv-split-order", "export/mha_export/decoder/archs/gpt2/__init__.py",
           "zip(QKV, split_qkv(fused, bias), strict=True)",
           'zip(("W_key", "W_query", "W_value"), split_qkv(fused, bias), strict=True)',
           "GPT-2's fused c_attn is split as k|q|v: a Hugging Face checkpoint exports to a different model",
           ["tests/decoder/test_gpt_export.py::test_hf_gpt2_every_form_equals_transformers"]),
    Mutant("weights-lm-head-vs-wte", "export/mha_export/decoder/archs/gpt2/__init__.py",
           'not torch.equal(source.get("lm_head.weight"), state["tok_emb.weight"])',
           'not torch.equal(source.get(f"{prefix}wte.weight"), state["tok_emb.weight"])',
           "a Hugging Face lm_head that differs from wte is accepted and silently exported tied (wrong head)",
           [f"{EDGES}::test_a_hugging_face_head_not_tied_to_wte_is_refused"]),
    # decoder/command.py's check_beside compares the fields the architecture's HF_DECIDED names
    Mutant("command-n-heads-unchecked", "export/mha_export/decoder/archs/gpt2/__init__.py",
           '"emb_dim": "n_embd", "n_heads": "n_head",', '"emb_dim": "n_embd",',
           "--config with another n_heads than the config.json beside --weights exports a silently wrong model",
           ["tests/decoder/test_gpt_cli_refusals.py::test_a_config_that_disagrees_with_the_checkpoints_own_is_refused"]),
    # ---- export/mha_export/decoder/checkpoint.py
    Mutant("command-config-json-not-found", "export/mha_export/decoder/checkpoint.py",
           "if weights is None or not (Path(weights).parent / HF_CONFIG).is_file():",
           "if weights is None or not (Path(weights) / HF_CONFIG).is_file():",
           "the config.json beside a Hugging Face checkpoint is never found: --weights alone is refused",
           ["tests/decoder/test_gpt_cli.py::test_export_hf_checkpoint_finds_config_json_beside_it"]),
    # ---- export/mha_export/decoder/steps/files.py (the decoder's builder table)
    Mutant("export-lossy-miss-swapped", "export/mha_export/decoder/steps/files.py",
           "return _missed(built, [outcome.miss_line()], lenient=loaded.plan.forms.lenient)",
           "return _missed(built, [outcome.miss_line()], lenient=not loaded.plan.forms.lenient)",
           "a lossy form named in --variants that misses its bar becomes a note (exit 0), a default one fails",
           [NAMED_LOSSY]),
    # ---- export/mha_export/decoder/lossy/quantize.py
    Mutant("quantize-second-pass-inverted", "export/mha_export/decoder/lossy/quantize.py",
           "for w, p in plan.kept.items() if p == \"int8\"}):",
           "for w, p in plan.kept.items() if p == \"none\"}):",
           "a 4-bit plan's kept matrices are left fp32 instead of 8 bits (the second pass excludes them)",
           ["tests/decoder/test_gpt_build.py::test_a_plan_keeps_its_matrices_at_the_higher_precision"]),
    # ---- export/mha_export/decoder/lossy/build.py
    Mutant("lossy-window-past-context", "export/mha_export/decoder/lossy/build.py",
           "width = max(2, min(WIDTH, cfg.context_length))",
           "width = max(2, min(WIDTH, cfg.context_length + 1))",
           "quality windows one token longer than context_length: mha check refuses the folder's own windows",
           [GOLDEN_CHECK]),
    # ---- export/mha_export/decoder/tokenizer.py
    Mutant("tokenizer-smaller-vocab-accepted", "export/mha_export/decoder/tokenizer.py",
           "if size != vocab_size:", "if size > vocab_size:",
           "--tokenizer with a smaller vocabulary than the model's is accepted (ids past it decode to nothing)",
           ["tests/decoder/test_gpt_tokenizer.py::test_a_tokenizer_of_another_vocabulary_is_refused"]),
    # ---- runtime/native/common/gpt/ (the JS runner of Node and wasm)
    Mutant("js-topk-ties-dropped", "runtime/native/common/gpt/sampling.mjs",
           "if (x[i] < kth) x[i] = -Infinity;", "if (x[i] <= kth) x[i] = -Infinity;",
           "the JS sampler drops the k-th logit and its ties: seeded top-k sampling differs from Python's",
           ["tests/native/test_gpt_js.py::test_seeded_sampling_equals_python"]),
    Mutant("js-context-stop-early", "runtime/native/common/gpt/generate.mjs",
           "if (promptTokens + ids.length >= contextLength) return 'context_length';",
           "if (promptTokens + ids.length + 1 >= contextLength) return 'context_length';",
           "Node and wasm stop one token before context_length (Python gives one more)",
           [CONTEXT_STOP]),
    Mutant("js-stream-fffd-emitted", "runtime/native/common/gpt/tokenizer.mjs",
           r"if (text.endsWith('\ufffd')) return '';", r"if (text === '\ufffd') return '';",
           "the JS TextStream shows half a character (U+FFFD) when a later character is split across tokens",
           [STREAM]),
    # ---- runtime/native/c/gpt_sample.c, gpt_session.c (the C runner)
    Mutant("c-topk-ties-dropped", "runtime/native/c/gpt_sample.c",
           "x[i] = logits[i] < kth ? -INFINITY : logits[i] / t;",
           "x[i] = logits[i] <= kth ? -INFINITY : logits[i] / t;",
           "the C sampler drops the k-th logit: mha_check generate --top-k samples other ids than Python",
           ["tests/native/test_gpt_native.py::test_generate_equals_python"]),
    Mutant("c-step-position", "runtime/native/c/gpt_session.c",
           "if (run_forward(r, &token, 1, T + out->count - 1, why, n)) return 1;",
           "if (run_forward(r, &token, 1, T + out->count, why, n)) return 1;",
           "the C runner writes each new token one cache row too far: its generations leave the golden ids",
           ["tests/native/test_gpt_native.py::test_check_passes_every_golden_generation"]),
    # ---- runtime/mha_runtime/executorch/decoder.py
    Mutant("executorch-full-context-refused", "runtime/mha_runtime/executorch/decoder.py",
           'if len(prompt) + max_new_tokens > bounds["context_length"]:',
           'if len(prompt) + max_new_tokens >= bounds["context_length"]:',
           "gpt.pte refuses a prompt + max_new_tokens that exactly fills context_length (the ONNX forms run it)",
           ["tests/decoder/test_gpt_pte.py::test_greedy_ids_equal_the_books_generate_text_simple[1]"]),
    # ---- export/mha_export/decoder/archs/gpt2/model.py (the book's GPTModel)
    Mutant("eager-key-built-before-query", "export/mha_export/decoder/archs/gpt2/model.py",
           "        self.W_query = nn.Linear(e, e, bias=cfg.qkv_bias)\n"
           "        self.W_key = nn.Linear(e, e, bias=cfg.qkv_bias)\n",
           "        self.W_key = nn.Linear(e, e, bias=cfg.qkv_bias)\n"
           "        self.W_query = nn.Linear(e, e, bias=cfg.qkv_bias)\n",
           "W_key is built before W_query: an export without --weights is not the book's GPTModel under seed 123",
           ["tests/decoder/test_gpt_export.py::test_seeded_export_is_the_books_model_under_seed_123"]),
    # ---- export/mha_export/decoder/genai.py
    Mutant("genai-past-key-value-swapped", "export/mha_export/decoder/genai.py",
           '"past_key_names": "past_key_values.%d.key",\n'
           '                          "past_value_names": "past_key_values.%d.value"}',
           '"past_key_names": "past_key_values.%d.value",\n'
           '                          "past_value_names": "past_key_values.%d.key"}',
           "genai_config.json feeds GenAI's key cache as gpt.onnx's past values: GenAI generates other ids",
           ["tests/decoder/test_gpt_tokenizer.py::test_onnxruntime_genai_runs_the_folder_with_the_same_greedy_ids"]),
    # ---- export/mha_export/decoder/golden.py
    Mutant("golden-last-step-logits", "export/mha_export/decoder/golden.py",
           "first = logits[0] if first is None else first", "first = logits[0]",
           "golden/*.logits.bin hold the last step's logits, not the first: mha check fails a sound folder",
           [GOLDEN_CHECK]),
    # ---- export/mha_export/decoder/validate.py
    Mutant("validate-step-reference-shifted", "export/mha_export/decoder/validate.py",
           "check(got, case.expected[:, t - split + 1], ", "check(got, case.expected[:, t - split], ",
           "each single step is compared with the previous position's eager logits: every sound export is refused",
           ["tests/decoder/test_gpt_export.py::test_manifest_records_every_form_and_file"]),
    # ---- export/mha_export/decoder/graphs/concat.py
    Mutant("concat-mask-hides-own-token", "export/mha_export/decoder/graphs/concat.py",
           'causal = g.one("LessOrEqual", ', 'causal = g.one("Less", ',
           "gpt.onnx's causal mask is s < P + t: a token cannot attend to itself (the first to nothing)",
           ["tests/decoder/test_gpt_export.py::test_book_gpt_every_form_equals_the_books_model[gpt.onnx]"]),
    # ---- export/mha_export/decoder/graphs/inplace.py
    Mutant("inplace-last-token-gathered-early", "export/mha_export/decoder/graphs/inplace.py",
           "if i == cfg.n_layers - 1:", "if i == 0:",
           "gpt.inplace.onnx keeps only the last token after the first block: later blocks lose the prompt's keys",
           ["tests/decoder/test_gpt_export.py::test_book_gpt_every_form_equals_the_books_model[gpt.inplace.onnx]"]),
    # ---- export/mha_export/decoder/archs/gpt2/graph.py (GPT-2's ONNX pieces, both graph builders')
    Mutant("shared-out-proj-untransposed", "export/mha_export/decoder/archs/gpt2/graph.py",
           'out = Linear(g.init(f"h{i}.out.weight", w[f"{p}att.out_proj.weight"].T),',
           'out = Linear(g.init(f"h{i}.out.weight", w[f"{p}att.out_proj.weight"]),',
           "the attention's out projection is stored untransposed (square, so it loads): every form computes wrong",
           ["tests/decoder/test_gpt_export.py::test_book_gpt_every_form_equals_the_books_model[gpt.onnx]"]),
    # ---- runtime/mha_runtime/artifact/forms.py (the forms' selection both kinds share; a form built from one a
    # config refuses shares its refusal: int8 and int4 need inplace, whose row refuses the head size)
    Mutant("plan-lossy-forms-kept", "runtime/mha_runtime/artifact/forms.py",
           "    return next((why for need in row.needs if (why := refusal(table, table[need], config, also))), None)\n",
           "    return None\n",
           "a head size GQA cannot take leaves out gpt.inplace.onnx but keeps int8/int4: the default export fails",
           ["tests/decoder/test_gpt_cli_refusals.py::test_a_head_size_gqa_cannot_take_limits_only_the_in_place_forms"]),
    # ---- runtime/mha_runtime/serve/decoder/wire.py (and the ids it takes, checked in decoder/contract.py)
    Mutant("wire-bool-token-id", "runtime/mha_runtime/decoder/contract.py",
           "bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int)]",
           "bad = [t for t in ids if not isinstance(t, int)]",
           "POST /v1/generate takes true/false in prompt_ids as token ids 1/0 instead of a 400",
           ["tests/serving/test_gpt_serve.py::test_bad_generate_requests_are_one_line_each"]),
    Mutant("wire-full-context-refused", "runtime/mha_runtime/serve/decoder/wire.py",
           "if len(ids) + max_new > context:", "if len(ids) + max_new >= context:",
           "POST /v1/generate refuses a prompt + max_new_tokens that exactly fills context_length (a 400 it documents "
           "as fitting)",
           ["tests/decoder/test_gpt_seeded.py::test_a_request_that_exactly_fills_context_length_is_taken"]),
    # ---- runtime/mha_runtime/serve/decoder/job.py
    Mutant("job-drawn-seed-not-reported", "runtime/mha_runtime/serve/decoder/job.py",
           "SEED: self.sampler.seed})", "SEED: self.request.seed})",
           "an unseeded sampled answer reports seed null, not the seed it drew: the client cannot reproduce it",
           ["tests/decoder/test_gpt_seeded.py::test_a_served_answer_reports_the_seed_that_reproduces_it_and_its_counts"]),
    # ---- runtime/mha_runtime/serve/decoder/answers.py
    Mutant("answers-stream-ids-only-counted", "runtime/mha_runtime/serve/decoder/answers.py",
           "if streamed != done[IDS]:", "if len(streamed) != len(done[IDS]):",
           "mha loadtest --generate passes a stream whose token events' ids differ from its done event's ids",
           ["tests/decoder/test_gpt_seeded.py::test_loadtest_judge_flags_each_tampered_answer"]),
    # ---- runtime/mha_runtime/gguf/llama_cpp.py (GGUF files run by llama.cpp)
    Mutant("gguf-judge-first-id-only", "runtime/mha_runtime/gguf/llama_cpp.py",
           "    if ids != case.ids:\n", "    if ids[:1] != case.ids[:1]:\n",
           "a GGUF whose greedy ids leave the golden ones after the first token passes mha check and the export",
           [GGUF_JUDGE]),
    Mutant("gguf-judge-encoding-unchecked", "runtime/mha_runtime/gguf/llama_cpp.py",
           "got.encoded[case.name] != case.prompt_ids", "got.encoded[case.name] != got.encoded[case.name]",
           "a GGUF whose tokenizer encodes the text prompts otherwise (another vocabulary) passes",
           [GGUF_JUDGE]),
    Mutant("gguf-copy-digest-unchecked", "runtime/mha_runtime/gguf/llama_cpp.py",
           "            verify_listed(folder, name, manifest, lambda chunk: _write(sink, chunk, copy))",
           "            sink.write((Path(folder) / name).read_bytes())",
           "llama.cpp is handed a copy whose bytes were never compared with the manifest (a file swapped after "
           "verify_all runs unverified)",
           ["tests/decoder/test_gpt_gguf.py::test_a_tampered_gguf_is_refused_before_llama_cpp_sees_it"]),
    # ---- export/mha_export/gguf/write.py
    Mutant("gguf-q4-head-not-kept", "export/mha_export/gguf/write.py",
           "return KEPT.get(dtype, TYPES[dtype]) if name == head else TYPES[dtype]", "return TYPES[dtype]",
           "gpt.q4_0.gguf writes its head at Q4_0 (llama-quantize keeps it higher): a worse file than llama.cpp's own",
           ["tests/decoder/test_gpt_gguf.py::test_quantized_bytes_equal_ggmls"]),
    # ---- export/mha_export/onnx_file/save.py
    Mutant("save-raw-data-length-in-elements", "export/mha_export/onnx_file/save.py",
           "+ _key(TENSOR_RAW_DATA) + _varint(array.nbytes)", "+ _key(TENSOR_RAW_DATA) + _varint(array.size)",
           "the streamed writer gives raw_data its element count as length: every exported .onnx is corrupt",
           ["tests/decoder/test_gpt_build.py::test_streamed_files_equal_onnx_save"]),
    # ---- issue 56: the lossy forms (export/mha_export/decoder/lossy/, their methods' rows in lossy/methods.py, and
    # decoder/plan.py's leniency), the check (runtime/mha_runtime/decoder/quality.py, record_check.py, graph_plan.py,
    # golden_check.py, cli/decoder_inspect.py, gguf/check.py) and the drop-in files (export/mha_export/decoder/
    # hf_files.py, archs/gpt2/__init__.py's hf_config, checkpoint.py, the eos ids of every runtime).
    # `python3 tools/seed_bugs.py --only 'i56-*'`.
    Mutant("i56-embedding-tied-zero-points-dropped", "export/mha_export/decoder/lossy/embedding.py",
           "symmetric = len(head_node.input) < 4", "symmetric = True",
           "a tied asymmetric head's gather reads its rows without the head's zero points: every embedding is off",
           [f"{EMB}::test_a_tied_embedding_is_the_heads_own_weights"]),
    Mutant("i56-embedding-untied-quantize-axis", "export/mha_export/decoder/lossy/embedding.py",
           "gather_axis=0, quantize_axis=1)", "gather_axis=0, quantize_axis=0)",
           "the gather dequantizes along the vocabulary instead of along E: wrong rows, or a graph ORT refuses",
           [f"{EMB}::test_an_untied_embedding_is_onnxruntimes_quantization_of_it"]),
    Mutant("i56-embedding-untied-not-transposed", "export/mha_export/decoder/lossy/embedding.py",
           "quantizer.qbits_block_quant(np.ascontiguousarray(table.T))",
           "quantizer.qbits_block_quant(np.ascontiguousarray(table))",
           "the untied embedding is quantized in blocks along the vocabulary (the quantizer's K axis) and stored so",
           [f"{EMB}::test_an_untied_embedding_is_onnxruntimes_quantization_of_it"]),
    Mutant("i56-embedding-left-fp32", "export/mha_export/decoder/lossy/quantize.py",
           "    stored = quantize_embedding(model, head=HEAD, tied=tied, precision=precision)\n",
           "    stored = dict(plan.embedding)\n",
           "the token embedding stays fp32 (the int8 file larger than fp32 again) while the plan says it is quantized",
           [f"{EMB}::test_lossy_files_are_small_beside_fp32"]),
    # the matmulnbits-4 row: the head kept at its 8 bits (higher) instead of in finer 4-bit blocks; the fast plan is
    # then the one this mutant seeded in the former FAST table (head int8 in blocks of 256), and the fine plans keep it
    Mutant("i56-fast4-head-at-8-bits", "export/mha_export/decoder/lossy/methods.py",
           'finer=("head",), ranks_embedding=True, offsets=True)',
           'stays_higher=("head",), ranks_embedding=True, offsets=True)',
           "the 4-bit fast plan keeps the head (and a tied embedding) at 8 bits: gpt-mini's int4 file is 0.204x fp32",
           [f"{EMB}::test_lossy_files_are_small_beside_fp32"]),
    Mutant("i56-fit-embedding-block-to-vocab", "export/mha_export/decoder/lossy/quantize.py",
           "else t.dims[1] if t.name == TOKENS and not tied else 0",
           "else t.dims[0] if t.name == TOKENS and not tied else 0",
           "the untied embedding's block is fitted to the vocabulary instead of its width E",
           ["tests/decoder/test_gpt_build.py::test_a_block_longer_than_a_matrix_is_fitted_to_it",
            f"{EMB}::test_an_untied_embedding_is_onnxruntimes_quantization_of_it"]),
    Mutant("i56-embedding-padded-width", "export/mha_export/decoder/lossy/embedding.py",
           "    return width % block == 0\n", "    return True\n",
           "an embedding whose width no block divides is gathered from padded rows: ORT refuses the lossy file",
           [f"{EMB}::test_a_width_no_block_divides_keeps_the_embedding_fp32"]),
    Mutant("i56-ranking-ascending", "export/mha_export/decoder/lossy/build.py",
           "return sorted(errors, key=lambda n: -errors[n])", "return sorted(errors, key=lambda n: errors[n])",
           "the search for the bar keeps the matrices rounding moves least: a plan keeps the wrong ones",
           ["tests/decoder/test_gpt_lossy_plans.py::test_the_planted_outlier_matrix_ranks_first_and_is_the_one_kept"]),
    Mutant("i56-ranking-embedding-at-8-bits", "export/mha_export/decoder/lossy/build.py",
           "table = None if tied or not method.ranks_embedding else next(", "table = None if tied else next(",
           "the 8-bit search may keep the embedding at fp32 (the demo's int8 file doubled for it)",
           ["tests/decoder/test_gpt_lossy_plans.py::test_only_the_4_bit_search_may_keep_the_embedding_higher"]),
    Mutant("i56-windows-from-training-text", "export/mha_export/decoder/lossy/build.py",
           "HELD_OUT_FROM = 200_000", "HELD_OUT_FROM = 0",
           "the quality windows are text the demo trained on: a trained model's lossy forms are judged on seen text",
           ["tests/decoder/test_gpt_lossy_plans.py::test_the_quality_windows_are_text_the_demo_never_trained_on"]),
    Mutant("i56-lenient-only-plain-all", "export/mha_export/decoder/plan.py",
           "return GPTPlan(files, PTE_VARIANT in built, ALL in variants, notes, GGUF_VARIANT in built)",
           "return GPTPlan(files, PTE_VARIANT in built, variants == (ALL,), notes, GGUF_VARIANT in built)",
           "`all,pte` (make export) fails the export on a lossy form that misses its bar, where `all` leaves it out",
           ["tests/decoder/test_gpt_lossy_plans.py::test_every_set_with_all_leaves_a_missing_lossy_form_out"]),
    Mutant("i56-quality-infinity-accepted", "runtime/mha_runtime/decoder/quality.py",
           "if not (math.isfinite(value) and value >= 0):", "if not value >= 0:",
           "a recorded mean_kl of Infinity passes mha check (abs(got - inf) <= 0.1 * inf)",
           ["tests/decoder/test_gpt_check_honest.py::test_an_impossible_or_foreign_quality_figure_fails_check"]),
    Mutant("i56-quality-same-top-one-way", "runtime/mha_runtime/decoder/quality.py",
           "if not abs(self.same_top - recorded.same_top) <= TOP_AGREEMENT:",
           "if not recorded.same_top - self.same_top <= TOP_AGREEMENT:",
           "a same-top share edited upward passes mha check (only a downward edit fails)",
           ["tests/decoder/test_gpt_check_honest.py::test_a_recorded_figure_the_form_does_not_reproduce_fails_check"]),
    Mutant("i56-quality-p99-max-not-compared", "runtime/mha_runtime/decoder/quality.py",
           "        for name in _KL_FIGURES:\n            got, was = getattr(self, name), getattr(recorded, name)",
           "        for name in _KL_FIGURES[:1]:\n            got, was = getattr(self, name), getattr(recorded, name)",
           "p99_kl and max_kl are shown but never compared: an edited p99 or max passes mha check",
           ["tests/decoder/test_gpt_check_honest.py::test_a_recorded_figure_the_form_does_not_reproduce_fails_check"]),
    # The windows' count is checked before measuring (Windows.mismatch); a measurement always scores that count, so
    # Quality.disagreements' own position comparison cannot fire after it (mutated, it survived: equivalent).
    Mutant("i56-quality-positions-not-compared", "runtime/mha_runtime/decoder/quality.py",
           "        if recorded.positions != self.positions:\n", "        if False:\n",
           "a recorded position count unlike the quality windows' passes mha check",
           ["tests/decoder/test_gpt_check_honest.py::test_an_impossible_or_foreign_quality_figure_fails_check"]),
    Mutant("i56-record-bar-unchecked", "runtime/mha_runtime/decoder/record_check.py",
           "if folder_bar(form, bar) is None:", "if False:",
           "a manifest recording a bar above the contract's ceiling (or none) passes mha check",
           ["tests/decoder/test_gpt_check_honest.py::test_an_impossible_or_foreign_quality_figure_fails_check"]),
    Mutant("i56-judge-bar-unchecked", "runtime/mha_runtime/decoder/golden_check.py",
           "if bar is None or got.mean_kl > bar:", "if bar is not None and got.mean_kl > bar:",
           "the quality judge passes a recorded bar the contract refuses (the record check alone would say so)",
           ["tests/decoder/test_gpt_check_honest.py::test_an_impossible_or_foreign_quality_figure_fails_check"]),
    Mutant("i56-record-dtype-unchecked", "runtime/mha_runtime/decoder/record_check.py",
           '("dtype", form.dtype, entry.dtype)', '("dtype", form.dtype, form.dtype)',
           "an int4 entry edited to say fp32 passes mha check",
           ["tests/decoder/test_gpt_check_honest.py::test_an_entry_unlike_the_contract_or_the_graph_fails_check"]),
    Mutant("i56-record-plan-unread", "runtime/mha_runtime/decoder/record_check.py",
           "out += plan_problems(plan, read_graph_plan(folder / form.file))", "out += []",
           "a recorded quantization plan unlike the graph's (bits 2, everything kept) passes mha check",
           ["tests/decoder/test_gpt_check_honest.py::test_an_entry_unlike_the_contract_or_the_graph_fails_check"]),
    Mutant("i56-graph-plan-symmetry-inverted", "runtime/mha_runtime/decoder/graph_plan.py",
           "symmetric = (len(inputs) < 4 or not inputs[3]) and not offsets",
           "symmetric = len(inputs) >= 4 and not offsets",
           "the graph reader takes an asymmetric weight (zero points given) for a symmetric one",
           ["tests/decoder/test_gpt_check_honest.py::test_graph_plan_reads_matmulnbits_and_a_quantized_gather"]),
    Mutant("i56-golden-tolerance-from-file", "runtime/mha_runtime/decoder/golden_check.py",
           "results += [check_case(gen, case, expected[case.name], row) for case in golden.cases]",
           "results += [check_case(gen, case, expected[case.name], golden.tolerance) for case in golden.cases]",
           "cases are compared at the golden file's own (re-sealable) tolerance: atol Infinity passes zeroed logits",
           ["tests/decoder/test_gpt_check_honest.py::test_a_golden_tolerance_edited_and_resealed_fails_check"]),
    Mutant("i56-inspect-bar-from-manifest", "runtime/mha_runtime/cli/decoder_inspect.py",
           'bar = "?" if bar_value is None else f"{bar_value:g}"',
           'bar = str((a.quality or {}).get("bar_mean_kl"))',
           "mha inspect shows the manifest's bar even past the ceiling, not the one mha check compares with",
           ["tests/decoder/test_gpt_check_honest.py::test_an_impossible_or_foreign_quality_figure_fails_check"]),
    Mutant("i56-gguf-quality-not-measured", "runtime/mha_runtime/gguf/check.py",
           "        results.append(judge(measured))\n", "",
           "mha check runs a GGUF quant type's generations but never its quality: an edited figure is shown unchecked",
           ["tests/decoder/test_gpt_gguf.py::test_check_measures_each_quant_types_quality_again"]),
    Mutant("i56-hf-config-transformersjs-dtype-dropped", "export/mha_export/decoder/archs/gpt2/__init__.py",
           '        "transformers.js_config": {"dtype": "fp32"},\n', "",
           "a browser's transformers.js asks for onnx/model_quantized.onnx (its wasm default) and loads nothing",
           ["tests/decoder/test_gpt_dropin_browser.py::test_browser_fetches_onnx_model_onnx_and_nothing_else_of_the_folder"]),
    Mutant("i56-checkpoint-eos-config-first", "export/mha_export/decoder/checkpoint.py",
           "from_gen = generation is not None and \"eos_token_id\" in generation", "from_gen = False",
           "the eos ids come from config.json even where generation_config.json (which transformers reads) differs",
           ["tests/decoder/test_gpt_checkpoint.py::test_the_checkpoints_eos_and_generation_defaults_reach_the_folder_and_"
            "every_runtime"]),
    Mutant("i56-checkpoint-dropouts-invented", "export/mha_export/decoder/hf_files.py",
           "return {k: v for k, v in fields.items() if k not in arch.HF_CARRIED} | origin.carried",
           "return fields",
           "the exported config.json says dropout 0.0 and eos 50256 where the checkpoint said otherwise",
           ["tests/decoder/test_gpt_checkpoint.py::test_the_checkpoints_eos_and_generation_defaults_reach_the_folder_and_"
            "every_runtime"]),
    Mutant("i56-stop-first-eos-only", "runtime/mha_runtime/decoder/manifest.py",
           "            return tuple(self.eos_ids)\n", "            return tuple(self.eos_ids[:1])\n",
           "mha generate stops at the first eos id only: a checkpoint's second eos (<|im_end|>) runs on",
           ["tests/decoder/test_gpt_checkpoint.py::test_the_checkpoints_eos_and_generation_defaults_reach_the_folder_and_"
            "every_runtime"]),
    Mutant("i56-js-stop-first-eos-only", "runtime/native/common/gpt/folder.mjs",
           "const stopIds = listed ?? (eos === null ? [] : [eos]);",
           "const stopIds = listed ? listed.slice(0, 1) : (eos === null ? [] : [eos]);",
           "Node, wasm and the page stop at the first eos id only",
           ["tests/native/test_gpt_js.py::test_generate_stops_at_any_of_the_folders_eos_ids"]),
]


@dataclass
class Result:
    """What one mutant came to."""

    name: str
    file: str
    status: str  # caught | survived | error | stale
    seconds: float
    why: str
    tests: list[str]
    returncode: int | None = None  # pytest's; None for a timeout, a failed build or a stale mutant
    note: str = ""

    def line(self) -> str:
        note = f" [{self.note}]" if self.note else ""
        return f"{self.status:<8} {self.seconds:7.1f}s  {self.name:<36} {self.why}{note}"


class Interrupted(Exception):
    """SIGTERM/SIGHUP, turned into an exception so the `finally` that restores the file runs."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """End the process group this harness started for `proc` (its own session): TERM, then KILL."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_command(command: Sequence[str], timeout_s: float, env: dict[str, str] | None = None
                ) -> tuple[int | None, str]:
    """(exit code, or None on timeout; stdout and stderr together). The child gets its own session so that a
    timeout or Ctrl-C ends it and everything it started (node, mha_check, mha subprocesses)."""
    proc = subprocess.Popen(list(command), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        return None, out
    except BaseException:
        _kill_group(proc)
        proc.communicate()
        raise


def build_native(python: Path) -> tuple[bool, str]:
    """runtime/native/c/build.sh with the given Python (the ONNX Runtime library comes from its wheel)."""
    env = os.environ | {"PYTHON": str(python)}
    code, out = run_command(["bash", str(REPO / C_BUILD)], BUILD_TIMEOUT_S, env)
    return code == 0, out


def _tail(text: str, lines: int = 1) -> str:
    kept = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(kept[-lines:])[:200]


def dirty_files(files: Sequence[str]) -> list[str]:
    """`git status --porcelain` lines of those files (modified, staged, deleted, untracked)."""
    out = subprocess.run(["git", "status", "--porcelain", "--", *files], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def missing_tests(mutant: Mutant) -> list[str]:
    """Selections whose file or test function does not exist (a cheap check that reads text, no pytest)."""
    bad = []
    for test in mutant.tests:
        file, _, node = test.partition("::")
        path = REPO / file
        function = re.sub(r"\[.*\]$", "", node.split("::")[-1]) if node else ""
        if not path.is_file() or (function and not re.search(rf"^\s*def {re.escape(function)}\(", path.read_text(),
                                                              re.MULTILINE)):
            bad.append(test)
    return bad


def run_mutant(mutant: Mutant, *, python: Path, timeout_s: float, logs: Path | None) -> Result:
    """Seed the bug, run its tests, restore the file (always), classify."""
    start = time.perf_counter()
    result = Result(mutant.name, mutant.file, "stale", 0.0, mutant.why, list(mutant.tests))
    found = mutant.count()
    if found != 1:
        result.note = "no such file" if found < 0 else f"'old' found {found} times, expected once"
        return result
    path = REPO / mutant.file
    original = path.read_bytes()
    stat = path.stat()
    output = ""
    try:
        path.write_bytes(original.replace(mutant.old.encode(), mutant.new.encode(), 1))
        built = True
        if mutant.native:
            built, output = build_native(python)
        if not built:
            result.status, result.note = "error", f"build failed: {_tail(output)}"
        else:
            env = os.environ | {"PYTHONDONTWRITEBYTECODE": "1"}  # no .pyc of the mutant is left behind
            code, output = run_command([str(python), "-m", "pytest", *PYTEST_FLAGS, *mutant.tests], timeout_s, env)
            result.returncode = code
            if code is None:
                result.status, result.note = "error", f"timeout after {timeout_s:g} s"
            else:
                result.status = {1: "caught", 0: "survived"}.get(code, "error")
                if result.status == "error":
                    result.note = f"pytest exit {code}: {_tail(output)}"
    finally:
        path.write_bytes(original)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the original's .pyc stays valid
        if path.read_bytes() != original:
            raise RuntimeError(f"{mutant.file}: could not restore the original bytes")
        if logs is not None:
            logs.mkdir(parents=True, exist_ok=True)
            (logs / f"{mutant.name}.log").write_text(output)
    if mutant.native:  # the binaries back to the clean source before anything else runs
        built, out = build_native(python)
        if not built:
            raise RuntimeError(f"rebuilding the C runners after {mutant.name} failed: {_tail(out, 3)}")
    result.seconds = time.perf_counter() - start
    return result


def list_table(mutants: Sequence[Mutant]) -> int:
    """Print the table; 1 when some `old` is not found exactly once or a test selection does not exist."""
    bad = 0
    for m in mutants:
        found = m.count()
        missing = missing_tests(m)
        state = "ok" if found == 1 else ("no-file" if found < 0 else f"stale:{found}")
        if found != 1 or missing:
            bad += 1
        print(f"{state:<8} {m.name:<36} {m.file}")
        print(f"{'':<8} why:   {m.why}")
        print(f"{'':<8} tests: {', '.join(m.tests)}" + (f"  (missing: {', '.join(missing)})" if missing else ""))
    found_once = sum(m.count() == 1 for m in mutants)
    print(f"{len(mutants)} mutants: {found_once} found exactly once, {len(mutants) - found_once} stale")
    return 1 if bad else 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="print the table and whether each 'old' is found once")
    parser.add_argument("--only", metavar="NAME,...",
                        help="run only these mutants (comma-separated names; 'PREFIX*' names every mutant it begins)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help=f"per-mutant pytest timeout in seconds (default {DEFAULT_TIMEOUT_S})")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON here")
    parser.add_argument("--logs", type=Path, metavar="DIR", help="write each mutant's pytest output to DIR/NAME.log")
    parser.add_argument("--python", type=Path, default=VENV_PYTHON, metavar="PATH",
                        help=f"the interpreter that runs pytest and build.sh (default {VENV_PYTHON})")
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout: expected a number of seconds > 0")
    return args


def choose(only: str | None) -> list[Mutant]:
    """All mutants, or those named (in the table's order); an unknown name is an error."""
    if only is None:
        return list(MUTANTS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = {m.name for m in MUTANTS}

    def matches(pattern: str, name: str) -> bool:  # a trailing '*' names every mutant with that prefix
        return name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern

    unknown = [n for n in names if not any(matches(n, k) for k in known)]
    if unknown or not names:
        raise SystemExit(f"error: --only: unknown mutant {', '.join(unknown) or '(none given)'}; "
                         f"known: {', '.join(sorted(known))}")
    return [m for m in MUTANTS if any(matches(n, m.name) for n in names)]


def summary(results: Sequence[Result]) -> dict[str, float | int]:
    ran = [r for r in results if r.status != "stale"]
    caught = sum(r.status == "caught" for r in ran)
    return {"caught": caught, "run": len(ran), "percent": round(100 * caught / len(ran), 1) if ran else 0.0,
            "survived": sum(r.status == "survived" for r in ran), "error": sum(r.status == "error" for r in ran),
            "stale": len(results) - len(ran)}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    mutants = choose(args.only)
    if args.list:
        return list_table(mutants)
    if not args.python.is_file():
        print(f"error: --python {args.python}: not found (make venv)", file=sys.stderr)
        return 2
    dirty = dirty_files(sorted({m.file for m in mutants}))
    if dirty:
        print("error: refusing to run: files this run would mutate are already modified (a crashed run?):\n  "
              + "\n  ".join(dirty) + "\nrestore them (git checkout -- FILE) or commit first", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    results: list[Result] = []
    current: Mutant | None = None
    try:
        for i, m in enumerate(mutants, 1):
            current = m
            print(f"[{i}/{len(mutants)}] {m.name} ({m.file}): {len(m.tests)} selection(s) ...", file=sys.stderr,
                  flush=True)
            result = run_mutant(m, python=args.python, timeout_s=args.timeout, logs=args.logs)
            results.append(result)
            print(f"  -> {result.line()}", file=sys.stderr, flush=True)
            current = None
    except (KeyboardInterrupt, Interrupted) as exc:
        print(f"interrupted ({type(exc).__name__} {exc}); every mutated file was restored", file=sys.stderr)
        if current is not None and current.native:
            print(f"the C runners may still hold {current.name}: rebuild them with PYTHON={args.python} {C_BUILD}",
                  file=sys.stderr)
    for r in results:
        print(r.line())
    totals = summary(results)
    print(f"{totals['caught']} caught of {totals['run']} run ({totals['percent']:g}%)")
    if args.json is not None:
        doc = {"results": [r.__dict__ for r in results], "summary": totals, "complete": len(results) == len(mutants)}
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if results and len(results) == len(mutants) and totals["caught"] == totals["run"] else 1


if __name__ == "__main__":
    sys.exit(main())
