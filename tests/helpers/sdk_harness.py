"""The official OJS SDKs, unmodified, from ../shared/ojs-sdks: the Python one installed into the venv by
`make install`, the JS one built here (npm ci, tsc) into build/ojs-js-sdk and driven by node scripts."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SDKS = Path(os.environ.get("OJS_SDKS_DIR") or ROOT.parent / "shared" / "ojs-sdks")
JS_BUILD = ROOT / "build" / "ojs-js-sdk"
NODE_TIMEOUT = 240


@contextlib.contextmanager
def _building():
    """One build at a time: tests on several pytest workers may ask for the same build at once."""
    (ROOT / "build").mkdir(exist_ok=True)
    with open(ROOT / "build" / ".sdk-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def js_sdk() -> Path:
    """The JS SDK's folder with node_modules and dist/esm, built once (again when the source changes).
    Its build reports three TypeScript errors of its own and still emits dist/esm (../shared/ojs-sdks)."""
    with _building():
        return _js_sdk()


def _js_sdk() -> Path:
    source = SDKS / "js"
    assert (source / "package.json").is_file(), f"the JS SDK is not at {source} (../shared/ojs-sdks/js)"
    stamp = JS_BUILD / ".built-from"
    mark = str(max(p.stat().st_mtime_ns for p in (source / "src").rglob("*.ts")))
    if stamp.is_file() and stamp.read_text() == mark and (JS_BUILD / "dist/esm/index.js").is_file():
        return JS_BUILD
    shutil.rmtree(JS_BUILD, ignore_errors=True)
    shutil.copytree(source, JS_BUILD, ignore=shutil.ignore_patterns("node_modules", "dist"))
    npm = ["npm", "--no-audit", "--no-fund", "--loglevel=error"]
    subprocess.run([*npm, "ci"], cwd=JS_BUILD, check=True, capture_output=True, timeout=600)
    subprocess.run(["npx", "tsc", "-p", "tsconfig.json"], cwd=JS_BUILD, capture_output=True, timeout=600)
    assert (JS_BUILD / "dist/esm/index.js").is_file(), "the JS SDK's build emitted no dist/esm"
    stamp.write_text(mark)
    return JS_BUILD


ADMIN_UI = Path(os.environ.get("OJS_ADMIN_UI_DIR") or ROOT.parent / "shared" / "ojs-admin-ui")
ADMIN_UI_BUILD = ROOT / "build" / "ojs-admin-ui"


def admin_ui() -> Path:
    """The official admin UI built from its source (npm ci, vite build) once; returns its dist-app.
    Its `build:app` script runs `tsc -b` first, which stops at an unused variable of its own
    (src/components/audit/AuditExplorer.tsx); vite's build of the same source is what it would ship."""
    with _building():
        return _admin_ui()


def _admin_ui() -> Path:
    assert (ADMIN_UI / "package.json").is_file(), f"the admin UI is not at {ADMIN_UI} (../shared/ojs-admin-ui)"
    stamp = ADMIN_UI_BUILD / ".built-from"
    mark = str(max(p.stat().st_mtime_ns for p in (ADMIN_UI / "src").rglob("*") if p.is_file()))
    dist = ADMIN_UI_BUILD / "dist-app"
    if stamp.is_file() and stamp.read_text() == mark and (dist / "index.html").is_file():
        return dist
    shutil.rmtree(ADMIN_UI_BUILD, ignore_errors=True)
    shutil.copytree(ADMIN_UI, ADMIN_UI_BUILD, ignore=shutil.ignore_patterns("node_modules", "dist", "dist-app"))
    npm = ["npm", "--no-audit", "--no-fund", "--loglevel=error"]
    subprocess.run([*npm, "ci"], cwd=ADMIN_UI_BUILD, check=True, capture_output=True, timeout=600)
    subprocess.run(["npx", "vite", "build"], cwd=ADMIN_UI_BUILD, check=True, capture_output=True, timeout=600)
    stamp.write_text(mark)
    return dist


def run_node(script: str, env: dict[str, str], name: str = "scenario") -> dict:
    """Run an ES module beside the built SDK (it imports `./dist/esm/index.js`); its last line of
    stdout is a JSON object, which is returned."""
    folder = js_sdk()
    path = folder / f"{name}.mjs"
    path.write_text(script)
    done = subprocess.run(["node", str(path)], cwd=folder, env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=NODE_TIMEOUT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, f"node {name} exited {done.returncode}:\n{done.stdout[-3000:]}\n" \
                                           f"{done.stderr[-3000:]}"
    return json.loads(lines[-1])
