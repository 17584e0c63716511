"""The docstring examples of funcnet's public API run, in one process, and say what they print.

Every name in ``funcnet.__all__`` carries an ``Examples:`` section (a module in its module
docstring), and so does each of ``funcnet.nn``'s layer-family modules (one example per
family, not one per class: the classes of a family share their calling convention).
"""

import doctest
import importlib
import inspect
import pkgutil

import funcnet
import funcnet.nn

# funcnet.parallel's example waits for its move into a package of its own
_NOT_YET = {"parallel"}


def _modules():
    found = [funcnet]
    for info in pkgutil.walk_packages(funcnet.__path__, "funcnet."):
        if info.name.rsplit(".", 1)[-1] != "__main__":  # importing it would run a command
            found.append(importlib.import_module(info.name))
    return found


def _has_example(obj) -> bool:
    text = inspect.getdoc(obj) or ""
    return "Examples:" in text and ">>> " in text


def test_the_public_api_has_an_example_each():
    missing = [name for name in funcnet.__all__ if name not in _NOT_YET and not _has_example(getattr(funcnet, name))]
    families = sorted({getattr(funcnet.nn, name).__module__ for name in funcnet.nn.__all__})
    assert len(families) >= 15, families
    missing += [m for m in families if not _has_example(importlib.import_module(m))]
    assert not missing, f"no Examples: section with a >>> example: {missing}"


def test_the_docstring_examples_run_and_print_what_they_say():
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    tests = {t.name: t for module in _modules() for t in finder.find(module) if t.examples}
    assert len(tests) >= 35, sorted(tests)  # the walk found them
    for name in sorted(tests):
        runner.run(tests[name])
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples failed (printed above)"


def test_ruff_passes_over_the_whole_tree():
    # pyflakes and pycodestyle's errors over benchmarks, comparisons, examples and tests too (an
    # unused import or variable there is as misleading to a reader as in the library)
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=root,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_ruff_checks_the_docstrings_of_the_library():
    # pyproject.toml's [tool.ruff.lint]: pydocstyle (google convention) over funcnet/
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "funcnet"], cwd=root,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # the check can fail: a public function without a docstring, as if in funcnet/ (read from stdin)
    probe = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--stdin-filename",
                            "funcnet/probe.py"], cwd=root, input='"""A module."""\n\n\ndef public(x):\n    return x\n',
                           capture_output=True, text=True, timeout=120, check=False)
    assert probe.returncode == 1 and "D103" in probe.stdout, probe.stdout + probe.stderr
