"""Every Python block in README.md and docs/*.md runs as written.

sybil parses the Markdown (code fences, and its ``<!-- skip: next "why" -->`` comment for
the rare block that is deliberately not runnable; the comment is invisible on the rendered
page). Each block then runs in a fresh ``python``, as a reader pasting it would: a block
may not lean on an earlier block's imports, and a block that sets ``XLA_FLAGS`` before
importing JAX (the data-parallel one) gets the devices it asks for. Tracebacks name the
document and its line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(path: Path) -> list[tuple[int, str, str | None]]:
    """``(line, source, skip_reason)`` for each Python block of ``path``, in order."""
    document = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()]).parse(path)
    blocks, pending = [], None
    for example in document.examples():  # in document order
        if not isinstance(example.region.evaluator, PythonEvaluator):  # a skip comment
            action, reason = example.parsed
            if action != "next":
                raise ValueError(f"{path.name}:{example.line}: only 'skip: next' is used here, got {action!r}")
            pending = eval(reason) if reason else "marked not runnable"  # a string literal
            continue
        # example.line is the ```python line; the code starts on the next one
        blocks.append((example.line + 1, str(example.parsed), pending))
        pending = None
    return blocks


BLOCKS = [(path, line, source, skip) for path in DOCS for line, source, skip in python_blocks(path)]


def test_the_docs_have_python_blocks_and_few_are_skipped():
    names = {path.name for path, *_ in BLOCKS}
    assert {"README.md", "design.md", "parallel.md"} <= names, names
    skipped = [f"{path.name}:{line}" for path, line, _, skip in BLOCKS if skip]
    assert len(skipped) <= 2, f"more than two blocks marked not runnable: {skipped}"


@pytest.mark.parametrize(("path", "line", "source", "skip"), BLOCKS,
                         ids=[f"{p.relative_to(ROOT)}:{line}" for p, line, _, _ in BLOCKS])
def test_block_runs_as_written(path, line, source, skip, tmp_path):
    if skip:
        pytest.skip(skip)
    # padded so that the traceback's line numbers are the document's
    script = tmp_path / f"{path.name}.py"
    script.write_text("\n" * (line - 1) + source)
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_ENABLE_X64")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["MPLBACKEND"] = "Agg"
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, (f"{path.relative_to(ROOT)}, block at line {line} failed "
                                  f"(exit {done.returncode}):\n{done.stderr[-4000:]}")


def test_every_relative_link_and_image_in_the_docs_is_a_file_of_the_repository():
    import re

    missing = []
    for path in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)", path.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (path.parent / target).resolve().exists():
                missing.append(f"{path.relative_to(ROOT)} -> {target}")
    assert not missing, missing
