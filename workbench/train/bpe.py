"""A byte-level BPE tokenizer (the ``tokenizers`` library) with ``<|endoftext|>`` and a reserved mask token.

Ids 0 and 1 are the special tokens (``<|endoftext|>``, ``<|mask|>``), then the 256 byte
symbols, then the merges. The mask token is never produced by encoding text: it exists for the
DFlash drafter's block (``[bonus, MASK x (B-1)]``), embedded with the target's table.
"""

from __future__ import annotations

from pathlib import Path

from .common import TrainError, write_json
from .corpus import EOS_TOKEN, MASK_TOKEN

SPECIAL_TOKENS = [EOS_TOKEN, MASK_TOKEN]


def train_bpe(texts, vocab_size: int = 4096, min_frequency: int = 2):
    """Train on an iterable of strings; deterministic for a given input order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if vocab_size < 256 + len(SPECIAL_TOKENS) + 1:
        raise TrainError(f"vocab_size {vocab_size} is too small for a byte-level BPE (need > {256 + len(SPECIAL_TOKENS)})")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=None)
    for i, t in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(t) != i:
            raise RuntimeError(f"special token {t} got id {tok.token_to_id(t)}, expected {i}")
    return tok


def save_bpe(tokenizer, directory: str | Path) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    write_json(
        directory / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": EOS_TOKEN,
            "pad_token": EOS_TOKEN,
            "mask_token": MASK_TOKEN,
            "additional_special_tokens": [MASK_TOKEN],
            "model_max_length": 4096,
            "clean_up_tokenization_spaces": False,
        },
    )
    return directory


def special_ids(tokenizer_dir: str | Path) -> tuple[int, int]:
    """(eos id, mask id) of a saved tokenizer, with a clear error if either is missing."""
    from tokenizers import Tokenizer

    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        raise TrainError(f"{tokenizer_dir}: no tokenizer.json")
    tok = Tokenizer.from_file(str(path))
    eos, mask = tok.token_to_id(EOS_TOKEN), tok.token_to_id(MASK_TOKEN)
    if eos is None or mask is None:
        raise TrainError(f"{path}: needs both {EOS_TOKEN} and {MASK_TOKEN} tokens (got ids {eos}, {mask})")
    return eos, mask
