"""What the notebooks run on: a target, its tokenizer and a drafter, with generations cached.

``open_session()`` with no arguments is the bundled default: the zoo pair
(``data/zoo/tiny-hybrid`` + ``tiny-hybrid-dflash``) when it exists, otherwise a small
random-weight hybrid written on the fly with the synthetic oracle drafter, and it says which.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

from ..engine import GenerationConfig, generate
from ..runner import (
    DEFAULT_DRAFTER,
    DEFAULT_TARGET,
    REPO_ROOT,
    ZOO_DIR,
    drafter_for,
    encode_prompt,
    is_oracle,
    load_dflash_drafter,
    load_target_and_tokenizer,
    reference_continuation,
)
from ..trace import Trace

DEFAULT_ORACLE = "oracle:p=0.5,rank=1,block=8"
def cache_dir() -> Path:
    """Where on-the-fly models go: $WORKBENCH_CACHE, else out/cache in the checkout."""
    return Path(os.environ.get("WORKBENCH_CACHE") or REPO_ROOT / "out" / "cache")

PROMPT_SETS = {
    "demo": [
        "def fibonacci(n):\n",
        "import os\n\ndef list_files(path):\n",
        "class Stack:\n    def __init__(self):\n",
        "def is_prime(n: int) -> bool:\n",
        "for i in range(10):\n",
        "def quicksort(xs):\n",
    ]
}


def load_prompt_set(source: str, n: int | None = None) -> list[str]:
    """``demo`` (bundled), ``humaneval``, or a JSON / JSONL prompt file."""
    if source in PROMPT_SETS:
        prompts = list(PROMPT_SETS[source])
        return prompts[:n] if n else prompts
    from ..prompts import load_prompts

    return load_prompts(source, n)


def zoo_available() -> bool:
    return (ZOO_DIR / DEFAULT_TARGET).is_dir()


def random_hybrid_dir(seed: int = 0, root: str | Path | None = None) -> Path:
    """A random-weight hybrid target (+ tokenizer), written once and reused.

    Written into a temporary sibling and renamed into place, so concurrent notebooks never
    read a half-written model.
    """
    from ..random_models import write_random_pair

    root = Path(root) if root is not None else cache_dir()
    final = root / f"random-hybrid-seed{seed}"
    if (final / "target" / "config.json").is_file() and (final / "target" / "tokenizer.json").is_file():
        return final / "target"
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".random-hybrid-seed{seed}."))
    try:
        write_random_pair(tmp, "hybrid", seed=seed)
        try:
            os.rename(tmp, final)
        except OSError:  # another process got there first: use theirs
            if not (final / "target" / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final / "target"


class Session:
    """A loaded target + tokenizer + drafter spec; ``generate`` caches by settings."""

    def __init__(self, target, tokenizer, drafter_spec: str | None, description: str, target_name: str, random_weights: bool):
        self.target = target
        self.tokenizer = tokenizer
        self.drafter_spec = drafter_spec
        self.description = description
        self.target_name = target_name
        self.random_weights = random_weights
        self._loaded_drafter = None
        self._traces: dict = {}
        self._references: dict = {}

    @property
    def recurrent(self) -> bool:
        return any(t == "linear_attention" for t in self.target.config.layer_types)

    def encode(self, prompt: str | list[int]) -> list[int]:
        return list(prompt) if isinstance(prompt, list) else encode_prompt(self.tokenizer, prompt)

    def _drafter(self, ids: list[int], cfg: GenerationConfig):
        if cfg.method == "ar":
            return None
        if is_oracle(self.drafter_spec):
            from ..drafters.oracle import OracleSpec

            block = OracleSpec.parse(self.drafter_spec).block
            key = (tuple(ids), cfg.temperature, cfg.seed)
            ref = self._references.get(key)
            if ref is None or len(ref) < len(ids) + cfg.max_new_tokens + block:
                ref = reference_continuation(self.target, ids, cfg, block)
                self._references[key] = ref
            return drafter_for(self.drafter_spec, self.target, ids, cfg, reference=ref)
        if self._loaded_drafter is None:
            self._loaded_drafter = load_dflash_drafter(self.drafter_spec, self.target)
        return self._loaded_drafter

    def config(self, **settings) -> GenerationConfig:
        fields = {f.name for f in dataclasses.fields(GenerationConfig)}
        unknown = set(settings) - fields
        if unknown:
            raise ValueError(f"unknown generation setting(s) {sorted(unknown)}: expected some of {sorted(fields)}")
        settings.setdefault("profile", self.target.device.type == "cuda")
        return GenerationConfig(**settings).validate()

    def generate(self, prompt: str | list[int], cache: bool = True, **settings) -> Trace:
        """One generation (``settings`` are GenerationConfig fields); identical calls are cached."""
        ids = self.encode(prompt)
        cfg = self.config(**settings)
        key = (tuple(ids), tuple(sorted(dataclasses.asdict(cfg).items())))
        if cache and key in self._traces:
            return self._traces[key]
        drafter = self._drafter(ids, cfg)
        trace = generate(self.target, ids, cfg, drafter, self.tokenizer)
        if cache:
            self._traces[key] = trace
        return trace


def open_session(target: str = "", drafter: str = "", device: str = "cpu", dtype: str = "auto", seed: int = 0) -> Session:
    """Load a target (directory or zoo name; "" = the bundled default) and pick its drafter.

    ``drafter`` "" means: the zoo's DFlash drafter for the zoo target, the oracle drafter for
    anything else (it needs no trained weights).
    """
    random_weights = False
    if not target:
        if zoo_available():
            target = DEFAULT_TARGET
            if not drafter:
                drafter = DEFAULT_DRAFTER if (ZOO_DIR / DEFAULT_DRAFTER).is_dir() else DEFAULT_ORACLE
            description = f"bundled zoo target {DEFAULT_TARGET} with drafter {drafter}"
        else:
            target = str(random_hybrid_dir(seed))
            random_weights = True
            drafter = drafter or DEFAULT_ORACLE
            description = (
                "no bundled trained models (data/zoo/tiny-hybrid is absent): using a RANDOM-WEIGHT hybrid "
                f"(Qwen3.5 layout, 3 GDN : 1 attention) written to {target}, with the synthetic drafter {drafter} "
                "(it knows the target's continuation). Text is gibberish; acceptance is controlled by the oracle."
            )
    else:
        drafter = drafter or DEFAULT_ORACLE
        description = f"target {target} with drafter {drafter}"
    model, tokenizer = load_target_and_tokenizer(target, device, dtype)
    if tokenizer is None:
        raise ValueError(f"target {target} has no tokenizer.json: the notebooks need text prompts")
    return Session(model, tokenizer, drafter, description, str(target), random_weights)
