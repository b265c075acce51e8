"""A small corpus for the training-recipe tests: a dozen standard-library files copied to a folder."""

import shutil
from pathlib import Path

from workbench.train.corpus import stdlib_root

FILES = ["textwrap.py", "bisect.py", "heapq.py", "colorsys.py", "fnmatch.py", "glob.py", "shlex.py", "keyword.py",
         "string.py", "dataclasses.py", "functools.py", "stat.py"]


def tiny_source(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    root = stdlib_root()
    for name in FILES:
        shutil.copyfile(root / name, directory / name)
    sub = directory / "pkg"
    sub.mkdir(exist_ok=True)
    (sub / "mod.py").write_text("def f(x):\n    return x + 1\n" * 20)
    site = directory / "site-packages"  # never part of the corpus
    site.mkdir(exist_ok=True)
    (site / "thirdparty.py").write_text("THIRD_PARTY = True\n")
    return directory
