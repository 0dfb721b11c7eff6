"""What importing each face of the library loads: modules, their lines, seconds.

For `langchain_tag` and each face (`retrievers`, `middleware`, `query_graph`), a
fresh interpreter imports it and reports the `langchain_tag` modules it loaded, the
lines of their source files, all modules loaded (third-party included) and the
seconds the import took. `tests/unit_tests/test_imports.py` pins what a face must
not load (the experiments, LangChain's community and classic packages, the text
splitters); this prints how much it does load. Nothing is asserted about time.

Run from the repository root:

    python benchmarks/bench_imports.py [--repeats N] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

FACES = (
    "langchain_tag",
    "langchain_tag.retrievers",
    "langchain_tag.middleware",
    "langchain_tag.query_graph",
)

_PROBE = """
import json, sys, time
start = time.perf_counter()
import {module}
seconds = time.perf_counter() - start
ours = sorted(
    (name, getattr(module, "__file__", None))
    for name, module in sys.modules.items()
    if name == "langchain_tag" or name.startswith("langchain_tag.")
)
print(json.dumps({{"seconds": seconds, "ours": ours, "all": len(sys.modules)}}))
"""


def measure(module: str) -> dict[str, object]:
    """One fresh interpreter importing `module`."""
    done = subprocess.run(  # noqa: S603 - our own interpreter
        [sys.executable, "-c", _PROBE.format(module=module)],
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(done.stdout)
    lines = sum(
        len(Path(path).read_text(encoding="utf-8").splitlines())
        for _, path in found["ours"]
        if path
    )
    return {
        "face": module,
        "modules": len(found["ours"]),
        "lines": lines,
        "all_modules": found["all"],
        "seconds": found["seconds"],
    }


def main() -> int:
    """Print one row per face (the fastest of `--repeats` imports)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="imports per face")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    rows = []
    print(f"{'face':<28}{'ours':>6}{'lines':>8}{'all modules':>13}{'seconds':>9}")
    for face in FACES:
        runs = [measure(face) for _ in range(args.repeats)]
        row = min(runs, key=lambda run: float(str(run["seconds"])))
        rows.append(row)
        print(
            f"{face:<28}{row['modules']:>6}{row['lines']:>8,}"
            f"{row['all_modules']:>13}{float(str(row['seconds'])):>9.2f}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
