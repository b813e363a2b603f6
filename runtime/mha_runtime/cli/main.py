"""The `mha` command: one click group, its error boundary, and the commands other packages register.

The runtime's own commands (run, check, inspect, serve, loadtest, triton) are always there; the export package
adds `export`, `validate` and `bench` through the `mha.commands` entry-point group. Without it those names
answer with one line saying what to install.
"""
from __future__ import annotations

import os
import signal
import sys
from importlib.metadata import entry_points
from typing import Any, cast

import click

from mha_runtime.artifact.errors import Interrupted, MHAError, first_line

COMMANDS_GROUP = "mha.commands"
EXPORT_COMMANDS = ("export", "validate", "bench")
EXPORT_HINT = "needs the mha-export package (torch, onnx): pip install ./runtime ./export from the repository"
SERVE_HINT = "needs the serve extra (Ray Serve): pip install './runtime[serve]' from the repository"
BENCH_HINT = "needs the bench extra (matplotlib): pip install './export[bench]' from the repository"
# A missing module, by its top-level name, and what installs it.
_HINTS = {**dict.fromkeys(("torch", "onnx", "onnxscript", "onnx_ir", "safetensors", "mha_export"), EXPORT_HINT),
          "matplotlib": BENCH_HINT, "ray": SERVE_HINT, "starlette": SERVE_HINT}


class MhaGroup(click.Group):
    """The one error boundary: every failure is one line on stderr and exit 1 (2 for a bad flag or value, 130 when
    interrupted), never a traceback; a missing optional dependency says what to install.
    MHA_DEBUG=1 lets an unexpected exception through with its traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *(ep.name for ep in entry_points(group=COMMANDS_GROUP))})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        for ep in entry_points(group=COMMANDS_GROUP, name=cmd_name):  # the first of that name
            return cast(click.Command, ep.load())
        if cmd_name in EXPORT_COMMANDS:
            raise click.ClickException(f"'mha {cmd_name}' {EXPORT_HINT}")
        return None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as exc:
            hint = _HINTS.get((exc.name or "").split(".")[0])
            if hint is None:
                raise
            raise click.ClickException(f"this command {hint} (missing module {exc.name!r})") from None

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            fail(f"{exc.format_message()}{where}", 2)
        except click.ClickException as exc:
            fail(exc.format_message(), exc.exit_code)
        except (click.Abort, KeyboardInterrupt):
            fail("interrupted; nothing was written", 130)
        except Interrupted as exc:
            fail(str(exc), 130)
        except MHAError as exc:
            fail(str(exc), exc.exit_code)
        except MemoryError:
            fail("out of memory: the input or the model is too large for this machine", 1)
        except OSError as exc:
            fail(f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or first_line(exc)}", 1)
        except Exception as exc:
            if os.environ.get("MHA_DEBUG"):
                raise
            fail(f"internal error: {type(exc).__name__}: {first_line(exc)} (MHA_DEBUG=1 shows the traceback)", 1)
        sys.exit(code if isinstance(code, int) else 0)


def fail(message: str, code: int) -> None:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


@click.group(cls=MhaGroup)
def cli() -> None:
    """Export, validate, run, check, inspect and serve the chapter 3 causal multi-head attention, and generate
    with the whole GPT."""


def _register() -> None:
    from mha_runtime.cli.generate_command import generate_cmd
    from mha_runtime.cli.run_commands import check_cmd, inspect_cmd, run_cmd
    from mha_runtime.cli.serve_commands import loadtest_cmd, serve_cmd, triton_cmd

    for command in (run_cmd, check_cmd, inspect_cmd, serve_cmd, loadtest_cmd, triton_cmd, generate_cmd):
        cli.add_command(command)


_register()


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM unwinds like Ctrl-C: staging folders are removed, nothing half-written


def main() -> None:
    signal.signal(signal.SIGTERM, _terminate)
    cli.main(prog_name="mha")
