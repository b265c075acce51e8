"""Random draft trees for tests: deep, wide, and mixed."""

import random

from workbench.tree import Tree


def random_tree(n: int, max_depth: int, seed: int, shape: str = "mixed", vocab: int = 97) -> Tree:
    rng = random.Random(seed)
    parents, depths = [-1], [0]
    for i in range(1, n):
        if shape == "wide":
            candidates = [j for j in range(i) if depths[j] < min(2, max_depth)]
        elif shape == "deep":
            candidates = [j for j in range(max(0, i - 2), i) if depths[j] < max_depth]
        else:
            candidates = [j for j in range(i) if depths[j] < max_depth]
        candidates = candidates or [j for j in range(i) if depths[j] < max_depth] or [0]
        p = rng.choice(candidates)
        parents.append(p)
        depths.append(depths[p] + 1)
    # siblings need distinct tokens (a real draft never repeats a token under one parent)
    tokens, used = [rng.randrange(vocab)], {}
    for i in range(1, n):
        taken = used.setdefault(parents[i], set())
        t = rng.randrange(vocab)
        while t in taken:
            t = rng.randrange(vocab)
        taken.add(t)
        tokens.append(t)
    return Tree.from_parents(tokens, parents)


TREE_CASES = [
    (1, 1, "mixed"),
    (2, 1, "wide"),
    (7, 3, "mixed"),
    (16, 16, "deep"),
    (33, 2, "wide"),  # wider than deep
    (64, 16, "mixed"),
    (100, 5, "wide"),
    (256, 16, "mixed"),
]
