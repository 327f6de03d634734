"""voxline installed from its wheel, not from the checkout: the wheel holds every module and the
page, and ``voxline serve`` run from it serves the real page (issue: a wheel install served
none, because the server looked for ``web/`` beside the source tree)."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import site
import subprocess
import sys
import threading
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent", "stages", "transports", "web")
PAGE = ("index.html", "app.js", "capture-worklet.js", "style.css")
# what a wheel may hold beside the packages; anything else (tests, benchmarks) leaked into it
WHEEL_TOP = {*PACKAGES, "voxline-0.1.0.dist-info"}
SERVE_TIMEOUT_S = 60.0

pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (cmd, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, dict[str, str]]:
    """The wheel built from a copy of the checkout, and a venv that has it installed: the
    venv sees the dependencies already installed (``--system-site-packages``), and the wheel's
    modules shadow the editable install of the checkout."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    # a copy, so building never writes into the checkout (nor races an install running there)
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", "__pycache__", "*.pyc", "*.egg-info", "build", "dist", ".venv", ".*_cache"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", str(tmp / "dist"), str(src)], tmp, env)
    (wheel,) = (tmp / "dist").glob("voxline-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], tmp, env)
    if sys.prefix != sys.base_prefix:
        # run from inside a virtual environment, "system" is the base Python: that environment's
        # site-packages come after the new venv's, .pth files and all, as system ones would
        (site_packages,) = (venv / "lib").glob("python3*/site-packages")
        (site_packages / "outer_site.pth").write_text(
            f"import site; [site.addsitedir(d) for d in {site.getsitepackages()!r}]\n")
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
          "--no-deps", "--no-index", "--ignore-installed", str(wheel)], tmp, env)
    return wheel, venv, env


def test_the_wheel_holds_every_module_and_the_page(installed):
    wheel, _, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {n.split("/", 1)[0] for n in names} == WHEEL_TOP
    for pkg in PACKAGES:
        for f in (ROOT / pkg).rglob("*.py"):
            assert f.relative_to(ROOT).as_posix() in names, f"{f} is not in the wheel"
    for f in PAGE:
        assert f"web/{f}" in names


def test_voxline_serve_from_the_wheel_serves_the_real_page(installed, tmp_path):
    _, venv, env = installed
    python = venv / "bin" / "python"
    # run from elsewhere: the checkout must not be importable, the venv's copy must be used
    where = _run([str(python), "-c", "import agent, transports.server as s; "
                  "print(agent.__file__); print(s.WEB_ROOT)"], tmp_path, env).split()
    assert all(Path(p).is_relative_to(venv) for p in where), where

    proc = subprocess.Popen([str(venv / "bin" / "voxline"), "serve", "--port", "0"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True).start()
    seen: list[str] = []
    try:
        url = None
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        while url is None:
            try:
                line = lines.get(timeout=0.2)
            except queue.Empty:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"voxline serve did not start (exit code {proc.poll()}):\n"
                                f"{''.join(seen)[-3000:]}")
                continue
            seen.append(line)
            if m := re.search(r"open (http://\S+/)", line):
                url = m.group(1)
        for path, name in [("", "index.html")] + [(f"static/{f}", f) for f in PAGE]:
            with urllib.request.urlopen(url + path, timeout=10) as r:
                assert r.status == 200
                assert r.read() == (ROOT / "web" / name).read_bytes(), name
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    assert rc == 0, seen
