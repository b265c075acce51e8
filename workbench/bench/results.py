"""Finding committed results: the newest ``data/results/e2e-*.json`` that holds a given part.

A device session often splits the end-to-end bench into several runs (the pairs in one
10-minute command, the 27B dims in another), so "the newest file" is not enough: the readers
ask for the newest file that has the part they draw from.
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "data" / "results"

# The README's speed tables and figures are the H200's (issue 6). Runs on other cards are
# committed beside them (an H100 when no H200 could be had) but are drawn only when asked for
# (--device), so a later run on another card never silently replaces the reported figures.
REPORTED_DEVICE = "H200"


def has_part(result: dict, part: str) -> bool:
    """``part`` is ``"pairs"`` (bundled-pair rows) or ``"qwen36_27b_dims"`` (27B-dims verify timings)."""
    if part == "pairs":
        return bool(result.get("pairs"))
    if part == "qwen36_27b_dims":
        return bool(result.get("qwen36_27b_dims", {}).get("verify_ms"))
    raise ValueError(f"unknown e2e part {part!r} (pairs or qwen36_27b_dims)")


def e2e_results(results: Path = RESULTS):
    """Every readable ``e2e-*.json`` under ``results`` as (path, result), oldest first: by recorded
    date, then name (split runs of one day). Unreadable files are skipped."""
    loaded = []
    for path in results.glob("e2e-*.json"):
        try:
            loaded.append((path, json.loads(path.read_text())))
        except (OSError, json.JSONDecodeError):
            continue
    return sorted(loaded, key=lambda pr: (str(pr[1].get("date", "")), pr[0].name))


def on_device(result: dict, device: str | None) -> bool:
    """Whether ``result`` was measured on ``device`` (a case-insensitive part of its recorded device
    name, "H200" or "H100 80GB"); None or "any" takes any."""
    return device in (None, "any") or device.lower() in str(result.get("device", "")).lower()


def newest_e2e_with(part: str, results: Path = RESULTS, dtype: str | None = "bfloat16",
                    device: str | None = REPORTED_DEVICE) -> Path:
    """The newest e2e result that has ``part``.

    ``dtype`` keeps to runs in that precision (the fp32 exactness runs are not the speed figures);
    ``device`` to runs on that card (see ``on_device``); None or "any" takes any.
    """
    matching = [path for path, result in e2e_results(results)
                if has_part(result, part) and on_device(result, device)
                and (dtype is None or result.get("settings", {}).get("dtype") == dtype)]
    if not matching:
        raise FileNotFoundError(f"no e2e-*.json under {results} has a {part} part" + (f" in {dtype}" if dtype else "")
                                + (f" on a device named like {device!r}" if device not in (None, "any") else ""))
    return matching[-1]
