"""Every error type of the project, and the one way to turn a foreign exception into one line."""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol


class MHAError(Exception):
    """Base class: the message is the whole story, printed as one line by the CLI, which exits `exit_code`."""

    exit_code = 1  # a bad file or a failed run


class ConfigError(MHAError, ValueError):
    """A config, preset or weights file does not fit what was expected."""


class BadValueError(ConfigError):
    """A flag or config value outside what the command takes (a name, a variant, a config field, a preset): a
    usage error, exit 2 like click's own. A file that cannot be read or parsed stays a ConfigError (exit 1)."""

    exit_code = 2


class ContractError(MHAError, ValueError):
    """An input breaks the I/O contract (rank, d_in, tokens, dtype, finiteness)."""


class ArtifactError(MHAError):
    """An artifact file is missing, truncated, altered or unreadable."""


class ProviderError(MHAError):
    """The requested ONNX Runtime execution provider is not available."""


class ExportError(MHAError):
    """An exporter produced something that breaks the artifact contract, or cannot build what was asked."""


class ServeError(MHAError):
    """A server cannot start (port taken, cluster unreachable, model unfit to serve), or a load test cannot run."""


class RequestError(MHAError):
    """An HTTP request the server refuses: malformed (400) or over the body limit (413)."""

    def __init__(self, message: str, *, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class _Failure(Protocol):
    def line(self) -> str: ...


class Interrupted(MHAError):
    """A Ctrl-C or SIGTERM that came after the output was complete: the message says what was written."""


class ValidationError(MHAError):
    """One or more artifacts differ from eager PyTorch beyond tolerance; every failing case is listed (a case with
    its own `line()`, or the line itself)."""

    def __init__(self, failures: Sequence[_Failure | str]) -> None:
        self.failures = list(failures)
        lines = "\n".join("  " + (f if isinstance(f, str) else f.line()) for f in self.failures)
        super().__init__(f"validation failed: {len(self.failures)} case(s) beyond tolerance\n{lines}")


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message, or its type name when it has none."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def cause_line(exc: BaseException) -> str:
    """One line for an exception raised elsewhere. A Ray task or actor error names the remote method on its first
    line (then pid, ip, actor id, cut here) and carries the remote exception as `cause`; of the cause's lines the
    first that HAProxy marks [ALERT] says what failed (its first lines are notices). Ray's colours are removed."""
    line = first_line(exc).split(" (pid=")[0]
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        lines = [text.strip() for text in str(cause).splitlines() if text.strip()]
        what = next((text for text in lines if "[ALERT]" in text), lines[0] if lines else "")
        line = f"{line}: {type(cause).__name__}" + (f": {what}" if what else "")
    return re.sub(r"\x1b\[[0-9;]*m", "", line)


def cut(text: str, limit: int = 40) -> str:
    """`text` as an error line quotes a client's value: at most `limit` characters, then "..."."""
    return text if len(text) <= limit else text[:limit] + "..."
