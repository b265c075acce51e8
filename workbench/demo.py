"""``make demo``: the main job on the bundled default.

Until the bundled trained models exist this runs on a small *random-weight* hybrid target
with the synthetic oracle drafter (which knows the target's continuation), and says so:
a DDTree generation, then a losslessness audit of ``fork`` against ``unsafe``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .engine import GenerationConfig
from .trace import write_json_atomic

DEMO_PROMPTS = [
    "def fibonacci(n):\n",
    "import os\n\ndef list_files(path):\n",
    "class Stack:\n    def __init__(self):\n",
    "def is_prime(n: int) -> bool:\n",
    "for i in range(10):\n",
    "def quicksort(xs):\n",
]


def run_demo(out: str | Path = "out/demo", quiet: bool = False) -> int:
    from .random_models import write_random_pair
    from .runner import audit, load_target_and_tokenizer, run_prompt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr))
    say("demo: no bundled trained models yet -> a RANDOM-WEIGHT hybrid (Qwen3.5 layout: 3 GDN : 1 attention)")
    say("      with the synthetic oracle drafter (true token at rank 0 w.p. 0.5, else rank 1)")
    tdir, _ = write_random_pair(out / "random-hybrid", "hybrid", seed=0)
    target, tokenizer = load_target_and_tokenizer(tdir, "cpu")
    spec = "oracle:p=0.5,rank=1,block=8"
    cfg = GenerationConfig(method="ddtree", budget=16, max_new_tokens=64)
    trace = run_prompt(target, tokenizer, spec, DEMO_PROMPTS[0], cfg)
    trace.save(out / "ddtree-trace.json")
    say(f"ddtree+fork: {len(trace.generated_ids)} tokens, {len(trace.rounds)} rounds, mean acceptance "
        f"{trace.mean_acceptance:.2f}, {trace.sibling_round_fraction:.0%} of rounds accepted through a non-first sibling")
    reports = {}
    for mode in ("fork", "unsafe"):
        reports[mode] = audit(target, tokenizer, spec, DEMO_PROMPTS, GenerationConfig(method="ddtree", budget=16, recurrent=mode, max_new_tokens=48))
        r = reports[mode]
        say(f"audit ddtree+{mode}: {r['identical']}/{r['prompts']} outputs identical to AR")
    summary = {
        "note": "random-weight hybrid target + synthetic oracle drafter (no trained models bundled yet)",
        "generation": trace.summary(),
        "audit": {m: {k: v for k, v in r.items() if k != "per_prompt"} for m, r in reports.items()},
    }
    write_json_atomic(out / "summary.json", summary, indent=2)
    say(f"demo: wrote {out / 'summary.json'} and {out / 'ddtree-trace.json'}")
    ok = reports["fork"]["identical"] == reports["fork"]["prompts"]
    print(json.dumps({"fork_identical": reports["fork"]["identical"], "unsafe_identical": reports["unsafe"]["identical"],
                      "prompts": len(DEMO_PROMPTS), "mean_acceptance": trace.mean_acceptance}))
    return 0 if ok else 1
