"""The attention's export steps in the one pipeline: build, validate, golden fixtures, offline-optimized copies."""
