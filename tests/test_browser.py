"""Notebooks as a researcher opens them: JupyterLab in headless Chromium, with no network.

JupyterLab runs on 127.0.0.1 with a token over a scratch copy of the project (the
notebooks copied, params/ and data/ linked), so nothing here edits a tracked notebook.
Chromium (Debian's, driven through Debian's chromedriver by selenium) resolves no host
but 127.0.0.1 (``--host-resolver-rules``) and sends everything else to a dead proxy, so a
machine with internet proves the offline case too; every request the page made is read
back from Chromium's log and must have gone to the Jupyter server. For each notebook:
Run All Cells, then every chart output must be drawn (an SVG or canvas of a real size in
a ``.vega-embed``), no output may show a script error, altair's text fallback, a
traceback or a warning; 04's slider is moved and the chart below it must be redrawn.
Screenshots land in ``out/browser/``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import ROOT
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from relakit.lab.lab import free_port

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SHOTS = ROOT / "out" / "browser"
RUN_S = 180.0  # Run All Cells of one notebook, at most (papermill: 04 94 s, 09 139 s at load 8)
# what a chart that failed shows instead of itself
FAILURES = ("Error loading script", "If you see this message", "<VegaLite", "JupyterChart",
            "alt.Chart(", "JavaScript Error", "Error displaying widget", "Traceback")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab on 127.0.0.1 over a scratch root; yields (base url, token)."""
    root = tmp_path_factory.mktemp("lab")
    for name in ("params", "data"):
        (root / name).symlink_to(ROOT / name)
    (root / "notebooks").mkdir()
    for nb in ("04_policy.ipynb", "09_control_plane.ipynb"):
        shutil.copy(ROOT / "notebooks" / nb, root / "notebooks" / nb)
    home = root.parent / f"{root.name}-home"
    # every cell laid out (no virtual scrolling), so every chart can be measured; no news
    for plugin, value in (("notebook-extension/tracker", {"windowingMode": "none"}),
                          ("apputils-extension/notification", {"fetchNews": "false"})):
        path = home / "settings" / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"))
    port, token = free_port(), secrets.token_hex(16)
    log = open(home / "lab.log", "w")  # (open while JupyterLab runs)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
         f"--port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--allow-root", "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=subprocess.DEVNULL, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                assert proc.poll() is None, (home / "lab.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "JupyterLab did not answer in 60 s"
                time.sleep(0.3)
        yield base, token
    finally:
        proc.terminate()  # JupyterLab stops its kernels on SIGTERM
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--window-size=1400,2000",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
                # offline: no name resolves but 127.0.0.1, and whatever goes by address
                # meets a proxy that is not there (127.0.0.1 bypasses it)
                "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
                "--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=127.0.0.1"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(options=opts, service=Service(CHROMEDRIVER))
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _requested(driver) -> set[str]:
    """Every URL the page asked for since the last call (Chromium's network log)."""
    urls = set()
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] == "Network.requestWillBeSent":
            urls.add(msg["params"]["request"]["url"])
    return urls


def _wait(predicate, timeout_s: float, what: str, poll_s: float = 0.25):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(poll_s)


# the notebook's state, read through the application object (expose_app_in_browser)
STATE_JS = """
const nb = window.jupyterapp && jupyterapp.shell.currentWidget;
if (!nb || !nb.content || !nb.sessionContext) return null;
const kernel = nb.sessionContext.session && nb.sessionContext.session.kernel;
const cells = nb.content.widgets.filter(c => c.model.type === 'code');
const errors = [];
for (const c of cells) for (const o of c.model.outputs.toJSON())
  if (o.output_type === 'error') errors.push(o.ename + ': ' + o.evalue);
return {kernel: kernel ? kernel.status : null, cells: cells.length,
        run: cells.filter(c => c.model.executionCount !== null).length,
        busy: cells.filter(c => c.node.querySelector('.jp-InputPrompt').textContent
                                  .includes('*')).length,
        errors: errors};
"""

