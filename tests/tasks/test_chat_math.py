"""The chat-math task: GSM8K-style chat rows, prompts that never hold the answer, and the compact stand-in
that the preparation trains being exactly the full-vocabulary model it saves."""

from __future__ import annotations

import random

import pytest
import torch
from distillery_runtime.data.chat import render, split_conversation
from distillery_runtime.tasks import task_for
from distillery_runtime.tasks.base import final_number
from distillery_runtime.tasks.build.sft import encode_batch, sft_loss
from distillery_runtime.tasks.problems import chat_math
from distillery_runtime.tasks.recipes.chat_math_recipe import ChatMathRecipe, CompactQwenModels, QwenShape
from distillery_runtime.tasks.recipes.qwen import MODEL_VOCAB_SIZE, build_qwen_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_qwen_tokenizer("qwen2.5")


def test_rows_are_conversations_ending_in_a_gsm8k_answer():
    rows = ChatMathRecipe().train(300, seed=2)
    kinds = set()
    for row in rows:
        user, assistant = row["messages"]
        assert user["role"] == "user" and assistant["role"] == "assistant"
        assert assistant["content"].splitlines()[-1].startswith("#### ")
        problem_answer = int(final_number(assistant["content"]))
        assert problem_answer >= 0 and chat_math.TASK.grade(f"so {problem_answer}", assistant["content"])
        kinds.add(len(assistant["content"].splitlines()))
    assert kinds == {2, 3}  # one operation and two
    assert task_for("synthetic://chat-math/train") is chat_math.TASK


def test_held_out_problems_are_never_trained_on():
    train = {str(r["messages"]) for r in ChatMathRecipe().train(2000, seed=2)}
    held_out = {str(r["messages"]) for r in ChatMathRecipe().held_out(640, seed=1)}
    assert len(held_out) == 640 and not train & held_out


def test_the_prompt_a_job_renders_is_the_question_without_the_answer(tokenizer):
    recipe = ChatMathRecipe()
    for row in recipe.held_out(20, seed=1):
        conversation = split_conversation(row["messages"])
        ids = render(tokenizer, conversation.turns, {})
        text = tokenizer.decode(ids)
        assert text.endswith("<|im_start|>assistant\n") and "####" not in text
        assert conversation.response == row["messages"][-1]["content"]
        # What the preparation trained on is what a job renders (the same template, the same ids).
        assert recipe.graded([row], tokenizer)[0]["prompt"] == text
        assert len(ids) <= 64  # the example's maxPromptTokens


def test_the_compact_stand_in_is_the_full_model_it_saves(tokenizer):
    # The SFT loss of the compact model equals the full-vocabulary loss of its expansion: the softmax over
    # 151,936 rows whose unused rows all equal the shared one.
    recipe = ChatMathRecipe()
    rows = recipe.train(64, seed=2)
    models = recipe.models(tokenizer, rows)
    assert isinstance(models, CompactQwenModels) and models.vocab.size < 200
    compact = models.new_model(QwenShape(layers=1), seed=0).train()
    pairs = [recipe.training_pair(random.Random(i), tokenizer) for i in range(4)]
    ids, mask, labels = encode_batch(tokenizer, pairs)
    with torch.no_grad():
        torch.nn.init.normal_(compact.get_input_embeddings().weight, std=0.5)  # a shared row that matters
        full = models.exported(compact)
        assert full.get_input_embeddings().weight.shape[0] == MODEL_VOCAB_SIZE
        assert full.get_output_embeddings().weight.data_ptr() == full.get_input_embeddings().weight.data_ptr()
        assert models.loss_fn(compact, ids, mask, labels).item() == pytest.approx(
            sft_loss(full, ids, mask, labels).item(), rel=1e-4
        )


def test_text_outside_the_compact_vocabulary_is_refused(tokenizer):
    models = ChatMathRecipe().models(tokenizer, ChatMathRecipe().train(8, seed=2))
    compact = models.new_model(QwenShape(layers=1), seed=0)
    ids, mask, labels = encode_batch(tokenizer, [("Zebra", "xylophone")])
    with pytest.raises(ValueError, match="not in the compact vocabulary"):
        models.loss_fn(compact, ids, mask, labels)
