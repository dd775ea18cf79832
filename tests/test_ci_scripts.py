"""CI's own scripts (.ci/): what .ci/uv-prefill passes to uv is the package sources pip is configured with."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_prefill():
    loader = importlib.machinery.SourceFileLoader("uv_prefill", str(ROOT / ".ci" / "uv-prefill"))
    spec = importlib.util.spec_from_loader("uv_prefill", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_uv_gets_pips_sources_with_the_most_binding_setting_of_each(monkeypatch):
    prefill = load_prefill()
    listed = ("global.find-links='/opt/global-wheels'\n"
              ":env:.find-links='/opt/wheels'\n"
              "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'\n"
              "user.constraint='/home/me/constraints.txt'\n"
              "global.constraint='/etc/constraints.txt'\n"
              "global.cert='/etc/ssl/certs/ca-certificates.crt'\n")
    monkeypatch.setattr(prefill.subprocess, "run",
                        lambda *args, **kwargs: subprocess.CompletedProcess(args, 0, stdout=listed))
    settings = prefill.pip_settings()
    assert settings == {"find-links": "/opt/wheels", "extra-index-url": "file:///opt/a/simple file:///opt/b/simple",
                        "constraint": "/home/me/constraints.txt", "cert": "/etc/ssl/certs/ca-certificates.crt"}
    assert prefill.uv_sources(settings) == [
        "--index-strategy", "unsafe-best-match",
        "--extra-index-url", "file:///opt/a/simple", "--extra-index-url", "file:///opt/b/simple",
        "--find-links", "/opt/wheels", "--constraint", "/home/me/constraints.txt"]


def test_without_pip_configuration_uv_uses_its_default_index():
    assert load_prefill().uv_sources({}) == ["--index-strategy", "unsafe-best-match"]
