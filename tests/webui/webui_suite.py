"""The web chat page in headless Chromium (Selenium over chromedriver) against real `kiln serve`
processes, started by tests/webui.rs:

  --url        a server on the random-weight fixture, whose chat template knows <think>
  --pid        that server's process id (killed at the end: the server gone)
  --keyed-url  the same model with --api-key KEY
  --key        that key
  --no-webui-url  a server started with --no-webui

Each step saves a screenshot (desktop 1280x900, phone 390x844) under --shots.
"""

import argparse
import json
import os
import re
import signal
import time
import urllib.error
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import (NoSuchElementException,
                                        StaleElementReferenceException, TimeoutException)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

ap = argparse.ArgumentParser()
ap.add_argument("--url", required=True)
ap.add_argument("--pid", type=int, required=True)
ap.add_argument("--keyed-url", required=True)
ap.add_argument("--key", required=True)
ap.add_argument("--no-webui-url", required=True)
ap.add_argument("--shots", required=True)
ap.add_argument("--chromium", required=True)
ap.add_argument("--chromedriver", required=True)
args = ap.parse_args()

os.makedirs(args.shots, exist_ok=True)
STEP = [0]


def log(msg):
    print(f"[webui] {msg}", flush=True)


def http(url, path, key=None):
    req = urllib.request.Request(url + path)
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(url, name):
    status, text = http(url, "/metrics")
    assert status == 200, text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


def browser():
    o = webdriver.ChromeOptions()
    o.binary_location = args.chromium
    for a in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
              "--window-size=1280,900", "--force-color-profile=srgb", "--hide-scrollbars"]:
        o.add_argument(a)
    d = webdriver.Chrome(options=o, service=Service(args.chromedriver))
    d.set_window_size(1280, 900)
    return d


def shot(d, name):
    STEP[0] += 1
    path = os.path.join(args.shots, f"{STEP[0]:02d}-{name}.png")
    assert d.save_screenshot(path), path
    log(f"screenshot {path}")


def wait(d, what, cond, timeout=60):
    try:
        # (An answer's element is replaced as it streams: one found a moment ago may be gone.)
        ignored = (StaleElementReferenceException, NoSuchElementException)
        w = WebDriverWait(d, timeout, poll_frequency=0.05, ignored_exceptions=ignored)
        return w.until(lambda _: cond())
    except TimeoutException:
        shot(d, "FAILED-" + re.sub(r"\W+", "-", what))
        raise AssertionError(f"timed out waiting for {what}")


def pending_text_over(d, n):
    """The answer still streaming holds more than `n` characters of text."""
    return d.execute_script(
        "const ms = document.querySelectorAll('#messages .message.assistant');"
        "const m = ms[ms.length - 1];"
        "return !!m && m.classList.contains('pending')"
        f" && m.querySelector('.body').textContent.length > {n}")


def el(d, css):
    return d.find_element(By.CSS_SELECTOR, css)


def els(d, css):
    return d.find_elements(By.CSS_SELECTOR, css)


def idle(d):
    return not el(d, "#stop").is_displayed() and el(d, "#send").is_displayed()


def send(d, text):
    box = el(d, "#input")
    box.clear()
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def last_answer(d):
    return els(d, ".message.assistant")[-1]


def titles(d):
    return [e.text for e in els(d, "#conversations .title")]


def set_settings(d, **fields):
    el(d, "#settings-open").click()
    wait(d, "the settings dialog", lambda: el(d, "#settings").is_displayed())
    ids = {"system": "#set-system", "temperature": "#set-temperature", "top_p": "#set-top-p",
           "max_tokens": "#set-max-tokens", "extra": "#set-extra"}
    for k, css in ids.items():
        e = el(d, css)
        e.clear()
        if k in fields:
            e.send_keys(str(fields[k]))
    return lambda name: (shot(d, name), el(d, "#settings-save").click(),
                         wait(d, "the settings dialog to close",
                              lambda: not el(d, "#settings").is_displayed()))


# The page's requests, recorded in the page (the request bodies it sends).
RECORD = """
window.__requests = [];
const f = window.fetch;
window.fetch = (url, init) => {
  if (init && init.body) window.__requests.push(JSON.parse(init.body));
  return f(url, init);
};
"""

