"""Check, before step 1, that every token the student can emit means the same to each teacher.

A teacher scores the student's token ids, and its top-k ids index the student's vocabulary, so every
student id must map to the same token string in the teacher. The teacher may have more: ids above the
student's (Qwen3's `<think>` = 151667 over Qwen2.5's 151665 tokens) are allowed, and the loss folds
teacher top-k ids beyond the student's embedding rows into its tail bucket (`losses.entry`). Encodings
of text are not compared: prompts are tokenized by the student and sent as ids.

The comparison is one pure function over id -> token maps (`first_difference`); the maps come from
tokenizer files (`tokenizer_vocabulary`), from Distillery's teacher server (`GET
/distillery/v1/vocabulary`), from a colocated engine, or, for an external server without that route,
from what vLLM's `/tokenize` says about a probe text (a partial map: only the ids it returns).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from distillery_runtime.teachers.types import TokenizerMismatchError
from distillery_runtime.teachers.wire import VOCABULARY_PATH

if TYPE_CHECKING:
    from distillery_runtime.teachers.access import ClientAccess

Vocabulary = Mapping[int, str]
"""token id -> token string, as `convert_ids_to_tokens` spells it (byte-level symbols for BPE)."""

DEFAULT_PROBES = (
    "Hello, world! 12+34=46",
    "  leading spaces\tand tabs\nnew lines",
    "ünïcødé 漢字 🙂",
)


@dataclass(frozen=True)
class TokenDifference:
    """The first student token id the teacher reads as another token (`teacher` None: it has no such id)."""

    token_id: int
    student: str
    teacher: str | None


def tokenizer_vocabulary(tok: Any) -> dict[int, str]:
    """Every id of a transformers tokenizer, added tokens included."""
    return {i: t for t, i in tok.get_vocab().items()}


def vocabulary_list(vocabulary: Vocabulary) -> list[str | None]:
    """The map as a list indexed by id (None for holes): the vocabulary route's JSON body."""
    out: list[str | None] = [None] * (max(vocabulary, default=-1) + 1)
    for i, token in vocabulary.items():
        out[i] = token
    return out


def first_difference(
    student: Vocabulary, teacher: Vocabulary, *, complete: bool = True
) -> TokenDifference | None:
    """The lowest student id whose token differs in the teacher; None when the teacher's vocabulary
    extends the student's. `complete` False: the teacher's map holds only some ids (an external server's
    `/tokenize` answer), so an id it lacks is unknown, not missing. Pure."""
    for i in sorted(student):
        theirs = teacher.get(i)
        if theirs is None and not complete:
            continue
        if theirs != student[i]:
            return TokenDifference(i, student[i], theirs)
    return None


def mismatch_message(teacher_name: str, difference: TokenDifference) -> str:
    """One line naming the teacher, the id and both tokens."""
    theirs = "no such id" if difference.teacher is None else repr(difference.teacher)
    return (
        f"{teacher_name}: token id {difference.token_id} is {difference.student!r} for the student but "
        f"{theirs} for the teacher, so its scores would not be of the student's tokens (a teacher's "
        "vocabulary must extend the student's: the same token at every student id)"
    )


def check_vocabulary(
    student: Vocabulary, teacher: Vocabulary, *, teacher_name: str = "teacher", complete: bool = True
) -> None:
    """Raise `TokenizerMismatchError` (one line) unless the teacher's vocabulary extends the student's."""
    difference = first_difference(student, teacher, complete=complete)
    if difference is not None:
        raise TokenizerMismatchError(mismatch_message(teacher_name, difference))


def check_tokenizer_compat(student_tok: Any, teacher_tok: Any, *, teacher_name: str = "teacher") -> None:
    """`check_vocabulary` of two transformers tokenizers."""
    check_vocabulary(
        tokenizer_vocabulary(student_tok), tokenizer_vocabulary(teacher_tok), teacher_name=teacher_name
    )


def probe_text(student_tok: Any, probes: Sequence[str] = DEFAULT_PROBES) -> str:
    """A text for an external server's `/tokenize`: the probes and every added token of the student (its
    chat and special tokens, where tokenizers of one family differ most)."""
    added = [token.content for token in getattr(student_tok, "added_tokens_decoder", {}).values()]
    return "\n".join([*probes, *added])


def tokenize_answer_vocabulary(
    student_ids: Sequence[int], teacher_ids: Sequence[int], teacher_strs: Sequence[str]
) -> dict[int, str]:
    """The partial teacher vocabulary a `/tokenize` answer shows (ids with their token strings). Where it
    split the probe text differently from the student, the student's id at the first such position is
    given the teacher's token there, so that `first_difference` names it. Pure."""
    seen = dict(zip(teacher_ids, teacher_strs, strict=True))
    for position, (ours, theirs) in enumerate(zip(student_ids, teacher_ids, strict=False)):
        if ours != theirs:
            seen[ours] = f"{teacher_strs[position]} (id {theirs} where the student has {ours})"
            break
    return seen


async def served_vocabulary(
    base_url: str,
    model: str,
    student_tok: Any,
    timeout: float = 60.0,
    access: ClientAccess | None = None,
) -> tuple[dict[int, str], bool] | None:
    """(vocabulary, complete) of a teacher's server: Distillery's vocabulary route (every id), else vLLM's
    `/tokenize` of `probe_text` (the ids it returns); None when the server has neither. `access`: the
    teacher's TLS context and key, as its scoring client sends them."""
    import aiohttp

    connector = aiohttp.TCPConnector(ssl=access.ssl) if access is not None else None
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=timeout),
        connector=connector,
        headers=access.headers if access is not None else None,
    ) as session:
        async with session.get(base_url.rstrip("/") + VOCABULARY_PATH) as response:
            if response.status not in (404, 405):
                response.raise_for_status()
                tokens = (await response.json())["tokens"]
                return {i: t for i, t in enumerate(tokens) if t is not None}, True
        text = probe_text(student_tok)
        body = {"model": model, "prompt": text, "add_special_tokens": False, "return_token_strs": True}
        async with session.post(base_url.rstrip("/") + "/tokenize", json=body) as response:
            if response.status in (404, 405):
                return None
            response.raise_for_status()
            answer = await response.json()
    if answer.get("token_strs") is None:  # a vLLM from before `return_token_strs`
        return None
    ours = student_tok.encode(text, add_special_tokens=False)
    return tokenize_answer_vocabulary(ours, answer["tokens"], answer["token_strs"]), False
