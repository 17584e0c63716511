"""The mkdocs hook (mkdocs.yml ``hooks:``) that adds the generated pages to the site.

At build time, without running anything heavy, it adds:

- ``index.md``: README.md with its links rewritten for the site (``docs_hooks.front``);
- ``concepts/index.md`` (the concept map) and ``concepts/NAME.md`` with its plots, one per
  comparison of the runner's registry, from the saved run ``docs/data/comparisons.json``
  (``docs_hooks.concepts``), each listed in the nav under Concepts;
- the figures of ``benchmarks.md``: its placeholders filled from the saved benchmark runs
  ``docs/data/bench_NAME.json`` and one SVG plot per run, ``img/bench-NAME.svg``
  (``docs_hooks.benchmarks``, ``docs_hooks.bench_plots``);
- the body of ``reference/cli.md``: every subcommand and flag of ``funcnet``, from its argparse
  parsers (``docs_hooks.cli_reference``); the file itself holds only a title and a comment, so
  that links to it are links to a file of the repository.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

__all__ = ["on_config", "on_files", "on_page_markdown"]

ROOT = Path(__file__).resolve().parents[1]


def _on_path() -> None:
    """The hook imports this checkout's comparisons, funcnet and docs_hooks. mkdocs restores
    ``sys.path`` after loading a hook file, so this runs when the hook is called, not at import."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))

_run = {}  # the saved run, read once per build: dtype and results in the registry's order


def _comparisons() -> tuple[str, list]:
    if not _run:
        from comparisons.__main__ import available
        from docs_hooks.concepts import SAVED_RUN, load_run

        names = available()
        try:
            dtype, results = load_run(ROOT / SAVED_RUN, names)
        except ValueError as e:
            raise PluginError(str(e)) from None
        _run.update(dtype=dtype, results=[results[n] for n in names])
    return _run["dtype"], _run["results"]


def on_config(config):
    """Lists each comparison's page under Concepts, after the concept map."""
    _on_path()
    _run.clear()  # `mkdocs serve` rebuilds: read the saved run again
    _, results = _comparisons()
    for entry in config["nav"]:
        if isinstance(entry, dict) and "Concepts" in entry:
            entry["Concepts"] = ["concepts/index.md"] + [{r.name: f"concepts/{r.name}.md"} for r in results]
            return config
    raise PluginError("mkdocs.yml's nav has no Concepts section for the comparisons' pages")


def on_files(files, config):
    from docs_hooks import concepts, front

    def add(path: str, content) -> None:
        if files.get_file_from_path(path) is not None:
            raise PluginError(f"docs/{path} exists, but the site generates {path}; remove docs/{path}")
        files.append(File.generated(config, path, content=content))

    add("index.md", front.front_page((ROOT / "README.md").read_text(encoding="utf-8")))
    dtype, results = _comparisons()
    add("concepts/index.md", concepts.concept_map(results, dtype))
    for r in results:
        drawn = concepts.figures(r)
        for name, _, png in drawn:
            add(f"concepts/{name}", png)
        add(f"concepts/{r.name}.md", concepts.comparison_page(r, dtype, [(n, t) for n, t, _ in drawn]))
    from docs_hooks import bench_plots, benchmarks

    for name in benchmarks.BENCHES:
        try:
            picture = bench_plots.svg(name, benchmarks.load(name))
        except ValueError as e:
            raise PluginError(str(e)) from None
        if picture is not None:
            add(f"img/bench-{name}.svg", picture)
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri == "reference/cli.md":
        from docs_hooks import cli_reference

        return cli_reference.cli_page()
    if page.file.src_uri == "benchmarks.md":
        from docs_hooks import benchmarks

        try:
            return benchmarks.render(markdown)
        except ValueError as e:
            raise PluginError(f"docs/benchmarks.md: {e}") from None
    return markdown
