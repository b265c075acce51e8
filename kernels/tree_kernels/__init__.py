"""Tree-verify kernels for DDTree on hybrid targets, each beside its plain-torch reference.

Installed as ``tree_kernels`` (the folder is ``kernels/`` in the repository; it is never a
package named ``kernels``, which is an unrelated project that transformers probes for).

The functions here dispatch: Triton on CUDA (or when forced), the torch reference otherwise.
The references live in ``tree_<op>/naive.py`` and are what every kernel is tested against.
"""

from __future__ import annotations

from .backend import get_backend, set_backend, triton_available, use_backend, use_triton
from .tree_attention import naive as attention_naive
from .tree_conv import naive as conv_naive
from .tree_gdn import naive as gdn_naive
from .tree_gdn.naive import TreeGDNStash

__all__ = [
    "TreeGDNStash",
    "get_backend",
    "set_backend",
    "use_backend",
    "use_triton",
    "triton_available",
    "tree_attention",
    "tree_conv1d",
    "tree_conv_commit",
    "tree_gdn_fork",
    "tree_gdn_commit",
]


def tree_gdn_fork(q, k, v, g, beta, state, anc, scale=None):
    """Exact ancestor-masked gated delta rule. See tree_gdn/naive.py."""
    return gdn_naive.tree_gdn_fork(q, k, v, g, beta, state, anc, scale)


def tree_gdn_commit(stash, state, path):
    return gdn_naive.tree_gdn_commit(stash, state, path)


def tree_conv1d(x, conv_state, weight, bias, index, activation="silu"):
    return conv_naive.tree_conv1d(x, conv_state, weight, bias, index, activation)


def tree_conv_commit(x, conv_state, path):
    return conv_naive.tree_conv_commit(x, conv_state, path)


def tree_attention(q, k, v, anc, prefix_len, scale=None, positions=None, window=None):
    return attention_naive.tree_attention(q, k, v, anc, prefix_len, scale, positions, window)
