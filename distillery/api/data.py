"""The DistillationJob's data (`spec.data`): its sources, their format and chat template use, and the grader
of its answers."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated

from pydantic import Field

from distillery.api.base import ApiModel, Rule
from distillery.api.bounds import (
    MAX_MAP,
    MAX_NAME,
    FieldName,
    Location,
    Name,
)
from distillery.api.student import pvc_rule


class DataFormat(StrEnum):
    AUTO = "auto"
    JSONL = "jsonl"
    PARQUET = "parquet"


class OverlongPolicy(StrEnum):
    REJECT = "reject"
    DROP = "drop"
    TRUNCATE = "truncate"


class ChatTemplateUse(StrEnum):
    AUTO = "auto"
    NONE = "none"


HF_DATASETS_SCHEME = "hf://datasets/"
HF_DATASET_RE = "^hf://datasets/[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*$"
"""`hf://datasets/ORG/NAME`: the Hub's repository id rules (letters, digits, `-`, `_`, `.`)."""
"""A Hugging Face Hub dataset, `hf://datasets/ORG/NAME`, read through the `datasets` library."""
MAX_SPLIT = 253
MAX_SYSTEM_PROMPT = 65536
MAX_CHAT_KWARG = 1024
"""Longest string value of data.chatTemplateKwargs."""
ChatKwargValue = bool | int | float | Annotated[str, Field(max_length=MAX_CHAT_KWARG)]
"""A chat template variable: a scalar (templates read flags such as enable_thinking and short strings)."""


class DataSource(ApiModel):
    """A dataset: a file or a `datasets.save_to_disk` folder (local path in the runtime image, or URI), or a
    Hugging Face Hub dataset."""

    path: Location
    """Local path (in the image), or URI: pvc://CLAIM/PATH (mounted by the operator), s3://, gs://,
    synthetic://TASK/SPLIT, hf://datasets/ORG/NAME (the Hub, through the `datasets` library). A file is
    .jsonl, a JSON array (.json) or .parquet; a folder is one written by `datasets`' save_to_disk."""
    format: DataFormat = DataFormat.AUTO
    """auto = from the file extension (.jsonl/.json, .parquet)."""
    split: str = Field(default="train", min_length=1, max_length=MAX_SPLIT)
    """hf:// datasets and save_to_disk folders holding several splits: the split to read."""
    subset: Name | None = None
    """hf:// datasets only: the subset (`datasets`' config name), for datasets that have several, e.g.
    `main` of openai/gsm8k."""

    rules = (
        pvc_rule("path", "path"),
        Rule(
            check=lambda s: s.subset is None or s.path.startswith(HF_DATASETS_SCHEME),
            cel=f"!has(self.subset) || self.path.startsWith('{HF_DATASETS_SCHEME}')",
            message=f"applies only to {HF_DATASETS_SCHEME}ORG/NAME paths",
            field="subset",
        ),
        Rule(
            check=lambda s: (
                not s.path.startswith(HF_DATASETS_SCHEME) or re.fullmatch(HF_DATASET_RE, s.path) is not None
            ),
            cel=f"!self.path.startsWith('{HF_DATASETS_SCHEME}') || self.path.matches('{HF_DATASET_RE}')",
            message=f"a Hub dataset is {HF_DATASETS_SCHEME}ORG/NAME",
            field="path",
        ),
    )


class GraderName(StrEnum):
    AUTO = "auto"
    EXACT = "exact"
    GSM8K = "gsm8k"
    MATH = "math"
    REGEX = "regex"
    MODULE = "module"


MAX_PATTERN = 1024
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*([.][A-Za-z_][A-Za-z0-9_]*)*"
FUNCTION_RE = f"^{_DOTTED}:{_DOTTED}$"
"""`package.module:function` (the function may be an attribute path, `module:Class.method`)."""


class Grader(ApiModel):
    """How a response is graded against its row's answerField (held-out accuracy, taskRewardCoef's reward)."""

    name: GraderName = GraderName.AUTO
    """auto: a synthetic:// task's own grader, exact otherwise; exact: the whole response equals the answer
    (surrounding whitespace ignored); gsm8k: the number after `####` in the response, else its last number,
    equals the answer's (taken the same way; 1,234 and 72.0 read as numbers); math: the answer and the
    response's \\boxed{} answer (else its last expression) are mathematically equal (math-verify); regex: the
    first group (else the whole match) of `pattern` in the response equals the answer; module: `function`
    decides."""
    pattern: str | None = Field(default=None, min_length=1, max_length=MAX_PATTERN)
    """regex only: a Python regular expression searched for in the response, e.g. `answer: (-?[0-9]+)`."""
    function: str | None = Field(default=None, max_length=MAX_NAME, pattern=FUNCTION_RE)
    """module only: `package.module:function`, importable in the runtime image, called as
    function(response, answer) and returning a bool or a score in [0, 1]."""

    rules = (
        Rule(
            check=lambda g: (g.pattern is not None) == (g.name == GraderName.REGEX),
            cel="has(self.pattern) == (self.name == 'regex')",
            message="is required for name regex and not allowed for the other graders",
            field="pattern",
        ),
        Rule(
            check=lambda g: (g.function is not None) == (g.name == GraderName.MODULE),
            cel="has(self.function) == (self.name == 'module')",
            message="is required for name module and not allowed for the other graders",
            field="function",
        ),
    )


