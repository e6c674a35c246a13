"""The Ray actors of a run: trainer ranks, the rollout engine, the teachers computed in the run's processes.

Each class is a plain Python class; `loop.py` turns it into an actor with `ray.remote(...).options(...)`
and the GPU the plan names for it (`placement.RayPlacement`). Samples move through Ray's object store; the new weights
do not: they stream from the trainers' shards to the rollout engine in buckets over a torch.distributed
group of their own (`sync/weight_sync.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from distillery.plan.checkpoints.export import ExportSettings
from distillery.plan.rollout.settings import RolloutSettings
from distillery.plan.teachers.engines import EngineSettings
from distillery_runtime.data.samples import RolloutSample, TrainSample

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def compute_dtype_here(precision: str) -> str:
    """The dtype `student.precision` means on this process's device (auto: bfloat16 on a GPU that has it).

    Each GPU actor decides for itself: in a cluster the driver runs on the Ray head, which has no GPU,
    so a dtype decided there would be float32 while the trainer computes in bfloat16."""
    from distillery.api.spec import Precision
    from distillery_runtime.training.trainer import resolve_precision

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return "bfloat16" if resolve_precision(Precision(precision), device) == torch.bfloat16 else "float32"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class TrainerWorker:
    """One data-parallel trainer rank."""

    def __init__(self, model_dir: str, settings: Any, rank: int, world_size: int) -> None:
        from distillery_runtime.training.trainer import Trainer

        self.rank, self.world_size = rank, world_size
        self.trainer = Trainer(model_dir, settings, rank=rank, world_size=world_size)

    def rendezvous(self) -> str:
        """rank 0: the tcp:// address the group initialises on."""
        import ray

        return f"tcp://{ray.util.get_node_ip_address()}:{free_port()}"

    def init_group(self, init_method: str) -> bool:
        import torch.distributed as dist

        from distillery_runtime.training.sharding import COLLECTIVE_TIMEOUT

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=self.rank,
            world_size=self.world_size,
            timeout=COLLECTIVE_TIMEOUT,
        )
        return True

    def train_step(self, samples: Sequence[TrainSample], normalizer: float) -> dict[str, float]:
        return self.trainer.train_step(samples, normalizer)

    def gradients(self) -> dict[str, torch.Tensor]:
        return self.trainer.gradients()

    def weights(self, dtype: str) -> list[tuple[str, torch.Tensor]]:
        return self.trainer.weights(DTYPES[dtype])

    def sync_address(self) -> tuple[str, int]:
        """rank 0: where the weight-sync group's store listens."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def join_weight_sync(self, host: str, port: int, names: list[str]) -> bool:
        """rank 0 joins the weight-sync group as its sender (the other ranks only gather)."""
        from distillery_runtime.sync.weight_sync import SyncGroup

        # Its own GPU: the group maps buckets through CUDA IPC to engine workers on the same GPU.
        self.sync_group = SyncGroup(host, port, 0, names, device=self.trainer.device)
        return True

    def weight_metas(self, dtype: str) -> list[Any]:
        return self.trainer.weight_metas(DTYPES[dtype])

    def stream_weights(self, dtype: str, bucket_bytes: int) -> int:
        """Every rank: a streamed sync (rank 0 sends, the others take part in the gathers)."""
        return self.trainer.stream_weights(getattr(self, "sync_group", None), DTYPES[dtype], bucket_bytes)

    def sequence_logprobs(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
        return self.trainer.sequence_logprobs(prompt_ids, response_ids)

    def load_state(self, checkpoint_path: str) -> int:
        from distillery_runtime.checkpoints import checkpoint

        ref = checkpoint.CheckpointRef(0, Path(checkpoint_path))
        state = checkpoint.load_trainer_state(ref)
        if self.trainer.lora is not None or checkpoint.is_lora(ref):
            # A LoRA student was built on the base (`checkpoint.weights_dir`): its adapter, exactly as saved.
            adapter = str(ref.path / checkpoint.ADAPTER_DIR)
            self.trainer.load_adapter(checkpoint.read_adapter(ref), source=adapter)
        if "optimizer" not in state:  # saved in shards, at whatever number of ranks: resharded on load
            self.trainer.load_optimizer_shards(ref.path / checkpoint.OPTIMIZER_DIR)
        self.trainer.load_trainer_state(state)
        checkpoint.set_rng_state(state["rng"])
        return self.trainer.version

    def save_checkpoint(
        self, root: str, step: int, state: dict[str, Any], keep: int, export: ExportSettings, final: bool
    ) -> tuple[str, str]:
        """Every rank calls it (FSDP2 gathers the weights and optimizer state); rank 0 writes and returns
        (the checkpoint's folder, `final/` when `final` else ''); ('', '') elsewhere.

        Streamed (`settings.streamed_export`): the weights go a tensor at a time from the shards into rank
        0's files while every other rank walks the same gathers (`streamed_export.WeightStream`); else
        every rank gathers the whole float32 state dict first. A LoRA student's: adapter/ and the merged
        model (`training/lora_export.py`), no master/."""
        from distillery_runtime.checkpoints import checkpoint
        from distillery_runtime.checkpoints.export import ModelExport

        sharded = self.trainer.settings.sharded_checkpoint and self.trainer.fsdp and self.world_size > 1
        staged = self._save_optimizer_shards(root, step) if sharded else None
        trainer_state = {
            **self.trainer.trainer_state(with_optimizer=not sharded),
            "rng": checkpoint.rng_state(),
        }
        stream, weights = self.trainer.kept_weights(self.trainer.settings.streamed_export)
        adapter = self.trainer.adapter_export(export.base_model)
        if self.rank != 0:
            if stream is not None and self.trainer.fsdp:
                stream.finish()  # the gathers rank 0 writes from
            return "", ""
        try:
            path = checkpoint.save(
                root,
                step,
                model=self.trainer.transformers_model(),
                state_dict=weights,
                tokenizer=self.trainer.tokenizer,
                trainer_state=trainer_state,
                state=state,
                keep=keep,
                export=ModelExport(dtype=str(export.dtype), tokenizer=self._export_tokenizer(export)),
                staged=staged,
                weights=stream,
                adapter=adapter,
            )
        finally:
            if stream is not None and self.trainer.fsdp:
                stream.finish()  # a save that failed before the weights: the other ranks wait in the gathers
        published = checkpoint.publish_final(checkpoint.CheckpointRef(step, path)) if final else ""
        return str(path), str(published)

    def _save_optimizer_shards(self, root: str, step: int) -> Path:
        """Every rank writes its optimizer shards into rank 0's staging folder (its path broadcast); a
        failed write on any rank fails every rank's save (DCP gathers the errors), and rank 0 removes the
        partial folder, as `checkpoint.save` does."""
        import shutil

        import torch.distributed as dist

        from distillery_runtime.checkpoints import checkpoint

        staged = [str(checkpoint.staging_dir(root, step)) if self.rank == 0 else ""]
        if self.rank == 0:
            shutil.rmtree(staged[0], ignore_errors=True)
            Path(staged[0]).mkdir(parents=True)
        dist.broadcast_object_list(staged, src=0)
        path = Path(staged[0])
        try:
            self.trainer.save_optimizer_shards(path / checkpoint.OPTIMIZER_DIR)
        except Exception as error:
            if self.rank == 0:
                shutil.rmtree(path, ignore_errors=True)
            raise checkpoint.CheckpointWriteError(
                f"{root}: could not write checkpoint step {step} ({error})"
            ) from error
        return path

    def _export_tokenizer(self, export: ExportSettings) -> Any:
        """The tokenizer the job used (student.tokenizer, else the student's), loaded once: the trainer's
        own comes from the folder it loaded, which is the student's or a checkpoint's master/."""
        if getattr(self, "export_tokenizer", None) is None:
            from transformers import AutoTokenizer

            from distillery_runtime.data.uris import resolve_location

            self.export_tokenizer = AutoTokenizer.from_pretrained(resolve_location(export.tokenizer))
        return self.export_tokenizer


class EngineCalls:
    """The calls `RolloutPool` makes on each replica that only read its engine (`self.engine`): shared by an
    engine's own actor (`RolloutWorker`) and the trainer's that hosts one (`TrainerWithRollout`)."""

    engine: Any
    dtype_name: str

    def dtype(self) -> str:
        """The engine's dtype, which the trainer casts the synced weights to."""
        return self.dtype_name

    def stream(self, requests: Sequence[Any], sampling: Any) -> Iterator[list[RolloutSample]]:
        """Samples as they finish, those of one engine step together (a Ray streaming generator)."""
        yield from self.engine.generate(requests, sampling)

    def generate(self, requests: Sequence[Any], sampling: Any) -> list[RolloutSample]:
        return [sample for finished in self.engine.generate(requests, sampling) for sample in finished]

    def policy_version(self) -> int:
        return int(self.engine.policy_version)

    def set_version(self, version: int) -> int:
        self.engine.policy_version = version
        return version

    def sleep(self) -> None:
        self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()


class HostedTeachers:
    """Teachers scored in a process that exists for something else (the trainer's, a rollout engine's),
    answering `teacher_*` calls by name (`scoring.RayTeacher` with `hosted`). Their calls are coroutines (the
    interface every teacher shares) that never wait on I/O here: one loop of this actor's own runs them, the
    actor's other calls staying synchronous."""

    teachers: dict[str, Any]
    event_loop: asyncio.AbstractEventLoop

    def host_teachers(self, teachers: dict[str, Any]) -> None:
        self.teachers = teachers
        self.event_loop = asyncio.new_event_loop()

    def teacher_score(self, name: str, samples: Sequence[Any], top_k: int) -> Any:
        return self.event_loop.run_until_complete(self.teachers[name].score(samples, top_k))

    def teacher_score_each(self, name: str, samples: Sequence[Any], top_k: int) -> list[Any]:
        """Each sample's scores (B = 1), in order, by teacher `name`: one call for the samples a client
        gathered (`InProcessTeacherWorker.score_each`)."""
        return self.event_loop.run_until_complete(self.teachers[name].score_each(samples, top_k))

    def teacher_vocabulary(self, name: str) -> dict[int, str]:
        vocabulary: dict[int, str] = self.teachers[name].vocabulary()
        return vocabulary


def base_teachers_on(engine: Any, base: dict[str, EngineSettings] | None) -> dict[str, Any]:
    """The teachers of the student's base (`plan.student_base`: name -> the plan's engine settings) on a LoRA
    student's rollout engine, the adapter off."""
    from distillery_runtime.teachers.in_process.student_base import student_base_teacher

    return {name: student_base_teacher(engine, settings) for name, settings in (base or {}).items()}


class RolloutWorker(EngineCalls, HostedTeachers):
    """The student's rollout engine (vLLM or transformers) in its own process; replica 0 also scores the
    teachers of the student's base (`plan.teachers_in_rollout`)."""

    def __init__(
        self, model_dir: str, settings: RolloutSettings, base: dict[str, EngineSettings] | None = None
    ) -> None:
        """`base`: name -> the plan's engine settings of the teachers of the student's base scored here."""
        from distillery_runtime.rollout import build_engine

        self.dtype_name = compute_dtype_here(settings.precision)
        self.engine = build_engine(
            settings.engine,
            model_dir,
            dtype=DTYPES[self.dtype_name],
            max_model_len=settings.max_model_len,
            seed=settings.seed,
            memory_fraction=settings.memory_fraction,
            enforce_eager=settings.enforce_eager,
            tensor_parallel=settings.tensor_parallel,
            decode_attention=settings.decode_attention,
            decode_threads=settings.decode_threads,
            sleep_level=settings.sleep_level,
            lora=settings.lora,
            max_logprobs=settings.max_logprobs,
        )
        self.host_teachers(base_teachers_on(self.engine, base))

    def update_weights(self, weights: Sequence[tuple[str, torch.Tensor]], version: int) -> int:
        self.engine.update_weights(weights, version)
        return version

    def join_weight_sync(self, host: str, port: int, first_rank: int, names: list[str]) -> bool:
        """The engine's workers join the sync group as ranks `first_rank` onwards."""
        from distillery_runtime.sync.weight_sync import DEFAULT_TIMEOUT

        self.engine.join_weight_sync(host, port, first_rank, names, DEFAULT_TIMEOUT.total_seconds())
        return True

    def receive_weights(self, metas: list[Any], bucket_bytes: int, version: int) -> int:
        """A streamed sync: the engine's workers load the buckets as they arrive."""
        self.engine.receive_weights(metas, bucket_bytes, version)
        return version

    def sequence_logprobs(self, prompt_ids: Sequence[int], response_ids: Sequence[int]) -> list[float]:
        return self.engine.sequence_logprobs(prompt_ids, response_ids)


def transformers_teacher(model_dir: str, engine: EngineSettings) -> Any:
    """The teacher's transformers forward (`teachers.transformers_forward`) on this process's device."""
    from distillery.plan.teachers.scoring_engine import TRANSFORMERS_DTYPES
    from distillery_runtime.teachers.in_process.transformers_forward import TransformersTeacher

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = TRANSFORMERS_DTYPES[engine.dtype]
    if dtype == "auto":
        dtype = compute_dtype_here("auto")
    return TransformersTeacher(model_dir, engine, dtype=getattr(torch, dtype), device=device)


class TrainerWithRollout(TrainerWorker, EngineCalls, HostedTeachers):
    """The one trainer rank, whose process also hosts the rollout engine, sampling with the trainer's own
    model (`plan.rollout_in_trainer`). It answers the rollout engine's calls (`EngineCalls`: `RolloutPool`
    drives it as its one replica; the engine's sleep and wake-up do nothing) besides the trainer's: the
    engine is always at the trainer's version, so no weight sync group is formed and a step's sync is
    nothing. The teachers the plan scores here too (`plan.teachers_in_trainer`: transformers forwards, and the
    student's base on the trainer's own model with the adapter off) answer `teacher_*` calls by name
    (`HostedTeachers`)."""

    def __init__(
        self,
        model_dir: str,
        settings: Any,
        rollout: RolloutSettings,
        teachers: dict[str, tuple[str, EngineSettings]] | None = None,
        base: dict[str, EngineSettings] | None = None,
    ) -> None:
        """`teachers`: name -> (model folder, the plan's engine settings) of the teachers scored here; `base`:
        name -> the plan's engine settings of the teachers of the student's base, scored here too."""
        from distillery_runtime.rollout.hf_engine import TransformersRolloutEngine

        super().__init__(model_dir, settings, 0, 1)
        self.engine = TransformersRolloutEngine(
            model_dir,
            dtype=self.trainer.compute_dtype,
            model=self.trainer.model,
            decode_attention=rollout.decode_attention,
            decode_threads=rollout.decode_threads,
        )
        self.dtype_name = compute_dtype_here(rollout.precision)
        self.host_teachers(
            {
                **{
                    name: transformers_teacher(folder, engine)
                    for name, (folder, engine) in (teachers or {}).items()
                },
                **base_teachers_on(self.engine, base),
            }
        )

    def train_step(self, samples: Sequence[TrainSample], normalizer: float) -> dict[str, float]:
        metrics = super().train_step(samples, normalizer)
        self.engine.policy_version = self.trainer.version
        return metrics

    def load_state(self, checkpoint_path: str) -> int:
        self.engine.policy_version = super().load_state(checkpoint_path)
        return self.engine.policy_version


class InProcessTeacherWorker:
    """A teacher computed in the run's own processes: a colocated one (an in-process vLLM engine beside the
    student), or one the plan scores with the transformers forward (`plan.scoring_engine`)."""

    def __init__(self, model_dir: str, engine: EngineSettings) -> None:
        """`engine`: the plan's settings; a colocated engine's dtype is the student's precision, resolved on
        this device."""
        from distillery.api.spec import TeacherEngine

        self.teacher: Any
        if engine.engine == TeacherEngine.TRANSFORMERS:
            self.teacher = transformers_teacher(model_dir, engine)
        else:
            from distillery_runtime.teachers.in_process.colocated import ColocatedTeacher

            here = dataclasses.replace(engine, dtype=compute_dtype_here(engine.dtype))
            self.teacher = ColocatedTeacher(model_dir, here)

    async def start(self) -> bool:
        await self.teacher.start()
        return True

    async def score(self, samples: Sequence[Any], top_k: int) -> Any:
        return await self.teacher.score(samples, top_k)

    async def score_each(self, samples: Sequence[Any], top_k: int) -> list[Any]:
        """Each sample's scores (B = 1), in order: one call for the samples a client gathered."""
        return await self.teacher.score_each(samples, top_k)

    async def vocabulary(self) -> dict[int, str]:
        return self.teacher.vocabulary()

    async def sleep(self) -> None:
        await self.teacher.sleep()

    async def wake_up(self) -> None:
        await self.teacher.wake_up()

    async def close(self) -> None:
        await self.teacher.close()
