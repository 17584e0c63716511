"""The documentation site: ``mkdocs build --strict`` passes, and the built site works in Chromium.

One build (a module-scoped fixture, ``mkdocs build --strict`` in a child process) serves every
test: strict mode fails the build on any warning, a broken link, reference or anchor included.
The browser test serves the build over http (the site's search needs it; ``file://`` does not
load its index) and needs Debian's ``chromium`` and ``chromium-driver`` and selenium, as
tests/test_comparisons_html.py does. Without them, or without mkdocs-material and
mkdocstrings-python, the tests skip, except in CI (``CI=true``), where they fail.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.browser import browser_or_skip

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    try:
        import material  # noqa: F401  (mkdocs-material, which brings mkdocs)
        import mkdocstrings_handlers.python  # noqa: F401
    except ImportError as e:
        why = f"{e.name} is missing: mkdocs-material and mkdocstrings-python are in the test extra (pip install -e '.[test]')"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must build the site: {why}")
        pytest.skip(why)
    out = tmp_path_factory.mktemp("site")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, f"mkdocs build --strict failed ({seconds:.1f} s):\n{done.stderr[-6000:]}"
    return out


def _saved_run() -> dict:
    return json.loads((ROOT / "docs" / "data" / "comparisons.json").read_text())


def test_strict_build_writes_every_page(site):
    from comparisons.__main__ import available

    for page in ["index.html", "getting-started/index.html", "concepts/index.html", "reference/cli/index.html",
                 "design/index.html", "errors/index.html", "search/search_index.json"]:
        assert (site / page).is_file(), page
    names = available()
    assert sorted(p.parent.name for p in (site / "concepts").glob("*/index.html")) == sorted(names)
    concept_map = (site / "concepts" / "index.html").read_text()
    assert all(f'href="{n}/"' in concept_map for n in names), "the concept map links every comparison"
    # the front page is the README, its links into docs/ made site links
    front = (site / "index.html").read_text()
    assert "PyTorch&rsquo;s core ideas" in front or "PyTorch's core ideas" in front
    assert not re.search(r'(href|src)="docs/', front)


def test_concept_pages_show_the_saved_run(site):
    saved = {r["name"]: r for r in _saved_run()["results"]}
    for name, r in saved.items():
        page = (site / "concepts" / name / "index.html").read_text()
        assert page.count('class="tabbed-set') == 1 and ">PyTorch</label>" in page and ">JAX</label>" in page, name
        text = re.sub(r"<[^>]+>", "", page)
        for check in r["checks"]:
            assert check["name"].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in text, \
                (name, check["name"])
        assert len(list((site / "concepts" / name).parent.glob(f"{name}-*.png"))) == len(r["series"]), name


def test_cli_reference_lists_every_flag_with_its_default(site):
    from docs_hooks.cli_reference import subcommands

    page = (site / "reference" / "cli" / "index.html").read_text()
    commands = subcommands()
    assert {name for name, *_ in commands} >= {"train", "sample", "info", "memory", "port"}
    for name, _, parser in commands:
        assert f"funcnet {name}" in page
        for action in parser._actions:
            for flag in action.option_strings:
                assert f"<code>{flag}" in page, (name, flag)
            if isinstance(action.default, (int, float)) and not isinstance(action.default, bool):
                assert f"<code>{action.default}</code>" in page, (name, action.dest, action.default)
    assert isinstance(commands[0][2], argparse.ArgumentParser)


def test_reference_pages_are_generated_from_the_docstrings(site):
    for page, objects in {"train": ["funcnet.train.make_step", "funcnet.train.fit"],
                          "nn": ["funcnet.nn.Linear"], "losses": ["funcnet.losses.cross_entropy"]}.items():
        html = (site / "reference" / page / "index.html").read_text()
        for obj in objects:
            assert f'id="{obj}"' in html, (page, obj)


def test_module_docstrings_code_renders_as_code(site):
    """A module docstring's torch code is a fenced block, which the reference pages show as code
    (reST's ``::`` literal blocks came out as a stray colon and a plain paragraph)."""
    html = (site / "reference" / "loader" / "index.html").read_text()
    block = re.search(r'<div class="highlight"><pre>.*?</pre></div>', html[html.index("torch counterpart"):], re.S)
    assert block and "DataLoader" in re.sub(r"<[^>]+>", "", block.group(0))
    for page in ("loader", "train"):
        assert "::" not in re.sub(r"<[^>]+>", "", (site / "reference" / page / "index.html").read_text()
                                   .split('<article', 1)[1]).replace("::: ", ""), page


def test_benchmarks_page_shows_every_saved_run_with_its_plot(site):
    import html as html_lib

    from docs_hooks import benchmarks

    page = (site / "benchmarks" / "index.html").read_text()
    assert "{{" not in page
    text = html_lib.unescape(re.sub(r"<[^>]+>", "", page))
    for name in benchmarks.BENCHES:
        saved = benchmarks.load(name)
        assert saved["run"]["command"] in text, name
        plot = site / "img" / f"bench-{name}.svg"
        if f"{{{{ plot {name} }}}}" in (ROOT / "docs" / "benchmarks.md").read_text():
            assert plot.is_file() and plot.read_text().lstrip().startswith("<?xml") and "<svg" in plot.read_text()
            assert f'src="../img/bench-{name}.svg"' in page, name


# ----------------------------------------------------------------------------- in a browser
@pytest.fixture(scope="module")
def served(site):
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def driver():
    drv = browser_or_skip("the site")
    yield drv
    drv.quit()


def _severe(driver) -> list:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_site_in_chromium(served, driver):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver.set_window_size(1280, 900)
    driver.get(served)
    assert driver.title.startswith("funcnet"), driver.title
    links = {a.get_attribute("href") for a in driver.find_elements(By.CSS_SELECTOR, "nav.md-nav--primary a.md-nav__link")
             if a.get_attribute("href")}
    pages = sorted({link.split("#")[0] for link in links if link.startswith(served)})
    assert len(pages) >= 30, pages  # front page, getting started, concepts, guides, reference, ...
    for page in pages:
        driver.get(page)
        assert driver.find_elements(By.CSS_SELECTOR, "article.md-content__inner h1"), f"{page}: no page there"
        assert not _severe(driver), page

    wait = WebDriverWait(driver, 15)
    for word, expected in (("GradScaler", "mixed_precision"), ("pipeline", "pipeline_parallel")):
        driver.get(served)
        box = wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "input.md-search__input")))
        box.click()
        box.send_keys(word)
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "li.md-search-result__item"))
        hits = [a.get_attribute("href") for a in driver.find_elements(By.CSS_SELECTOR, "li.md-search-result__item a")]
        assert any(f"/concepts/{expected}/" in h for h in hits), (word, hits)
        box.send_keys(Keys.ESCAPE)

    driver.get(f"{served}concepts/autograd/")
    tabs = driver.find_element(By.CSS_SELECTOR, ".tabbed-set")
    blocks = tabs.find_elements(By.CSS_SELECTOR, ".tabbed-content > .tabbed-block")
    torch_code, jax_code = (block.find_element(By.TAG_NAME, "pre") for block in blocks)
    assert torch_code.is_displayed() and not jax_code.is_displayed()
    tabs.find_element(By.XPATH, ".//label[normalize-space()='JAX']").click()
    wait.until(lambda d: jax_code.is_displayed())
    assert not torch_code.is_displayed()
    assert "jax" in jax_code.text.lower()
    assert not _severe(driver)