class Data(ApiModel):
    """Prompts, and how each is routed to its teacher."""

    train: DataSource
    """The prompts the student trains on."""
    eval: DataSource | None = None
    """Held-out prompts for evaluation (accuracy: the grader's mean score on answerField)."""
    prompt_field: FieldName = "prompt"
    """Field holding the prompt text: one user turn through the student's chat template (after systemPrompt's
    system turn) when the tokenizer has one, the raw text otherwise or with chatTemplate: none."""
    messages_field: FieldName | None = None
    """Field holding a conversation (a list of {role, content}); when set, it is used instead of promptField.
    Every turn before the last assistant turn is the prompt (system turn and history kept), rendered with
    the student's chat template; that last assistant turn is the row's reference response (the off-policy
    share) and, when the row has no answerField value, its reference answer."""
    response_field: FieldName | None = None
    """Field holding a reference response, used for the off-policy share when onPolicyFraction < 1 (messages
    rows: the last assistant turn, unless this field is set and present)."""
    answer_field: FieldName | None = "answer"
    """Field holding the reference answer that `grader` compares a response with (a number is read as its
    shortest form: 72.0 is "72")."""
    system_prompt: str | None = Field(default=None, min_length=1, max_length=MAX_SYSTEM_PROMPT)
    """A system turn put before every prompt that has none (promptField rows; messages rows without a
    system turn of their own)."""
    chat_template: ChatTemplateUse = ChatTemplateUse.AUTO
    """auto: render prompts with the student tokenizer's chat template when it has one; none: promptField
    text is tokenized as it is (base models)."""
    chat_template_kwargs: dict[str, ChatKwargValue] | None = Field(default=None, max_length=MAX_MAP)
    """Variables passed to every rendering of the chat template, e.g. {enable_thinking: false} for Qwen3
    (teachers score the student's token ids, so they see the same rendering)."""
    grader: Grader = Field(default_factory=Grader)
    route_field: FieldName = "data_source"
    """Field whose value picks the teacher of a sample."""
    max_prompt_tokens: int = Field(default=1024, ge=1, le=1048576)
    """Longest prompt, in student tokens."""
    overlong_prompts: OverlongPolicy = OverlongPolicy.REJECT
    """reject: fail the job naming the rows; drop: skip them (counted, named in the log); truncate: cut the
    last turn's content from its start (raw text: keep the last maxPromptTokens tokens), so the template's
    opening and the assistant header stay (counted)."""

    rules = (
        Rule(
            check=lambda d: d.messages_field is None or d.chat_template != ChatTemplateUse.NONE,
            cel="!has(self.messagesField) || self.chatTemplate != 'none'",
            message="messagesField needs the chat template: leave chatTemplate auto",
            field="chatTemplate",
        ),
        Rule(
            check=lambda d: d.system_prompt is None or d.chat_template != ChatTemplateUse.NONE,
            cel="!has(self.systemPrompt) || self.chatTemplate != 'none'",
            message="a system turn needs the chat template: leave chatTemplate auto",
            field="systemPrompt",
        ),
        Rule(
            # Set at all, even to {}: the CRD sees the map (its values untyped) but cannot count its keys.
            # Unset is None, so that a spec written back (to_yaml_dict) leaves it out.
            check=lambda d: d.chat_template_kwargs is None or d.chat_template != ChatTemplateUse.NONE,
            cel="!has(self.chatTemplateKwargs) || self.chatTemplate != 'none'",
            message="applies to the chat template, which chatTemplate: none turns off",
            field="chatTemplateKwargs",
        ),
        Rule(
            # The CRD keeps these values untyped (a scalar union has no structural schema, and CEL sees no
            # type in an untyped value): the API server accepts any, the operator refuses the job.
            check=lambda d: all(
                not isinstance(v, dict | list) for v in (d.chat_template_kwargs or {}).values()
            ),
            cel=None,
            message=f"values are booleans, numbers or strings of at most {MAX_CHAT_KWARG} characters",
            field="chatTemplateKwargs",
        ),
    )
