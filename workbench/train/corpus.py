"""The training corpus: CPython standard-library ``.py`` sources, split by file, tokenized.

    stdlib_root()                       the running interpreter's stdlib (sysconfig "stdlib")
    collect_documents(root)             sorted (relative path, text) pairs; site-packages excluded
    is_heldout(rel, fraction)           deterministic split by a hash of the relative path
    prepare_corpus(out, tokenizer, ...) train/held-out token streams (documents joined by EOS)
    load_corpus(dir)                    the prepared streams and their manifest

A prepared corpus directory holds ``corpus.json`` (manifest: interpreter, file lists'
fingerprints, token counts, the tokenizer's sha256), ``train.safetensors`` and
``heldout.safetensors`` (one 1-D ``tokens`` tensor each), and the tokenizer files it was
encoded with. Because the split hashes the *relative path*, a held-out path is held out
under every interpreter version.
"""

from __future__ import annotations

import hashlib
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .common import TrainError, read_json, sha256_file, write_json

EOS_TOKEN = "<|endoftext|>"
MASK_TOKEN = "<|mask|>"
DEFAULT_HELDOUT = 0.02
_EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def stdlib_root() -> Path:
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise TrainError(f"the interpreter's stdlib directory {root} does not exist")
    return root


def interpreter() -> str:
    return f"{platform.python_implementation()} {platform.python_version()}"


def is_heldout(rel: str, fraction: float = DEFAULT_HELDOUT) -> bool:
    """True for the files excluded from training: a hash of the relative (posix) path, not of content."""
    h = int(hashlib.sha256(("heldout:" + rel).encode()).hexdigest()[:8], 16)
    return h / 2**32 < fraction


def collect_documents(root: str | Path, suffixes: tuple[str, ...] = (".py",)) -> tuple[list[tuple[str, str]], list[str]]:
    """Every text file under ``root`` with one of ``suffixes`` (sorted by relative path),
    skipping site-packages/dist-packages/__pycache__. Returns (documents, skipped undecodable)."""
    root = Path(root)
    if not root.is_dir():
        raise TrainError(f"corpus directory {root} does not exist")
    docs, skipped = [], []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.suffix not in suffixes:
            continue
        rel = path.relative_to(root)
        if _EXCLUDED_DIRS & set(rel.parts[:-1]):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            skipped.append(rel.as_posix())  # a few test files are deliberately not UTF-8
            continue
        if text:
            docs.append((rel.as_posix(), text))
    if not docs:
        raise TrainError(f"no {'/'.join(suffixes)} files under {root}")
    return docs, skipped


def split_documents(docs, fraction: float = DEFAULT_HELDOUT):
    if not 0 <= fraction < 1:
        raise TrainError(f"held-out fraction must be in [0, 1), got {fraction}")
    train = [d for d in docs if not is_heldout(d[0], fraction)]
    heldout = [d for d in docs if is_heldout(d[0], fraction)]
    if not train:
        raise TrainError("every file fell into the held-out split; lower the held-out fraction")
    return train, heldout


def fingerprint(docs) -> str:
    h = hashlib.sha256()
    for rel, text in docs:
        h.update(rel.encode() + b"\0" + hashlib.sha256(text.encode()).digest())
    return h.hexdigest()


def encode_documents(tokenizer, docs, eos_id: int) -> torch.Tensor:
    """Documents joined with the EOS token (one after each document), as one 1-D int64 stream."""
    ids: list[int] = []
    if not docs:
        return torch.zeros(0, dtype=torch.int64)
    for enc in tokenizer.encode_batch([t for _, t in docs], add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.int64)


def _storage_dtype(vocab: int) -> torch.dtype:
    return torch.int16 if vocab <= 32767 else torch.int32


@dataclass
class Corpus:
    directory: Path
    manifest: dict
    train: torch.Tensor  # int64 [N]
    heldout: torch.Tensor  # int64 [M]


