"""Serving over HTTP: the API without a server, exact batching, the wire format, the Ray Serve app and launcher."""
