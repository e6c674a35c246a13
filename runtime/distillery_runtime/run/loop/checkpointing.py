"""The checkpoint phase, and where a run starts: resume from the newest complete checkpoint per the job's
resume policy (refusing another run's), check the folder before the first step, save when due."""

from __future__ import annotations

import asyncio
import time

from distillery.api.spec import ResumePolicy
from distillery.model_shapes import resolve_shape
from distillery.plan.lora import adapter_params
from distillery_runtime.checkpoints import checkpoint
from distillery_runtime.checkpoints.export import DTYPE_BYTES
from distillery_runtime.run.loop.components import Components
from distillery_runtime.run.loop.state import LoopState, earlier_run_refusal


class ResumeError(RuntimeError):
    """resume: required and no complete checkpoint exists."""


class CheckpointPhase(LoopState):
    """Resume, preflight and save."""

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
        # A LoRA student's checkpoint: the student model, which the trainers put its adapter on.
        self.model_dir = str(checkpoint.weights_dir(ref, base=self.student_dir))
        self.last_checkpoint = str(ref.path)
        self.saved_step = self.step_done
        self.metrics_file.truncate_after(self.step_done)
        self.eval_file.truncate_after(self.step_done)
        self.samples_file.truncate_after(self.step_done)
        from distillery_runtime.observe.metrics import read_jsonl

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
        lora = self.plan.trainer.lora
        shape = resolve_shape(self.student_dir) if lora is not None else None
        checkpoint.preflight(
            self.ckpt_root,
            checkpoint.parameter_count(self.model_dir),
            field=field,
            model_bytes=DTYPE_BYTES[self.plan.export.dtype],
            # A LoRA student's adapter (its size from the student's shape: 0 where that is unknown).
            adapter=None if lora is None else adapter_params(shape, lora) if shape is not None else 0,
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
