"""workbench.viz.save: PNG / SVG / PDF through kaleido + the system chromium, HTML through plotly."""

import plotly.graph_objects as go
import pytest
from viz_helpers import decode_pdf, decode_png, decode_svg, require_chromium

import workbench.viz as viz
from workbench.viz import export


def figure(title="export test", n=5):
    fig = go.Figure(go.Scatter(x=list(range(n)), y=[i * i for i in range(n)], mode="lines+markers", name="squares"))
    fig.update_layout(title=title, width=640, height=360)
    return fig


def test_save_each_format_and_decode(tmp_path):
    require_chromium()
    fig = figure()
    paths = {"png": viz.save(fig, tmp_path / "fig.png"), "html": viz.save(fig, tmp_path / "fig.html")}
    paths["svg"], paths["pdf"] = viz.save_many([(fig, tmp_path / "fig.svg"), (fig, tmp_path / "fig.pdf")])
    for fmt, p in paths.items():
        assert p.is_file() and p.stat().st_size > 0, fmt
    assert decode_png(paths["png"]) == (640 * 2, 360 * 2)  # layout size at scale 2
    assert decode_png(viz.save(fig, tmp_path / "small.png", width=300, height=200, scale=1)) == (300, 200)
    svg = decode_svg(paths["svg"])
    assert svg.get("width") == "640" and svg.get("height") == "360"
    assert "export test" in paths["svg"].read_text()
    assert decode_pdf(paths["pdf"]) == 1
    html = paths["html"].read_text()
    assert "export test" in html and "plotly" in html.lower()
    assert not list(tmp_path.glob(".*tmp*")), "temporary files left behind"


def test_save_many_uses_one_browser_session(tmp_path, monkeypatch):
    require_chromium()
    import kaleido

    opened = []
    real = kaleido.Kaleido

    class Counting(real):
        def __init__(self, *a, **kw):
            opened.append(kw.get("path"))
            super().__init__(*a, **kw)

    monkeypatch.setattr(kaleido, "Kaleido", Counting)
    items = [(figure(f"figure {i}"), tmp_path / f"f{i}.{fmt}") for i in range(3) for fmt in ("png", "svg")]
    written = viz.save_many(items)
    assert len(opened) == 1 and opened[0] == export.chromium_path()
    assert written == [p for _, p in items]
    for p in written:
        assert p.stat().st_size > 0
        if p.suffix == ".png":
            assert decode_png(p) == (1280, 720)


def test_unknown_extension_fails_before_writing(tmp_path):
    with pytest.raises(ValueError, match="unknown figure format '.gif'"):
        viz.save_many([(figure(), tmp_path / "a.png"), (figure(), tmp_path / "b.gif")])
    assert not (tmp_path / "a.png").exists()


def test_missing_browser_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-chromium"))
    assert export.chromium_path() is None
    with pytest.raises(export.BrowserNotFound, match="install-chromium.sh"):
        viz.save(figure(), tmp_path / "x.png")
    # HTML needs no browser
    assert viz.save(figure(), tmp_path / "x.html").stat().st_size > 0


def test_save_inside_a_running_event_loop(tmp_path):
    """Jupyter kernels run an asyncio loop; export must still work from inside one."""
    require_chromium()
    import asyncio

    async def main():
        return viz.save(figure(), tmp_path / "in-loop.png")

    p = asyncio.run(main())
    assert decode_png(p) == (1280, 720)
