"""Multi-turn episodes played greedily with transformers: a task whose model calls a tool (the tools task's
calculator) is measured by playing its episodes, the environment's answers spliced in between turns.

A turn is generated until the environment's stop string (one token: `]`, the end of a call) or EOS, or until
its token budget runs out; the environment answers it (`step`: observation, done, error) and the observation
is appended to the context of the next turn. The episode ends when the environment says so (a turn with
no call is the answer) or after `max_turns` turns. The episode's response, what a grader reads, is the
turns and observations in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from distillery_runtime.tasks.base import Task


class Environment(Protocol):
    """One episode's environment: the interface a job names by `spec.environment.module`."""

    def reset(self, prompt: str, answer: str | None) -> None: ...
    def step(self, output: str) -> tuple[str, bool, bool]: ...


@dataclass
class Episode:
    prompt: str
    turns: list[str] = field(default_factory=list)
    """The model's turns (an opening given to `play_many` is the first)."""
    observations: list[str] = field(default_factory=list)
    """The environment's answer to each turn ("" to the one that ended the episode)."""
    errors: int = 0
    """Turns the environment flagged (the calculator: malformed calls)."""
    done: bool = False
    """Whether the environment ended it (False: it ran out of turns)."""

    @property
    def response(self) -> str:
        """The episode after its prompt: each turn followed by its observation."""
        return "".join(turn + seen for turn, seen in zip(self.turns, self.observations, strict=True))


def _take(episode: Episode, environment: Environment, turn: str) -> None:
    seen, done, error = environment.step(turn)
    episode.turns.append(turn)
    episode.observations.append(seen)
    episode.errors += int(error)
    episode.done = done


@torch.inference_mode()
def play_many(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    environment: Callable[[], Environment],
    stop: str,
    answers: Sequence[str | None] | None = None,
    openings: Sequence[str] | None = None,
    max_turns: int = 3,
    max_new_tokens: int = 16,
    batch_size: int = 256,
) -> list[Episode]:
    """Greedy episodes of `prompts`, one `environment()` each (reset with the prompt and its answer, when
    given). With `openings`, each episode's first turn is given, not generated (a malformed call, to see what
    the model does after the environment's error). `stop` must be one token of `tokenizer`; a turn has at
    most `max_new_tokens` tokens, an episode at most `max_turns` turns, the given opening included."""
    stop_ids = tokenizer(stop, add_special_tokens=False)["input_ids"]
    if len(stop_ids) != 1:
        raise ValueError(f"the stop string {stop!r} is {len(stop_ids)} tokens, not one")
    episodes = [Episode(prompt) for prompt in prompts]
    environments = [environment() for _ in prompts]
    for i, env in enumerate(environments):
        env.reset(prompts[i], answers[i] if answers is not None else None)
        if openings is not None:
            _take(episodes[i], env, openings[i])
    tokenizer.padding_side = "left"
    while True:
        going = [i for i, e in enumerate(episodes) if not e.done and len(e.turns) < max_turns]
        if not going:
            return episodes
        for start in range(0, len(going), batch_size):
            chunk = going[start : start + batch_size]
            contexts = [episodes[i].prompt + episodes[i].response for i in chunk]
            enc = tokenizer(contexts, return_tensors="pt", padding=True, add_special_tokens=False)
            gen = model.generate(  # type: ignore[operator]  # transformers' stubs type `generate` as a Tensor
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=[tokenizer.eos_token_id, stop_ids[0]],
            )
            turns = tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            for i, turn in zip(chunk, turns, strict=True):
                _take(episodes[i], environments[i], turn)


def play(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: str,
    *,
    environment: Callable[[], Environment],
    stop: str,
    answer: str | None = None,
    max_turns: int = 3,
    max_new_tokens: int = 16,
) -> Episode:
    """One greedy episode of `prompt` (`play_many`'s, alone)."""
    return play_many(
        model,
        tokenizer,
        [prompt],
        environment=environment,
        stop=stop,
        answers=None if answer is None else [answer],
        max_turns=max_turns,
        max_new_tokens=max_new_tokens,
    )[0]


def played_accuracy(episodes: Sequence[Episode], answers: Sequence[str], task: Task) -> float:
    """Fraction of episodes whose response `task` grades correct against its answer."""
    graded = (task.grade(e.response, answer) for e, answer in zip(episodes, answers, strict=True))
    return sum(graded) / len(episodes)
