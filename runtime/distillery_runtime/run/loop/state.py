"""The state one run of the loop carries from step to step (`LoopState`), what a run is told and what it
returns (`RunOptions`, `RunResult`), and where a local run keeps its checkpoints.

`LoopState` reads the job once: the plan, the tokenizer, the prepared data, the sampling settings and the
output files. The phases (`sampling.py`, `training.py`, `evaluation.py`, `checkpointing.py`) extend it with
their steps, and `loop.Loop` joins them into the step."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distillery.model_shapes import resolve_shape
from distillery.plan import resolve
from distillery.plan.agents.episodes import resolve_episodes
from distillery.plan.grader import resolve_grader
from distillery.plan.rollout.generation import end_token_ids, resolve_generation
from distillery.plan.teachers.scoring_overlap import teachers_scoring_after_rollout
from distillery.runtime_config import RuntimeConfig
from distillery_runtime.agents.environments import Environments
from distillery_runtime.agents.episodes import EpisodeRunner
from distillery_runtime.agents.observations import ObservationEncoder
from distillery_runtime.checkpoints import checkpoint
from distillery_runtime.data.data import PreparedData, check_training_rows, prepare, teacher_views
from distillery_runtime.data.generation_config import declared_end_tokens
from distillery_runtime.data.samples import RolloutSample
from distillery_runtime.data.uris import resolve_location
from distillery_runtime.observe.metrics import JsonlWriter, RuntimeMetrics
from distillery_runtime.rollout.base import SamplingSettings
from distillery_runtime.tasks.graders import load_grader
from distillery_runtime.teachers.clients.outage import OutageChange

log = logging.getLogger("distillery.runtime")


def local_checkpoints(output_dir: Path) -> Path:
    """Where a local run keeps its checkpoints."""
    return output_dir / "checkpoints"


def earlier_run_refusal(output_dir: Path, *, resume: bool, overwrite: bool) -> str | None:
    """Why a local run must not start in this folder: it holds an earlier run's checkpoints and neither
    --resume nor --overwrite says what to do with them. None when it may start."""
    if resume or overwrite:
        return None
    root = local_checkpoints(output_dir)
    complete = checkpoint.list_complete(root) if root.exists() else []
    if not complete:
        return None
    return (
        f"{root} holds {len(complete)} checkpoint(s) of an earlier run (newest: {complete[-1].path.name}): "
        "pass --resume to continue from it, or --overwrite to start fresh and delete them"
    )


@dataclass
class RunOptions:
    output_dir: Path
    resume: bool = False
    overwrite: bool = False
    """Local runs: start fresh in an output folder holding an earlier run's checkpoints, deleting them."""
    steps: int | None = None
    local: bool = True
    """Local run: checkpoints under the output directory; in a cluster: spec.checkpoint.path."""
    local_gpus: int = 0
    """Local run: the CUDA GPUs the machine shows it, where its standalone teachers run (`scoring_engine`)."""
    on_step: Callable[[dict[str, Any]], None] | None = None
    on_event: Callable[[str], None] | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    metrics: RuntimeMetrics | None = None
    status: Any | None = None
    """A StatusReporter (cluster) or None."""


@dataclass
class RunResult:
    steps_done: int
    total_steps: int
    stopped: bool
    records: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    last_checkpoint: str | None
    model: str | None = None
    """The final model's folder (`<checkpoints>/final`), once the run took its last step."""


