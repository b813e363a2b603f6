"""The tutorial's model: golden output, names, and the seed initialisation."""
from pathlib import Path

import numpy as np
import torch

from mha_export.attention.weights.load import seeded_model
from mha_runtime.attention.config import preset
from torch_refs import EXPECTED, INPUTS


def test_golden_seed_output() -> None:
    model = seeded_model(preset("seed"))
    with torch.no_grad():
        out = model(torch.stack((INPUTS, INPUTS)))
    assert out.shape == (2, 6, 4)
    # the tutorial prints 4 decimals: equal after rounding to 4 places, for both batch rows
    assert torch.equal(torch.round(out * 1e4) / 1e4, torch.round(torch.stack((EXPECTED, EXPECTED)) * 1e4) / 1e4)


def test_parameter_and_buffer_names_match_the_tutorial() -> None:
    names = set(seeded_model(preset("seed")).state_dict())
    parts = ("W_query.weight", "W_key.weight", "W_value.weight", "mask")
    expected = {f"heads.{h}.{w}" for h in range(2) for w in parts}
    assert names == expected


def test_mask_is_upper_triangular_ones() -> None:
    mask = seeded_model(preset("seed")).heads[1].mask
    assert torch.equal(mask, torch.triu(torch.ones(6, 6), diagonal=1))


def test_causality_future_tokens_do_not_change_the_past() -> None:
    model = seeded_model(preset("seed"))
    x = torch.randn(1, 6, 3)
    y = x.clone()
    y[:, 4:] += 1.0
    with torch.no_grad():
        assert torch.equal(model(x)[:, :4], model(y)[:, :4])
        assert not torch.allclose(model(x)[:, 4:], model(y)[:, 4:])


def test_the_seed_model_is_the_books_own_wrapper() -> None:
    """The book's published code (llms-from-scratch 1.0.19, ch03) under the tutorial's seed builds the same module:
    the same names, the same weights and, on the book's input, the same output to the last bit."""
    from llms_from_scratch.ch03 import MultiHeadAttentionWrapper

    torch.manual_seed(123)
    book = MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2).eval()
    ours = seeded_model(preset("seed"))
    assert book.state_dict().keys() == ours.state_dict().keys()
    assert all(torch.equal(book.state_dict()[k], v) for k, v in ours.state_dict().items())
    batch = torch.stack((INPUTS, INPUTS))
    with torch.no_grad():
        assert torch.equal(book(batch), ours(batch))
        assert torch.equal(torch.round(book(batch)[0] * 1e4) / 1e4, EXPECTED)


def test_the_seed_presets_goldens_are_the_books_wrapper(seed_dir: Path) -> None:
    """Every golden case of the exported seed preset equals the book's wrapper, seeded as the tutorial does."""
    from llms_from_scratch.ch03 import MultiHeadAttentionWrapper

    from mha_runtime.attention.golden import iter_cases, load_cases

    torch.manual_seed(123)
    book = MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2).eval()
    cases = list(iter_cases(seed_dir, load_cases(seed_dir)))
    assert len(cases) >= 3
    for name, x, expected in cases:
        with torch.no_grad():
            got = book(torch.from_numpy(x)).numpy()
        assert np.array_equal(got, expected), name
