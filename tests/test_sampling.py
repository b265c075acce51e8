"""T > 0: DDTree samples have the distribution of AR sampling.

The workbench samples by Gumbel-max with noise keyed on (seed, position, token). Two claims:
1. that sampler draws from softmax(logits / T) (goodness of fit against exact probabilities);
2. over many seeds, the first 3 tokens DDTree emits have the same distribution as an
   independent AR sampler built on torch.multinomial (two-sample chi-square).
Each test's false-alarm rate is stated; seeds are fixed, so CI is deterministic.
"""

import torch
from scipy import stats

from workbench.drafters.dflash import DFlashDrafter
from workbench.engine import GenerationConfig, generate
from workbench.random_models import random_dflash, random_target
from workbench.tree import compile_chain
from workbench.verify import Sampler, gumbel_noise

ALPHA = 1e-3  # false-alarm rate per test (Bonferroni-split across the sub-tests)


def test_noise_is_a_pure_function_of_seed_position_and_token():
    pos = torch.tensor([0, 5, 5, 9])
    a, b = gumbel_noise(1, pos, 50), gumbel_noise(1, pos, 50)
    assert torch.equal(a, b) and torch.equal(a[1], a[2])
    assert not torch.equal(a[0], a[1]) and not torch.equal(a, gumbel_noise(2, pos, 50))
    # standard Gumbel: KS test of exp(-exp(-g)) against U(0, 1)
    g = gumbel_noise(7, torch.arange(400), 500).flatten()
    assert stats.kstest(torch.exp(-torch.exp(-g.double())).numpy(), "uniform").pvalue > ALPHA


def test_gumbel_sampler_draws_from_the_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    temperature = 0.8
    n = 20000
    picks = torch.cat([Sampler(temperature, seed).choose(logits.expand(50, -1), torch.arange(50)) for seed in range(n // 50)])
    counts = torch.bincount(picks, minlength=6).double()
    expected = torch.softmax(logits[0] / temperature, -1).double() * n
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert stats.chi2.sf(chi2, df=5) > ALPHA


def multinomial_ar(target, prompt, n_tokens, temperature, generator):
    """An independent AR sampler: torch.multinomial on softmax(logits / T), token by token."""
    cache = target.new_cache(len(prompt) + n_tokens + 2)
    logits = target.run_chain(prompt, cache, logits="last").logits[-1]
    out = []
    for _ in range(n_tokens):
        t = int(torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1, generator=generator))
        out.append(t)
        logits = target.run_chain([t], cache).logits[-1]
    return out


def two_sample_chi2_pvalue(a: list, b: list, min_count: int = 5) -> float:
    """Equal-size samples; categories with fewer than min_count pooled observations are merged."""
    cats = sorted(set(a) | set(b), key=str)
    ca = {c: 0 for c in cats}
    cb = dict(ca)
    for x in a:
        ca[x] += 1
    for x in b:
        cb[x] += 1
    big = [c for c in cats if ca[c] + cb[c] >= min_count]
    rest_a = sum(ca[c] for c in cats if c not in big)
    rest_b = sum(cb[c] for c in cats if c not in big)
    pairs = [(ca[c], cb[c]) for c in big] + ([(rest_a, rest_b)] if rest_a + rest_b else [])
    chi2 = sum((x - y) ** 2 / (x + y) for x, y in pairs)
    return stats.chi2.sf(chi2, df=len(pairs) - 1)


def test_first_tokens_of_ddtree_match_ar_sampling():
    # a 12-token vocabulary: a budget-16 tree covers most candidates, so acceptances through
    # non-first siblings are common even with a random drafter
    target = random_target("hybrid", seed=21, vocab_size=12, eos_token_id=None, hidden_size=32, intermediate_size=64)
    drafter = DFlashDrafter(random_dflash(target, seed=2, block_size=4, mask_token_id=11), target)
    prompt, temperature, n = [1, 4, 2, 7], 1.0, 1200
    tree_samples, ar_samples, sibling_rounds, rounds = [], [], 0, 0
    g = torch.Generator().manual_seed(0)
    for seed in range(n):
        cfg = GenerationConfig(method="ddtree", budget=16, temperature=temperature, seed=seed, max_new_tokens=3, trace_topk=0)
        trace = generate(target, prompt, cfg, drafter)
        tree_samples.append(tuple(trace.generated_ids))
        sibling_rounds += sum(r.through_sibling for r in trace.rounds)
        rounds += len(trace.rounds)
        ar_samples.append(tuple(multinomial_ar(target, prompt, 3, temperature, g)))
    assert sibling_rounds / rounds > 0.2  # the walk really leaves the first chain
    alpha = ALPHA / 4  # four sub-tests below
    for i in range(3):
        assert two_sample_chi2_pvalue([s[i] for s in tree_samples], [s[i] for s in ar_samples]) > alpha, f"token {i}"
    assert two_sample_chi2_pvalue([s[:2] for s in tree_samples], [s[:2] for s in ar_samples]) > alpha


def test_the_distribution_test_has_power():
    """The same machinery rejects a sampler at the wrong temperature."""
    target = random_target("dense", seed=3, vocab_size=12, eos_token_id=None, hidden_size=32, intermediate_size=64)
    prompt = [3, 1, 4]
    g = torch.Generator().manual_seed(1)
    right = [multinomial_ar(target, prompt, 1, 1.0, g)[0] for _ in range(1200)]
    wrong = [multinomial_ar(target, prompt, 1, 0.6, g)[0] for _ in range(1200)]
    assert two_sample_chi2_pvalue(right, wrong) < 1e-6
