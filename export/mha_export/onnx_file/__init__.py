"""ONNX files too large to hold twice: streamed saving and a checker that skips the weights' bytes."""
