"""MLflow's UI in headless Chromium (Debian's `chromium`): a screenshot kept as a test artefact and the
page's DOM once the app has rendered. Tests that need it skip, saying why, where Chromium is absent."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from workflow_cli import REPO

ARTIFACTS = REPO / "test-artifacts"  # screenshots, for a person to look at (ignored by git)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--virtual-time-budget=60000", "--hide-scrollbars",
                  "--run-all-compositor-stages-before-draw"]  # lets the lazily drawn charts finish


def chromium_or_skip() -> str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (apt-get install chromium); UI screenshot not taken")
    return chromium


def render(chromium: str, url: str, screenshot: str, profile: str | Path, window: str = "2200,900") -> str:
    """Screenshot `url` into ARTIFACTS/`screenshot` and return its DOM once the app has rendered, both in
    a browser window of `window` (width,height) pixels with a fresh profile under `profile`: one Chromium
    takes both, after the same virtual time (headless commands combine)."""
    ARTIFACTS.mkdir(exist_ok=True)
    shot_file = ARTIFACTS / screenshot
    shot_file.unlink(missing_ok=True)
    shown = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}/shot", f"--window-size={window}",
                            f"--screenshot={shot_file}", "--dump-dom", url], capture_output=True, text=True,
                           timeout=180)
    assert shot_file.exists() and shot_file.stat().st_size > 10_000, shown.stderr[-2000:]
    print(f"\nMLflow UI screenshot: {shot_file}")
    page = shown.stdout
    assert "<title>" in page, f"no page came back; chromium said: {shown.stderr[-2000:]}"
    return page
