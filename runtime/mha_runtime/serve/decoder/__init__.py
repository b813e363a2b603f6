"""Serving a decoder folder: the generation engine, its wire format, the HTTP service and its load test."""
