"""The demo page in a real headless Chromium (Debian's chromium + chromium-driver, driven by Selenium): no empty
panels before the first input, digits drawn as mouse strokes are classified right, a slider redraws the
reconstruction, the perturbation grid is drawn with legible labels and follows the capsule shown; a matrix capsule
model's page titles its pose as a pose and says when the first prediction compiles the EM kernel. The page runs
under the demo's Content-Security-Policy, and nothing it uses is refused.

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


def _serve(demo):
    """Serve ``demo`` with uvicorn in a thread, on a free port of localhost; yields its address."""
    import uvicorn

    from capsnets.demo.app import create_app, listen, url

    sock = listen("127.0.0.1", 0)
    uvicorn_server = uvicorn.Server(uvicorn.Config(create_app(demo), log_level="warning"))
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
def server(trained):
    """The demo of the trained model, served on a free port of localhost; its address."""
    yield from _serve(trained)


@pytest.fixture
def matrix_server(monkeypatch):
    """An untrained matrix capsule model served as if its first prediction compiled the EM kernel: the kernel
    reports a build as needed, and each prediction takes a second (the PyTorch path runs; nothing is compiled)."""
    import torch

    from capsnets.demo import DemoModel
    from capsnets.functional.em import kernel as em_kernel
    from capsnets.models import create_model

    monkeypatch.setenv(em_kernel.ENV_VAR, "torch")
    monkeypatch.setattr(em_kernel, "build_needed", lambda: True)
    torch.manual_seed(0)
    model = create_model("matrix_capsnet_small", num_classes=10, input_size=(1, 28, 28), routing={"iterations": 1})
    demo = DemoModel(model, source="untrained", name="matrix_capsnet_small")
    analyse = demo.analyse
    monkeypatch.setattr(demo, "analyse", lambda *args: time.sleep(1.0) or analyse(*args))
    yield from _serve(demo)


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
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console: what the CSP refused
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


def _post_json(url: str, body: dict | None) -> dict:
    """The JSON answer of the demo at ``url``: a GET without ``body``, else a POST of it as JSON."""
    import json
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


ONE = [(0, -95 + 19 * k) for k in range(11)]  # a vertical stroke
ZERO = [(55 * math.sin(2 * math.pi * k / 28), -90 * math.cos(2 * math.pi * k / 28)) for k in range(29)]  # an oval


def test_drawn_digits_are_classified_and_the_sliders_redraw_the_reconstruction(browser, server, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server)
    by_id = lambda name: browser.find_element("id", name)  # noqa: E731
    WebDriverWait(browser, 15).until(lambda d: len(d.find_elements("css selector", "#samples img")) == 20)
    assert "trained" in by_id("model").text or "loaded" in by_id("model").text
    _nothing_empty_before_the_first_input(browser)
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
    assert by_id("grid-class").text == "0"
    _grid_labels_are_legible_and_aligned(browser)
    _screenshot(browser, tmp_path / "demo.png")

    seen, grid = by_id("input").get_attribute("src"), by_id("grid").get_attribute("src")
    browser.find_elements("css selector", "#samples img")[6].click()  # a test image of a 3
    settled(browser)
    assert by_id("input").get_attribute("src") != seen and by_id("prediction").text == "3"
    answer = _post_json(f"{server}api/samples", None)["samples"][6]
    answer = _post_json(f"{server}api/predict", {"pixels": answer["pixels"]})  # the page shows the API's unsure
    assert by_id("unsure").is_displayed() == answer["uncertain"]
    assert not answer["uncertain"] or by_id("unsure").text == f"Unsure: {answer['doubt']}."
    assert by_id("grid-class").text == "3", "the perturbation grid follows the capsule shown"
    assert by_id("grid").get_attribute("src") != grid
    _screenshot(browser, tmp_path / "demo_test_image.png", height=520)
    browser.find_elements("css selector", "#bars .bar-row")[5].click()  # the capsule of class 5
    settled(browser)
    assert by_id("shown").text == "5" and by_id("grid-class").text == "5"
    _nothing_refused_by_the_content_security_policy(browser)


def _nothing_refused_by_the_content_security_policy(driver) -> None:
    """The page ran under the demo's Content-Security-Policy and nothing it uses was refused (Chromium logs each
    refusal to the console)."""
    margin = driver.execute_script("return getComputedStyle(document.body).marginTop")
    assert margin == "0px", "demo.css applies (its body has no margin, a browser's 8px)"
    refused = [e["message"] for e in driver.get_log("browser") if "Content Security Policy" in e["message"]]
    assert refused == [], refused


def _nothing_empty_before_the_first_input(driver) -> None:
    """No image without a picture (a broken-image placeholder) and no caption with a blank in it is visible; the
    page says what to do instead."""
    broken = driver.execute_script(
        "return [...document.images].filter((i) => i.getClientRects().length > 0 && !(i.complete && i.naturalWidth > 0))"
        ".map((i) => i.id || i.alt)"
    )
    assert broken == [], f"images shown without a picture: {broken}"
    text = driver.find_element("tag name", "body").text
    assert "to class , over" not in text and "Reconstruction from capsule" not in text
    assert "Draw a digit, or pick one of the test images" in text


def _grid_labels_are_legible_and_aligned(driver) -> None:
    """11 column labels (the steps) and 16 row labels (the dimensions) of at least 10 CSS pixels, spanning the
    grid's picture exactly, so that each labels its own column or row."""
    sizes = driver.execute_script(
        "const box = (e) => e.getBoundingClientRect();"
        "const px = (e) => parseFloat(getComputedStyle(e).fontSize);"
        "const grid = box(document.getElementById('grid'));"
        "const steps = [...document.querySelectorAll('#grid-steps span')];"
        "const dims = [...document.querySelectorAll('#grid-dims span')];"
        "return {steps: steps.map((e) => e.textContent), dims: dims.length, fonts: [...steps, ...dims].map(px),"
        " width: [grid.width, box(document.getElementById('grid-steps')).width],"
        " height: [grid.height, box(document.getElementById('grid-dims')).height],"
        " label: Math.min(...dims.map((e) => box(e).height))};"
    )
    assert sizes["steps"][0] == "\u22120.25" and sizes["steps"][-1] == "+0.25" and len(sizes["steps"]) == 11
    assert sizes["dims"] == 16 and min(sizes["fonts"]) >= 10, sizes
    assert abs(sizes["width"][0] - sizes["width"][1]) < 1.5 and abs(sizes["height"][0] - sizes["height"][1]) < 1.5
    assert sizes["label"] >= 10, sizes  # each row label has the height of a line of text


def test_a_matrix_capsule_model_titles_its_pose_and_says_when_the_kernel_compiles(browser, matrix_server):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(matrix_server)
    by_id = lambda name: browser.find_element("id", name)  # noqa: E731
    WebDriverWait(browser, 15).until(lambda d: "matrix capsules" in by_id("model").text)
    _nothing_empty_before_the_first_input(browser)
    assert not by_id("compiling").is_displayed()  # said while the first prediction waits
    strokes(browser, by_id("canvas"), ONE)
    WebDriverWait(browser, 5).until(lambda d: by_id("compiling").is_displayed())
    assert (
        "compiling the fused EM routing kernel once for this environment (a minute or less)" in by_id("compiling").text
    )
    settled(browser, timeout=60)
    WebDriverWait(browser, 30).until(lambda d: by_id("prediction").text != "")
    settled(browser, timeout=60)
    assert not by_id("compiling").is_displayed()
    title = browser.find_element("css selector", "#capsule-panel h2").text
    assert title == f"Pose of class capsule {by_id('prediction').text}", title
    assert len(browser.find_elements("css selector", "#pose td")) == 16
    _nothing_refused_by_the_content_security_policy(browser)


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
