"""Screenshot of a viewer page (arbor-view) in headless Chromium, e.g. docs/viewer.png.

    python scripts/view_screenshot.py /tmp/demo/view/0.html docs/viewer.png            # the step with most host blocks
    python scripts/view_screenshot.py PAGE.html OUT.png --step 40 --node 12 --width 1280 --height 800

Needs selenium (the dev extra) and Debian's chromium + chromium-driver (or set --chromium / --driver).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

#: JS: per step, how many blocks are on the host tier (host or partial)
HOST_COUNTS = """
const v = window.arborView, out = [], n = +document.getElementById('step').max;
const ids = Array.from(document.querySelectorAll('#tree g.node')).map(g => +g.dataset.id);
for (let s = 0; s <= n; s++) {
  v.setStep(s);
  out.push(ids.filter(i => ['host', 'partial'].includes(v.stateOf(i))).length);
}
return out;
"""
#: JS: the block with the most tokens on the host at the shown step (the best path's first), else the best leaf
PICK_NODE = """
const v = window.arborView, best = new Set(v.best);
const ids = Array.from(document.querySelectorAll('#tree g.node')).map(g => +g.dataset.id);
const key = i => (best.has(i) ? 1e9 : 0) + v.residency(i)[1];
const hosted = ids.filter(i => v.residency(i)[1] > 0).sort((a, b) => key(b) - key(a));
return hosted.length ? hosted[0] : Math.max(...v.best);
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--step", type=int, default=None, help="default: the step with the most blocks on the host")
    parser.add_argument("--node", type=int, default=None, help="node to select (default: a hosted best-path block)")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=800)
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    parser.add_argument("--driver", default=shutil.which("chromedriver"))
    args = parser.parse_args()
    opts = webdriver.ChromeOptions()
    opts.binary_location = args.chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(args.driver), options=opts)
    try:
        metrics = {"width": args.width, "height": args.height, "deviceScaleFactor": 1, "mobile": False}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        url = args.page.resolve().as_uri()
        driver.get(url)
        step = args.step
        if step is None:
            counts = driver.execute_script(HOST_COUNTS)
            step = max(range(len(counts)), key=lambda s: (counts[s], s))
        driver.execute_script("window.arborView.setStep(arguments[0])", step)
        node = args.node if args.node is not None else driver.execute_script(PICK_NODE)
        driver.get(f"{url}#step={step}&node={node}")
        driver.refresh()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(args.out))
        print(f"{args.out}: step {step}, node {node}")
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
