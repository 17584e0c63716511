"""Every Python block in README.md and docs/**/*.md (the site's pages) runs as written.

sybil parses the Markdown (code fences, and its ``<!-- skip: next "why" -->`` comment for
the rare block that is deliberately not runnable; the comment is invisible on the rendered
page). Each block then runs in a fresh ``python``, as a reader pasting it would: a block
may not lean on an earlier block's imports, and a block that sets ``XLA_FLAGS`` before
importing JAX (the data-parallel one) gets the devices it asks for. Tracebacks name the
document and its line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README_MAX_LINES = 200  # the front page: what funcnet is, a taste, the two commands, the map, links


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


def test_the_readme_is_a_front_page_and_names_this_machine_nowhere():
    readme = (ROOT / "README.md").read_text()
    lines = len(readme.splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/ (at most {README_MAX_LINES})"
    for command in ('pip install -e ".[torch]" && python -m comparisons', 'pip install -e ".[test]" && python -m pytest -q'):
        assert f"python3 -m venv .venv && . .venv/bin/activate && {command}\n" in readme, command
    for path in DOCS:  # figures are tied to the machine on the Benchmarks page, not to "this machine"
        if path.name in ("errors.md",):  # generated from real runs: quotes the command's own messages
            continue
        text = " ".join(path.read_text().split())
        assert not re.search(r"\bthis (2-core |shared |shared 2-core )?machine\b", text), path.relative_to(ROOT)


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


# ----------------------------------------------------------------------------- printed figures
def funcnet_command(command: str) -> str:
    """The output of a ``funcnet ...`` command line quoted in the docs, run from this checkout."""
    import shlex

    argv = shlex.split(command)
    assert argv[0] == "funcnet", command
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
    done = subprocess.run([sys.executable, "-c", "import sys; from funcnet.cli import main; sys.exit(main(sys.argv[1:]))",
                           *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stderr[-2000:]}"
    return done.stdout


def _paragraph(page: str, start: str) -> str:
    text = " ".join((ROOT / page).read_text().split())  # lines joined, as the page shows them
    i = text.index(start)
    return text[i: i + 1200]


def test_memory_guide_transformer_figures_are_what_the_command_prints():
    import re

    paragraph = _paragraph("docs/guides/memory.md", "**Memory.** `funcnet memory --transformer")
    command = re.search(r"`(funcnet memory --transformer[^`]+)`", paragraph).group(1)
    printed = funcnet_command(command)
    rows = {m.group(1): m.group(2) for m in re.finditer(r"(params|grads|optimizer|activations)\s*│\s*[\d,]+\s*│\s*"
                                                          r"([\d.]+) GB", printed)}
    n_params = re.search(r"([\d,]+) parameters", printed).group(1)
    claimed = re.search(r"the ([\d.]+)B parameters of that shape, ([\d.]+) GB params \+ ([\d.]+) GB grads \+ "
                        r"([\d.]+) GB Adam \+ ([\d.]+) GB of activations", paragraph)
    assert claimed, paragraph
    assert claimed.group(1) == f"{int(n_params.replace(',', '')) / 1e9:.2f}"
    assert claimed.groups()[1:] == (rows["params"], rows["grads"], rows["optimizer"], rows["activations"]), \
        (claimed.groups(), rows)


def test_memory_guide_7b_table_figures_are_what_the_command_prints():
    import re

    paragraph = _paragraph("docs/guides/memory.md", "`funcnet memory --params 7B --optimizer adam` prints")
    printed = funcnet_command("funcnet memory --params 7B --optimizer adam")
    claimed = re.search(r"(\d+) GB of params, (\d+) GB of gradients and (\d+) GB of Adam state \((\d+) GB\)", paragraph)
    rows = {m.group(1): float(m.group(2)) for m in re.finditer(r"(params|grads|optimizer)\s*│\s*[\d,]+\s*│\s*"
                                                                r"([\d.]+) GB", printed)}
    assert claimed and rows, (paragraph, printed)
    params, grads, adam, total = map(int, claimed.groups())
    assert (params, grads, adam) == (round(rows["params"]), round(rows["grads"]), round(rows["optimizer"]))
    assert total == params + grads + adam


def test_readme_counts_every_comparison():
    import re

    from comparisons.__main__ import available

    claimed = re.search(r"It covers (\d+) comparisons", (ROOT / "README.md").read_text())
    assert claimed and int(claimed.group(1)) == len(available()), (claimed, available())
