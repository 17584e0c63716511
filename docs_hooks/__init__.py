"""The documentation site's build hooks (mkdocs.yml ``hooks:``): pages generated at build time.

``site`` is the hook mkdocs loads; ``front`` turns README.md into the front page, ``concepts``
writes one page per comparison from the saved run and the concept map, ``cli_reference`` writes
the command line's reference from its argparse parsers, ``benchmarks`` fills the Benchmarks
page's figures from the saved benchmark runs and ``bench_plots`` draws their plots.
``save_run`` and ``save_bench`` save those runs.
"""

__all__ = ["bench_plots", "benchmarks", "cli_reference", "concepts", "front"]
