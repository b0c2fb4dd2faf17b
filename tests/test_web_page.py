"""The playground page in headless Chromium: type code, ask for a completion, and check the
screenshot's page state: coloured token spans and the stats table."""

import os

import pytest
from conftest import SERVE_KEY

CHROMIUM = "/usr/bin/chromium"


def test_playground_colours_tokens_and_shows_stats(served, tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    url, _ = served
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            page.goto(url)
            page.fill("#api-key", SERVE_KEY)
            page.dispatch_event("#api-key", "change")
            page.wait_for_function("document.getElementById('served').textContent.includes('smollm2-135m')")
            page.fill("#prefix", "def fibonacci(n):\n    ")
            page.fill("#max-tokens", "12")
            page.click("#complete")
            page.wait_for_selector("#completion[data-state=done]", timeout=180_000)
            shot = tmp_path / "playground.png"
            page.screenshot(path=str(shot), full_page=True)
            spans = page.eval_on_selector_all(
                "#completion span", "els => els.map(e => [e.textContent, getComputedStyle(e).backgroundColor, e.dataset.layers])")
            stats = page.inner_text("#stats")
            error = page.inner_text("#error")
            # an early-exit method: tokens leave at different layers, so the colours differ
            page.fill("#method", "early-exit:confidence/lens@0.5")
            page.click("#complete")
            page.wait_for_selector("#completion[data-state=done]", timeout=180_000)
            page.screenshot(path=str(tmp_path / "playground-early-exit.png"), full_page=True)
            exit_spans = page.eval_on_selector_all(
                "#completion span", "els => els.map(e => [getComputedStyle(e).backgroundColor, e.dataset.layers])")
            exit_stats = page.inner_text("#stats")
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
    assert spans and "".join(text for text, _, _ in spans).strip(), (spans, error)
    assert all(bg not in ("rgba(0, 0, 0, 0)", "transparent") for _, bg, _ in spans)
    assert {layers for _, _, layers in spans} == {"30"}  # baseline: every token runs all 30 layers
    assert "layer evals / token" in stats and "30.0 of 30" in stats and "energy" in stats
    assert len({bg for bg, _ in exit_spans}) >= 2 and min(int(n) for _, n in exit_spans) < 30, exit_spans
    assert "early-exit:confidence/lens@0.5" in exit_stats
