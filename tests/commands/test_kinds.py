"""The tables of model kinds (the runtime's, mha_runtime.kinds, and the export package's, mha_export.kinds): a
folder's kind is read from its manifest in one place; every row resolves every target it names, and a row naming
something that does not exist fails; every command goes through the tables for both kinds, and a command a kind
has no target for is one line naming what the kind offers; `mha export`'s flag matrix is the table's."""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mha_export.cli import export_cmd
from mha_export.kinds import EXPORT_KINDS
from mha_runtime.artifact.errors import ArtifactError
from mha_runtime.artifact.manifest import ATTENTION_KIND, DECODER_KIND, folder_kind
from mha_runtime.attention.manifest import load_manifest
from mha_runtime.cli.main import cli
from mha_runtime.decoder.manifest import GPTManifest, load_gpt_manifest
from mha_runtime.kinds import COMMANDS, KINDS, kind_of
from mha_runtime.serve.attention.service import CONTEXT
from mha_runtime.serve.decoder.wire import GENERATE


def test_each_folder_is_its_kind(seed_dir: Path, book_gpt: tuple[object, Path], tmp_path: Path) -> None:
    assert kind_of(seed_dir).name == ATTENTION_KIND and kind_of(book_gpt[1]).name == DECODER_KIND
    (tmp_path / "manifest.json").write_text("{not json")
    assert kind_of(tmp_path).name == ATTENTION_KIND  # unreadable: the attention loader names the problem
    result = CliRunner().invoke(cli, ["inspect", str(tmp_path)])
    assert result.exit_code == 1 and "expected JSON" in result.stderr and result.stderr.count("\n") == 1


def test_a_folder_of_the_older_kind_name_is_a_decoder(book_gpt: tuple[object, Path], tmp_path: Path) -> None:
    """New folders say "decoder"; one exported before the kind was named for its task says "gpt" and still reads."""
    data = json.loads((book_gpt[1] / "manifest.json").read_text())
    assert data["kind"] == DECODER_KIND
    (tmp_path / "manifest.json").write_text(json.dumps({**data, "kind": "gpt"}))
    assert folder_kind(tmp_path) == DECODER_KIND and load_gpt_manifest(tmp_path).name == data["name"]
    with pytest.raises(ArtifactError, match="a decoder folder"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({**data, "kind": "llama"}))  # a kind no runtime knows
    assert folder_kind(tmp_path) == ATTENTION_KIND  # whose loader then names the problem


def test_the_routes_are_the_services_own() -> None:
    assert KINDS[ATTENTION_KIND].route == CONTEXT and KINDS[DECODER_KIND].route == GENERATE


def test_inspect_and_check_take_both_kinds(seed_dir: Path, book_gpt: tuple[object, Path]) -> None:
    for folder, says in ((seed_dir, "opset"), (book_gpt[1], "gpt.inplace.onnx")):
        shown = CliRunner().invoke(cli, ["inspect", str(folder)])
        assert shown.exit_code == 0 and says in shown.stdout, shown.output
        as_json = json.loads(CliRunner().invoke(cli, ["inspect", str(folder), "--json"]).stdout)
        assert as_json["name"] == json.loads((folder / "manifest.json").read_text())["name"]
        checked = CliRunner().invoke(cli, ["check", str(folder)])
        assert checked.exit_code == 0 and checked.stdout.strip().splitlines()[-1].endswith(" 0 failed")


