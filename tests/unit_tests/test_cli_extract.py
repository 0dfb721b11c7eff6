"""`tag extract DOCUMENT... -o RULEBOOK` (`cli/extract.py`): the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from langchain_tag import cli
from langchain_tag.testing import ExtractionFakeChatModel

# --- tag extract -o checked before the first model call -------------------------------


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (".", "is a directory"),
        ("doc.md/rulebook.json", "is not a directory"),
    ],
)
def test_tag_extract_checks_the_output_path_first(
    output: str,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: a raw traceback after the whole extraction had run (and been paid).
    monkeypatch.chdir(tmp_path)
    Path("doc.md").write_text("# Rules\n\nImports must be on separate lines.\n")
    model = ExtractionFakeChatModel()
    monkeypatch.setattr("langchain_tag.models.default_chat_model", lambda **_: model)
    code = cli.main(["extract", "doc.md", "-o", output, "--no-checkpoint", "-q"])
    assert code == 2
    assert message in capsys.readouterr().err
    assert model.calls == 0
