"""The chapter 3 causal attention (faithful), its fused form, and example inputs for tracing."""
