"""Examples run from a checkout (not packaged): `examples.demo` is `make demo`."""
