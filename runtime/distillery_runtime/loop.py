"""The on-policy distillation loop, on Ray actors.

One step, top to bottom (`Loop.step`):
  rollout   the rollout actors (student.rollout.replicas) sample the step's responses, each a share, and
            stream each one out as it finishes (rollout_pool.py)
  teacher   each sample goes to its routed teacher the moment it arrives (scoring overlaps rollout); a
            teacher on the rollout's own CPU cores gets them once the rollout is done (plan.scoring_overlap)
  train     the trainer ranks take one optimizer step on their shards (gradients all-reduced)
  sync      the new weights stream from the trainers' shards to the rollout engine in buckets, over a
            torch.distributed group of their own (weight_sync.py), not through Ray's object store; none
            where the engine samples with the trainer's own model in its process (plan.rollout_in_trainer:
            one float32 CPU replica and the transformers engine); that process then also scores the
            teachers computed by their transformers forward (plan.teachers_in_trainer)
then metrics, status, checkpoint and evaluation when due. With `schedule.oneStepOff` the rollout of step
i+1 is started before step i trains, so sampling overlaps training and each sample is one policy version
stale (recorded as `staleness`). Everything stateful (engines, models, files) lives in the leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from distillery.api.spec import Placement, ResumePolicy
from distillery.model_shapes import resolve_shape
from distillery.plan import resolve
from distillery.plan.generation import EVAL_SAMPLES_LOGGED, end_token_ids, resolve_generation
from distillery.plan.grader import resolve_grader
from distillery.plan.host_threads import lone_process_env
from distillery.plan.scoring_overlap import teachers_scoring_after_rollout
from distillery.runtime_config import RuntimeConfig, TeacherProtocol
from distillery_runtime import checkpoint, plan
from distillery_runtime.data import PreparedData, PromptRecord, check_training_rows, prepare, take
from distillery_runtime.export import DTYPE_BYTES
from distillery_runtime.generation_config import declared_end_tokens
from distillery_runtime.metrics import JsonlWriter, RuntimeMetrics
from distillery_runtime.placement import RayPlacement
from distillery_runtime.rollout.base import GenerationRequest, SamplingSettings
from distillery_runtime.rollout_pool import RolloutPool
from distillery_runtime.rollout_stats import response_stats
from distillery_runtime.samples import RolloutSample, TrainSample
from distillery_runtime.tasks.graders import load_grader
from distillery_runtime.teachers.outage import OutageChange, OutageTracker, TeacherOutageError
from distillery_runtime.teachers.types import ScoreRequest
from distillery_runtime.trainer import MAX_METRICS, SUMMED_OVER_RANKS, step_normalizer
from distillery_runtime.uris import resolve_location

log = logging.getLogger("distillery.runtime")


class ResumeError(RuntimeError):
    """resume: required and no complete checkpoint exists."""


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


SYNC_BUCKET_BYTES = 256 * 1024**2
"""Bytes per bucket of a streamed weight sync: large enough to run at the link's speed, small enough that
a bucket of whole tensors is nothing beside a rank's shards."""


@dataclass
class Components:
    """The actors and clients of a run (started by `start_components`)."""

    trainers: list[Any]
    rollout: RolloutPool
    scoring: Any
    teachers: list[Any]
    """The actors of the teachers computed in the run (`workers.InProcessTeacherWorker`)."""
    rollout_dtype: str
    weight_metas: list[Any] | None = None
    """What a streamed weight sync sends (weight_sync.py); None: through the object store."""
    placement: Any = None
    """The student's placement groups (`placement.RayPlacement`), released when the run stops."""


