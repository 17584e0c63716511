"""The README's pictures of the documentation site, taken in headless Chromium.

    python -m docs_hooks.screenshots            # builds the site, writes docs/img/site-*.png

Builds the site (``mkdocs build --strict``) into a temporary folder, serves it over http
and saves the front page and one concept page at 1280 x 800 as 8-bit palette PNGs
(``comparisons._screenshot.screenshot``), each with the digests of its page's sources in its
PNG text (``sources``), which tests/test_readme_pictures.py checks. Needs Chromium, chromedriver and selenium, as the
site's test does.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
__all__ = ["PAGES", "take"]

# picture -> page of the site
PAGES = {"site-front.png": "", "site-concept.png": "concepts/mixed_precision/#pytorch-and-jax"}


def first_screen(readme: str) -> str:
    """The part of README.md the front page's picture shows: everything above its first picture."""
    return readme.split("\n![", 1)[0]


def _saved(name: str) -> dict:
    """The saved run's result of comparison ``name`` (docs/data/comparisons.json): what its page shows."""
    run = json.loads((ROOT / "docs" / "data" / "comparisons.json").read_text())
    return next(r for r in run["results"] if r["name"] == name)


def sources() -> dict[str, dict[str, str]]:
    """picture -> ``{name: sha256}`` of the sources its page is made of (the site's nav in
    mkdocs.yml for both; the README's first screen for the front page, which docs_hooks.front
    makes from README.md; the comparison's own file and its saved result for the concept page).
    Recorded in each PNG's text; tests/test_readme_pictures.py recomputes them."""
    import hashlib

    digest = lambda text: hashlib.sha256(text.encode()).hexdigest()  # noqa: E731
    nav = digest((ROOT / "mkdocs.yml").read_text())
    return {
        "site-front.png": {"mkdocs.yml": nav, "README.md first screen": digest(first_screen((ROOT / "README.md").read_text()))},
        "site-concept.png": {"mkdocs.yml": nav,
                             "comparisons/mixed_precision.py": digest((ROOT / "comparisons" / "mixed_precision.py").read_text()),
                             "saved run of mixed_precision": digest(json.dumps(_saved("mixed_precision"), sort_keys=True))},
    }


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def take(site: Path, out: Path, *, width: int = 1280, height: int = 800) -> list[Path]:
    """Serve the built ``site`` and save each of ``PAGES`` into ``out``."""
    from comparisons._screenshot import screenshot

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(_QuietHandler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        about = sources()
        return [screenshot(base + page, out / png, width=width, height=height, viewport=True, about=about[png])
                for png, page in PAGES.items()]
    finally:
        server.shutdown()
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs_hooks.screenshots", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="folder of the pictures")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", tmp],
                       cwd=ROOT, check=True)
        for path in take(Path(tmp), args.out):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
