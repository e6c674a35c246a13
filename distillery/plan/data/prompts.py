"""How a job's rows become prompts: which field, whether the chat template renders them, and with what.

Decided once from `data`, so that the runtime's preparation of the training and eval sets reads one answer.
Whether the template applies depends also on the student's tokenizer (has it a chat template?), which only
the runtime loads; `uses_template` is that last decision, pure in (plan, has_template).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from distillery.api.spec import ChatTemplateUse, Data, OverlongPolicy, Teacher


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
    """Passed to every rendering, the teachers' views' too."""
    teacher_contexts: dict[str, str] = field(default_factory=dict)
    """Teacher name -> the system turn it sees and the student does not (`teachers[].systemPrompt`, context
    distillation): that teacher scores the prompt rendered with it (`with_context`), the student's tokens
    the same."""
    max_tokens: int = 1024
    overlong: OverlongPolicy = OverlongPolicy.REJECT


def resolve_prompts(data: Data, teachers: Sequence[Teacher] = ()) -> PromptPlan:
    """The prompt plan of a job with this `data` block and these teachers (their contexts)."""
    source = PromptSource.MESSAGES if data.messages_field else PromptSource.TEXT
    return PromptPlan(
        source=source,
        row_field=data.messages_field or data.prompt_field,
        template=data.chat_template,
        system_prompt=data.system_prompt,
        template_kwargs=dict(data.chat_template_kwargs or {}),
        max_tokens=data.max_prompt_tokens,
        overlong=data.overlong_prompts,
        teacher_contexts={t.name: t.system_prompt for t in teachers if t.system_prompt is not None},
    )


def with_context(system: str | None, context: str) -> str:
    """The system turn a teacher with `context` sees where the student's prompt has `system` (None: no
    system turn): the context first, the prompt's own system text after a blank line."""
    return context if system is None else f"{context}\n\n{system}"


def uses_template(plan: PromptPlan, has_template: bool) -> bool:
    """Whether prompts go through the student's chat template, given whether its tokenizer has one.

    Raises TemplateRequired when the job asks for what only a template renders (a conversation, a system
    turn) and the tokenizer has none: tokenizing it as raw text would train on a prompt nobody meant."""
    if plan.template == ChatTemplateUse.NONE:
        return False
    needs = (
        plan.source == PromptSource.MESSAGES or plan.system_prompt is not None or bool(plan.teacher_contexts)
    )
    if needs and not has_template:
        if plan.source == PromptSource.MESSAGES:
            what = "data.messagesField"
        elif plan.system_prompt is not None:
            what = "data.systemPrompt"
        else:
            what = f"the systemPrompt of teacher {min(plan.teacher_contexts)}"
        raise TemplateRequired(
            f"{what} needs a chat template and the student's tokenizer has none; "
            "use a tokenizer with one (student.tokenizer) or promptField text with chatTemplate: none"
        )
    return has_template
