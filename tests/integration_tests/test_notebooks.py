"""The notebooks in notebooks/ run top to bottom, as CI runs them.

Each notebook runs in a Jupyter kernel of this interpreter (nbclient), in a temporary
copy of notebooks/ so that nothing it writes is left behind, twice:

- offline: no OpenAI settings in the environment, so `notebook_model()` gives the
  deterministic fakes of `langchain_tag.testing`;
- configured: `OPENAI_BASE_URL` points at a `FakeOpenAIServer` on loopback, so the
  notebooks take their real-model path (`ChatOpenAI` over HTTP) with fake answers.

The kernel talks to nbclient over loopback TCP (ZeroMQ), which is why these are
integration tests: unit tests have sockets disabled.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from langchain_tag.data import shared_data_dir
from langchain_tag.testing import FakeOpenAIServer, JudgeAndExtractorFakeChatModel

pytestmark = pytest.mark.notebook

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
NEEDS_DATA = {"03_rulearena_nba"}
"""Notebooks that read the real data sets (`shared_data_dir()`)."""
CELL_SECONDS = 300
KERNEL = "python3"


@pytest.fixture
def kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A `python3` kernelspec running this interpreter, found before any other.

    A user-level or system-wide `python3` kernelspec could point at another Python;
    `JUPYTER_PATH` is searched first.
    """
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    launch = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": launch,
                "display_name": "langchain-tag tests",
                "language": "python",
            }
        ),
        encoding="utf-8",
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    for variable in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "TAG_MODEL"):
        monkeypatch.delenv(variable, raising=False)
    return KERNEL


@pytest.fixture(params=["offline", "configured"])
def model_note(
    request: pytest.FixtureRequest, kernel: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """Run offline, or with `OPENAI_BASE_URL` set to a fake OpenAI server.

    Yields what the model note of each notebook must say in that mode.
    """
    if request.param == "offline":
        yield "**Offline run"
        return
    with FakeOpenAIServer(JudgeAndExtractorFakeChatModel()) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        yield f"at {server.base_url}"


def read(path: Path) -> Any:
    """The notebook at `path`, as nbformat 4."""
    return nbformat.read(path, as_version=4)  # type: ignore[no-untyped-call]


def execute(notebook: Path, workdir: Path, kernel_name: str) -> Any:
    """Run a copy of `notebook` in `workdir` (the kernel's working directory)."""
    shutil.copytree(NOTEBOOKS_DIR, workdir)
    nb = read(workdir / notebook.name)
    NotebookClient(
        nb,
        timeout=CELL_SECONDS,
        kernel_name=kernel_name,
        resources={"metadata": {"path": str(workdir)}},
    ).execute()
    return nb


def markdown_outputs(nb: Any) -> list[str]:
    return [
        output["data"]["text/markdown"]
        for cell in nb.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if "text/markdown" in output.get("data", {})
    ]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_runs_top_to_bottom(
    notebook: Path, tmp_path: Path, kernel: str, model_note: str
) -> None:
    if notebook.stem in NEEDS_DATA and shared_data_dir() is None:
        pytest.skip(
            f"{notebook.name} needs the real data: set TAG_DATA_DIR or place "
            "shared/data beside the repository (CI does)"
        )
    before = sorted(NOTEBOOKS_DIR.rglob("*"))

    nb = execute(notebook, tmp_path / "notebooks", kernel)

    # The first thing every notebook shows is which model its results come from.
    assert model_note in markdown_outputs(nb)[0]
    assert sorted(NOTEBOOKS_DIR.rglob("*")) == before


def test_the_notebooks_are_there() -> None:
    assert [path.stem for path in NOTEBOOKS] == [
        "01_quickstart",
        "02_dropin_chroma_vs_tag",
        "03_rulearena_nba",
        "04_query_graph",
        "05_agent_middleware",
    ]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_is_stored_without_outputs(notebook: Path) -> None:
    nb = read(notebook)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code
    assert all(cell.outputs == [] for cell in code), "clear the outputs before saving"
    assert all(cell.execution_count is None for cell in code)
    assert nb.metadata["kernelspec"]["name"] == KERNEL
