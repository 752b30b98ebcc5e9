"""The chat page at / of `qhx serve`, in headless Chromium (Debian's chromium + chromedriver,
driven by selenium): a conversation typed and answered with the API key asked for, the answer the
API's own and in a screenshot (read back by tesseract), kept across a reload, regenerated; on a
phone's screen. Thinking folded and Stop against a scripted server that streams the page's API.

Run by ctest (ChatPage.HeadlessChromium), with python/tests on PYTHONPATH and QHX_CLI naming the
qhx binary.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from serving import REPO, serve  # python/tests, on PYTHONPATH

MODEL = REPO / "models" / "qwen3.5-kjv"
PAGE = REPO / "src" / "server" / "chat_page.html"
KEY = "s3cret-key"
PROMPT = "And it came to pass"


def browser(width: int, height: int, phone: bool = False) -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}", "--force-device-scale-factor=1",
                "--hide-scrollbars"]:
        options.add_argument(arg)
    if phone:  # a window cannot be that narrow: the phone's screen, emulated (touch, viewport)
        options.add_experimental_option("mobileEmulation", {
            "deviceMetrics": {"width": width, "height": height, "pixelRatio": 3, "touch": True},
            "userAgent": "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 "
                         "(KHTML, like Gecko) Chrome/156.0 Mobile Safari/537.36"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def wait_idle(driver, timeout=120):
    WebDriverWait(driver, timeout).until(
        lambda d: d.execute_script("return document.body.dataset.busy") == "0")


def answers(driver) -> list[str]:
    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".message.assistant .content")]


def ocr(png: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".png") as f:
        f.write(png)
        f.flush()
        return subprocess.run(["tesseract", f.name, "-", "--psm", "6"], capture_output=True,
                              text=True, check=True).stdout


def words(text: str) -> list[str]:
    return [w.lower() for w in re.findall(r"[A-Za-z]{4,}", text)]


@pytest.fixture(scope="module")
def server():
    with serve(MODEL, "--api-key", KEY) as url:
        yield url


def open_with_key(driver, url: str) -> None:
    """Opens the page, which asks for the server's key before anything else, and gives it."""
    driver.get(url + "/")
    key = WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "api-key"))
    WebDriverWait(driver, 30).until(lambda d: key.is_displayed())
    key.send_keys(KEY)
    driver.find_element(By.ID, "api-key-save").click()


def api_answer(url: str, messages: list[dict], max_tokens: int) -> str:
    import urllib.request
    body = {"messages": messages, "temperature": 0, "max_tokens": max_tokens}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json",
                                  "Authorization": "Bearer " + KEY})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["choices"][0]["message"]["content"]


def test_served_page_is_self_contained(server):
    import urllib.request
    with urllib.request.urlopen(server + "/", timeout=30) as r:  # no key needed for the page
        assert r.headers["Content-Type"] == "text/html; charset=utf-8"
        assert "connect-src 'self'" in r.headers["Content-Security-Policy"]
        page = r.read().decode()
    assert page == PAGE.read_text()
    # Nothing from elsewhere: no URL to another host anywhere in it.
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", page), "an external resource"
    assert "innerHTML" not in page


def test_a_typed_conversation_is_answered(server):
    driver = browser(1280, 900)
    try:
        open_with_key(driver, server)
        WebDriverWait(driver, 30).until(
            lambda d: d.find_element(By.ID, "model").text == "qwen3.5-kjv")
        # Greedy, short answers: the same as the API gives.
        driver.find_element(By.ID, "settings-toggle").click()
        for field, value in [("temperature", "0"), ("max-tokens", "24")]:
            box = driver.find_element(By.ID, field)
            box.clear()
            box.send_keys(value)
        driver.find_element(By.ID, "settings-toggle").click()
        prompt = driver.find_element(By.ID, "prompt")
        prompt.send_keys(PROMPT)
        prompt.send_keys(Keys.ENTER)
        wait_idle(driver)
        want = api_answer(server, [{"role": "user", "content": PROMPT}], 24)
        assert want.strip(), "the model answered nothing"
        got = answers(driver)
        assert got == [want.strip()] or got == [want], (got, want)

        # The screenshot shows it: most of the answer's words read back from the pixels.
        seen = set(words(ocr(driver.get_screenshot_as_png())))
        expected = words(want)
        found = [w for w in expected if w in seen]
        assert len(found) >= 0.6 * len(expected), (expected, sorted(seen))

        # Kept in the browser: a reload shows the same conversation (and keeps the key).
        driver.refresh()
        WebDriverWait(driver, 30).until(lambda d: len(answers(d)) == 1)
        assert answers(driver) == got
        assert not driver.find_element(By.ID, "key-panel").is_displayed()
        users = driver.find_elements(By.CSS_SELECTOR, ".message.user .content")
        assert [u.text for u in users] == [PROMPT]

        # Regenerate: the last answer asked again (greedy: the same text), not a second one.
        WebDriverWait(driver, 30).until(
            lambda d: d.find_element(By.CSS_SELECTOR, ".message.assistant .regenerate"))
        driver.find_element(By.CSS_SELECTOR, ".message.assistant .regenerate").click()
        wait_idle(driver)
        assert answers(driver) == got

        # A second turn goes with the first as history.
        prompt = driver.find_element(By.ID, "prompt")
        prompt.send_keys("And the LORD said")
        driver.find_element(By.ID, "send").click()
        wait_idle(driver)
        history = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": got[0]},
                   {"role": "user", "content": "And the LORD said"}]
        assert answers(driver)[1] == api_answer(server, history, 24).strip()

        # New chat empties it.
        driver.find_element(By.ID, "new-chat").click()
        WebDriverWait(driver, 10).until(lambda d: not answers(d))
    finally:
        driver.quit()


