"""A character-level tokenizer for arithmetic tasks, loadable by transformers and vLLM.

Every digit, '+', '=' and space is its own token: BPE tokenizers that merge digits ("12", "345")
hide the place value a model needs to learn addition, so a tiny model learns much slower. Built with
the `tokenizers` library (a BPE model with no merges and a `Fuse` decoder, so decoding concatenates
characters) and wrapped in `PreTrainedTokenizerFast` with pad/eos and a chat template.

No BOS is added when encoding: prompts are used as raw text, and a tokenizer that adds nothing gives
the same ids whether a caller asks for special tokens or not (vLLM's completions endpoint does, a
trainer may not).
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'assistant' %}</s>{% endif %}{% endfor %}"
)
"""Concatenates the turns: a user turn is the prompt, an assistant turn the answer then EOS."""


def build_char_tokenizer(alphabet: str, *, model_max_length: int = 64) -> PreTrainedTokenizerFast:
    """A tokenizer with one token per character of `alphabet` (after the four special tokens)."""
    chars = list(dict.fromkeys(alphabet))
    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *chars])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.add_special_tokens(list(SPECIALS))
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        model_max_length=model_max_length,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )
