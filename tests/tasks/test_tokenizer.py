"""The character-level tokenizer: one token per character, round trips, EOS, and loading back."""

from __future__ import annotations

from distillery_runtime.tasks.build.tokenizer import build_char_tokenizer
from distillery_runtime.tasks.problems.addition import ALPHABET
from transformers import AutoTokenizer


def test_one_token_per_character_and_round_trip(tmp_path):
    tok = build_char_tokenizer(ALPHABET)
    text = "321+954=2850"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)  # no BOS and no merges
    assert tok.convert_ids_to_tokens(ids) == list(text)
    assert tok.decode([*ids, tok.eos_token_id], skip_special_tokens=True) == text
    assert len(tok) == 4 + len(ALPHABET)

    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again(text)["input_ids"] == ids
    assert again(text, add_special_tokens=False)["input_ids"] == ids
    assert again.eos_token == "</s>" and again.pad_token_id != again.eos_token_id


def test_chat_template_renders_prompt_then_answer_and_eos():
    tok = build_char_tokenizer(ALPHABET)
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "12+34="}, {"role": "assistant", "content": "46"}], tokenize=False
    )
    assert rendered == "12+34=46</s>"


def test_unknown_characters_map_to_unk():
    tok = build_char_tokenizer(ALPHABET)
    assert tok("1x")["input_ids"] == [tok.convert_tokens_to_ids("1"), tok.unk_token_id]