# every output of every code cell: its mime type, its text, the charts drawn in it
OUTPUTS_JS = """
const out = [];
const cells = jupyterapp.shell.currentWidget.content.widgets.filter(c => c.model.type === 'code');
cells.forEach((c, i) => c.node.querySelectorAll('.jp-OutputArea-child > .jp-OutputArea-output')
  .forEach(o => out.push({cell: i, mime: o.getAttribute('data-mime-type'),
    text: o.innerText.slice(0, 300),
    charts: [...o.querySelectorAll('.vega-embed')].map(e => {
      const g = e.querySelector('canvas, svg.marks');
      const r = g ? g.getBoundingClientRect() : {width: 0, height: 0};
      return {width: r.width, height: r.height};
    })})));
return out;
"""


def _open_and_run(driver, lab, name: str) -> tuple[list[dict], float]:
    base, token = lab
    driver.get(f"{base}/lab/tree/notebooks/{name}?token={token}")
    _wait(lambda: (s := driver.execute_script(STATE_JS)) and s["kernel"] == "idle", 60,
          f"{name}: the notebook open with an idle kernel")
    t0 = time.monotonic()
    driver.execute_script("jupyterapp.commands.execute('notebook:run-all-cells')")

    last = {}

    def done():
        last.update(s := driver.execute_script(STATE_JS))
        assert not s["errors"], f"{name}: {s['errors']}"
        return s["run"] == s["cells"] and s["busy"] == 0 and s["kernel"] == "idle"

    try:
        _wait(done, RUN_S, f"{name}: Run All Cells")
    except AssertionError as exc:  # where it stood: cells run of all, busy, kernel
        raise AssertionError(f"{exc}; {last}") from None
    run_s = time.monotonic() - t0
    # the widgets draw after the kernel is idle: wait until every chart has its size
    def drawn():
        outs = driver.execute_script(OUTPUTS_JS)
        charts = [c for o in outs for c in o["charts"]]
        return outs if charts and all(c["width"] > 100 and c["height"] > 50
                                      for c in charts) else None

    outs = _wait(drawn, 30, f"{name}: every chart drawn")
    return outs, run_s


def _check_outputs(name: str, outs: list[dict], min_charts: int) -> int:
    """Every widget output is a drawn chart (or holds one), nothing shows a failure; the
    number of cells that drew a chart (each of these notebooks draws one per cell)."""
    for o in outs:
        bad = [f for f in FAILURES if f in o["text"]]
        assert not bad, f"{name}, code cell {o['cell']}: {bad}: {o['text']!r}"
        assert o["mime"] != "application/vnd.jupyter.stderr", \
            f"{name}, code cell {o['cell']} wrote to stderr: {o['text']!r}"
        if o["mime"] == "application/vnd.jupyter.widget-view+json":
            assert o["charts"], f"{name}, code cell {o['cell']}: a widget with no chart drawn"
    charts = len({o["cell"] for o in outs if o["charts"]})  # (an output nests in a widget's)
    assert charts >= min_charts, f"{name}: {charts} charts drawn, expected {min_charts}"
    return charts


def _shots(driver, name: str) -> None:
    folder = SHOTS / name.removesuffix(".ipynb")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for i, chart in enumerate(driver.find_elements(By.CSS_SELECTOR, ".vega-embed")):
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", chart)
        chart.screenshot(str(folder / f"chart-{i:02d}.png"))


