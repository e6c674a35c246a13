"""How a job's rows become prompts: which field, whether the chat template renders them, and with what.

Decided once from `data`, so that the runtime's preparation of the training and eval sets reads one answer.
Whether the template applies depends also on the student's tokenizer (has it a chat template?), which only
the runtime loads; `uses_template` is that last decision, pure in (plan, has_template).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from distillery.api.spec import ChatTemplateUse, Data, OverlongPolicy


class PromptSource(StrEnum):
    MESSAGES = "messages"
    """data.messagesField: a conversation, split at its last assistant turn."""
    TEXT = "text"
    """data.promptField: one text, a user turn when the template applies."""


class TemplateRequired(ValueError):
    """The job needs a chat template (messages, a system prompt) and the student's tokenizer has none."""


@dataclass(frozen=True)
class PromptPlan:
    source: PromptSource
    row_field: str
    """The row field the prompt is read from."""
    template: ChatTemplateUse
    system_prompt: str | None = None
    template_kwargs: dict[str, bool | int | float | str] = field(default_factory=dict)
    """Passed to every rendering (the only one: teachers score the student's token ids)."""
    max_tokens: int = 1024
    overlong: OverlongPolicy = OverlongPolicy.REJECT


def resolve_prompts(data: Data) -> PromptPlan:
    """The prompt plan of a job with this `data` block."""
    source = PromptSource.MESSAGES if data.messages_field else PromptSource.TEXT
    return PromptPlan(
        source=source,
        row_field=data.messages_field or data.prompt_field,
        template=data.chat_template,
        system_prompt=data.system_prompt,
        template_kwargs=dict(data.chat_template_kwargs or {}),
        max_tokens=data.max_prompt_tokens,
        overlong=data.overlong_prompts,
    )


def uses_template(plan: PromptPlan, has_template: bool) -> bool:
    """Whether prompts go through the student's chat template, given whether its tokenizer has one.

    Raises TemplateRequired when the job asks for what only a template renders (a conversation, a system
    turn) and the tokenizer has none: tokenizing it as raw text would train on a prompt nobody meant."""
    if plan.template == ChatTemplateUse.NONE:
        return False
    needs = plan.source == PromptSource.MESSAGES or plan.system_prompt is not None
    if needs and not has_template:
        what = "data.messagesField" if plan.source == PromptSource.MESSAGES else "data.systemPrompt"
        raise TemplateRequired(
            f"{what} needs a chat template and the student's tokenizer has none; "
            "use a tokenizer with one (student.tokenizer) or promptField text with chatTemplate: none"
        )
    return has_template
