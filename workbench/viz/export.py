"""Figure export: PNG / SVG / PDF through kaleido with the system's chromium, HTML through plotly.

    save(fig, "tree.png")                      one figure (format from the extension)
    save_many([(fig, "a.png"), (g, "b.pdf")])  many figures through ONE browser session

The browser is never downloaded: ``$BROWSER_PATH``, else /usr/bin/chromium, else chromium /
chromium-browser / google-chrome on PATH. Install it with ``env/install-chromium.sh``.
Files are written next to their destination and renamed into place (no half-written files).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from pathlib import Path

FORMATS = ("png", "svg", "pdf", "html")
STATIC = ("png", "svg", "pdf")
CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class BrowserNotFound(RuntimeError):
    pass


def chromium_path() -> str | None:
    """The browser kaleido (and the browser test) should drive, or None."""
    env = os.environ.get("BROWSER_PATH")
    if env:
        return env if os.access(env, os.X_OK) else None
    for c in CANDIDATES:
        if os.access(c, os.X_OK):
            return c
    for name in NAMES:
        p = shutil.which(name)
        if p:
            return p
    return None


def _require_browser() -> str:
    path = chromium_path()
    if path is None:
        hint = f" (BROWSER_PATH={os.environ['BROWSER_PATH']!r} is not executable)" if os.environ.get("BROWSER_PATH") else ""
        raise BrowserNotFound(
            f"static figure export (PNG/SVG/PDF) needs chromium and none was found{hint}: run env/install-chromium.sh "
            "(apt-get install chromium), or set BROWSER_PATH; HTML export works without it"
        )
    return path


def _format(path: Path) -> str:
    fmt = path.suffix.lower().lstrip(".")
    if fmt == "htm":
        fmt = "html"
    if fmt not in FORMATS:
        raise ValueError(f"{path}: unknown figure format {path.suffix!r}; expected one of .{', .'.join(FORMATS)}")
    return fmt


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp{path.suffix}")


def _size(fig, width, height):
    lay = fig.layout
    return int(width or lay.width or 900), int(height or lay.height or 500)


def _write_html(fig, path: Path, include_plotlyjs=True) -> None:
    tmp = _tmp(path)
    try:
        fig.write_html(str(tmp), include_plotlyjs=include_plotlyjs, full_html=True)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _run(coro_fn):
    """Run an async job to completion, also from inside a running loop (Jupyter kernels)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro_fn())
    box = {}

    def worker():
        try:
            box["value"] = asyncio.run(coro_fn())
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    t = threading.Thread(target=worker, name="workbench-figure-export")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")


def save_many(items, width: int | None = None, height: int | None = None, scale: float = 2.0, timeout: float = 120) -> list[Path]:
    """Write ``[(fig, path), ...]``; every static format goes through one chromium session."""
    items = [(fig, Path(p)) for fig, p in items]
    jobs = []
    for fig, path in items:
        fmt = _format(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "html":
            _write_html(fig, path)
        else:
            jobs.append((fig, path, fmt, _tmp(path)))
    if jobs:
        browser = _require_browser()
        import kaleido

        async def render():
            async with kaleido.Kaleido(n=1, timeout=timeout, mathjax=False, path=browser) as k:
                specs = []
                for fig, _, fmt, tmp in jobs:
                    w, h = _size(fig, width, height)
                    specs.append({"fig": fig.to_dict(), "path": str(tmp),
                                  "opts": {"format": fmt, "width": w, "height": h, "scale": scale if fmt == "png" else 1}})
                await k.write_fig_from_object(specs)

        try:
            _run(render)
            for _, path, _, tmp in jobs:
                if not tmp.is_file() or tmp.stat().st_size == 0:
                    raise RuntimeError(f"kaleido wrote nothing for {path}")
                os.replace(tmp, path)
        finally:
            for _, _, _, tmp in jobs:
                tmp.unlink(missing_ok=True)
    return [p for _, p in items]


def save(fig, path: str | Path, width: int | None = None, height: int | None = None, scale: float = 2.0) -> Path:
    """Write one figure; the format follows the extension (.png .svg .pdf .html)."""
    return save_many([(fig, path)], width, height, scale)[0]
