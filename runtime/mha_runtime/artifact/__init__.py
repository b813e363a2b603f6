"""What every kind's artifacts share, read and written without onnxruntime: the manifest envelope, records, errors,
atomic writes, tolerance."""