def prepare_corpus(
    out: str | Path,
    tokenizer_dir: str | Path,
    source: str | Path = "stdlib",
    heldout_fraction: float = DEFAULT_HELDOUT,
    suffixes: tuple[str, ...] = (".py",),
    log=print,
) -> Path:
    """Tokenize ``source`` (``stdlib`` or a directory) with the tokenizer in ``tokenizer_dir``."""
    from tokenizers import Tokenizer

    out = Path(out)
    tok_path = Path(tokenizer_dir) / "tokenizer.json"
    if not tok_path.is_file():
        raise TrainError(f"{tokenizer_dir}: no tokenizer.json")
    tokenizer = Tokenizer.from_file(str(tok_path))
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    if eos_id is None:
        raise TrainError(f"{tok_path}: the tokenizer has no {EOS_TOKEN} token")
    root = stdlib_root() if str(source) == "stdlib" else Path(source)
    docs, skipped = collect_documents(root, suffixes)
    train, heldout = split_documents(docs, heldout_fraction)
    log(f"corpus: {len(train)} training files, {len(heldout)} held-out files, {len(skipped)} skipped (not UTF-8) from {root}")
    train_ids = encode_documents(tokenizer, train, eos_id)
    heldout_ids = encode_documents(tokenizer, heldout, eos_id)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    out.mkdir(parents=True, exist_ok=True)
    dtype = _storage_dtype(vocab)
    save_file({"tokens": train_ids.to(dtype)}, str(out / "train.safetensors"))
    save_file({"tokens": heldout_ids.to(dtype)}, str(out / "heldout.safetensors"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        src = Path(tokenizer_dir) / name
        if src.is_file() and src.resolve() != (out / name).resolve():
            (out / name).write_bytes(src.read_bytes())
    manifest = {
        "source": "stdlib" if str(source) == "stdlib" else str(source),
        "root": str(root),
        "interpreter": interpreter() if str(source) == "stdlib" else None,
        "suffixes": list(suffixes),
        "heldout_fraction": heldout_fraction,
        "heldout_rule": "sha256('heldout:' + relative posix path)[:8] / 2**32 < heldout_fraction",
        "files": {"train": len(train), "heldout": len(heldout), "skipped_not_utf8": skipped},
        "bytes": {"train": sum(len(t.encode()) for _, t in train), "heldout": sum(len(t.encode()) for _, t in heldout)},
        "tokens": {"train": int(train_ids.numel()), "heldout": int(heldout_ids.numel())},
        "fingerprint": {"train": fingerprint(train), "heldout": fingerprint(heldout)},
        "heldout_files": [rel for rel, _ in heldout],
        "tokenizer_sha256": sha256_file(tok_path),
        "vocab_size": vocab,
        "eos_token_id": eos_id,
    }
    write_json(out / "corpus.json", manifest)
    log(f"corpus: {manifest['tokens']['train']:,} training tokens, {manifest['tokens']['heldout']:,} held-out tokens")
    return out


def _read_tokens(path: Path) -> torch.Tensor:
    with safe_open(str(path), framework="pt") as f:
        if "tokens" not in f.keys():
            raise TrainError(f"{path}: no 'tokens' tensor")
        t = f.get_tensor("tokens")
    if t.dim() != 1:
        raise TrainError(f"{path}: 'tokens' must be 1-D, got shape {tuple(t.shape)}")
    return t.to(torch.int64)


def is_prepared(directory: str | Path) -> bool:
    return (Path(directory) / "corpus.json").is_file()


def load_corpus(directory: str | Path) -> Corpus:
    directory = Path(directory)
    manifest = read_json(directory / "corpus.json", "corpus manifest")
    for name in ("train.safetensors", "heldout.safetensors"):
        if not (directory / name).is_file():
            raise TrainError(f"{directory}: prepared corpus lacks {name}")
    return Corpus(directory, manifest, _read_tokens(directory / "train.safetensors"), _read_tokens(directory / "heldout.safetensors"))


def check_corpus_tokenizer(corpus: Corpus, tokenizer_dir: str | Path, vocab_size: int) -> None:
    """A corpus is only usable with the tokenizer it was encoded with (and a model of that vocabulary)."""
    tok = Path(tokenizer_dir) / "tokenizer.json"
    want = corpus.manifest.get("tokenizer_sha256")
    if tok.is_file() and want and sha256_file(tok) != want:
        raise TrainError(
            f"corpus {corpus.directory} was tokenized with a different tokenizer than {tok} "
            "(sha256 differs); prepare the corpus again with this model's tokenizer"
        )
    top = int(max(corpus.train.max(), corpus.heldout.max() if corpus.heldout.numel() else 0))
    if top >= vocab_size:
        raise TrainError(f"corpus {corpus.directory} has token id {top} but the model's vocabulary has {vocab_size} entries")
    if corpus.train.numel() < 2:
        raise TrainError(f"corpus {corpus.directory} has fewer than 2 training tokens")
