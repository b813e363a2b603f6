"""Gemma 3, as the book's Gemma3Model builds it (ch05/12_gemma3): the Architecture protocol (archs/protocol.py) for
it. Being written (issue 59): config.py first."""
