"""The artifact contract, read and written without onnxruntime: config, contract, registry, manifest, golden cases."""
