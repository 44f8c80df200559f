"""The demo page in a real headless Chromium (Debian's chromium + chromium-driver, driven by Selenium): digits drawn
as mouse strokes are classified right, a slider redraws the reconstruction, the perturbation grid is drawn.

Skipped where Chromium, chromedriver or Selenium are missing, except in CI (``CI`` set), where that fails the test.
The screenshot goes to pytest's temporary folder, or, with ``CAPSNETS_DEMO_SCREENSHOTS=DIR`` (e.g.
``docs/images``), to ``DIR/demo.png`` for docs/demo.md.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(trained):
    """The demo of the trained model served by uvicorn in a thread, on a free port of localhost; its address."""
    import uvicorn

    from capsnets.demo.app import create_app, listen, url

    sock = listen("127.0.0.1", 0)
    uvicorn_server = uvicorn.Server(uvicorn.Config(create_app(trained), log_level="warning"))
    thread = threading.Thread(target=uvicorn_server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not uvicorn_server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert uvicorn_server.started, "the demo server did not start"
    yield url(sock)
    uvicorn_server.should_exit = True
    thread.join(10)
    sock.close()


@pytest.fixture(scope="module")
def browser(need):
    """A headless Chromium, 1280 CSS pixels wide, driven by Debian's chromedriver."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    need(
        ("selenium", importlib.util.find_spec("selenium") is not None),
        ("chromium", chromium is not None),
        ("chromedriver", driver_path is not None),
    )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1150",
        "--force-device-scale-factor=1",
        "--hide-scrollbars",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))  # no Selenium Manager download
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def strokes(driver, canvas, points: list[tuple[float, float]]) -> None:
    """One mouse stroke through ``points`` (pixels from the canvas's centre)."""
    from selenium.webdriver.common.action_chains import ActionChains

    actions = ActionChains(driver, duration=15)
    x, y = points[0]
    actions.move_to_element_with_offset(canvas, round(x), round(y)).click_and_hold()
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        actions.move_by_offset(round(x1) - round(x0), round(y1) - round(y0))
    actions.release().perform()


def settled(driver, timeout: float = 15.0) -> None:
    """Wait until the page has no request in flight (``<body data-pending="0">``)."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(
        lambda d: d.find_element("tag name", "body").get_attribute("data-pending") == "0"
    )


ONE = [(0, -95 + 19 * k) for k in range(11)]  # a vertical stroke
ZERO = [(55 * math.sin(2 * math.pi * k / 28), -90 * math.cos(2 * math.pi * k / 28)) for k in range(29)]  # an oval


def test_drawn_digits_are_classified_and_the_sliders_redraw_the_reconstruction(browser, server, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server)
    by_id = lambda name: browser.find_element("id", name)  # noqa: E731
    WebDriverWait(browser, 15).until(lambda d: len(d.find_elements("css selector", "#samples img")) == 20)
    assert "trained" in by_id("model").text or "loaded" in by_id("model").text
    canvas = by_id("canvas")
    for digit, points in (("1", ONE), ("0", ZERO)):
        by_id("clear").click()
        strokes(browser, canvas, points)
        settled(browser)
        assert by_id("prediction").text == digit, f"drew a {digit}, the page says {by_id('prediction').text}"
        bars = browser.find_elements("css selector", "#bars .bar-row")
        assert "winner" in bars[int(digit)].get_attribute("class")

    before = by_id("reconstruction").get_attribute("src")
    assert before.startswith("data:image/png;base64,")
    slider = by_id("dim-0")
    ActionChains(browser, duration=15).click_and_hold(slider).move_by_offset(60, 0).release().perform()
    settled(browser)
    assert float(slider.get_attribute("value")) > 0.05, "the slider moved"
    assert by_id("reconstruction").get_attribute("src") != before, "moving a slider redraws the reconstruction"

    by_id("grid-button").click()
    WebDriverWait(browser, 15).until(lambda d: (by_id("grid").get_attribute("src") or "").startswith("data:"))
    settled(browser)
    assert by_id("status").text == "", by_id("status").text
    assert len(browser.find_elements("css selector", "#maps img")) == 10
    _screenshot(browser, tmp_path / "demo.png")

    seen = by_id("input").get_attribute("src")
    browser.find_elements("css selector", "#samples img")[6].click()  # a test image of a 3
    settled(browser)
    assert by_id("input").get_attribute("src") != seen and by_id("prediction").text in "0123456789"
    _screenshot(browser, tmp_path / "demo_test_image.png", height=520)


def _screenshot(driver, target: Path, height: int | None = None) -> Path:
    """The page's top ``height`` CSS pixels (None: the whole page) as a PNG at ``target``, or, where
    ``CAPSNETS_DEMO_SCREENSHOTS`` names a folder, as a small palette PNG of that name there, for docs/demo.md."""
    from PIL import Image

    folder = os.environ.get("CAPSNETS_DEMO_SCREENSHOTS")
    target = Path(folder) / target.name if folder else target
    target.parent.mkdir(parents=True, exist_ok=True)
    height = height or driver.execute_script("return document.documentElement.scrollHeight")
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1280, "height": int(height), "deviceScaleFactor": 1, "mobile": False},
    )
    driver.save_screenshot(str(target))
    if folder:
        with Image.open(target) as shot:
            small = shot.convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT)
        small.save(target, optimize=True)
    assert target.stat().st_size > 10_000
    return target
