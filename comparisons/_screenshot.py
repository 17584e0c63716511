"""The README's picture of the comparisons page, taken in headless Chromium.

    python -m comparisons                                  # the run: runs/comparisons/index.html
    python -m comparisons --from-json r.json --html page   # or a saved run's page, without running again
    python -m comparisons._screenshot runs/comparisons/index.html docs/img/comparisons_page.png
    python -m comparisons._screenshot page/index.html docs/img/comparisons_page.png --results r.json

The picture records the run's counts (comparisons, checks; from results.json beside the
page) in its PNG text, and tests/test_readme_pictures.py compares them with the saved run
docs/data/comparisons.json, so a picture of an older run fails the tests.
Needs Debian's ``chromium`` and ``chromium-driver`` and selenium (the ``test`` extra), as the
page test does; without them it exits 2 with one line naming what to install. The picture
is the top of the page (headline, summary, concept map) at 1440 pixels wide, saved as an
8-bit palette PNG to keep the repository small.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path


class MissingTool(RuntimeError):
    """A program or package the screenshot needs is not installed; the message says how to install it."""


def _require_selenium() -> None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        raise MissingTool('selenium is not installed; it comes with the test extra: pip install -e ".[test]"') \
            from None


def screenshot(page: Path | str, png: Path, *, width: int = 1440, height: int = 1960, viewport: bool = False,
               about: dict[str, str] | None = None) -> Path:
    """Save ``page`` (a file, or an http:// URL) as seen in a ``width`` x ``height`` window to ``png``
    (``viewport``: the page's own area is that size, the picture too). ``about`` goes into the PNG's
    text chunks: what the picture was taken of (a run's counts, its sources' digests), which the
    tests compare with the repository so a stale picture fails."""
    _require_selenium()
    from PIL import Image
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not binary or not driver_path:
        raise MissingTool("chromium and chromedriver are needed: apt-get install chromium chromium-driver")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}", "--hide-scrollbars"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    try:
        if viewport:
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                   {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        driver.get(page if "://" in str(page) else Path(page).resolve().as_uri())
        png.parent.mkdir(parents=True, exist_ok=True)
        raw = png.with_suffix(".raw.png")
        driver.save_screenshot(str(raw))
    finally:
        driver.quit()
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    for key, value in (about or {}).items():
        info.add_text(key, str(value))
    Image.open(raw).convert("RGB").quantize(colors=256).save(png, optimize=True, pnginfo=info)
    raw.unlink()
    return png


def run_counts(results: Path) -> dict[str, str]:
    """``{"comparisons": N, "checks": M}`` of a run's results.json (the page's own folder holds
    one): what the picture of its page shows in its summary."""
    import json

    run = json.loads(Path(results).read_text())["results"]
    return {"comparisons": str(len(run)), "checks": str(sum(len(r["checks"]) for r in run))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m comparisons._screenshot", description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path,
                        help="the page's index.html (python -m comparisons writes runs/comparisons/index.html)")
    parser.add_argument("png", type=Path, help="where to write the picture")
    parser.add_argument("--results", type=Path, default=None,
                        help="the run the page shows (default: results.json beside the page; a --from-json page "
                             "has none: pass the saved run)")
    args = parser.parse_args(argv)
    if not args.page.is_file():
        print(f"{args.page}: no such page; write one with python -m comparisons (runs/comparisons/index.html)",
              file=sys.stderr)
        return 2
    try:
        results = args.results or args.page.parent / "results.json"
        about = run_counts(results) if results.is_file() else None
        print(f"wrote {screenshot(args.page, args.png, about=about)}")
    except MissingTool as e:
        print(f"python -m comparisons._screenshot: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