class Loop:
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
        self.train_data: PreparedData = prepare(spec.data.train, spec.data, self.tokenizer)
        check_training_rows(self.train_data, spec.data.train, spec)
        self.eval_data: PreparedData | None = (
            prepare(spec.data.eval, spec.data, self.tokenizer) if spec.data.eval else None
        )
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
        self.last_checkpoint: str | None = None
        self.saved_step = 0
        """Step of the newest checkpoint this run wrote or resumed from."""
        self.model: str | None = None
        """The final model's folder, once published (the last step's checkpoint, `checkpoint.publish_final`)."""
        self.model_dir = self.student_dir

    # ---------------------------------------------------------------------------------------- setup

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

    def restore(self) -> None:
        """Pick the starting point: the newest complete checkpoint (per the resume policy) or step 0."""
        swept = checkpoint.sweep_temporary(self.ckpt_root)
        if swept:
            self._event(f"removed {swept} incomplete checkpoint(s) from {self.ckpt_root}")
        policy = self.spec.checkpoint.resume
        wanted = self.options.resume or (not self.options.local and policy != ResumePolicy.NEVER)
        ref = self._own_latest(policy) if wanted else None
        if ref is None and not self.options.local:
            self._refuse_other_runs(policy)
        if ref is None:
            if not self.options.local and policy == ResumePolicy.REQUIRED:
                raise ResumeError(
                    f"checkpoint.resume is required and {self.ckpt_root} holds no complete checkpoint"
                )
            if self.options.local and not self.options.resume:
                self._start_fresh()
            return
        state = checkpoint.read_state(ref)
        self.step_done = int(state["step"])
        self.position = int(state["position"])
        self.version = int(state["version"])
        self.model_dir = str(checkpoint.weights_dir(ref))
        self.last_checkpoint = str(ref.path)
        self.saved_step = self.step_done
        self.metrics_file.truncate_after(self.step_done)
        self.eval_file.truncate_after(self.step_done)
        self.samples_file.truncate_after(self.step_done)
        from distillery_runtime.metrics import read_jsonl

        self.records = read_jsonl(self.metrics_file.path)
        self.evals = read_jsonl(self.eval_file.path)
        published = checkpoint.read_final(self.ckpt_root)
        if (
            self.step_done >= self.total
            and published is not None
            and published.get("step") == self.step_done
            and checkpoint.belongs_to(published, self.config.run_id)
        ):
            self.model = str(self.ckpt_root / checkpoint.FINAL_DIR)
            return
        self._event(f"resuming from {ref.path} (step {self.step_done})")

    @property
    def finished(self) -> bool:
        """The run is finished: its last step's checkpoint is there and its model published as final/. True
        once `restore` finds it so (a driver retried after its last step, or `--resume` once more): nothing is
        left to run."""
        return self.step_done >= self.total and self.model is not None

    def _own_latest(self, policy: ResumePolicy) -> checkpoint.CheckpointRef | None:
        """The checkpoint to resume from: this run's newest; another run's only when resume is required
        (the user said to continue from what the folder holds)."""
        run = self.config.run_id
        mine = [
            ref
            for ref in checkpoint.list_complete(self.ckpt_root)
            if checkpoint.belongs_to(checkpoint.read_state(ref), run)
        ]
        if mine:
            return mine[-1]
        if policy == ResumePolicy.REQUIRED:
            return checkpoint.latest(self.ckpt_root)
        return None

    def _refuse_other_runs(self, policy: ResumePolicy) -> None:
        """A fresh run must not write (and prune) beside another run's checkpoints, nor resume them
        unasked: it stops before the first step, naming them."""
        others = checkpoint.other_runs(self.ckpt_root, self.config.run_id)
        if others and policy != ResumePolicy.REQUIRED:
            run = checkpoint.read_state(others[-1]).get("run")
            raise ResumeError(
                f"spec.checkpoint.path: {self.ckpt_root} holds {len(others)} checkpoint(s) of another run of "
                f"this job (job uid {run}, newest {others[-1].path.name}); set checkpoint.resume: required to "
                "continue from it, or point checkpoint.path at a new folder (they are never deleted)"
            )

    def preflight(self) -> None:
        """Before the first step: the checkpoint folder can be written and has room for this student's
        checkpoints (found now, not by a traceback at the first save after steps were spent)."""
        field = "--output" if self.options.local else "spec.checkpoint.path"
        checkpoint.preflight(
            self.ckpt_root,
            checkpoint.parameter_count(self.model_dir),
            field=field,
            model_bytes=DTYPE_BYTES[self.plan.export.dtype],
        )

    def _start_fresh(self) -> None:
        import shutil

        if self.ckpt_root.exists() and checkpoint.list_complete(self.ckpt_root):
            refusal = earlier_run_refusal(
                self.options.output_dir, resume=self.options.resume, overwrite=self.options.overwrite
            )
            if refusal:  # the CLI refuses before anything starts; this guards every other caller
                raise ResumeError(refusal)
            self._event(f"starting fresh (--overwrite): removing earlier checkpoints in {self.ckpt_root}")
            shutil.rmtree(self.ckpt_root)
        for path in (self.metrics_file.path, self.eval_file.path, self.samples_file.path):
            path.unlink(missing_ok=True)

    # ---------------------------------------------------------------------------------------- step parts

    def prompts_for(self, step: int) -> list[PromptRecord]:
        """The prompts of step `step` (1-based); pure in the data position."""
        n = self.spec.schedule.prompts_per_step
        return take(self.train_data.records, (step - 1) * n, n, self.spec.schedule.seed)

    async def rollout_and_score(self, c: Components, step: int) -> dict[str, Any]:
        """Sample the step's responses and score each as soon as it is out of the engine."""
        spec = self.spec
        records = self.prompts_for(step)
        started = time.perf_counter()
        on_policy = plan.is_on_policy(spec.schedule.seed, step, spec.loss.on_policy_fraction)
        scoring_tasks: dict[int, asyncio.Task] = {}
        held: dict[int, ScoreRequest] = {}
        samples: list[RolloutSample] = []
        if self.plan.rollout.sleeps:
            await c.scoring.wake_up()

        def submit(sample: RolloutSample) -> None:
            index = len(samples)
            samples.append(sample)
            request = ScoreRequest(sample.prompt_ids, sample.response_ids, sample.sample_id, sample.route)
            if self.scored_after_rollout and c.scoring.teacher_name(request) in self.scored_after_rollout:
                held[index] = request
            else:
                scoring_tasks[index] = asyncio.create_task(c.scoring.score_one(request))

        if on_policy:
            requests = plan.generation_requests(
                records, step, spec.student.rollout.samples_per_prompt, spec.schedule.seed
            )
            wanted = [r.sample_id for r in requests]
            sampling = replace(
                self.sampling, logprobs=plan.wants_logprobs(step, self.plan.rollout.logprobs_every)
            )
            async for sample in c.rollout.stream(requests, sampling):
                submit(sample)
        else:
            dataset = plan.dataset_samples(
                records, step, spec.student.rollout.samples_per_prompt, self.version
            )
            wanted = [s.sample_id for s in dataset]
            for sample in dataset:
                submit(sample)
        rollout_done = time.perf_counter()
        scoring_tasks.update({i: asyncio.create_task(c.scoring.score_one(r)) for i, r in held.items()})
        tasks = [scoring_tasks[i] for i in range(len(samples))]
        try:
            scored = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:  # a teacher gave up: the samples still waiting on others stop too
                task.cancel()
            raise
        done = time.perf_counter()
        # Samples stream out in completion order; train in request order so a run is reproducible.
        position = {sample_id: i for i, sample_id in enumerate(wanted)}
        ranked = sorted(range(len(samples)), key=lambda i: position[samples[i].sample_id])
        return {
            "samples": [samples[i] for i in ranked],
            "scored": [scored[i] for i in ranked],
            "on_policy": on_policy,
            "rollout_s": rollout_done - started,
            "teacher_s": done - rollout_done,
        }

    def train_samples(self, rolled: dict[str, Any]) -> list[TrainSample]:
        samples: list[RolloutSample] = rolled["samples"]
        advantages: dict[str, float] = {}
        if self.plan.loss.task_reward_coef > 0:
            advantages = plan.group_advantages(samples, self._reward)
        return [
            plan.train_sample(s, name, scores, advantages.get(s.sample_id, 0.0))
            for s, (name, scores) in zip(samples, rolled["scored"], strict=True)
        ]

    def _reward(self, sample: RolloutSample) -> float:
        if sample.answer is None:
            return 0.0
        return self.grader.score(self._text(sample.response_ids), sample.answer)

    def _text(self, ids: list[int]) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        assert isinstance(text, str)  # one sequence of ids decodes to one string
        return text

    async def train(self, c: Components, samples: list[TrainSample]) -> dict[str, float]:
        normalizer = step_normalizer(samples, self.plan.loss)
        shards = plan.shard(samples, len(c.trainers))
        results = await asyncio.gather(
            *(t.train_step.remote(s, normalizer) for t, s in zip(c.trainers, shards, strict=True))
        )
        return _combine_rank_metrics(results)

    async def sync(self, c: Components) -> None:
        if self.plan.rollout.in_trainer:  # the engine samples with the trainer's model: already in step
            return
        if c.weight_metas is not None:
            # Streamed: bucket by bucket from the shards to the engine, over the weight-sync group.
            await asyncio.gather(
                *(t.stream_weights.remote(c.rollout_dtype, SYNC_BUCKET_BYTES) for t in c.trainers),
                c.rollout.receive_weights(c.weight_metas, SYNC_BUCKET_BYTES, self.version),
            )
            return
        # Every rank takes part (FSDP2 gathers each tensor from the shards); rank 0's copy goes on.
        refs = [t.weights.remote(c.rollout_dtype) for t in c.trainers]
        await c.rollout.update_weights(refs[0], self.version)
        await asyncio.gather(*refs[1:])

    # ---------------------------------------------------------------------------------------- the loop

    async def run(self, c: Components) -> RunResult:
        try:
            return await self._run(c)
        except TeacherOutageError:
            # The finished steps are not thrown away with the run: save them, then fail.
            if self.step_done > self.saved_step:
                await self.save(c, self.step_done)
            raise

    async def _run(self, c: Components) -> RunResult:
        if self.step_done == 0 and self.eval_data is not None:
            await self.evaluate(c, 0)
        one_step_off = self.spec.schedule.one_step_off
        pending: asyncio.Task | None = None
        stopped = False
        step = self.step_done
        while step < self.total:
            step += 1
            started = time.perf_counter()
            rolled = await (pending or asyncio.create_task(self.rollout_and_score(c, step)))
            pending = None
            if one_step_off and step < self.total and not self.options.stop.is_set():
                pending = asyncio.create_task(self.rollout_and_score(c, step + 1))
            elif self.plan.rollout.sleeps:
                # Nothing samples or scores while the student trains: the engines on its GPUs free them.
                await asyncio.gather(c.scoring.sleep(), c.rollout.sleep())
            samples = self.train_samples(rolled)
            t_train = time.perf_counter()
            train_metrics = await self.train(c, samples)
            self.version += 1
            t_sync = time.perf_counter()
            if self.plan.rollout.sleeps:
                await c.rollout.wake_up()
            await self.sync(c)
            finished = time.perf_counter()
            self.step_done, self.position = step, step * self.spec.schedule.prompts_per_step
            record = self._record(step, rolled, samples, train_metrics, started, t_train, t_sync, finished)
            self._publish(c, record)
            stop = self.options.stop.is_set()
            if stop and pending is not None:
                await pending  # let the overlapped rollout finish; its samples are redone on resume
                pending = None
            if plan.is_due(step, self.spec.schedule.checkpoint_every, self.total) or stop:
                await self.save(c, step)
            if self.eval_data is not None and plan.is_due(step, self.spec.schedule.eval_every, self.total):
                # The rollout actor runs one call at a time: this evaluation queues behind the weight
                # sync above, so it sees the weights of `step` even while a rollout is overlapped.
                await self.evaluate(c, step)
            if stop:
                stopped = True
                self._event(f"stopped after step {step} (checkpoint saved)")
                break
        if pending is not None:
            await pending
        return self.result(stopped)

    def result(self, stopped: bool) -> RunResult:
        """What the run did so far (its end, or where a failure left it)."""
        return RunResult(
            self.step_done, self.total, stopped, self.records, self.evals, self.last_checkpoint, self.model
        )

    def _record(
        self,
        step: int,
        rolled: dict[str, Any],
        samples: list[TrainSample],
        train_metrics: dict[str, float],
        started: float,
        t_train: float,
        t_sync: float,
        finished: float,
    ) -> dict[str, Any]:
        tokens = sum(len(s.response_ids) for s in samples)
        step_s = finished - started
        staleness = max((self.version - 1 - s.policy_version for s in rolled["samples"]), default=0)
        return {
            "step": step,
            "loss": train_metrics.get("distill/loss"),
            "kl": train_metrics.get("distill/kl_k3"),
            "kl_per_teacher": plan.kl_per_teacher(samples),
            "grad_norm": train_metrics.get("train/grad_norm"),
            "lr": train_metrics.get("train/lr"),
            "on_policy": rolled["on_policy"],
            "staleness": staleness,
            "samples": len(samples),
            "generated_tokens": tokens if rolled["on_policy"] else 0,
            "response_tokens": tokens,
            "tokens_per_s": tokens / step_s if step_s > 0 else 0.0,
            "time/step_s": step_s,
            "time/rollout_s": rolled["rollout_s"],
            "time/teacher_s": rolled["teacher_s"],
            "time/train_s": t_sync - t_train,
            "time/sync_s": finished - t_sync,
            "samples_per_teacher": dict(Counter(s.teacher for s in samples)),
            **response_stats(rolled["samples"]),
            "entropy": train_metrics.get("distill/entropy"),
            # Rollout engine vs trainer log-probs of the same tokens: ~0 unless the two copies differ.
            "logprob_gap_mean": train_metrics.get("distill/logprob_gap_mean"),
            "logprob_gap_max": train_metrics.get("distill/logprob_gap_max"),
            "metrics": train_metrics,
            "time": time.time(),
        }

    def _publish(self, c: Components, record: dict[str, Any]) -> None:
        stats = c.scoring.take_stats()
        self.metrics.record_retries(c.scoring.retries())
        self.records.append(record)
        self.metrics_file.write(record)
        self.metrics.record_step(record, dict(stats.seconds))
        if self.options.on_step:
            self.options.on_step(record)
        if self.options.status is not None:
            self.options.status.progress(record, self.total)

    async def save(self, c: Components, step: int) -> None:
        started = time.perf_counter()
        state = {
            "position": self.position,
            "version": self.version,
            "job": self.config.job_name,
            "run": self.config.run_id,
        }
        # The last step's checkpoint is also published as final/, by rank 0, which wrote it: without a
        # claim the driver's pod may not see that folder at all.
        final = step == self.total
        # Every rank takes part (FSDP2 gathers weights and optimizer state); rank 0 writes.
        paths = await asyncio.gather(
            *(
                t.save_checkpoint.remote(
                    str(self.ckpt_root), step, state, self.spec.checkpoint.keep, self.plan.export, final
                )
                for t in c.trainers
            )
        )
        path, model = paths[0]
        seconds = time.perf_counter() - started
        self.metrics.checkpoint_seconds.observe(seconds)
        self.metrics.checkpoint_step.set(step)
        self.last_checkpoint = path
        self.saved_step = step
        self._event(f"checkpoint step {step}: {path} ({seconds:.2f} s)")
        if self.options.status is not None:
            self.options.status.checkpoint(step, path)
        if model:
            self.model = model
            self._event(f"final model ({self.plan.export.dtype}): {model}")
            if self.options.status is not None:
                self.options.status.model(step, model, self.plan.export.dtype)

    async def evaluate(self, c: Components, step: int) -> float:
        """Greedy decoding of the held-out prompts. Those with a reference answer are graded by the job's
        grader (the accuracy is the mean score; NaN when none has one); the first `EVAL_SAMPLES_LOGGED`
        responses are scored by their teachers, whose per-token KL is the quality signal of data with no
        reference. Every sample goes to samples.jsonl, so that a user can read what the student writes."""
        assert self.eval_data is not None
        records = list(self.eval_data.records)
        if not records:
            return float("nan")
        requests = [
            GenerationRequest(
                sample_id=f"eval-{r.index}", prompt_ids=r.prompt_ids, seed=0, route=r.route, answer=r.answer
            )
            for r in records
        ]
        started = time.perf_counter()
        outputs = await c.rollout.generate(requests, self.sampling.for_eval())
        grades = [
            None if o.answer is None else self.grader.score(self._text(o.response_ids), o.answer)
            for o in outputs
        ]
        scored = await self._score_eval_samples(c, outputs[:EVAL_SAMPLES_LOGGED])
        graded = [g for g in grades if g is not None]
        accuracy = sum(graded) / len(graded) if graded else None
        stats = response_stats(outputs)
        kl_per_teacher = plan.mean_kl_per_teacher([(name, kl) for name, kl in scored if kl is not None])
        entry: dict[str, Any] = {
            "step": step,
            "grader": self.grader.name,
            "eval_accuracy": accuracy,
            "n": len(outputs),
            "graded": len(graded),
            "response_length_mean": stats["rollout/response_length_mean"],
            "response_length_max": stats["rollout/response_length_max"],
            "truncated_fraction": stats["rollout/truncated_fraction"],
            "kl_per_teacher": kl_per_teacher,
            "kl_samples": len(scored),
            "seconds": time.perf_counter() - started,
        }
        self.samples_file.write_many(
            plan.eval_sample_lines(step, outputs, grades, scored, self._prompt_text, self._text)
        )
        self.evals.append(entry)
        self.eval_file.write(entry)
        self.metrics.record_eval(entry)
        kl = ", ".join(f"{name} {value:.3f}" for name, value in kl_per_teacher.items())
        if accuracy is None:
            length = stats["rollout/response_length_mean"]
            self._event(
                f"eval step {step}: no reference answers; KL {kl or '-'}, {length:.0f} tokens a response"
            )
            return float("nan")
        self.metrics.eval_accuracy.set(accuracy)
        self._event(
            f"eval step {step}: {self.grader.name} accuracy {accuracy:.3f} ({sum(graded):g}/{len(graded)})"
            + (f"; KL {kl}" if kl else "")
        )
        if self.options.status is not None:
            self.options.status.eval_accuracy(accuracy)
        return accuracy

    async def _score_eval_samples(
        self, c: Components, outputs: list[RolloutSample]
    ) -> list[tuple[str, float | None]]:
        """(teacher, per-token k3 KL of the student's own response under it) of each sample: a bounded
        number of scoring requests per eval (EVAL_SAMPLES_LOGGED), not the whole eval set."""
        if not outputs:
            return []
        await c.scoring.wake_up()  # colocated teachers sleep while the student trains
        requests = [ScoreRequest(o.prompt_ids, o.response_ids, o.sample_id, o.route) for o in outputs]
        results = await asyncio.gather(*(c.scoring.score_one(r) for r in requests))
        return [
            (name, plan.sample_kl(o.logprobs, scores))
            for o, (name, scores) in zip(outputs, results, strict=True)
        ]

    def _prompt_text(self, ids: list[int]) -> str:
        """The prompt as the student saw it: the rendered chat template, special tokens included."""
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        assert isinstance(text, str)
        return text


