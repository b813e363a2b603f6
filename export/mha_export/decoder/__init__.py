"""The causal decoder kind: any architecture of decoder/archs/ exported as decoders with a key/value cache."""
