"""What `scripts/check-wheel` runs inside the clean venv holding the built wheels.

    python wheel_smoke.py library README.md      # the library's wheel alone
    python wheel_smoke.py experiments README.md  # the experiments' wheel on top

`library`: the package imports from the venv (not a checkout), is typed and
versioned, its bundled resources load, README's quickstart block runs as printed
with `ChatOpenAI` answered by a loopback fake (`FakeDecisionsServer`), `tag --help`
works and `tag eval` names the package it comes with. `experiments`: `tag eval
--help` works. Run from a folder outside the checkout.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from contextlib import redirect_stdout
from importlib import metadata, resources
from io import StringIO
from pathlib import Path

_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def _tag(*argv: str) -> subprocess.CompletedProcess[str]:
    tag = Path(sys.executable).with_name("tag")
    return subprocess.run(
        [str(tag), *argv], capture_output=True, text=True, check=False
    )


def _quickstart(readme: Path) -> str:
    blocks = _BLOCK.findall(readme.read_text(encoding="utf-8"))
    found = [b for b in blocks if "TAGRetriever.from_rulebook" in b and "Rule(" in b]
    if not found:
        sys.exit(f"{readme}: no quickstart block (Rule(...) and from_rulebook)")
    return str(found[0])


def library(readme: Path) -> None:
    """The library's wheel alone: its files, the quickstart, `tag`."""
    import langchain_tag  # noqa: PLC0415
    from langchain_tag.testing import RuleAwareFakeChatModel  # noqa: PLC0415
    from langchain_tag.testing.decisions import FakeDecisionsServer  # noqa: PLC0415

    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    where = Path(langchain_tag.__file__).resolve()
    if site not in where.parents:
        sys.exit(f"langchain_tag was imported from {where}, not the wheel in {site}")
    version = metadata.version("langchain-tag")
    if langchain_tag.__version__ != version:
        sys.exit(f"__version__ {langchain_tag.__version__!r} != metadata {version!r}")
    package = resources.files("langchain_tag")
    for name in ("py.typed", "resources/pep-0008.rst", "resources/pep8.rulebook.json"):
        if not package.joinpath(name).is_file():
            sys.exit(f"the wheel lacks langchain_tag/{name}")
    langchain_tag.Rulebook.load(str(package / "resources" / "pep8.rulebook.json"))

    with FakeDecisionsServer(chat_model=RuleAwareFakeChatModel()) as fake:
        os.environ["OPENAI_BASE_URL"] = fake.base_url
        os.environ["OPENAI_API_KEY"] = "sk-test"
        out = StringIO()
        with redirect_stdout(out):
            exec(compile(_quickstart(readme), "README.md:quickstart", "exec"), {})  # noqa: S102
    printed = out.getvalue()
    if "PEP8-IMPORT-WILDCARD" not in printed or not fake.chat_requests:
        sys.exit(f"the quickstart did not match over HTTP; it printed {printed!r}")
    print(f"langchain-tag {version} from {where.parent}; quickstart: {printed.strip()}")

    if (done := _tag("--help")).returncode != 0:
        sys.exit(f"tag --help failed: {done.stderr}")
    done = _tag("eval", "nba")
    if done.returncode == 0 or "langchain-tag-experiments" not in done.stderr:
        sys.exit(f"tag eval without the experiments: {done.returncode} {done.stderr}")
    print(f"tag eval without the experiments: {done.stderr.strip()}")


def experiments() -> None:
    """The experiments' wheel on top: `tag eval` is there."""
    version = metadata.version("langchain-tag-experiments")
    done = _tag("eval", "--help")
    if done.returncode != 0 or "nba" not in done.stdout:
        sys.exit(f"tag eval --help failed: {done.returncode} {done.stderr}")
    print(f"langchain-tag-experiments {version}: tag eval --help ok")


if __name__ == "__main__":
    match sys.argv[1:]:
        case ["library", readme]:
            library(Path(readme))
        case ["experiments", _]:
            experiments()
        case _:
            sys.exit("usage: python wheel_smoke.py library|experiments README.md")
