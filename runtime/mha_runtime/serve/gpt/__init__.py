"""Serving a GPT folder: the generation engine, its wire format, the HTTP service and its load test."""