# The visible length of the streaming answer at each change of the message list.
OBSERVE = """
window.__lens = [];
const box = document.getElementById('messages');
new MutationObserver(() => {
  const ms = box.querySelectorAll('.message.assistant');
  const m = ms[ms.length - 1];
  if (!m || !m.classList.contains('pending') || m.querySelector('.dots')) return;
  window.__lens.push(m.querySelector('.body').textContent.length);
}).observe(box, {childList: true, subtree: true, characterData: true});
"""

# (With a link, which opens beside the chat, and HTML with a script in it, which is dropped.)
THINK_ANSWER = ("<think>plan it</think>\n\nHere is code, see [the docs](https://example.com/docs) "
                "and <b onclick=\"alert(1)\">this</b>:\n\n```python\nprint(1)\n```\n")

model_id = json.loads(http(args.url, "/v1/models")[1])["data"][0]["id"]
d = browser()
try:
    # ---- the page loads, with the model's name ---------------------------------------------
    d.get(args.url + "/")
    wait(d, "the model's name", lambda: el(d, "#model").text == model_id)
    shot(d, "desktop-empty")

    # ---- a message streams into the answer --------------------------------------------------
    # (Random weights end an answer at any token: 2000 of them, to watch it grow.)
    set_settings(d, max_tokens=2000, extra='{"ignore_eos": true}')("desktop-settings-stream")
    d.execute_script(OBSERVE)
    send(d, "Hello there")
    wait(d, "the answer to start", lambda: els(d, ".message.assistant.pending"))
    wait(d, "the answer to finish", lambda: idle(d), timeout=120)
    lens = d.execute_script("return window.__lens")
    growing = sorted(set(n for n in lens if n > 0))
    assert len(growing) >= 3, f"the answer did not stream (lengths seen {lens})"
    a = last_answer(d)
    stats = a.find_element(By.CSS_SELECTOR, ".stats").text
    assert re.fullmatch(r"\d+ tokens · \d+\.\d tokens/s", stats), stats
    first_answer = a.find_element(By.CSS_SELECTOR, ".body").text
    assert first_answer.strip(), "a blank answer"
    assert titles(d) == ["Hello there"], titles(d)
    log(f"streamed in {len(growing)} steps; {stats}")
    shot(d, "desktop-streamed")

    # ---- the stop button stops a long answer, on the server too -----------------------------
    set_settings(d, max_tokens=4000, extra='{"ignore_eos": true}')("desktop-settings-long")
    cancelled = metric(args.url, "kiln_requests_cancelled_total")
    el(d, "#new-chat").click()
    send(d, "Write a long answer")
    # (Stop once text has streamed into the pending answer, by its text's length rather than
    # what of a random model's text is visible, so that the answer is still running.)
    wait(d, "the long answer's text", lambda: pending_text_over(d, 200))
    assert el(d, "#stop").is_displayed()
    shot(d, "desktop-streaming")
    el(d, "#stop").click()
    wait(d, "the page to stop", lambda: idle(d), timeout=10)
    stats = last_answer(d).find_element(By.CSS_SELECTOR, ".stats").text
    assert stats.endswith("stopped"), stats
    wait(d, "the server to cancel the generation",
         lambda: metric(args.url, "kiln_requests_cancelled_total") > cancelled, timeout=10)
    gen = metric(args.url, "kiln_generated_tokens_total")
    time.sleep(1)
    assert metric(args.url, "kiln_generated_tokens_total") == gen, "still generating"
    stopped_answer = last_answer(d).find_element(By.CSS_SELECTOR, ".body").text
    log(f"stopped: {stats}")
    shot(d, "desktop-stopped")

    # ---- reload: both conversations are there ----------------------------------------------
    d.refresh()
    wait(d, "the list after reload", lambda: len(titles(d)) == 2)
    assert titles(d) == ["Write a long answer", "Hello there"], titles(d)
    assert last_answer(d).find_element(By.CSS_SELECTOR, ".body").text == stopped_answer
    els(d, "#conversations .title")[1].click()
    wait(d, "the first conversation",
         lambda: last_answer(d).find_element(By.CSS_SELECTOR, ".body").text == first_answer)
    shot(d, "desktop-reloaded")

    # ---- rename and delete, kept across reloads ---------------------------------------------
    els(d, "#conversations .rename")[1].click()
    box = el(d, "#conversations .rename-input")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("Renamed chat", Keys.ENTER)
    wait(d, "the new name", lambda: "Renamed chat" in titles(d))
    shot(d, "desktop-renamed")
    els(d, "#conversations .delete")[0].click()
    alert = d.switch_to.alert
    assert "Write a long answer" in alert.text, alert.text
    alert.accept()
    wait(d, "the deletion", lambda: titles(d) == ["Renamed chat"])
    d.refresh()
    wait(d, "the list after reload", lambda: titles(d) == ["Renamed chat"])
    shot(d, "desktop-deleted")

    # ---- settings go into the request -------------------------------------------------------
    set_settings(d, system="You answer in one word.", temperature=0.3, top_p=0.9,
                 max_tokens=7, extra='{"seed": 42, "ignore_eos": true}')("desktop-settings")
    d.execute_script(RECORD)
    el(d, "#new-chat").click()
    send(d, "Count")
    wait(d, "the answer", lambda: idle(d) and els(d, ".message.assistant"))
    body = d.execute_script("return window.__requests")[-1]
    assert body["messages"][0] == {"role": "system", "content": "You answer in one word."}, body
    assert body["messages"][-1] == {"role": "user", "content": "Count"}, body
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == \
        (0.3, 0.9, 7, 42), body
    assert body["stream"] is True and body["model"] == model_id, body
    # The server's own count of the answer: max_tokens was applied.
    stats = last_answer(d).find_element(By.CSS_SELECTOR, ".stats").text
    assert re.fullmatch(r"7 tokens · \d+\.\d tokens/s", stats), stats
    shot(d, "desktop-settings-applied")

    # ---- Markdown, highlighted code with a copy button, reasoning folded ----------------------
    grammar = "root ::= " + json.dumps(THINK_ANSWER)
    set_settings(d, temperature=0, max_tokens=400,
                 extra=json.dumps({"grammar": grammar}))("desktop-settings-grammar")
    send(d, "Show me code")
    wait(d, "the answer", lambda: idle(d) and len(els(d, ".message.assistant")) == 2)
    a = last_answer(d)
    r = a.find_element(By.CSS_SELECTOR, "details.reasoning")
    assert r.get_attribute("open") is None, "reasoning shown unfolded"
    assert r.find_element(By.CSS_SELECTOR, "summary").text == "Reasoning"
    code = a.find_element(By.CSS_SELECTOR, "pre.code code.hljs.language-python")
    assert code.text == "print(1)", code.text
    assert code.find_elements(By.CSS_SELECTOR, "span[class^=hljs-]"), "not highlighted"
    assert "Here is code, see the docs and this:" in a.find_element(By.CSS_SELECTOR, ".body p").text
    link = a.find_element(By.CSS_SELECTOR, ".body a")
    assert (link.get_attribute("href"), link.get_attribute("target")) == \
        ("https://example.com/docs", "_blank")
    assert a.find_element(By.CSS_SELECTOR, ".body b").get_attribute("onclick") is None
    shot(d, "desktop-markdown")
    copy = a.find_element(By.CSS_SELECTOR, "pre.code .copy")
    copy.click()
    wait(d, "the copy button's answer", lambda: copy.text == "Copied", timeout=5)
    r.find_element(By.CSS_SELECTOR, "summary").click()
    wait(d, "the reasoning unfolded", lambda: r.get_attribute("open") is not None)
    assert "plan it" in r.text, r.text
    shot(d, "desktop-reasoning-open")

    # ---- a phone's width ----------------------------------------------------------------------
    d.set_window_size(390, 844)
    time.sleep(0.3)
    assert not el(d, "#sidebar").is_displayed() or \
        el(d, "#sidebar").rect["x"] + el(d, "#sidebar").rect["width"] <= 0
    width = d.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"wider than the phone: {width}"
    assert el(d, "#send").is_displayed() and el(d, "#menu").is_displayed()
    shot(d, "phone-chat")
    el(d, "#menu").click()
    wait(d, "the list to slide in", lambda: el(d, "#sidebar").rect["x"] >= 0)
    time.sleep(0.3)
    shot(d, "phone-conversations")
    els(d, "#conversations .title")[0].click()
    wait(d, "the list to close", lambda: el(d, "#sidebar").rect["x"] < 0)
    d.set_window_size(1280, 900)

    # ---- the server gone: an error in the page, not a blank answer ----------------------------
    # Killed while it answers: what came is kept, and the page says the answer was cut.
    set_settings(d, max_tokens=3000, extra='{"ignore_eos": true}')("desktop-settings-last")
    send(d, "A long one")
    # (While it still answers: by its text's length, not what of it is visible.)
    wait(d, "the long answer's text", lambda: pending_text_over(d, 100))
    os.kill(args.pid, signal.SIGKILL)
    wait(d, "the cut", lambda: idle(d) and last_answer(d).find_elements(By.CSS_SELECTOR, ".error"))
    err = last_answer(d).find_element(By.CSS_SELECTOR, ".error").text
    assert "cut off" in err or "ended early" in err, err
    kept = d.execute_script(
        "const ms = document.querySelectorAll('#messages .message.assistant');"
        "return ms[ms.length - 1].querySelector('.body').textContent.length")
    assert kept > 100, f"the text that came was not kept ({kept} characters)"
    shot(d, "desktop-server-killed-mid-answer")
    log(f"server killed mid-answer: {err}")
    # Gone: nothing answers.
    send(d, "Are you there?")
    wait(d, "the error", lambda: idle(d) and last_answer(d).find_elements(By.CSS_SELECTOR, ".error"))
    err = last_answer(d).find_element(By.CSS_SELECTOR, ".error").text
    assert "Cannot reach the server" in err, err
    shot(d, "desktop-server-gone")
    log(f"server gone: {err}")

    # ---- an API key: asked for once, then used; a bad one shows the server's error -----------
    d.get(args.keyed_url + "/")
    wait(d, "the key dialog", lambda: el(d, "#key-dialog").is_displayed())
    assert "needs an API key" in el(d, "#key-reason").text
    shot(d, "desktop-key-asked")
    el(d, "#key-input").send_keys(args.key, Keys.ENTER)
    wait(d, "the model's name", lambda: el(d, "#model").text == model_id)
    set_settings(d, max_tokens=12)("desktop-keyed-settings")
    send(d, "Hello with a key")
    wait(d, "the answer", lambda: idle(d) and els(d, ".message.assistant"))
    assert not last_answer(d).find_elements(By.CSS_SELECTOR, ".error")
    assert last_answer(d).find_element(By.CSS_SELECTOR, ".stats").text.startswith("12 tokens")
    d.refresh()
    wait(d, "the model's name", lambda: el(d, "#model").text == model_id)
    assert not el(d, "#key-dialog").is_displayed(), "the key was asked for again"
    shot(d, "desktop-keyed")

    el(d, "#settings-open").click()
    el(d, "#key-change").click()
    wait(d, "the key dialog", lambda: el(d, "#key-dialog").is_displayed())
    box = el(d, "#key-input")
    box.clear()
    box.send_keys("not-the-key", Keys.ENTER)
    wait(d, "the refusal", lambda: el(d, "#key-dialog").is_displayed()
         and "refused" in el(d, "#key-reason").text)
    el(d, "#key-cancel").click()
    status, text = http(args.keyed_url, "/v1/models", key="not-the-key")
    assert status == 401, (status, text)
    server_says = json.loads(text)["error"]["message"]
    send(d, "Hello with a bad key")
    wait(d, "the error", lambda: last_answer(d).find_elements(By.CSS_SELECTOR, ".error"))
    err = last_answer(d).find_element(By.CSS_SELECTOR, ".error").text
    assert err == f"401: {server_says}", err
    shot(d, "desktop-bad-key-asked-again")
    el(d, "#key-cancel").click()
    assert server_says in el(d, "#model").text, el(d, "#model").text
    shot(d, "desktop-bad-key")

    # ---- --no-webui: / is not the page --------------------------------------------------------
    d.get(args.no_webui_url + "/")
    wait(d, "the 404", lambda: "no route for /" in el(d, "body").text)
    assert not els(d, "#app")
    shot(d, "desktop-no-webui")

    log("all scenarios passed")
finally:
    d.quit()
