"""Helpers for the workbench-face tests: models, notebook outputs, browser lookup, file decoders."""

from __future__ import annotations

import json
import os
import shutil
import struct
import zlib
from pathlib import Path
from xml.etree import ElementTree

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
ORACLE = "oracle:p=0.5,rank=1,block=8"
PROMPT = "def fibonacci(n):\n"


def write_pair(directory: Path, **dims) -> Path:
    """A random-weight hybrid target with tokenizer; returns the target directory."""
    from workbench.random_models import write_random_pair

    target, _ = write_random_pair(directory, "hybrid", seed=0, **dims)
    return target


def session_for(target_dir: Path):
    from workbench.viz.session import open_session

    return open_session(str(target_dir), ORACLE, "cpu")


# ----------------------------------------------------------------------------------------------
# chromium: skip only where it truly cannot be had


def require_chromium() -> str:
    """The system chromium, or skip; where apt-get could install it (root, apt present) a missing
    browser is a failure, not a skip: CI has apt, so the browser tests must run there."""
    from workbench.viz.export import chromium_path

    path = chromium_path()
    if path:
        return path
    can_apt = shutil.which("apt-get") is not None and (os.geteuid() == 0 or shutil.which("sudo") is not None)
    if can_apt:
        pytest.fail("chromium is missing but apt-get is available here: run env/install-chromium.sh (make test does)")
    pytest.skip("no chromium and no apt-get to install it (static figure export and the browser test need it)")


# ----------------------------------------------------------------------------------------------
# executed notebooks


def load_notebook(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def outputs(nb: dict):
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            for out in cell.get("outputs", []):
                yield i, out


def figures(nb: dict) -> dict[str, dict]:
    """Figures the notebook displayed through FigureBook, by name (plotly JSON)."""
    found = {}
    for _, out in outputs(nb):
        data = out.get("data", {})
        name = out.get("metadata", {}).get("workbench", {}).get("figure")
        if name and "application/vnd.plotly.v1+json" in data:
            found[name] = data["application/vnd.plotly.v1+json"]
    return found


def numbers(nb: dict) -> dict[str, dict]:
    """The JSON outputs of show_numbers, by kind."""
    found = {}
    for _, out in outputs(nb):
        payload = out.get("data", {}).get("application/json")
        if isinstance(payload, dict) and "kind" in payload:
            found[payload["kind"]] = payload
    return found


def errors(nb: dict) -> list[dict]:
    return [out for _, out in outputs(nb) if out.get("output_type") == "error"]


def trace_named(fig: dict, name: str) -> dict:
    matches = [t for t in fig["data"] if t.get("name") == name]
    assert len(matches) == 1, f"expected one trace named {name!r}, found {[t.get('name') for t in fig['data']]}"
    return matches[0]


# ----------------------------------------------------------------------------------------------
# file decoders (no Pillow / pypdf needed)


def decode_png(path: Path) -> tuple[int, int]:
    """Parse every chunk (CRC checked), inflate the image data, check its length; return (w, h)."""
    raw = Path(path).read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    pos, chunks = 8, []
    while pos < len(raw):
        (length,) = struct.unpack(">I", raw[pos : pos + 4])
        kind = raw[pos + 4 : pos + 8]
        body = raw[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", raw[pos + 8 + length : pos + 12 + length])
        assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc, f"bad CRC in chunk {kind!r}"
        chunks.append((kind, body))
        pos += 12 + length
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert interlace == 0
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour]
    pixels = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
    assert len(pixels) == height * (1 + (width * channels * depth + 7) // 8), "image data has the wrong size"
    return width, height


def decode_svg(path: Path) -> ElementTree.Element:
    root = ElementTree.fromstring(Path(path).read_bytes())
    assert root.tag.endswith("svg"), root.tag
    return root


def decode_pdf(path: Path) -> int:
    """Check the header, trailer and that every Flate stream inflates; return the page count."""
    import re

    raw = Path(path).read_bytes()
    assert raw.startswith(b"%PDF-"), "not a PDF header"
    assert b"%%EOF" in raw[-1024:], "no PDF trailer"
    streams = 0
    for m in re.finditer(rb"/Filter\s*/FlateDecode.*?stream\r?\n", raw, re.S):
        start = m.end()
        end = raw.index(b"endstream", start)
        zlib.decompressobj().decompress(raw[start:end])
        streams += 1
    pages = len(re.findall(rb"/Type\s*/Page[^s]", raw))
    assert pages >= 1, "no pages"
    return pages


def export_formats() -> list[str]:
    """["png"] where chromium exists; [] where it truly cannot be had (notebook tests still run);
    a failure where apt could install it."""
    from workbench.viz.export import chromium_path

    if chromium_path():
        return ["png"]
    try:
        require_chromium()
    except pytest.skip.Exception:
        return []
    return ["png"]


def run_notebook(name: str, out: Path, **parameters) -> dict:
    """Execute a committed notebook with papermill into ``out``; returns the executed notebook."""
    import papermill

    out.mkdir(parents=True, exist_ok=True)
    executed = out / f"{name}.ipynb"
    papermill.execute_notebook(str(NOTEBOOKS / f"{name}.ipynb"), str(executed), parameters=parameters,
                               progress_bar=False, cwd=str(out))
    return load_notebook(executed)
