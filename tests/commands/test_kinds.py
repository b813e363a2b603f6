"""The table of model kinds: a folder's kind is read from its manifest in one place, and `mha check`, `mha inspect`
and `mha serve` go through the table for both kinds."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from mha_runtime.artifact.errors import ArtifactError
from mha_runtime.artifact.manifest import ATTENTION_KIND, DECODER_KIND, folder_kind, load_manifest
from mha_runtime.cli.main import cli
from mha_runtime.decoder.manifest import GPTManifest, load_gpt_manifest
from mha_runtime.kinds import KINDS, kind_of
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