def _combine_rank_metrics(results: list[dict[str, float]]) -> dict[str, float]:
    """Per-rank metrics weighted by each rank's share of the loss (grad norm, lr: the same on all ranks)."""
    if len(results) == 1:
        return results[0]
    total = sum(r.get("train/share", 0.0) for r in results) or 1.0
    out: dict[str, float] = {}
    for name in results[0]:
        if name in SUMMED_OVER_RANKS:
            out[name] = sum(r.get(name, 0.0) for r in results)
        elif name in MAX_METRICS:
            out[name] = max(r[name] for r in results if name in r)
        elif name.startswith("train/"):
            out[name] = (
                results[0][name]
                if name not in {"train/samples", "train/share"}
                else sum(r[name] for r in results)
            )
        else:
            out[name] = sum(r.get(name, 0.0) * r.get("train/share", 0.0) for r in results) / total
    return out


async def _start_student(
    loop: Loop, config: RuntimeConfig, placement: RayPlacement
) -> tuple[list[Any], RolloutPool]:
    """The trainer ranks and the rollout engines as Ray actors, each on the GPU the plan names
    (`placement`): the engines in actors of their own, or, where the plan puts the one engine in the
    trainer's process (`rollout_in_trainer`), the one trainer rank as the rollout's replica, with the
    teachers the plan scores there (`teachers_in_trainer`)."""
    import ray

    from distillery_runtime import workers

    spec, plan = config.spec, loop.plan
    world, settings = plan.world_size, plan.trainer
    # Actor handles: Ray's stubs type them as the worker class, whose methods have no `.remote`.
    trainers: list[Any]
    if plan.rollout.in_trainer:
        trainer_options = placement.trainer(0)
        if plan.trainer_alone and loop.options.local:
            # Ray merges these into the run's env_vars (`local.init_ray`): this actor's threads only.
            trainer_options["runtime_env"] = {"env_vars": lone_process_env(os.environ)}
        hosting_cls = ray.remote(workers.TrainerWithRollout).options(**trainer_options)
        scored_here = {
            t.name: (resolve_location(t.model), plan.engines[t.name])
            for t in spec.teachers
            if t.name in plan.teachers_in_trainer
        }
        trainers = [hosting_cls.remote(loop.model_dir, settings, plan.rollout, scored_here)]
        return trainers, RolloutPool(trainers)
    trainer_cls = ray.remote(workers.TrainerWorker)
    trainers = [
        trainer_cls.options(**placement.trainer(rank)).remote(loop.model_dir, settings, rank, world)
        for rank in range(world)
    ]
    if world > 1:
        address = await trainers[0].rendezvous.remote()
        await asyncio.gather(*(t.init_group.remote(address) for t in trainers))
    rollout_cls = ray.remote(workers.RolloutWorker)
    engines = [
        rollout_cls.options(**placement.rollout(replica)).remote(loop.model_dir, plan.rollout)
        for replica in range(plan.rollout.replicas)
    ]
    return trainers, RolloutPool(engines, tensor_parallel=plan.rollout.tensor_parallel)


