"""Generation in the torch-free runtime against the book's generate_text_simple / ch05.generate and transformers'
generate: greedy ids, the sampling rule's probabilities, seeds, batches of different lengths, the stops."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mha_runtime.artifact.errors import ContractError
from mha_runtime.decoder.contract import CONCAT_FORM, INPLACE_FORM
from mha_runtime.decoder.generate import Generator
from mha_runtime.decoder.sampling import Sampler, probabilities

PROMPTS = [[464, 3290, 318], [15496, 11, 314, 716, 257, 2746, 286, 262, 1492, 13], [7, 8, 9, 10, 11, 12, 13, 14, 15,
                                                                                     16, 17, 18, 19, 20, 21]]
NEW = 32
FP32 = [CONCAT_FORM, INPLACE_FORM]


def book_greedy(model: torch.nn.Module, prompt: list[int], new: int, context: int) -> list[int]:
    from llms_from_scratch.ch04 import generate_text_simple

    with torch.no_grad():
        out = generate_text_simple(model, torch.tensor([prompt]), max_new_tokens=new, context_size=context)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("form", FP32)
def test_greedy_ids_equal_the_books_generate_text_simple(book_gpt: tuple[torch.nn.Module, Path], form: str) -> None:
    model, folder = book_gpt
    gen = Generator(folder, form=form)
    expected = [book_greedy(model, p, NEW, gen.shapes.context_length) for p in PROMPTS]
    for prompt, ids in zip(PROMPTS, expected, strict=True):
        alone = gen.generate([prompt], max_new_tokens=NEW)
        assert alone.ids == [ids] and alone.stops == ["max_new_tokens"]
    batch = gen.generate(PROMPTS, max_new_tokens=NEW)  # three lengths in one batch
    assert batch.ids == expected


@pytest.mark.parametrize("form", FP32)
def test_greedy_ids_equal_transformers_generate(hf_gpt: tuple[torch.nn.Module, Path], form: str) -> None:
    model, folder = hf_gpt
    gen = Generator(folder, form=form)
    prompts = [p[:n] for p, n in zip(PROMPTS, (2, 5, 8), strict=True)]  # context_length 40: room for 32 new
    expected = []
    for prompt in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=NEW, min_new_tokens=0,
                                 eos_token_id=None, pad_token_id=0, use_cache=True)
        expected.append(out[0, len(prompt):].tolist())
    assert [len(e) for e in expected] == [NEW] * 3
    for prompt, ids in zip(prompts, expected, strict=True):
        assert gen.generate([prompt], max_new_tokens=NEW).ids == [ids]
    assert gen.generate(prompts, max_new_tokens=NEW).ids == expected


class _FixedLogits(torch.nn.Module):
    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits  # (1, V)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.logits[:, None, :].expand(idx.shape[0], idx.shape[1], -1)


# The last two: the ends of the accepted range (sampling.TEMPERATURE_MIN and _MAX).
@pytest.mark.parametrize(("temperature", "top_k"), [(1.0, None), (0.7, 50), (1.5, 3), (0.3, 1000), (1e-4, None),
                                                    (1e4, 5)])
def test_probabilities_equal_the_books_sampling_rule(monkeypatch: pytest.MonkeyPatch, temperature: float,
                                                     top_k: int | None) -> None:
    """ch05.generate's own probabilities, caught where it hands them to torch.multinomial."""
    from llms_from_scratch import ch05

    rng = np.random.default_rng(3)
    logits = torch.tensor(rng.normal(0, 3, (1, 50257)), dtype=torch.float32)
    caught: list[torch.Tensor] = []
    real = torch.multinomial

    def catch(probs: torch.Tensor, num_samples: int) -> torch.Tensor:
        caught.append(probs.clone())
        return real(probs, num_samples)

    monkeypatch.setattr(torch, "multinomial", catch)
    ch05.generate(_FixedLogits(logits), torch.tensor([[1, 2]]), max_new_tokens=1, context_size=8,
                  temperature=temperature, top_k=top_k)
    ours = probabilities(logits.numpy(), temperature, top_k)
    assert len(caught) == 1
    np.testing.assert_allclose(ours, caught[0].numpy(), atol=1e-6, rtol=0)
    if top_k is not None:
        assert int((ours > 0).sum()) == top_k


