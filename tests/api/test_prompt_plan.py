"""The prompt half of the resolved plan (`distillery.plan.data.prompts`): which field a prompt comes from, and
whether the student's chat template renders it, given whether its tokenizer has one."""

from __future__ import annotations

from typing import Any

import pytest
from api.corpus import mutated

from distillery.api.spec import ChatTemplateUse, OverlongPolicy
from distillery.plan import resolve
from distillery.plan.data.prompts import PromptPlan, PromptSource, TemplateRequired, uses_template
from distillery.validation import parse_job


def prompts_of(base: dict[str, Any], **data: Any) -> PromptPlan:
    return resolve(parse_job(mutated(base, {f"spec.data.{k}": v for k, v in data.items()})).spec).prompts


def test_prompt_text_uses_the_template_where_the_tokenizer_has_one(base_manifest: dict[str, Any]) -> None:
    plan = prompts_of(base_manifest, maxPromptTokens=64, overlongPrompts="drop")
    assert (plan.source, plan.row_field, plan.template) == (PromptSource.TEXT, "prompt", ChatTemplateUse.AUTO)
    assert (plan.max_tokens, plan.overlong) == (64, OverlongPolicy.DROP)
    assert uses_template(plan, has_template=True) and not uses_template(plan, has_template=False)
    raw = prompts_of(base_manifest, chatTemplate="none")
    assert not uses_template(raw, has_template=True)


def test_messages_and_a_system_prompt_need_a_template(base_manifest: dict[str, Any]) -> None:
    chat = prompts_of(
        base_manifest, messagesField="conversation", chatTemplateKwargs={"enable_thinking": False}
    )
    assert (chat.source, chat.row_field, chat.template_kwargs) == (
        PromptSource.MESSAGES,
        "conversation",
        {"enable_thinking": False},
    )
    assert uses_template(chat, has_template=True)
    with pytest.raises(TemplateRequired, match=r"^data\.messagesField needs a chat template"):
        uses_template(chat, has_template=False)
    system = prompts_of(base_manifest, systemPrompt="Be brief.")
    with pytest.raises(TemplateRequired, match=r"^data\.systemPrompt needs a chat template"):
        uses_template(system, has_template=False)
