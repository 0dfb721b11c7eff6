"""The notebooks in notebooks/ run top to bottom, as CI runs them.

Each notebook runs in a Jupyter kernel of this interpreter (nbclient), in a temporary
copy of notebooks/ so that nothing it writes is left behind, twice:

- offline: no OpenAI settings in the environment, so `notebook_model()` gives the
  deterministic fakes of `langchain_tag.testing`;
- configured: `OPENAI_BASE_URL` points at a `FakeOpenAIServer` on loopback, so the
  notebooks take their real-model path (`ChatOpenAI` over HTTP) with fake answers.

The notebooks are stored with the outputs of their offline run (`bash
scripts/notebooks` writes them), so a reader sees results without running anything;
the offline run here checks that those outputs are there and not stale.

The kernel talks to nbclient over loopback TCP (ZeroMQ), which is why these are
integration tests: unit tests have sockets disabled.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from langchain_tag_experiments.data import shared_data_dir
from nbclient import NotebookClient

from langchain_tag.testing import FakeOpenAIServer, JudgeAndExtractorFakeChatModel
from langchain_tag.testing.notebook import OFFLINE_NOTE

pytestmark = pytest.mark.notebook

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
NEEDS_DATA = {"03_rulearena_nba"}
"""Notebooks that read the real data sets (`shared_data_dir()`)."""
CELL_SECONDS = 300
KERNEL = "python3"
RESTORE = "run `bash scripts/notebooks` to execute and store them again"


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


def output_shape(nb: Any) -> list[tuple[int, list[str]]]:
    """Which code cells show output, and of which kinds (a stream, MIME types).

    Warnings on stderr depend on the environment (installed extras, for one) and a
    stream may arrive in several parts: left out, and merged.
    """
    shape = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        kinds = {
            f"stream:{output['name']}"
            if output["output_type"] == "stream"
            else f"{output['output_type']}:{','.join(sorted(output.get('data', {})))}"
            for output in cell.outputs
            if output.get("name") != "stderr"
        }
        if kinds:
            shape.append((index, sorted(kinds)))
    return shape


def output_text(nb: Any) -> str:
    """Everything the stored outputs show, as text."""
    return json.dumps([cell.get("outputs", []) for cell in nb.cells])


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
    if model_note == "**Offline run":
        # The stored outputs are this run's: every cell that shows something here
        # shows the same kinds of output in the stored notebook.
        assert output_shape(read(notebook)) == output_shape(nb), (
            f"{notebook.name} is stored with outputs that are missing or stale: "
            f"{RESTORE}"
        )


def test_the_notebooks_are_there() -> None:
    assert [path.stem for path in NOTEBOOKS] == [
        "01_quickstart",
        "02_dropin_chroma_vs_tag",
        "03_rulearena_nba",
        "04_query_graph",
        "05_agent_middleware",
        "06_decision_model",
    ]


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem)
def test_notebook_is_stored_with_its_offline_outputs(notebook: Path) -> None:
    """Stored run top to bottom, offline, saying so, and nothing of this machine."""
    nb = read(notebook)
    nbformat.validate(nb)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code
    counts = [cell.execution_count for cell in code]
    assert counts == list(range(1, len(code) + 1)), f"not run in order: {RESTORE}"
    assert output_shape(nb), f"{notebook.name} is stored without outputs: {RESTORE}"
    # Which model produced the stored results: the deterministic fakes.
    assert OFFLINE_NOTE in markdown_outputs(nb)[0], RESTORE
    assert nb.metadata["kernelspec"]["name"] == KERNEL
    assert not any("execution" in cell.metadata for cell in code), "timestamps"
    shown = output_text(nb)
    for local in {str(REPO), str(Path.home()), tempfile.gettempdir(), sys.prefix}:
        assert local not in shown, f"{notebook.name} shows the local path {local}"