async def start_components(loop: Loop, config: RuntimeConfig) -> Components:
    """Start the trainer ranks, the rollout engine and the teachers computed in the run as Ray actors, and the
    clients."""
    import ray

    from distillery_runtime import workers
    from distillery_runtime.scoring import TeacherScoring, build_client, client_retry
    from distillery_runtime.teachers.tokenizer_compat import check_vocabulary, tokenizer_vocabulary
    from distillery_runtime.teachers.wire import job_identity

    spec = config.spec
    plan = loop.plan
    in_process = {t.name for t in config.teachers if t.protocol == TeacherProtocol.IN_PROCESS}
    hosted = plan.teachers_in_trainer
    placement = RayPlacement(plan.gpu_placement)
    # In a worker thread: the driver's event loop keeps serving while Ray places the student's GPUs.
    await asyncio.to_thread(placement.reserve)
    trainers, rollout = await _start_student(loop, config, placement)
    teacher_actors: dict[str, Any] = {}
    for index, teacher in enumerate(spec.teachers):
        if teacher.name not in in_process or teacher.name in hosted:
            continue
        # A colocated teacher shares the student's GPU the plan names; a local run's CPU standalone takes none.
        options = placement.teacher(index, colocated=teacher.placement == Placement.COLOCATED)
        actor = (
            ray.remote(workers.InProcessTeacherWorker)
            .options(**options)
            .remote(resolve_location(teacher.model), plan.engines[teacher.name])
        )
        teacher_actors[teacher.name] = actor
    await asyncio.gather(*(a.start.remote() for a in teacher_actors.values()))
    # The vocabulary of a teacher in the run as its engine loaded it (a hub id has no files here to read first).
    student_vocabulary = tokenizer_vocabulary(loop.tokenizer)
    for index, teacher in enumerate(spec.teachers):
        if teacher.name in teacher_actors or teacher.name in hosted:
            vocabulary = (
                await trainers[0].teacher_vocabulary.remote(teacher.name)
                if teacher.name in hosted
                else await teacher_actors[teacher.name].vocabulary.remote()
            )
            check_vocabulary(
                student_vocabulary, vocabulary, teacher_name=f"spec.teachers[{index}] ({teacher.name})"
            )
    # Past a client's own retries a teacher counts as down: scoring waits for it, up to the job's budget.
    retry = client_retry(spec.teacher_outage_timeout_seconds)
    job = job_identity(config.job_name, config.namespace)
    clients = {
        t.name: build_client(
            t,
            plan.engines[t.name],
            trainers[0] if t.name in hosted else teacher_actors.get(t.name),
            retry,
            job,
            hosted=t.name in hosted,
        )
        for t in config.teachers
    }
    outages = OutageTracker(
        spec.teacher_outage_timeout_seconds, detected_after=retry.total_timeout, on_change=loop.teacher_outage
    )
    scoring = TeacherScoring(plan, clients, outages)
    dtype = await rollout.dtype()
    metas = None
    if not plan.rollout.in_trainer:
        # The weight-sync group: trainer rank 0 sends, every rollout replica's workers receive (weight_sync.py).
        host, port = await trainers[0].sync_address.remote()
        names = ["trainer rank 0", *rollout.names]
        await asyncio.gather(
            trainers[0].join_weight_sync.remote(host, port, names),
            rollout.join_weight_sync(host, port, names),
        )
        metas = await trainers[0].weight_metas.remote(dtype)
    components = Components(
        trainers, rollout, scoring, list(teacher_actors.values()), dtype, metas, placement=placement
    )
    if loop.version:  # resumed: the trainers restore optimizer, schedule and RNG states
        assert loop.last_checkpoint is not None
        await asyncio.gather(*(t.load_state.remote(loop.last_checkpoint) for t in trainers))
    # Resumed: the engine loaded the checkpoint's weights; it only needs to know their version.
    await rollout.set_version(loop.version)
    return components


async def stop_components(c: Components) -> None:
    await c.scoring.close()
    for actor in c.teachers:
        with contextlib.suppress(Exception):
            await actor.close.remote()
    if c.placement is not None:
        c.placement.release()
