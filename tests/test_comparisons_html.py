"""``python -m comparisons --html DIR``: the page, opened from disk in headless Chromium.

The browser test needs Debian's ``chromium`` and ``chromium-driver`` and selenium (the
``test`` extra); ``.ci/run`` installs them. Without them it skips, except in CI
(``CI=true``), where it fails: the page must have been seen by a browser there.
"""

import re
from pathlib import Path

import pytest

from comparisons import __main__ as runner
from comparisons._core import Check, Options, Result, Seconds, Side, close
from comparisons._page import CONCEPTS, render, write_page
from tests.browser import browser_or_skip

REAL = ["autograd", "autograd_from_scratch"]  # quick ones; the second has a plot


def _failing():
    """A comparison whose verdict fails, with a plot and a source line wider than its column."""
    long_line = "total = " + " + ".join(f"weights_{i}.sum()" for i in range(12))
    return Result("broken", "a failing comparison", Side(f"def f():\n    {long_line}\n    return total", "1.0",
                                                         Seconds(0.01, 0.0, 0.01)),
                  Side("def g():\n    return 2.0  # <b>not bold</b>", "2.0", Seconds(1.5, 1.4, 0.02)),
                  [close("values agree", 2.0, 1.0, rtol=0, atol=0, why="one is not two"),
                   Check("a condition", True, "held")],
                  series={"loss per step": {"torch": [1.0, 0.5, 0.25], "jax": [1.0, 0.6, 0.3]}})


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    results = [runner.run_one(name, Options()) for name in REAL] + [_failing()]
    assert [r.ok for r in results] == [True, True, False], [r.report() for r in results]
    return write_page(results, tmp_path_factory.mktemp("page"), Options()), results


@pytest.fixture(scope="module")
def driver():
    drv = browser_or_skip("the page")
    yield drv
    drv.quit()


def test_page_is_self_contained(page):
    path, results = page
    text = path.read_text()
    # nothing to fetch: no script, no external style sheet, images inline
    assert "<script" not in text and not re.search(r'(src|href)="(?!#|data:)', text)
    assert text.count('src="data:image/png;base64,') == sum(len(r.series) for r in results) == 2
    assert "&lt;b&gt;not bold&lt;/b&gt;" in text  # sources are escaped
    assert "@media print" in text and "@media (max-width: 900px)" in text
    assert "2 comparisons agree" not in text and "1 of 3 comparisons fail (broken)" in text