class LoopState:
    """A run of one DistillationJob: owns the step counter, data position and output files."""

    def __init__(self, config: RuntimeConfig, options: RunOptions) -> None:
        from transformers import AutoTokenizer

        self.config = config
        self.spec = spec = config.spec
        self.options = options
        self.grader = load_grader(resolve_grader(spec.data))
        """Grades responses against `data.answerField` (eval accuracy, task reward); first, so that a
        grader that cannot be used (its module does not import) stops the job before anything loads (the
        plan's `grader` is the same function's)."""
        self.episodes = resolve_episodes(spec)
        """A tool-using student's episodes (spec.environment), or None: one response per prompt."""
        environments = Environments(self.episodes) if self.episodes is not None else None
        """Made here, after the grader and for the same reason: a module that does not import stops the job."""
        self.student_dir = resolve_location(spec.student.model)
        self.plan = resolve(
            spec,
            steps=options.steps,
            local_gpus=options.local_gpus if options.local else None,
            student=resolve_shape(self.student_dir),
        )
        """Every setting derived from the spec (distillery.plan): the run reads them from here."""
        self.scored_after_rollout = teachers_scoring_after_rollout(spec, local=options.local)
        """Teachers on the rollout's own CPU cores: they score a step's samples once its rollout is done."""
        self.total = self.plan.trainer.total_steps
        tok_dir = resolve_location(spec.student.tokenizer) if spec.student.tokenizer else self.student_dir
        self.tokenizer = AutoTokenizer.from_pretrained(tok_dir)
        self.episode_runner: EpisodeRunner | None = None
        if self.episodes is not None and environments is not None:
            encoder = ObservationEncoder(self.tokenizer, self.episodes.tool_call_format)
            self.episode_runner = EpisodeRunner(self.episodes, environments, encoder, self._text)
        prompts, routes = self.plan.prompts, self.plan.routes
        self.train_data: PreparedData = prepare(spec.data.train, spec.data, self.tokenizer, prompts, routes)
        check_training_rows(self.train_data, spec.data.train, spec)
        self.eval_data: PreparedData | None = (
            prepare(spec.data.eval, spec.data, self.tokenizer, prompts, routes) if spec.data.eval else None
        )
        self.teacher_views = teacher_views(self.train_data, self.eval_data)
        """The prompts teachers with a context of their own score after (`data.scored_prompt`)."""
        end_ids = end_token_ids(*declared_end_tokens(self.student_dir), self.tokenizer.eos_token_id)
        self.generation = resolve_generation(spec, end_ids)
        """How responses are sampled and where they end (every end token of the student, the stop strings)."""
        self.sampling = SamplingSettings.of(self.generation)
        out = options.output_dir
        self.ckpt_root = local_checkpoints(out) if options.local else Path(spec.checkpoint.path)
        self.metrics_file = JsonlWriter(out / "metrics.jsonl")
        self.eval_file = JsonlWriter(out / "eval.jsonl")
        self.samples_file = JsonlWriter(out / "samples.jsonl")
        """Each eval's responses, one JSON object a sample: what the student writes, read by a person."""
        self.metrics = options.metrics or RuntimeMetrics()
        self.metrics.total_steps.set(self.total)
        for prepared in (self.train_data, self.eval_data):
            if prepared is not None and prepared.truncated:
                self.metrics.truncated.inc(prepared.truncated)
            if prepared is not None and prepared.dropped:
                self.metrics.dropped.inc(prepared.dropped)
        self.notes = [
            f"{p.source}: {note}" for p in (self.train_data, self.eval_data) if p for note in p.notes
        ]
        self.records: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self.step_done = 0
        self.position = 0
        self.version = 0
        self.sync_bytes = 0
        """Bytes the last weight sync sent to the rollout engines (0 where the trainer samples itself)."""
        self.last_checkpoint: str | None = None
        self.saved_step = 0
        """Step of the newest checkpoint this run wrote or resumed from."""
        self.model: str | None = None
        """The final model's folder, once published (the last step's checkpoint, `checkpoint.publish_final`)."""
        self.model_dir = self.student_dir

    def teacher_outage(self, change: OutageChange) -> None:
        """A teacher stopped answering past its client's retries, or came back: said at once."""
        self.metrics.teacher_down(change.teacher, change.down)
        if change.down:
            self._event(
                f"teacher {change.teacher} is not answering; scoring waits for it up to {change.seconds:.0f} s "
                f"(spec.teacherOutageTimeoutSeconds), keeping what is scored: {change.error}"
            )
        else:
            self._event(
                f"teacher {change.teacher} answers again after {change.seconds:.0f} s; scoring goes on"
            )
        if self.options.status is not None:  # in a cluster: the job's TeachersReady condition shows it
            self.options.status.teacher_outage(change.teacher, change.down, change.error)

    def _event(self, message: str) -> None:
        log.info(message)
        if self.options.on_event:
            self.options.on_event(message)

    def _grade(self, sample: RolloutSample) -> float | None:
        """A sample's grade: its episode's environment reward where it gives one, else the grader's score of
        the response against the row's answer (None: no answer to grade against)."""
        if sample.episode is not None and sample.episode.reward is not None:
            return sample.episode.reward
        if sample.answer is None:
            return None
        return self.grader.score(self._text(sample.response_ids), sample.answer)

    def _text(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        assert isinstance(text, str)  # one sequence of ids decodes to one string
        return text

    def _prompt_text(self, ids: list[int]) -> str:
        """The prompt as the student saw it: the rendered chat template, special tokens included."""
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        assert isinstance(text, str)
        return text