def _tooltip(driver, chart) -> str:
    """Hover over a grid of points on a chart until vega's tooltip shows; its text."""
    drawn = chart.find_element(By.CSS_SELECTOR, "canvas, svg.marks")
    w, h = drawn.size["width"], drawn.size["height"]
    shown = ("const t = document.getElementById('vg-tooltip-element');"
             "return t && t.classList.contains('visible') ? t.innerText : '';")
    for fy in (0.45, 0.55, 0.65, 0.75, 0.35, 0.25):
        for fx in (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
            ActionChains(driver).move_to_element_with_offset(
                drawn, int((fx - 0.5) * w), int((fy - 0.5) * h)).perform()
            if text := driver.execute_script(shown):
                return text
    return ""


def _note(name: str, **numbers) -> None:
    """What the run measured, beside its screenshots (out/browser/NAME.json)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    (SHOTS / f"{name.removesuffix('.ipynb')}.json").write_text(json.dumps(numbers))


def _only_the_jupyter_server(driver, lab) -> None:
    base = lab[0]
    elsewhere = sorted(u for u in _requested(driver)  # (chrome://, data:, blob: stay inside)
                       if u.startswith(("http:", "https:", "ws:", "wss:"))
                       and not u.startswith((base, base.replace("http", "ws"))))
    assert not elsewhere, f"requests to other hosts: {elsewhere[:5]}"


def test_the_resolver_reaches_only_loopback(browser):
    """The proof that the charts below are drawn offline: the CDN altair's default
    renderer loads from is out of reach, by name and by address."""
    for url in ("https://cdn.jsdelivr.net/npm/vega@6?noext", "https://esm.sh/vega-embed@7"):
        browser.get("about:blank")
        err = browser.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0], {mode: 'no-cors'}).then(() => done('reached'),"
            " e => done(String(e)))", url)
        assert err != "reached", url
    _requested(browser)  # (these two were on purpose)


def test_notebook_04_draws_every_chart_and_its_slider_redraws(lab, browser):
    name = "04_policy.ipynb"
    outs, run_s = _open_and_run(browser, lab, name)
    charts = _check_outputs(name, outs, min_charts=3)  # spike, ramp dashboard, slider's
    # the slider (survival threshold, 250 ms, step 50): one step right with the keyboard
    box = browser.find_element(By.CSS_SELECTOR, ".widget-interact")
    old_chart = box.find_element(By.CSS_SELECTOR, ".vega-embed")
    old_text = box.find_element(By.CSS_SELECTOR, ".widget-output").text
    handle = box.find_element(By.CSS_SELECTOR, ".noUi-handle")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", box)
    t0 = time.monotonic()
    handle.send_keys(Keys.ARROW_RIGHT)

    def redrawn():
        try:
            old_chart.is_displayed()
            return None  # the old chart is still in the page
        except StaleElementReferenceException:
            pass
        charts = box.find_elements(By.CSS_SELECTOR, ".vega-embed canvas, .vega-embed svg.marks")
        return charts and charts[0].size["width"] > 100 and charts[0].size["height"] > 50

    _wait(redrawn, 60, "04: the chart below the slider redrawn", poll_s=0.05)
    redraw_s = time.monotonic() - t0
    readout = box.find_element(By.CSS_SELECTOR, ".widget-readout").text
    assert readout == "300", readout
    text = box.find_element(By.CSS_SELECTOR, ".widget-output").text
    assert text != old_text and not any(f in text for f in FAILURES), text
    assert "Warning" not in text, text  # the overload warning the notebook explains: silenced
    # still interactive: the redrawn timeline's bars carry their mode in a tooltip
    tip = _tooltip(browser, box.find_element(By.CSS_SELECTOR, ".vega-embed"))
    assert any(m in tip for m in ("normal", "performance", "survival")), repr(tip)
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / "04_policy_slider.png"))
    _shots(browser, name)
    _only_the_jupyter_server(browser, lab)
    _note(name, run_all_s=run_s, slider_redraw_s=redraw_s, charts=charts)


def test_notebook_09_draws_every_chart(lab, browser):
    name = "09_control_plane.ipynb"
    outs, run_s = _open_and_run(browser, lab, name)
    charts = _check_outputs(name, outs, min_charts=8)
    first = browser.find_element(By.CSS_SELECTOR, ".vega-embed")
    browser.execute_script("arguments[0].scrollIntoView({block: 'start'})", first)
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SHOTS / "09_control_plane.png"))
    _shots(browser, name)
    _only_the_jupyter_server(browser, lab)
    _note(name, run_all_s=run_s, charts=charts)
