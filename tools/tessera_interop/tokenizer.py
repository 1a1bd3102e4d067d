"""tessera's two tokenizers as token tables other tools read (doc/interop.md, "Tokenizers").

Both are byte-level BPE in GPT-2's sense: a token is a string of GPT-2's printable stand-ins
for bytes. tessera's byte tokenizer is the special case with the 256 single bytes as tokens
(id = byte value), no merges, and <|endoftext|> as id 256: any text splits into its bytes,
whatever the pre-tokenizer, exactly as tessera encodes it.
"""
import json
import os

from .common import Refusal

EOS = "<|endoftext|>"


def byte_symbols():
    """GPT-2's map from a byte to a printable character (its bytes_to_unicode, rebuilt from the
    published rule: printable Latin-1 bytes stand for themselves, the others for 256 + n)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + \
        list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class Vocabulary:
    """tokens (by id), merges ("a b" strings, in rank order), eos id."""

    def __init__(self, tokens, merges, eos):
        self.tokens, self.merges, self.eos = tokens, merges, eos


def load(model, vocab_dir=None):
    if model.tokenizer == "byte":
        if model.vocab != 257:
            raise Refusal(f"model.vocab = {model.vocab} with the byte tokenizer, which has 257 tokens")
        symbols = byte_symbols()
        return Vocabulary([symbols[b] for b in range(256)] + [EOS], [], 256)
    if model.tokenizer != "gpt2":
        raise Refusal(f"data.tokenizer = {model.tokenizer!r}: only byte and gpt2 export")
    vocab_dir = vocab_dir or model.vocab_dir
    if not vocab_dir:
        raise Refusal("the model uses the gpt2 tokenizer: name its vocabulary directory "
                      "(encoder.json, vocab.bpe) with --vocab-dir (tools/fetch-gpt2-vocab fetches it)")
    try:
        with open(os.path.join(vocab_dir, "encoder.json"), encoding="utf-8") as f:
            encoder = json.load(f)
        with open(os.path.join(vocab_dir, "vocab.bpe"), encoding="utf-8") as f:
            lines = f.read().split("\n")
    except OSError as e:
        raise Refusal(f"cannot read the GPT-2 vocabulary in '{vocab_dir}': {e}")
    tokens = [None] * len(encoder)
    for text, i in encoder.items():
        tokens[i] = text
    if len(tokens) != model.vocab or None in tokens:
        raise Refusal(f"'{vocab_dir}/encoder.json' has {len(encoder)} tokens but model.vocab = "
                      f"{model.vocab}")
    merges = [ln for ln in lines if ln and not ln.startswith("#version")]
    return Vocabulary(tokens, merges, encoder[EOS])


def write_hf_files(vocab, seq_len, out_dir):
    """vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json: the files of
    Hugging Face's GPT2Tokenizer (byte-level BPE), for both of tessera's tokenizers."""
    with open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({t: i for i, t in enumerate(vocab.tokens)}, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "".join(m + "\n" for m in vocab.merges))
    special = {"bos_token": EOS, "eos_token": EOS, "unk_token": EOS}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(dict(special, tokenizer_class="GPT2Tokenizer", model_max_length=seq_len,
                       add_prefix_space=False, add_bos_token=False), f, indent=2)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump(special, f, indent=2)
