"""`_text.read_text`: the one reader of a user's text files and standard input."""

from __future__ import annotations

import codecs
import io
from pathlib import Path

import pytest

from langchain_tag._text import json_lines, read_text
from langchain_tag.errors import TextEncodingError

TEXT = "Imports go first.\nCafé staff must wash their hands.\n"


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(TEXT.encode("utf-8"), id="utf-8"),
        pytest.param(codecs.BOM_UTF8 + TEXT.encode("utf-8"), id="utf-8-bom"),
        pytest.param(TEXT.encode("utf-16"), id="utf-16-bom"),
        pytest.param(codecs.BOM_UTF16_BE + TEXT.encode("utf-16-be"), id="utf-16be-bom"),
        pytest.param(codecs.BOM_UTF16_LE + TEXT.encode("utf-16-le"), id="utf-16le-bom"),
    ],
)
def test_utf8_and_marked_utf16_are_read(raw: bytes, tmp_path: Path) -> None:
    path = tmp_path / "doc.txt"
    path.write_bytes(raw)
    assert read_text(path) == TEXT
    assert read_text(str(path)) == TEXT
    assert read_text(io.BytesIO(raw), what="standard input") == TEXT


def test_latin1_names_the_file_the_byte_its_line_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes(TEXT.encode("latin-1"))
    with pytest.raises(TextEncodingError) as raised:
        read_text(path)
    message = str(raised.value)
    offset = TEXT.encode("latin-1").index(b"\xe9")
    assert message.startswith(f"{path}: is not UTF-8 text ")
    assert f"(byte 0xe9 at offset {offset}, line 2)" in message
    assert "save it as UTF-8" in message
    assert isinstance(raised.value, ValueError)  # `tag` prints it in one line


def test_standard_input_is_named(tmp_path: Path) -> None:
    with pytest.raises(TextEncodingError, match=r"^standard input: is not UTF-8"):
        read_text(io.BytesIO(b"ok\n\xff\n"), what="standard input")


@pytest.mark.parametrize(
    ("encoding", "named"),
    [("utf-16-le", "UTF-16LE"), ("utf-16-be", "UTF-16BE"), ("utf-32", "UTF-32")],
)
def test_unmarked_utf16_and_utf32_are_refused_by_name(
    encoding: str, named: str, tmp_path: Path
) -> None:
    # Unmarked UTF-16 of ASCII text is valid UTF-8 with NULs: it must not pass.
    path = tmp_path / "wide.txt"
    path.write_bytes(TEXT.encode(encoding))
    with pytest.raises(TextEncodingError) as raised:
        read_text(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: is {named} text, not UTF-8.")
    assert f"iconv -f {named} -t UTF-8" in message


def test_nul_bytes_are_refused_as_binary(tmp_path: Path) -> None:
    path = tmp_path / "guide.tar"
    path.write_bytes(b"guide.md" + b"\x00" * 92 + TEXT.encode())
    with pytest.raises(TextEncodingError, match=r"contains NUL bytes \(at offset 8\)"):
        read_text(path)


def test_bad_utf16_names_the_offset(tmp_path: Path) -> None:
    path = tmp_path / "cut.txt"
    # A lone high surrogate, then a line: not text in any encoding.
    path.write_bytes(codecs.BOM_UTF16_LE + "a\n".encode("utf-16-le") + b"\x00\xd8b\x00")
    with pytest.raises(TextEncodingError, match=r"at offset 6, line 2\)"):
        read_text(path)


def test_json_lines_split_at_newlines_only() -> None:
    text = '{"a": "x\u2028y\u0085z"}\r\n{"b": 1}\n'
    assert json_lines(text) == ['{"a": "x\u2028y\u0085z"}', '{"b": 1}', ""]
