"""A real browser: JupyterLab on loopback, the tree explorer opened in headless Debian chromium
through Playwright (the system browser, never a download), the notebook run, the round slider
moved, and the tree figure's node markers checked present and changed. Screenshots go to
out/browser/ (the CI artifact)."""

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from viz_helpers import NOTEBOOKS, ORACLE, REPO, load_notebook, require_chromium, write_pair

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
SHOTS = REPO / "out" / "browser"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def explorer_copy(directory: Path, target: str) -> Path:
    """The committed explorer with small parameters written into its parameters cell."""
    nb = load_notebook(NOTEBOOKS / "01_tree_explorer.ipynb")
    cell = next(c for c in nb["cells"] if "parameters" in c.get("metadata", {}).get("tags", []))
    values = {"target": target, "drafter": ORACLE, "budget": 8, "max_new_tokens": 32, "round_index": 0,
              "export_formats": [], "interactive": True}
    lines = []
    for line in "".join(cell["source"]).splitlines():
        name = line.split(":", 1)[0].strip()
        if name in values:
            annotation = line.split(":", 1)[1].split("=", 1)[0].strip()
            line = f"{name}: {annotation} = {json.dumps(values[name]) if not isinstance(values[name], bool) else values[name]}"
        lines.append(line)
    cell["source"] = "\n".join(lines)
    path = directory / "explorer.ipynb"
    path.write_text(json.dumps(nb, indent=1))
    return path


@pytest.fixture
def lab(tmp_path):
    require_chromium()
    root = tmp_path / "lab"
    root.mkdir()
    explorer_copy(root, str(write_pair(tmp_path / "pair")))
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ,
               JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    log = open(tmp_path / "lab.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--LabApp.extension_manager=readonly"] + (["--allow-root"] if os.geteuid() == 0 else []),
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited: {(tmp_path / 'lab.log').read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2).read()
                break
            except OSError:
                if time.time() > deadline:
                    raise RuntimeError(f"jupyter lab did not start: {(tmp_path / 'lab.log').read_text()[-2000:]}")
                time.sleep(0.5)
        # start the notebook's kernel session before the page opens: the page then attaches to it
        # instead of racing the kernelspec list (which can end in a "Select Kernel" dialog)
        body = json.dumps({"path": "explorer.ipynb", "type": "notebook", "name": "explorer.ipynb",
                           "kernel": {"name": "python3"}}).encode()
        req = urllib.request.Request(f"{base}/api/sessions", data=body, method="POST",
                                     headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
        json.loads(urllib.request.urlopen(req, timeout=60).read())
        yield base, token, lambda: (tmp_path / "lab.log").read_text(errors="replace")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


TREE_STATE = """
() => {
  const box = document.querySelector('.workbench-explorer');
  if (!box) return null;
  for (const plot of box.querySelectorAll('.js-plotly-plot')) {
    const title = plot.querySelector('.gtitle');
    if (!title || !title.textContent.includes('tree of')) continue;
    const traces = plot.data || [];
    const index = traces.findIndex(t => t.name === 'nodes');
    if (index < 0) return null;
    const groups = plot.querySelectorAll('.scatterlayer .trace');
    const points = groups[index] ? [...groups[index].querySelectorAll('path.point')] : [];
    return {
      title: title.textContent,
      markers: points.length,
      expected: traces[index].x.length,
      signature: points.map(p => (p.getAttribute('transform') || '') + (p.style.fill || '')).join('|'),
      tokens: (traces[index].customdata || []).map(c => c[1]),
    };
  }
  return null;
}
"""


def accept_dialog(page) -> bool:
    """If JupyterLab asks which kernel to use anyway, take its default (the notebook's python3)."""
    button = page.locator(".jp-Dialog .jp-Dialog-button.jp-mod-accept")
    if button.count() and button.first.is_visible():
        button.first.click()
        return True
    return False


def session_kernel_id(base: str, token: str) -> str | None:
    req = urllib.request.Request(f"{base}/api/sessions", headers={"Authorization": f"token {token}"})
    sessions = json.loads(urllib.request.urlopen(req, timeout=10).read())
    ids = [s["kernel"]["id"] for s in sessions if s.get("path", "").endswith("explorer.ipynb") and s.get("kernel")]
    return ids[0] if len(ids) == 1 else None


def wait_for_settled_kernel(page, base: str, token: str, quiet_s: float = 4.0, timeout_s: float = 90.0) -> None:
    """The page may still swap the session's kernel right after it opens (a new kernel started,
    the old one shut down); cells run on the old one would be lost. Wait until the notebook's
    session keeps one kernel for ``quiet_s`` and the page shows it idle."""
    deadline = time.time() + timeout_s
    last, since = None, time.time()
    while time.time() < deadline:
        accept_dialog(page)
        current = session_kernel_id(base, token)
        if current != last:
            last, since = current, time.time()
        elif current is not None and time.time() - since >= quiet_s:
            page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=90_000)
            return
        time.sleep(0.5)
    raise AssertionError(f"the notebook's kernel did not settle in {timeout_s:.0f}s (last {last})")