def test_phone_screen(server):
    driver = browser(390, 844, phone=True)
    try:
        open_with_key(driver, server)
        prompt = driver.find_element(By.ID, "prompt")
        prompt.send_keys(PROMPT + Keys.ENTER)
        wait_idle(driver)
        assert answers(driver) and answers(driver)[0]
        # Nothing wider than the screen; the input bar at its bottom, its buttons tappable.
        assert driver.execute_script("return window.innerWidth") == 390
        width = driver.execute_script("return document.documentElement.scrollWidth")
        assert width <= 390, width
        bar = driver.find_element(By.ID, "composer").rect
        assert bar["y"] + bar["height"] >= 844 - 40 - 1 and bar["y"] > 844 / 2, bar
        send = driver.find_element(By.ID, "send").rect
        assert send["height"] >= 40 and send["width"] >= 40, send
        message = driver.find_element(By.CSS_SELECTOR, ".message.assistant").rect
        assert message["x"] >= 0 and message["x"] + message["width"] <= 390, message
    finally:
        driver.quit()


class Scripted(BaseHTTPRequestHandler):
    """The page's API, scripted: thinking, then an answer token by token (slowly for Stop)."""
    slow = False
    requests: list[dict] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.path == "/":
            body, kind = PAGE.read_bytes(), "text/html; charset=utf-8"
        else:
            body, kind = json.dumps({"object": "list", "data": [{"id": "scripted"}]}).encode(), \
                "application/json"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        Scripted.requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()

        def event(delta, finish=None):
            chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
        try:
            event({"role": "assistant", "content": ""})
            for piece in ["Counting ", "the ", "days."]:
                event({"reasoning_content": piece})
            for i in range(200 if Scripted.slow else 3):
                event({"content": (" " if i else "") + f"word{i}"})
                if Scripted.slow:
                    time.sleep(0.05)
            event({}, "stop")
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # Stop: the page hung up


@pytest.fixture()
def scripted():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    Scripted.requests = []
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def test_thinking_is_folded_and_stop_keeps_the_partial_answer(scripted):
    driver = browser(1024, 800)
    try:
        driver.get(scripted + "/")
        prompt = WebDriverWait(driver, 30).until(lambda d: d.find_element(By.ID, "prompt"))
        prompt.send_keys("How many days?" + Keys.ENTER)
        wait_idle(driver, 30)
        thinking = driver.find_element(By.CSS_SELECTOR, ".message.assistant details.thinking")
        assert thinking.get_attribute("open") is None  # folded
        assert answers(driver) == ["word0 word1 word2"]
        assert "Counting the days." not in driver.find_element(By.ID, "messages").text
        thinking.find_element(By.TAG_NAME, "summary").click()
        assert "Counting the days." in thinking.text
        assert Scripted.requests[0]["stream"] is True
        assert Scripted.requests[0]["messages"] == [{"role": "user", "content": "How many days?"}]

        Scripted.slow = True
        prompt.send_keys("Again" + Keys.ENTER)
        WebDriverWait(driver, 30).until(lambda d: len(answers(d)) == 2 and "word3" in answers(d)[1])
        stop = driver.find_element(By.ID, "stop")
        assert stop.is_displayed() and not driver.find_element(By.ID, "send").is_displayed()
        stop.click()
        wait_idle(driver, 30)
        partial = answers(driver)[1]
        assert partial.startswith("word0 word1 word2 word3") and "word199" not in partial
        time.sleep(0.5)
        assert answers(driver)[1] == partial  # nothing more came
        # The thinking of the first turn does not go back to the model.
        assert Scripted.requests[1]["messages"][1] == {"role": "assistant",
                                                        "content": "word0 word1 word2"}
    finally:
        Scripted.slow = False
        driver.quit()
