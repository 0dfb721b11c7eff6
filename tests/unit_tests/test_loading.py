"""Loading models quietly: progress bars are dropped, anything else still shows."""

from __future__ import annotations

import sys

import pytest

from langchain_tag._loading import quiet_model_loading

BAR = (
    "\rConverting and de-quantizing GGUF tensors...:  42%|████      | 114/272 "
    "[00:01<00:00, 141.34it/s]"
)


def test_bars_are_dropped_and_other_lines_kept(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with quiet_model_loading():
        sys.stderr.write(BAR + BAR + "\n")
        sys.stderr.write("UserWarning: a real problem\n")
    assert capsys.readouterr().err == "UserWarning: a real problem\n"


def test_what_a_failed_load_said_is_shown(capsys: pytest.CaptureFixture[str]) -> None:
    def load() -> None:
        with quiet_model_loading():
            sys.stderr.write(BAR + "\nerror: config.json missing\n")
            raise OSError("no such model")  # noqa: EM101, TRY003

    with pytest.raises(OSError, match="no such model"):
        load()
    assert capsys.readouterr().err == "error: config.json missing\n"
