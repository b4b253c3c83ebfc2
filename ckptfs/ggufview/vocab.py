"""The tokenizer keys of ``gguf/model.gguf``: one export per architecture, choosing among the vocabulary
readers (``vocab_spm``, ``vocab_bpe``) as the converter's class for it does, then special tokens, merges,
``add_*_token`` flags and the chat template from gguf-py's ``SpecialVocab``, read by the converter's gguf-py's
rules (``special``). The tokenizer files are read from the local folder, as the libraries read them.
Every export takes ``(GGUFWriter, config, folder)``.
"""

from __future__ import annotations

from pathlib import Path

from ckptfs.ggufview import Config, Unsupported
from ckptfs.ggufview.vocab_bpe import write_gpt2, write_wordpiece
from ckptfs.ggufview.files import read_json
from ckptfs.ggufview.vocab_spm import phi3_spm_vocab, spm_vocab, write_spm

_TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "vocab.json")


def _require_tokenizer(folder: Path) -> None:
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        raise Unsupported("the folder has no tokenizer (tokenizer.model, tokenizer.json or vocab.json)")


def writer_token_count(writer) -> int:
    import gguf

    return len(writer.kv_data[0][gguf.Keys.Tokenizer.LIST].value)


def _special(writer, folder: Path, **kwargs) -> None:
    from ckptfs.ggufview.special import SpecialVocab

    SpecialVocab(folder, **kwargs).add_to_gguf(writer)


def _spm(writer, folder: Path, config: Config, read=spm_vocab) -> None:
    tokens, scores, types = read(folder, config)
    write_spm(writer, tokens, scores, types)
    _special(writer, folder, n_vocab=len(tokens))


def _gpt2(writer, folder: Path, config: Config) -> None:
    write_gpt2(writer, folder, config)
    _special(writer, folder, load_merges=True)


def add_llama_vocab(writer, config: Config, folder: Path) -> None:
    """llama: ``add_prefix_space`` from ``tokenizer_config.json``; SentencePiece ``tokenizer.model`` first,
    then a SentencePiece-style ``tokenizer.json`` (gguf-py's ``LlamaHfVocab``), then GPT-2 BPE."""
    import gguf

    tokenizer_config = read_json(folder / "tokenizer_config.json")
    if tokenizer_config is not None:
        if (prefix := tokenizer_config.get("add_prefix_space")) is not None:
            writer.add_add_space_prefix(prefix)
        if tokenizer_config.get("tokenizer_class") == "HybridDNATokenizer":
            raise Unsupported("the HybridDNA tokenizer is not served")
    if (folder / "tekken.json").is_file() and not (folder / "tokenizer.json").is_file():
        raise Unsupported("a Mistral tekken.json tokenizer is not served")
    _require_tokenizer(folder)
    if (folder / "tokenizer.model").is_file():
        _spm(writer, folder, config)
    else:
        try:
            hf_vocab = gguf.LlamaHfVocab(folder)
        except (FileNotFoundError, TypeError):
            _gpt2(writer, folder, config)
        else:
            write_spm(writer, *map(list, zip(*hf_vocab.all_tokens())))
            _special(writer, folder, n_vocab=writer_token_count(writer))
    vocab_size = config.get("vocab_size", 32000)
    if vocab_size == 32016:
        raise Unsupported("CodeLlama's infill tokens are not served yet")
    if vocab_size == 49152:
        writer.add_add_bos_token(False)


def add_spm_or_gpt2_vocab(writer, config: Config, folder: Path) -> None:
    """qwen2/qwen3: a SentencePiece ``tokenizer.model`` if there is one, else GPT-2 BPE."""
    _require_tokenizer(folder)
    if (folder / "tokenizer.model").is_file():
        _spm(writer, folder, config)
    else:
        _gpt2(writer, folder, config)


def add_gpt2_vocab(writer, config: Config, folder: Path) -> None:
    """gpt-oss: GPT-2 BPE only."""
    _require_tokenizer(folder)
    _gpt2(writer, folder, config)


def add_gemma3_vocab(writer, config: Config, folder: Path) -> None:
    """gemma3: SentencePiece without a space prefix, else GPT-2 BPE."""
    _require_tokenizer(folder)
    if (folder / "tokenizer.model").is_file():
        _spm(writer, folder, config)
        writer.add_add_space_prefix(False)
    else:
        _gpt2(writer, folder, config)


def add_phi3_vocab(writer, config: Config, folder: Path) -> None:
    """phi3: GPT-2 BPE when ``tokenizer_config.json`` names ``GPT2Tokenizer`` (Phi-4), else its own
    SentencePiece export (``tokenizer.model`` required)."""
    tokenizer_config = read_json(folder / "tokenizer_config.json")
    if tokenizer_config is not None:
        if "tokenizer_class" not in tokenizer_config:
            raise Unsupported("tokenizer_config.json names no tokenizer_class")
        if tokenizer_config["tokenizer_class"] == "GPT2Tokenizer":
            _gpt2(writer, folder, config)
            return
    if not (folder / "tokenizer.model").is_file():
        raise Unsupported("the folder has no tokenizer.model")
    _spm(writer, folder, config, read=phi3_spm_vocab)


def add_wordpiece_vocab(writer, config: Config, folder: Path) -> None:
    """BERT: the WordPiece vocabulary in phantom-space form, special tokens without merges."""
    _require_tokenizer(folder)
    count = write_wordpiece(writer, folder, config)
    _special(writer, folder, n_vocab=count)
