"""Tokenizers from a target directory (tokenizer.json, as HF saves it), with a clear error if absent."""

from __future__ import annotations

from pathlib import Path


class TokenizerError(ValueError):
    pass


class Tokenizer:
    """A thin wrapper over ``tokenizers.Tokenizer``: encode text to ids, decode ids to text."""

    def __init__(self, backend, eos_token_ids: list[int] | None = None):
        self.backend = backend
        self.eos_token_ids = list(eos_token_ids or [])

    @classmethod
    def from_directory(cls, directory: str | Path, eos_token_ids: list[int] | None = None) -> "Tokenizer":
        from tokenizers import Tokenizer as Backend

        path = Path(directory) / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(
                f"{directory}: no tokenizer.json; text prompts need the target's tokenizer files "
                "(or pass token ids)"
            )
        return cls(Backend.from_file(str(path)), eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def token_text(self, token_id: int) -> str:
        """How one token reads on its own (for hover labels)."""
        return self.backend.decode([int(token_id)], skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)
