"""pyproject lists every package (a non-editable install carries only the listed ones), and the
kernels never install under the bare name ``kernels``."""

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_every_package_directory_is_listed():
    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tool["packages"])
    found = set()
    for name, directory in tool["package-dir"].items():
        root = REPO / directory
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root)
            found.add(".".join([name, *rel.parts]) if rel.parts else name)
    assert found == listed, f"unlisted: {sorted(found - listed)}, listed but absent: {sorted(listed - found)}"
    assert "kernels" not in listed and not any(p.startswith("kernels.") for p in listed)
