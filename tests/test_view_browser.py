"""The viewer in a real browser: headless Chromium (Debian's chromium + chromium-driver, .ci/run
installs them) driven by selenium over the pages of a tiny-model run (tests/view_run.py).

Skipped, with the reason, only where no Chromium or chromedriver can be found.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest
from view_run import block_states, tiny_view_run

from arbor_cli.view import embedded_data
from arbor_cli.view.page import problem_page

#: viewer.js's block fills by state
COLORS = {"whole": "#2e7d32", "shared": "#00838f", "partial": "#f9a825", "host": "#7e57c2", "dropped": "#c62828",
          "released": "#cfcfcf", "future": "#ffffff"}  # fmt: skip
CHROMIUM = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def _find_browser() -> tuple[str, str]:
    binary = os.environ.get("ARBOR_CHROMIUM") or next((p for p in map(shutil.which, CHROMIUM) if p), None)
    driver = os.environ.get("ARBOR_CHROMEDRIVER") or shutil.which("chromedriver")
    if binary is None or driver is None:
        pytest.skip(
            "no headless Chromium here (chromium and chromedriver not on PATH): install Debian's "
            "`chromium chromium-driver` (.ci/run does) or set ARBOR_CHROMIUM / ARBOR_CHROMEDRIVER"
        )
    return binary, driver


@pytest.fixture(scope="module")
def browser():
    binary, driver_path = _find_browser()
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the dev extra: pip install -e .[dev]")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,800"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    driver.execute_cdp_cmd(  # the viewport itself 1280 x 800
        "Emulation.setDeviceMetricsOverride", {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False}
    )
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, data_dir, one_torch_thread) -> Path:
    return tiny_view_run(tmp_path_factory.getbasetemp(), data_dir)


def open_page(driver, path: Path, fragment: str = "") -> list[dict]:
    """Load a page from disk; returns the console entries it logged."""
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(path.resolve().as_uri() + fragment)
    driver.find_element("css selector", "body")
    return driver.get_log("browser")


def fills(driver) -> dict[int, tuple[str, str]]:
    """Every block's (fill, device/host/dropped) as drawn."""
    rows = driver.execute_script(
        "return Array.from(document.querySelectorAll('#tree g.node')).map(g => "
        "[+g.dataset.id, g.querySelector('rect.block').getAttribute('fill'), g.dataset.res])"
    )
    return {i: (fill, res) for i, fill, res in rows}


def test_pages_load_without_console_errors(browser, run_dir):
    for name in ("index.html", "900.html", "901.html"):
        logs = open_page(browser, run_dir / "view" / name)
        assert [e for e in logs if e["level"] in ("SEVERE", "WARNING")] == [], name
    assert browser.execute_script("return document.querySelectorAll('#tree g.node').length") > 0


def test_the_svg_has_one_element_per_node(browser, run_dir):
    page = embedded_data((run_dir / "view" / "900.html").read_text())
    open_page(browser, run_dir / "view" / "900.html")
    ids = browser.execute_script("return Array.from(document.querySelectorAll('#tree g.node')).map(g => +g.dataset.id)")
    assert sorted(ids) == [n["id"] for n in page["tree"]["nodes"]] and len(ids) == len(set(ids))


def test_moving_the_slider_recolours_exactly_the_blocks_that_changed(browser, run_dir):
    page = embedded_data((run_dir / "view" / "900.html").read_text())
    expected = block_states(page["tree"], page["residency"], page["trace"])
    open_page(browser, run_dir / "view" / "900.html")
    changes = [i for i in range(1, len(expected)) if expected[i] != expected[i - 1]]
    step = next(i for i in changes if any(s in ("host", "partial") for s in expected[i].values()))
    slider = browser.find_element("id", "step")
    browser.execute_script("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'))",
                           slider, step - 1)  # fmt: skip
    before = fills(browser)
    browser.find_element("id", "treebox").click()
    browser.find_element("css selector", "body").send_keys("\ue014")  # ArrowRight: the next step
    assert int(slider.get_attribute("value")) == step
    after = fills(browser)
    recoloured = {i for i in after if after[i][0] != before[i][0]}
    assert recoloured == {i for i in expected[step] if expected[step][i] != expected[step - 1][i]} != set()
    assert all(after[i][0] == COLORS[s] for i, s in expected[step].items())
    moved = {i for i in after if after[i][1] != before[i][1]}  # the device/host/dropped tokens drawn
    in_tree = {n["id"] for n in page["tree"]["nodes"]}
    trace_step = page["trace"][step]["step"]
    prev_step = page["trace"][step - 1]["step"]
    assert moved == {d[1] for d in page["residency"]["deltas"] if prev_step < d[0] <= trace_step and d[1] in in_tree}
    for i in range(len(expected)):  # and every other step, through the page's own setStep
        browser.execute_script("window.arborView.setStep(arguments[0])", i)
        assert {k: v[0] for k, v in fills(browser).items()} == {k: COLORS[s] for k, s in expected[i].items()}, i


