"""Helpers to drive JupyterLab 4 / Notebook 7 from Playwright (sync API), from the shared recipe."""

from __future__ import annotations

import secrets
import time

# Lab: a fresh, uniquely named workspace per page, otherwise Lab restores the tabs of
# earlier tests (the "default" workspace) and selectors hit the wrong notebook.
URLS = {"lab": "/lab/workspaces/{ws}/tree/{name}", "notebook7": "/notebooks/{name}"}
# the visible notebook panel (hidden Lab tabs carry lm-mod-hidden)
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"


def open_notebook(page, server, name: str, ui: str = "lab") -> None:
    path = URLS[ui].format(name=name, ws="t" + secrets.token_hex(4))
    page.goto(server["base"] + path + f"?token={server['token']}")
    page.wait_for_selector(f"{PANEL} .jp-Notebook .jp-Cell", state="visible")
    wait_kernel_idle(page)


def wait_kernel_idle(page, timeout: float = 60_000) -> None:
    """Wait until a kernel is attached AND idle.  The toolbar execution indicator
    (Lab 4 and Notebook 7) reads data-status="idle" *before* any kernel exists
    ("No Kernel"), then initializing -> connecting -> unknown -> idle; a Shift+Enter
    sent during the first 'idle' is silently lost."""
    page.wait_for_function(
        """(panel) => {
            const p = document.querySelector(panel);
            const ei = p && p.querySelector('.jp-Notebook-ExecutionIndicator');
            const kn = p && p.querySelector('.jp-Toolbar-kernelName');
            return ei && ei.dataset.status === 'idle' && kn &&
                   kn.textContent.trim() !== '' && !/No Kernel/.test(kn.textContent);
        }""",
        arg=PANEL,
        timeout=timeout,
    )


def cell(page, index: int):
    return page.locator(f"{PANEL} .jp-Notebook .jp-Cell").nth(index)


def run_cell(page, index: int, wait: bool = True, timeout: float = 60_000) -> float:
    """Select cell `index` (command mode) and press Shift+Enter. Returns wall seconds
    until its execution count appears (or 0 if wait=False)."""
    c = cell(page, index)
    c.locator(".jp-InputPrompt").click()  # select without entering edit mode
    t0 = time.perf_counter()
    page.keyboard.press("Shift+Enter")
    if not wait:
        return 0.0
    # prompt text goes "[ ]:" -> "[*]:" -> "[n]:"
    page.wait_for_function(
        "el => /\\[\\d+\\]/.test(el.textContent)", arg=c.locator(".jp-InputPrompt").element_handle(), timeout=timeout
    )
    return time.perf_counter() - t0


KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def write_notebook(path, sources: list[str]):
    """A notebook with kernelspec metadata (without it Lab asks which kernel to use)."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = KERNELSPEC
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)
    return path