def test_page_in_chromium(page, driver):
    from selenium.webdriver.common.by import By

    path, results = page
    driver.set_window_size(1440, 1000)
    driver.get(path.resolve().as_uri())
    assert driver.title.startswith("funcnet comparisons")
    severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe

    # the summary: one row per comparison, each linking to its section, with the timing split
    rows = driver.find_elements(By.CSS_SELECTOR, "table.summary tbody tr")
    assert [r.find_element(By.TAG_NAME, "a").text for r in rows] == [r.name for r in results]
    assert [r.find_elements(By.TAG_NAME, "td")[1].text for r in rows] == ["PASS", "PASS", "FAIL"]
    # torch eager compiled nothing: n/a, not a measured "0.00 ms"
    assert rows[2].text.split()[2:] == ["1/2", "10.0", "ms", "n/a", "10.0", "ms", "1.50", "s", "1.40", "s",
                                        "20.0", "ms"]
    # each concept-map row links to a section that exists
    for row in driver.find_elements(By.CSS_SELECTOR, "table.concepts tbody tr"):
        for link in row.find_elements(By.TAG_NAME, "a"):
            assert driver.find_elements(By.ID, link.get_attribute("href").split("#")[1])
    linked = {a.text for a in driver.find_elements(By.CSS_SELECTOR, "table.concepts a")}
    assert linked == set(REAL)

    sections = driver.find_elements(By.CSS_SELECTOR, "section.comparison")
    assert [s.get_attribute("id") for s in sections] == [f"cmp-{r.name}" for r in results]
    for section, result in zip(sections, results):
        torch_src = section.find_element(By.CSS_SELECTOR, "pre.src.torch")
        jax_src = section.find_element(By.CSS_SELECTOR, "pre.src.jax")
        t, j = torch_src.rect, jax_src.rect
        # side by side: same top, JAX to the right of PyTorch, each a real column
        assert abs(t["y"] - j["y"]) < 1 and j["x"] >= t["x"] + t["width"] and min(t["width"], j["width"]) > 500, (t, j)
        assert torch_src.text.split("\n")[0] == result.torch.source.split("\n")[0]
        checks = section.find_elements(By.CSS_SELECTOR, "table.checks tbody tr")
        assert [c.find_elements(By.TAG_NAME, "td")[1].text for c in checks] == [c.name for c in result.checks]
        assert [c.find_elements(By.TAG_NAME, "td")[0].text for c in checks] == \
            ["✓" if c.ok else "✗" for c in result.checks]
        tolerances = [c.find_elements(By.TAG_NAME, "td")[3].text for c in checks]
        assert tolerances == [c.tolerance for c in result.checks]
        images = section.find_elements(By.TAG_NAME, "img")
        assert len(images) == len(result.series)
        assert all(driver.execute_script("return arguments[0].naturalWidth", img) > 100 for img in images)

    # on screen too, a source line wider than its column folds: no box scrolls sideways
    wide = sections[2].find_element(By.CSS_SELECTOR, "pre.src.torch")
    assert driver.execute_script("return arguments[0].scrollWidth <= arguments[0].clientWidth", wide)

    # a narrow window stacks the sources, PyTorch above JAX
    driver.set_window_size(700, 1000)
    t, j = (sections[0].find_element(By.CSS_SELECTOR, f"pre.src.{k}").rect for k in ("torch", "jax"))
    assert j["y"] > t["y"] + t["height"] - 1 and abs(t["x"] - j["x"]) < 1
    # printed, long source lines wrap instead of being cut
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": "print"})
    wrap = driver.execute_script("return getComputedStyle(arguments[0]).whiteSpace",
                                 sections[0].find_element(By.CSS_SELECTOR, "pre.src.torch"))
    assert wrap == "pre-wrap"
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"media": ""})
    assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_cli_writes_the_page(monkeypatch, tmp_path):
    monkeypatch.setattr(runner, "run_one", lambda name, opts: _failing() if name == "memory" else Result(
        name, "t", Side("a = 1", "1", Seconds(0.001)), Side("a = 1", "1", Seconds(0.002)), [Check("c", True, "d")]))
    assert runner.main(["paradigms", "memory", "--no-source", "--no-page", "--html", str(tmp_path / "page")]) == 1
    text = (tmp_path / "page" / "index.html").read_text()
    assert 'id="cmp-paradigms"' in text and 'id="cmp-broken"' in text


def test_concept_map_matches_the_readme():
    readme = Path(__file__).resolve().parents[1] / "README.md"
    if not readme.exists():
        pytest.skip("no README.md beside the package")
    text = readme.read_text()
    table = text[text.index("## Concept map"):].split("\n\n")[1]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    expected = [[concept, ours, ", ".join(f"`{n}`" for n in names)] for concept, ours, names in CONCEPTS]
    assert rows == expected


def test_the_concept_map_names_every_comparison():
    from comparisons.__main__ import available

    named = {name for _, _, names in CONCEPTS for name in names}
    assert named == set(available()), (sorted(set(available()) - named), sorted(named - set(available())))


def test_render_escapes_and_marks_failures():
    html = render([_failing()])
    assert 'class="badge fail"' in html and "one is not two" in html and "rtol 0, atol 0" in html


def test_the_readme_screenshot_command_writes_a_picture_of_the_page(tmp_path):
    from comparisons import _screenshot

    browser_or_skip("the page").quit()
    page = write_page([_failing()], tmp_path / "page", Options())
    assert _screenshot.main([str(page), str(tmp_path / "shot.png")]) == 0
    from PIL import Image

    with Image.open(tmp_path / "shot.png") as image:
        assert image.size[0] == 1440 and image.size[1] > 1000 and image.mode == "P"
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert "python -m comparisons._screenshot runs/comparisons/index.html docs/img/comparisons_page.png" in readme