def execution_started(page) -> bool:
    """Some cell shows an execution prompt ([*] or [n]) instead of the empty [ ]."""
    prompts = page.evaluate("() => [...document.querySelectorAll('.jp-Cell .jp-InputPrompt')].map(e => e.innerText.trim())")
    return any(p not in ("", "[ ]:", "[ ]") for p in prompts)


def run_all_cells(page, base: str, token: str, lab_log, timeout_ms: int = 240_000) -> None:
    """Run > Run All Cells from the menu, as a user would; wait for the explorer widget. If the
    run never starts (the request went to a kernel the page let go of), ask once more."""
    wait_for_settled_kernel(page, base, token)
    for attempt in range(3):
        # the Run menu acts on the current widget: make the notebook current by selecting a cell
        page.locator(".jp-Notebook .jp-Cell .jp-InputPrompt").first.click()
        page.click(".lm-MenuBar-itemLabel:text-is('Run')")
        page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")
        deadline = time.time() + 45
        while time.time() < deadline and not execution_started(page):
            accept_dialog(page)
            time.sleep(0.5)
        if execution_started(page):
            break
        wait_for_settled_kernel(page, base, token)
    try:
        page.wait_for_selector(".workbench-explorer", timeout=timeout_ms)
    except Exception:
        page.screenshot(path=str(SHOTS / "failure.png"), full_page=True)
        (SHOTS / "failure-lab.log").write_text(lab_log())
        shown = page.evaluate("() => [...document.querySelectorAll('.jp-OutputArea-output')].map(e => e.innerText).join('\\n---\\n')")
        raise AssertionError(f"the explorer widget never appeared (run started: {execution_started(page)}); outputs:\n"
                             f"{shown[-3000:]}\nlab log:\n{lab_log()[-3000:]}")


def test_explorer_in_jupyterlab_with_headless_chromium(lab):
    from playwright.sync_api import sync_playwright

    base, token, lab_log = lab
    SHOTS.mkdir(parents=True, exist_ok=True)
    chromium = require_chromium()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1400})
            page.goto(f"{base}/lab/tree/explorer.ipynb?token={token}", wait_until="domcontentloaded", timeout=90_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=90_000)
            run_all_cells(page, base, token, lab_log)
            page.wait_for_function(f"({TREE_STATE})() && ({TREE_STATE})().markers > 0", timeout=60_000)
            before = page.evaluate(TREE_STATE)
            assert before["title"].startswith("Round 0:")
            assert before["markers"] == before["expected"] == 8  # one marker per draft node, drawn
            box = page.locator(".workbench-explorer")
            box.scroll_into_view_if_needed()
            page.screenshot(path=str(SHOTS / "explorer-round0.png"), full_page=True)

            # move the round slider: keyboard on its handle (noUiSlider), as a user would
            handle = box.locator(".widget-slider .noUi-handle").first
            handle.focus()
            handle.press("ArrowRight")
            page.wait_for_function(f"({TREE_STATE})() && !({TREE_STATE})().title.startsWith('Round 0:')", timeout=60_000)
            page.wait_for_function(f"({TREE_STATE})().markers > 0", timeout=30_000)
            after = page.evaluate(TREE_STATE)
            page.screenshot(path=str(SHOTS / "explorer.png"), full_page=True)
        finally:
            browser.close()
    assert after["title"].startswith("Round 1:"), after["title"]
    assert after["markers"] == after["expected"] == 8
    assert after["tokens"] != before["tokens"] and after["signature"] != before["signature"]
    assert (SHOTS / "explorer.png").stat().st_size > 10_000