@pytest.mark.parametrize("temperature", [1e-39, 5e-324, 1e39])
def test_a_temperature_outside_the_range_where_the_books_rule_fails_is_refused(temperature: float) -> None:
    """Past float32's reach the book's rule itself breaks (NaN probabilities, which torch.multinomial refuses): such
    a temperature is refused in one line, not sampled into a silent eos."""
    from llms_from_scratch import ch05

    logits = torch.tensor(np.random.default_rng(4).normal(0, 3, (1, 50257)), dtype=torch.float32)
    with pytest.raises(RuntimeError, match="probability tensor contains either"):
        ch05.generate(_FixedLogits(logits), torch.tensor([[1, 2]]), max_new_tokens=1, context_size=8,
                      temperature=temperature, top_k=5)
    with pytest.raises(ContractError, match=r"^temperature: expected 0 \(greedy\) or a number in 0.0001..10000, got"):
        Sampler(1, temperature=temperature, top_k=5, seed=1, vocab_size=50257)


def test_a_seed_gives_the_same_tokens_and_rows_equal_their_solo_runs(book_gpt: tuple[torch.nn.Module, Path]) -> None:
    gen = Generator(book_gpt[1])
    kwargs = dict(max_new_tokens=12, temperature=1.0, top_k=40, seed=2024)
    first = gen.generate(PROMPTS, **kwargs)  # type: ignore[arg-type]
    assert first.ids == gen.generate(PROMPTS, **kwargs).ids  # type: ignore[arg-type]
    for row, prompt in enumerate(PROMPTS):
        assert gen.generate([prompt], **kwargs).ids == [first.ids[row]]  # type: ignore[arg-type]
    other = gen.generate(PROMPTS, **(kwargs | {"seed": 2025}))  # type: ignore[arg-type]
    assert other.ids != first.ids
    greedy = gen.generate(PROMPTS, max_new_tokens=12)
    assert first.ids != greedy.ids  # the draw did something


def test_generation_stops_at_context_length_and_eos(book_gpt: tuple[torch.nn.Module, Path]) -> None:
    gen = Generator(book_gpt[1])
    c = gen.shapes.context_length
    long = list(range(100, 100 + c - 2))
    result = gen.generate([long, PROMPTS[0]], max_new_tokens=10)
    assert [len(r) for r in result.ids] == [2, 10] and result.stops == ["context_length", "max_new_tokens"]
    first = gen.generate([PROMPTS[1]], max_new_tokens=5).ids[0]
    stopped = gen.generate([PROMPTS[1], PROMPTS[0]], max_new_tokens=5, eos_id=first[2])
    assert stopped.ids[0] == first[:2] and stopped.stops[0] == "eos"
    assert stopped.ids[1] == gen.generate([PROMPTS[0]], max_new_tokens=5, eos_id=first[2]).ids[0]


@pytest.mark.parametrize(("prompts", "message"), [
    ([[1, 2, 50257]], "token id 50257 is outside the vocabulary"),
    ([[1, None]], "expected integer token ids, got None"),  # was a TypeError
    ([[]], "empty prompt"),
    ([list(range(49))], "49 tokens, longer than context_length 48"),
    # 1 <= prompt + new tokens <= context_length (`mha inspect`'s rule): a prompt of context_length ids got one new
    # token, 49 positions in a context of 48; it is refused, as serve and the C runner refuse it
    ([list(range(48))], "48 tokens fill context_length 48, leaving no room for a new token; give at most 47"),
    ([], "at least one prompt"),
])
def test_bad_prompts_are_one_line_each(book_gpt: tuple[torch.nn.Module, Path], prompts: list[list[int]],
                                       message: str) -> None:
    gen = Generator(book_gpt[1])
    with pytest.raises(ContractError, match=message):
        gen.generate(prompts, max_new_tokens=4)
