"""A throw-away JupyterLab on 127.0.0.1 and headless Debian Chromium driven by Playwright.

Playwright never downloads a browser here: the system chromium is used. The
tests skip, saying why, when chromium or playwright is missing; `make test` installs both.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROME_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
REPO = Path(__file__).resolve().parents[2]

if not os.path.exists(CHROMIUM):
    pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright", reason="pip install playwright (no browser download needed)")
pytest.importorskip("jupyterlab")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def jupyter_server(tmp_path_factory):
    """`jupyter lab` on 127.0.0.1, which also serves Notebook 7; all user state isolated."""
    root = tmp_path_factory.mktemp("nbroot")
    home = tmp_path_factory.mktemp("jhome")
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(home / "lab-settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "lab-workspaces"),
        IPYTHONDIR=str(home / "ipython"),
        MPLBACKEND="module://matplotlib_inline.backend_inline",
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
    )
    # No "Jupyter news?" toast and no update check: both would reach the network.
    notif = home / "lab-settings" / "@jupyterlab" / "apputils-extension"
    notif.mkdir(parents=True)
    (notif / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    # No autosave: a notebook on disk changes only when a test saves it (Ctrl+S), so a save is tested.
    docs = home / "lab-settings" / "@jupyterlab" / "docmanager-extension"
    docs.mkdir(parents=True)
    (docs / "plugin.jupyterlab-settings").write_text('{"autosave": false}')
    log = open(home / "server.log", "w")
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}", "--ServerApp.allow_root=True", "--LabApp.extension_manager=readonly",
        "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while True:
        try:
            with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError((home / "server.log").read_text())
        time.sleep(0.3)
    yield {"base": base, "token": token, "root": Path(root), "log": home / "server.log"}
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


@pytest.fixture(scope="session")
def pw():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


@pytest.fixture()
def page(pw):
    """A fresh headless Chromium profile per test."""
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    ctx = pw.chromium.launch_persistent_context(
        user_data_dir=profile,
        executable_path=CHROMIUM,
        headless=True,
        args=CHROME_ARGS,
        viewport={"width": 1400, "height": 1000},
    )
    page = ctx.pages[0] if ctx.pages else ctx.new_page()
    page.set_default_timeout(90_000)
    messages: list[str] = []
    page.on("console", lambda m: messages.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: messages.append(f"pageerror: {e}"))
    page.console_messages = messages
    urls: list[str] = []
    page.on("request", lambda r: urls.append(r.url))
    page.request_urls = urls
    yield page
    ctx.close()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On failure, keep a screenshot and the console log."""
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" and rep.failed and "page" in item.funcargs:
        page = item.funcargs["page"]
        out = Path(tempfile.mkdtemp(prefix="nbdiff-browser-"))
        try:
            page.screenshot(path=str(out / "failure.png"))
            (out / "console.txt").write_text("\n".join(page.console_messages))
            rep.sections.append(("browser", f"failure screenshot: {out / 'failure.png'}"))
        except Exception as exc:  # pragma: no cover
            rep.sections.append(("browser", f"could not screenshot: {exc}"))
