"""Error types that reach the user as one clear line (never a traceback)."""


class MHAError(Exception):
    """Base class: the message is the whole story, printed as one line by the CLI."""


class ConfigError(MHAError, ValueError):
    """A config, preset or weights file does not fit what was expected."""


class ContractError(MHAError, ValueError):
    """An input breaks the I/O contract (rank, d_in, tokens, dtype, finiteness)."""


class ArtifactError(MHAError):
    """An artifact file is missing, truncated, altered or unreadable."""


class ProviderError(MHAError):
    """The requested ONNX Runtime execution provider is not available."""