@pytest.mark.parametrize(("text", "says"), [
    # one reader, one limit: a 5 MiB manifest is refused before it is parsed
    ('{"kind": "gpt", "pad": "' + "x" * (5 << 20) + '"}', "at most 4194304 bytes"),
    # json.loads alone kept the last of two "kind" members (and read this one as a GPT's); the C runners refuse it
    ('{"kind": "attention", "format": 2, "kind": "gpt"}', "expected unique member names, got 'kind' twice"),
])
def test_a_bad_manifest_is_refused_alike_for_either_kind(tmp_path: Path, text: str, says: str) -> None:
    """By each kind's loader and by the command line, in one line."""
    (tmp_path / "manifest.json").write_text(text)
    for load in (load_manifest, load_gpt_manifest):
        with pytest.raises(ArtifactError, match=re.escape(says)):
            load(tmp_path)
    for command in (["inspect", str(tmp_path)], ["check", str(tmp_path)]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 1 and says in result.stderr and result.stderr.count("\n") == 1


def test_a_gpt_manifest_format_of_true_is_not_format_1(book_gpt: tuple[object, Path]) -> None:
    """JSON's true equals 1 in Python: the format check reads the type too."""
    data = json.loads((book_gpt[1] / "manifest.json").read_text())
    GPTManifest.from_dict(data, "manifest")  # as written: read
    with pytest.raises(ArtifactError, match=re.escape("format 1), got kind 'decoder', format True")):
        GPTManifest.from_dict({**data, "format": True}, "manifest")


def resolve_rows(table: Mapping[str, Any]) -> dict[str, object]:
    """Every target every row of `table` names, by "kind.what", each imported by its loader."""
    return {f"{kind}.{what}": loader() for kind, row in table.items() for what, loader in row.loaders().items()}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray Serve's own config, imported by the replicas
@pytest.mark.parametrize("table", [KINDS, EXPORT_KINDS], ids=["runtime", "export"])
def test_every_row_resolves_every_target_it_names(table: Mapping[str, Any]) -> None:
    targets = resolve_rows(table)
    assert targets and all(callable(target) for target in targets.values())
    assert {kind for kind in table} == {ATTENTION_KIND, DECODER_KIND}
    for kind, row in table.items():
        assert row.name == kind


def test_looking_a_kind_up_imports_no_torch_onnx_runtime_or_ray(seed_dir: Path,
                                                               book_gpt: tuple[object, Path]) -> None:
    """The loaders import their targets only when called: a refusal is one line in the time Python takes to start."""
    code = ("import sys\nfrom pathlib import Path\nfrom mha_export.kinds import export_row, selected\n"
            "from mha_runtime.kinds import kind_of\n"
            f"rows = [kind_of(Path({str(seed_dir)!r})), kind_of(Path({str(book_gpt[1])!r})), selected(['--gpt']), "
            f"export_row(Path({str(book_gpt[1])!r}))]\n"
            "print(sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'ray') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_row_naming_something_that_does_not_exist_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loader is checked by importing what it names: a module that is not there, or a name its module lacks."""

    def no_module() -> Callable[..., object]:
        from mha_runtime.decoder.nowhere import generate  # type: ignore[import-not-found]
        return generate  # type: ignore[no-any-return]

    def no_name() -> Callable[..., object]:
        from mha_runtime.decoder.generate import Generator2  # type: ignore[attr-defined]
        return Generator2  # type: ignore[no-any-return]

    for bogus, error in ((no_module, ModuleNotFoundError), (no_name, ImportError)):
        monkeypatch.setitem(KINDS, DECODER_KIND, dataclasses.replace(KINDS[DECODER_KIND], generator=bogus))
        with pytest.raises(error):
            resolve_rows(KINDS)
        monkeypatch.setitem(EXPORT_KINDS, ATTENTION_KIND, dataclasses.replace(EXPORT_KINDS[ATTENTION_KIND],
                                                                              bencher=bogus))
        with pytest.raises(error):
            resolve_rows(EXPORT_KINDS)


def test_the_two_tables_agree_on_what_each_kind_offers() -> None:
    """The runtime's row names the export package's commands of its kind (for its refusals): those the export row
    has targets for."""
    for kind, row in EXPORT_KINDS.items():
        assert set(KINDS[kind].export_commands) == set(row.loaders()) - {"export"}
        assert set(KINDS[kind].offers()) <= set(COMMANDS)
    assert "run" in KINDS[ATTENTION_KIND].offers() and "run" not in KINDS[DECODER_KIND].offers()
    assert "generate" in KINDS[DECODER_KIND].offers() and "generate" not in KINDS[ATTENTION_KIND].offers()


def test_the_flags_given_select_the_row() -> None:
    """mha export's row is the one whose flag was given (--gpt: the decoder's), else the one no flag selects."""
    from mha_export.kinds import selected

    assert sum(row.flag is None for row in EXPORT_KINDS.values()) == 1
    for row in EXPORT_KINDS.values():
        given = ["--preset", "--out", *([row.flag] if row.flag else []), "--variants"]
        assert selected(given) is row
    assert selected(["--gpt"]) is EXPORT_KINDS[DECODER_KIND] and selected([]) is EXPORT_KINDS[ATTENTION_KIND]


# One value per flag a row owns, to give it on the command line (a new owned flag needs one here).
FLAG_VALUES = {"--layer": "0", "--opset": "20", "--tokenizer": "tok.json", "--arch": "gpt2", "--context-length": "64"}


def _other_owners(kind: str) -> list[tuple[str, str]]:
    """(flag, the line) of every flag another row owns."""
    return [(flag, line) for other, row in EXPORT_KINDS.items() if other != kind
            for flag, line in row.own_flags.items()]


@pytest.mark.parametrize("kind", list(EXPORT_KINDS))
def test_the_flag_matrix_of_mha_export_is_the_tables(kind: str, tmp_path: Path) -> None:
    """Each flag one row owns is refused for every other kind with the owner's line, exit 2, before any work; the
    kind that owns it takes it; and every owned flag is an option of `mha export`."""
    options = {opt for param in export_cmd.params for opt in param.opts}
    row = EXPORT_KINDS[kind]
    base = ["export", *([row.flag] if row.flag else []), "--preset", row.default_presets[0], "--out", str(tmp_path)]
    assert _other_owners(kind), "no other row owns a flag"
    for flag, line in _other_owners(kind):
        assert flag in options and not row.takes(flag)
        result = CliRunner().invoke(cli, [*base, flag, FLAG_VALUES[flag]])
        assert result.exit_code == 2 and result.stdout == "", result.output
        assert result.stderr.startswith(f"Error: {line}") and result.stderr.count("\n") == 1, result.stderr
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("")
    for flag in row.own_flags:  # taken: the export goes on to its next refusal (--out is a file)
        assert flag in options and row.takes(flag)
        result = CliRunner().invoke(cli, [*base, flag, FLAG_VALUES[flag], "--out", str(tmp_path / "file")])
        assert result.exit_code in (1, 2) and result.stderr.count("\n") == 1, result.output
        assert all(line not in result.stderr for _, line in _other_owners(kind)), result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


def test_a_preset_of_the_other_kind_names_the_flag_that_selects_it(tmp_path: Path) -> None:
    for flags, preset, says in (([], "gpt-mini", "(a decoder preset: add --gpt)"),
                                (["--gpt"], "seed", "(an attention preset: drop --gpt)")):
        result = CliRunner().invoke(cli, ["export", *flags, "--preset", preset, "--out", str(tmp_path)])
        assert result.exit_code == 2 and says in result.stderr and result.stderr.count("\n") == 1, result.output


@pytest.mark.parametrize("command", ["run", "triton", "bench"])
def test_a_command_a_decoder_folder_has_not_is_one_line_naming_what_it_offers(
        command: str, book_gpt: tuple[object, Path], tmp_path: Path) -> None:
    folder = book_gpt[1]
    args = {"run": ["run", str(folder), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")],
            "triton": ["triton", str(folder), "--out", str(tmp_path / "repo")],
            "bench": ["bench", "--preset", folder.name, "--artifacts", str(folder.parent), "--out",
                      str(tmp_path / "bench")]}[command]
    result = CliRunner().invoke(cli, args)
    offers = ", ".join(f"mha {c}" for c in ("generate", "check", "inspect", "serve", "validate"))
    assert result.exit_code == 1 and result.stdout == "", result.output
    assert result.stderr == (f"Error: {folder}: a decoder folder (made by `mha export --gpt`) has no `mha {command}`; "
                             f"it offers {offers}\n")
    assert list(tmp_path.iterdir()) == []


def test_a_command_an_attention_folder_has_not_is_refused_by_the_table(seed_dir: Path) -> None:
    kind = kind_of(seed_dir)
    offers = "mha run, mha check, mha inspect, mha serve, mha triton, mha validate, mha bench"
    with pytest.raises(ArtifactError, match=re.escape(f"{seed_dir}: an attention folder (made by `mha export`) has no "
                                                      f"`mha generate`; it offers {offers}")):
        kind.needs(kind.generator, "generate", seed_dir)
    assert kind.needs(kind.runner, "run", seed_dir).__name__ == "OnnxRunner"


def test_mha_serve_takes_its_default_ingress_from_the_kind(seed_dir: Path, book_gpt: tuple[object, Path]) -> None:
    from mha_runtime.serve.options import ServeOptions

    for folder, kind in ((seed_dir, ATTENTION_KIND), (book_gpt[1], DECODER_KIND)):
        assert ServeOptions(artifact=folder).chosen_ingress == KINDS[kind].local_ingress
        assert ServeOptions(artifact=folder, address="auto").chosen_ingress == "proxy"  # a cluster's own proxy
        assert ServeOptions(artifact=folder, ingress="haproxy", address="auto").chosen_ingress == "haproxy"
    assert {row.local_ingress for row in KINDS.values()} == {"proxy", "haproxy"}
