"""A page opened in headless Chromium (Debian's `chromium` and `chromium-driver`, driven by selenium) and
checked as a reader would see it: every image loaded, nothing wider than the card holding it, no image
shown at less than `MIN_SCALE` of its drawn size (its text stays readable), no console errors; and a
screenshot of the whole page.
"""

from __future__ import annotations

import base64
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# Launch flags: no sandbox (CI runs as root), no GPU, and nothing that reaches the network on its own.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
# The least an image may be scaled down on the page: its 10 pt text then stays above 10 px.
MIN_SCALE = 0.75
# Allowed slack in CSS pixels (sub-pixel layout rounding).
SLACK = 1.0

PAGE_PROBLEMS_JS = """
const problems = [];
const minScale = arguments[0], slack = arguments[1];
for (const img of document.images) {
  if (!img.complete || img.naturalWidth === 0) problems.push(`image not loaded: ${img.getAttribute('src')}`);
  else if (img.clientWidth < minScale * img.naturalWidth)
    problems.push(`image ${img.getAttribute('src')} shown at ${img.clientWidth} of its ${img.naturalWidth} px`);
}
document.querySelectorAll('.card').forEach((card, i) => {
  const box = card.getBoundingClientRect();
  const name = card.id || card.querySelector('h3')?.textContent || `card ${i}`;
  if (card.scrollWidth > card.clientWidth + slack)
    problems.push(`${name}: content ${card.scrollWidth} px wide in a card of ${card.clientWidth} px`);
  for (const el of card.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && (r.right > box.right + slack || r.left < box.left - slack))
      problems.push(`${name}: <${el.tagName.toLowerCase()}> spans ${Math.round(r.left)}-${Math.round(r.right)} px, `
        + `outside its card ${Math.round(box.left)}-${Math.round(box.right)} px`);
  }
});
if (document.documentElement.scrollWidth > window.innerWidth + slack)
  problems.push(`the page is ${document.documentElement.scrollWidth} px wide in a ${window.innerWidth} px window`);
return problems;
"""


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here (None when they can)."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).is_file()]
    if missing:
        return f"{', '.join(missing)} missing: apt-get install -y chromium chromium-driver (.ci/run does)"
    return None


@contextmanager
def chromium() -> Iterator[object]:
    """A headless Chromium with a fresh profile, its console messages kept; quit and removed after."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="inloop-eval-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def page_problems(driver: object, page: Path, width: int, screenshot: Path | None = None) -> list[str]:
    """What is wrong with `page` seen in a window `width` CSS pixels wide (images, overflow, console
    errors); with `screenshot`, the whole page saved there as a PNG."""
    metrics = {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False}
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    driver.get(page.resolve().as_uri())  # returns once the page and its images have loaded
    problems = list(driver.execute_script(PAGE_PROBLEMS_JS, MIN_SCALE, SLACK))
    problems += [f"console {e['level']}: {e['message']}" for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    if screenshot is not None:
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {**metrics, "height": int(height)})
        shot = driver.execute_cdp_cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        screenshot.write_bytes(base64.b64decode(shot["data"]))
    return problems
