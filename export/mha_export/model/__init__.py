"""The chapter 3 causal attention (faithful), its fused form, and example inputs for tracing.

The attention kind's model stays at this import path, outside the attention's room (mha_export.attention): the
tracers write the modules' qualified names (mha_export.model.wrapper.MultiHeadAttentionWrapper, ...) into mha.onnx's
node metadata and mha.pt's code, so moving it would change the bytes of every attention artifact."""
