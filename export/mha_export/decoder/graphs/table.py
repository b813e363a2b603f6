"""The builder of every exact (fp32) GPT form, keyed by the contract's file names: real references tools can follow.

`mha_runtime.decoder.forms.FORMS` declares each form without torch; this table gives each exact form its graph, and
refuses at import a form left without one (the lossy forms are built from gpt.inplace.onnx by decoder/lossy/).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from mha_export.decoder.graphs.concat import concat_model
from mha_export.decoder.graphs.inplace import inplace_model
from mha_export.decoder.graphs.shared import Built
from mha_runtime.decoder.contract import CONCAT_FORM, INPLACE_FORM
from mha_runtime.decoder.forms import FORMS

# (state, config, *, tied) -> the graph, checked and streamed to its file by the export.
GraphBuilder = Callable[..., Built]

GRAPHS: Mapping[str, GraphBuilder] = MappingProxyType({
    CONCAT_FORM: concat_model,
    INPLACE_FORM: inplace_model,
})

if set(GRAPHS) != {f for f, form in FORMS.items() if not form.lossy}:
    raise ImportError(f"mha_export.decoder.graphs.table: graphs for {sorted(GRAPHS)}, exact forms "
                      f"{sorted(f for f, form in FORMS.items() if not form.lossy)}")
