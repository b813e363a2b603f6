"""Serving an attention folder: its route (/v1/context), wire format, request batching, deployment and load test."""
