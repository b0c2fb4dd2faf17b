"""The playground page in headless Chromium: type code, ask for a completion, and check the
screenshot's page state: coloured token spans and the stats table. Its server allows an
early-exit method besides the default and reads its API key from a file."""

import os

import pytest
from helpers import EARLY_EXIT, PAGE_KEY

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture
def page_server(server):
    return server("page")


@pytest.mark.model
def test_api_key_file_keeps_the_key_out_of_the_process_list(page_server):
    import httpx

    url, proc = page_server
    with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
        assert PAGE_KEY.encode() not in f.read()
    assert httpx.get(f"{url}/v1/models").status_code == 401
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {PAGE_KEY}"}).status_code == 200


@pytest.mark.parametrize("content, words", [(None, "cannot read"), ("\n  \n", "is empty")])
def test_api_key_file_errors(tmp_path, capsys, content, words):
    from dyncomplete.cli import main

    key_file = tmp_path / "key"
    if content is not None:
        key_file.write_text(content)
    assert main(["serve", "--api-key-file", str(key_file)]) == 2  # before any model is loaded
    assert words in capsys.readouterr().err


@pytest.mark.model
def test_playground_colours_tokens_and_shows_stats(page_server, tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    url, _ = page_server
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            page.goto(url)
            page.fill("#api-key", PAGE_KEY)
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
            offered = page.eval_on_selector_all("#methods option", "els => els.map(e => e.value)")
            # a method the server does not allow: refused, and the page says which ones it does
            page.fill("#method", "lookup")
            page.click("#complete")
            page.wait_for_selector("#completion[data-state=done]", timeout=60_000)
            refused = page.inner_text("#error")
            # an early-exit method: tokens leave at different layers, so the colours differ
            page.fill("#method", EARLY_EXIT)
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
    assert EARLY_EXIT in exit_stats
    assert offered == ["baseline", EARLY_EXIT]
    assert "this server allows: baseline, " + EARLY_EXIT in refused, refused
