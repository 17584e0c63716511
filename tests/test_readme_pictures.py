"""The README's pictures show what the repository now holds, or the tests say how to retake them.

Each picture records in its PNG text what it was taken of: the comparisons page's picture the
counts of its run, the site's pictures the digests of their pages' sources. A test that only
looked at the files' presence would not see a picture of an older run (12 comparisons and 231
checks, where a run gives 21 and 516) or of a front page whose contents changed."""

import json
from pathlib import Path

import pytest
from PIL import Image

from comparisons._screenshot import run_counts
from docs_hooks import screenshots

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "img"
SAVED = ROOT / "docs" / "data" / "comparisons.json"  # kept true by tests/test_saved_run.py


def _text(png: str) -> dict:
    return dict(Image.open(IMG / png).text)


def test_comparisons_picture_shows_the_saved_runs_counts():
    shown = _text("comparisons_page.png")
    saved = run_counts(SAVED)
    assert {k: shown.get(k) for k in saved} == saved, (
        "docs/img/comparisons_page.png is a picture of another run: retake it with python -m comparisons "
        "--from-json docs/data/comparisons.json --html runs/page && python -m comparisons._screenshot "
        "runs/page/index.html docs/img/comparisons_page.png --results docs/data/comparisons.json")
    from comparisons.__main__ import available
    assert int(saved["comparisons"]) == len(available())


def test_run_counts_reads_a_results_file(tmp_path):
    # the oracle: counts written by hand for a two-comparison run with three checks
    run = {"results": [{"name": "a", "checks": [{}, {}]}, {"name": "b", "checks": [{}]}]}
    (tmp_path / "results.json").write_text(json.dumps(run))
    assert run_counts(tmp_path / "results.json") == {"comparisons": "2", "checks": "3"}


@pytest.mark.parametrize("png", sorted(screenshots.PAGES))
def test_site_pictures_were_taken_of_the_current_sources(png):
    shown = _text(png)
    now = screenshots.sources()[png]
    stale = [name for name, digest in now.items() if shown.get(name) != digest]
    assert not stale, (f"docs/img/{png} was taken before {', '.join(stale)} changed: retake the site's pictures "
                       f"with python -m docs_hooks.screenshots (needs chromium and chromium-driver)")


def test_the_front_pictures_first_screen_is_the_readme_above_its_first_picture():
    readme = "# funcnet\n\nintro\n\n![front](docs/img/site-front.png)\nbelow\n"
    assert screenshots.first_screen(readme) == "# funcnet\n\nintro\n"
