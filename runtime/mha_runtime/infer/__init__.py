"""Running artifacts: the ONNX Runtime runner, its providers, the two decode sessions, .npy files, golden checks."""
