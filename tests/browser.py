"""Headless Chromium for the tests that open a page (the comparisons page, the docs site).

Without chromium, chromedriver or selenium a browser test skips, except in CI (``CI=true``),
where it fails: there the page must have been seen by a browser (``.ci/run`` installs them).
"""

from __future__ import annotations

import os
import shutil

import pytest


def _browser():
    """A headless Chromium driver, or the reason there is none."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None, "selenium is not installed (pip install -e '.[test]')"
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not binary or not driver_path:
        return None, "chromium/chromedriver are not installed (apt-get install chromium chromium-driver)"
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1440,1000"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver_path), options=opts), ""


def browser_or_skip(what: str):
    """A headless Chromium driver to open ``what`` with; the test skips without one, or fails in CI."""
    driver, why = _browser()
    if driver is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must open {what} in a browser: {why}")
        pytest.skip(why)
    return driver
