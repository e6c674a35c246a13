"""The actors and clients of a run (`Components`): the trainer ranks, the rollout engines and the teachers
computed in the run started as Ray actors on the plan's placement, the teachers' clients built, the
weight-sync group joined; and stopped again."""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from typing import Any

from distillery.api.spec import Placement
from distillery.plan.env.threads import lone_process_env
from distillery.runtime_config import RuntimeConfig, TeacherProtocol
from distillery_runtime.data.uris import resolve_location
from distillery_runtime.rollout.pool import RolloutPool
from distillery_runtime.run.loop.state import LoopState
from distillery_runtime.run.placement import RayPlacement
from distillery_runtime.teachers.clients.outage import OutageTracker


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
    """What a streamed weight sync sends (`sync/weight_sync.py`); None: through the object store."""
    placement: Any = None
    """The student's placement groups (`placement.RayPlacement`), released when the run stops."""


SYNC_BUCKET_BYTES = 256 * 1024**2
"""Bytes per bucket of a streamed weight sync: large enough to run at the link's speed, small enough that
a bucket of whole tensors is nothing beside a rank's shards."""


async def sync_weights(c: Components, version: int) -> int:
    """The trainers' weights (a LoRA student's adapter alone) to every rollout engine, as `version`;
    returns the bytes trainer rank 0 sent (each receiver gets them all)."""
    if c.weight_metas is not None:
        # Streamed: bucket by bucket from the shards to the engine, over the weight-sync group.
        sent, *_ = await asyncio.gather(
            *(t.stream_weights.remote(c.rollout_dtype, SYNC_BUCKET_BYTES) for t in c.trainers),
            c.rollout.receive_weights(c.weight_metas, SYNC_BUCKET_BYTES, version),
        )
        return int(sent)
    # Every rank takes part (FSDP2 gathers each tensor from the shards); rank 0's copy goes on.
    refs = [t.weights.remote(c.rollout_dtype) for t in c.trainers]
    await c.rollout.update_weights(refs[0], version)
    await asyncio.gather(*refs[1:])
    return sum(meta.nbytes for meta in await c.trainers[0].weight_metas.remote(c.rollout_dtype))


async def _start_student(
    loop: LoopState, config: RuntimeConfig, placement: RayPlacement
) -> tuple[list[Any], RolloutPool]:
    """The trainer ranks and the rollout engines as Ray actors, each on the GPU the plan names
    (`placement`): the engines in actors of their own, or, where the plan puts the one engine in the
    trainer's process (`rollout_in_trainer`), the one trainer rank as the rollout's replica, with the
    teachers the plan scores there (`teachers_in_trainer`)."""
    import ray

    from distillery_runtime.run import workers

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
            if t.name in plan.teachers_in_trainer and t.name not in plan.student_base
        }
        base = {name: plan.engines[name] for name in plan.teachers_in_trainer & plan.student_base}
        trainers = [hosting_cls.remote(loop.model_dir, settings, plan.rollout, scored_here, base)]
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
    # Replica 0 scores the teachers of the student's base too (`plan.teachers_in_rollout`).
    base = {name: plan.engines[name] for name in plan.teachers_in_rollout}
    engines = [
        rollout_cls.options(**placement.rollout(replica)).remote(
            loop.model_dir, plan.rollout, base if replica == 0 else None
        )
        for replica in range(plan.rollout.replicas)
    ]
    return trainers, RolloutPool(engines, replica_ranks=plan.rollout.replica_sync_ranks)


async def start_components(loop: LoopState, config: RuntimeConfig) -> Components:
    """Start the trainer ranks, the rollout engine and the teachers computed in the run as Ray actors, and the
    clients."""
    import ray

    from distillery_runtime.run import workers
    from distillery_runtime.teachers.checks.tokenizer_compat import check_vocabulary, tokenizer_vocabulary
    from distillery_runtime.teachers.scoring import TeacherScoring, build_client, client_retry
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
        if teacher.name not in in_process or teacher.name in hosted or teacher.name in plan.student_base:
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
    # The vocabulary of a teacher in the run as its engine loaded it (a hub id has no files here to read first);
    # the student's base is the student's own model and tokenizer.
    student_vocabulary = tokenizer_vocabulary(loop.tokenizer)
    for index, teacher in enumerate(spec.teachers):
        if teacher.name in plan.student_base:
            continue
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
    # The actor whose process scores each teacher computed there besides its own work (`HostedTeachers`).
    hosts = {
        **{name: trainers[0] for name in hosted},
        **{name: rollout.actors[0] for name in plan.teachers_in_rollout},
    }
    clients = {
        t.name: build_client(
            t,
            plan.engines[t.name],
            hosts.get(t.name, teacher_actors.get(t.name)),
            retry,
            job,
            hosted=t.name in hosts,
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
        # The weight-sync group: trainer rank 0 sends, every rollout replica's workers receive (`sync/weight_sync.py`).
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
        if plan.rollout.lora is not None and not plan.rollout.in_trainer:
            # A LoRA student's engines start from the base model and the trainers now hold the restored
            # adapter: one sync before the first rollout.
            await sync_weights(components, loop.version)
    # Resumed: the engine loaded the checkpoint's weights (a LoRA student's adapter: synced above); it only
    # needs to know their version.
    await rollout.set_version(loop.version)
    return components


async def stop_components(c: Components) -> None:
    await c.scoring.close()
    for actor in c.teachers:
        with contextlib.suppress(Exception):
            await actor.close.remote()
    if c.placement is not None:
        c.placement.release()