def test_a_click_on_a_node_shows_its_text(browser, run_dir):
    page = embedded_data((run_dir / "view" / "900.html").read_text())
    open_page(browser, run_dir / "view" / "900.html")
    best = page["tree"]["best"]
    node = next(n for n in page["tree"]["nodes"] if n["id"] == best)
    assert node["text"].strip()
    browser.find_element("css selector", f"#node-{best} rect.block").click()
    assert browser.find_element("id", "node-text").get_attribute("textContent") == node["text"]
    assert f"#{best}" in browser.find_element("id", "panel").text


def test_hover_shows_the_thought(browser, run_dir):
    from selenium.webdriver import ActionChains

    page = embedded_data((run_dir / "view" / "900.html").read_text())
    open_page(browser, run_dir / "view" / "900.html")
    node = next(n for n in page["tree"]["nodes"] if n["parent"] == page["tree"]["nodes"][0]["id"])
    block = browser.find_element("css selector", f"#node-{node['id']} rect.block")
    ActionChains(browser).move_to_element(block).perform()
    tip = browser.find_element("id", "tip")
    assert tip.is_displayed() and node["text"].strip()[:15] in tip.text and f"#{node['id']}" in tip.text


def test_300_nodes_stay_readable_at_1280x800(browser, tmp_path):
    """A synthetic 300-node tree: nothing overlaps, nothing runs off the side; big subtrees are collapsed to "+n"."""
    path = tmp_path / "big.html"
    path.write_text(problem_page(synthetic_page(300)))
    logs = open_page(browser, path)
    assert [e for e in logs if e["level"] == "SEVERE"] == []
    shown = browser.execute_script(
        "return Array.from(document.querySelectorAll('#tree g.node')).filter(g => g.getAttribute('display') !== 'none')"
        ".map(g => { const r = g.querySelector('rect.block').getBoundingClientRect(); return [+g.dataset.id, r.left,"
        " r.top, r.right, r.bottom]; })"
    )
    box = browser.execute_script(
        "const b = document.getElementById('treebox');"
        "return [b.clientWidth, b.scrollWidth, b.clientHeight, b.scrollHeight]"
    )
    assert box[1] <= box[0] and box[3] <= box[2]  # no scrolling needed
    assert 20 < len(shown) < 300
    for i, a in enumerate(shown):
        for b in shown[i + 1 :]:
            assert a[3] + 4 <= b[1] or b[3] + 4 <= a[1] or a[4] <= b[2] or b[4] <= a[2], (a, b)
    badges = browser.execute_script(
        "return Array.from(document.querySelectorAll('#tree .badge')).filter(t => t.getAttribute('display') !== 'none')"
        ".map(t => +t.textContent.slice(1))"
    )
    assert len(shown) + sum(badges) == 300
    first = browser.find_element("css selector", "#tree .badge[display=inline]")
    first.click()  # a badge expands its subtree
    after = browser.execute_script(
        "return Array.from(document.querySelectorAll('#tree g.node'))"
        ".filter(g => g.getAttribute('display') !== 'none').length"
    )
    assert after > len(shown)


def synthetic_page(n: int) -> dict:
    """Page data of an n-node ToT-like tree of depth 4: 16 children per kept node, the best 6 of
    each level kept, the rest pruned (released)."""
    rng = random.Random(0)
    nodes = [_node(0, None, 0)]
    frontier = [0]
    while len(nodes) < n:
        level = []
        for parent in frontier:
            for _ in range(16):
                if len(nodes) < n:
                    nodes.append(_node(len(nodes), parent, nodes[parent]["depth"] + 1, rng.random()))
                    level.append(len(nodes) - 1)
        frontier = sorted(level, key=lambda i: -nodes[i]["value"])[:6]
        for i in set(level) - set(frontier):
            nodes[i]["released"] = True
    best, on_best = frontier[0], set()
    while best is not None:
        on_best.add(best)
        best = nodes[best]["parent"]
    for node in nodes:
        node["best"] = node["id"] in on_best
    deltas = [[i, node["id"], node["tokens"], 0, 0, "put", -1] for i, node in enumerate(nodes)]
    trace = [{"step": i, "op": "expand", "resident_tokens": 0, "host_tokens": 0, "peak_tokens": 0, "rehydrations": 0,
              "events": 0} for i in range(n)]  # fmt: skip
    tree = {"index": 0, "question": "synthetic", "best": frontier[0], "expansions": [], "nodes": nodes}
    residency = {"deltas": deltas, "event_steps": []}
    return {"index": 0, "question": "synthetic", "row": {"solved": True, "answer": "x"}, "tree": tree, "trace": trace,
            "events": [], "residency": residency, "event_steps": [], "budget": 1000}  # fmt: skip


def _node(i: int, parent: int | None, depth: int, value: float | None = None) -> dict:
    return {"id": i, "parent": parent, "kind": "generated", "text": f"thought {i}\n", "tokens": 10, "start_pos": 0,
            "depth": depth, "value": value, "expansion": None, "stop_reason": "", "mean_logprob": -1.0, "best": False,
            "released": False, "kv_device": 10, "kv_host": 0, "kv_dropped": 0, "meta": {}}  # fmt: skip
