"""Save the run the site shows again, for the named comparisons only.

``python -m docs_hooks.save_run NAME ...`` runs ``python -m comparisons NAME ... --json`` and
puts those results into docs/data/comparisons.json in place of the saved ones, keeping the
others and the registry's order; with no names it runs every comparison (the same as
``python -m comparisons --json docs/data/comparisons.json``). A comparison whose code changed
is saved again this way in seconds instead of rerunning all of them; the file is replaced
atomically, and nothing is written unless every named comparison passed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAVED = ROOT / "docs" / "data" / "comparisons.json"

__all__ = ["main", "merge"]


def merge(saved: dict, fresh: dict, order: list[str]) -> dict:
    """``saved`` with ``fresh``'s results in place of those of the same name, in ``order``."""
    if fresh["dtype"] != saved["dtype"]:
        raise ValueError(f"the fresh run is {fresh['dtype']}, the saved one {saved['dtype']}: rerun with the same dtype")
    by_name = {r["name"]: r for r in saved["results"]} | {r["name"]: r for r in fresh["results"]}
    return {"dtype": saved["dtype"], "results": [by_name[name] for name in order if name in by_name]}


def main(argv: list[str] | None = None) -> int:
    names = list(sys.argv[1:] if argv is None else argv)
    from comparisons.__main__ import available

    unknown = sorted(set(names) - set(available()))
    if unknown:
        print(f"save_run: unknown comparisons {unknown}; choose from {available()}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        code = subprocess.call([sys.executable, "-m", "comparisons", *names, "--no-page", "--json", str(out)], cwd=ROOT)
        if code != 0 or not out.exists():
            print(f"save_run: the run exited {code}; {SAVED} is unchanged", file=sys.stderr)
            return code or 1
        fresh = json.loads(out.read_text())
    saved = json.loads(SAVED.read_text()) if names and SAVED.exists() else {"dtype": fresh["dtype"], "results": []}
    merged = merge(saved, fresh, available())
    from funcnet.cli.outputs import write_atomic

    write_atomic(SAVED, json.dumps(merged, indent=2) + "\n")
    print(f"saved {len(fresh['results'])} comparison(s) into {SAVED.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
