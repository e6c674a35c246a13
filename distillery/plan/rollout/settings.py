"""The student's side of a run, resolved: its rollout engines' settings and how many trainer ranks it has.

Each rollout replica is started from one `RolloutSettings` (the loop only translates it into an actor), and
the context every engine needs, the student's and the teachers', is `sequence_length`.
"""

from __future__ import annotations

from dataclasses import dataclass

from distillery.api.spec import DistillationJobSpec, Objective, Precision, RolloutEngine
from distillery.model_shapes import ModelShape
from distillery.plan.agents.episodes import response_tokens
from distillery.plan.attention import decode_attention
from distillery.plan.lora import LoraSettings, resolve_lora
from distillery.plan.rollout.sleep import SleepLevel, sleep_level
from distillery.plan.rollout.student_base import rollout_scoring_logprobs

LOGPROB_CHECK_EVERY = 10
"""Where the loss has no use for the rollout's own log-probs, they are still asked for on the first step
and every this many steps: the gap between them and the trainer's (metrics) is where a wrong weight sync
shows first."""


@dataclass(frozen=True)
class RolloutSettings:
    """What each of the student's rollout engines is started with."""

    engine: RolloutEngine
    precision: Precision
    """auto is resolved by each engine on its own device (it must match the trainer's cast of synced
    weights)."""
    max_model_len: int
    seed: int
    memory_fraction: float
    """vLLM's gpu_memory_utilization on the student's GPU (awake beside the colocated teachers)."""
    enforce_eager: bool | None
    """None: vLLM compiles on a GPU, runs eagerly on CPU."""
    replicas: int
    tensor_parallel: int
    """Workers (GPUs; on CPU, processes) of each replica's engine: each is one rank of the weight sync, but for
    a LoRA adapter (`replica_sync_ranks`)."""
    logprobs_every: int = 1
    """Steps whose rollout returns the sampled tokens' log-probs: every step where the loss reads them (the
    policy-gradient objective's ratio, the task reward's), else every LOGPROB_CHECK_EVERY-th. They cost
    vLLM a log-softmax over the vocabulary at every decode iteration: ~22% of a CPU rollout (bench/README)."""
    sleeps: bool = False
    """The engines on the student's GPUs (rollout, colocated teachers) sleep while the student trains
    (vLLM sleep mode frees their weights and KV cache for the trainer). Only on a GPU: on CPU vLLM has no
    sleep mode, and each sleep or wake-up would be a Ray call per engine for nothing, every step."""
    sleep_level: SleepLevel = SleepLevel.NONE
    """How deep the vLLM engine sleeps (`sleep.sleep_level`): level 2 on GPUs, its weights discarded, as
    the sync after each wake-up overwrites them; NONE where it never sleeps."""
    in_trainer: bool = False
    """The engine samples with the trainer's own model, in the trainer's process
    (`placement.rollout.rollout_in_trainer`): no second copy of the student, no weight sync."""
    decode_attention: str | None = None
    """The transformers engine's attention implementation in its decode steps (`attention.decode_attention`);
    None: the model's own."""
    decode_threads: int | None = None
    """torch's intra-op threads in the transformers engine's decode steps (`decode_threads`); None: the
    process's own."""
    lora: LoraSettings | None = None
    """A LoRA student's adapter (`plan.lora`): the transformers engine puts it on its model, vLLM loads it as
    a LoRA adapter after each sync, which sends the adapter alone; None: full fine-tuning."""
    max_logprobs: int = 1
    """Log-probs a position vLLM may return: the loss's topK where the engine also scores a teacher of the
    student's base (`rollout.student_base.rollout_scoring_logprobs`), else the sampled token's own."""

    @property
    def replica_sync_ranks(self) -> int:
        """Ranks of one replica in the weight-sync group: each tensor-parallel worker of a vLLM engine, which
        loads its shard of every weight; one where the engine receives a LoRA adapter in its own process
        (it writes the adapter's files and loads them into every worker)."""
        if self.lora is not None and self.engine == RolloutEngine.VLLM:
            return 1
        return self.tensor_parallel

    @property
    def sync_ranks(self) -> int:
        """Receivers of a weight sync: every replica's ranks (`replica_sync_ranks`)."""
        return self.replicas * self.replica_sync_ranks


def sequence_length(spec: DistillationJobSpec) -> int:
    """The longest sequence an engine sees: the longest prompt, the longest response and one scoring
    token (a teacher scores the position after the last response token)."""
    return spec.data.max_prompt_tokens + response_tokens(spec) + 1


CPU_TRANSFORMERS_MAX_TOKEN_PARAMS = 1_500_000
"""The largest student (`ModelShape.token_params`) that `engine: auto` samples with the transformers engine
on CPU. vLLM's CPU engine pays a fixed cost at each decode step (its scheduler, input preparation and
sampler in Python) for faster kernels; our batched decode loop pays less fixed cost and more per parameter.
Measured in one run on the 2-core host (`bench/rollout_engines.py --scales tiny mini`, a step of 32 prompts
x 128 tokens, s/step, vLLM against transformers): 0.46M 0.629 vs 0.433, 2.23M 0.772 vs 0.885 (11M 2.182 vs
3.168 on another day); the two cross at ~1.6M. The bundled tasks' students (0.13-0.53M) are below it,
chat-math's (9.8M, most of it Qwen's 151,936-token head) above."""


def rollout_engine(spec: DistillationJobSpec, student: ModelShape | None) -> RolloutEngine:
    """The engine that samples the student, never auto: the spec's, else the transformers engine for a LoRA
    student with modules trained whole (`lora_needs_transformers`), else vLLM, except on CPU for a student
    whose shape is known (`student`: its config.json) and below CPU_TRANSFORMERS_MAX_TOKEN_PARAMS."""
    rollout = spec.student.rollout
    if rollout.engine != RolloutEngine.AUTO:
        return rollout.engine
    if lora_needs_transformers(spec):
        return RolloutEngine.TRANSFORMERS
    small = student is not None and student.token_params <= CPU_TRANSFORMERS_MAX_TOKEN_PARAMS
    on_cpu = spec.student.pool.gpus_per_worker == 0 and rollout.tensor_parallel == 1
    return RolloutEngine.TRANSFORMERS if small and on_cpu else RolloutEngine.VLLM


def lora_needs_transformers(spec: DistillationJobSpec) -> bool:
    """A LoRA student with modules trained whole (`lora.modulesToSave`): vLLM's LoRA loads low-rank modules
    only, so only the transformers engine samples it (the API refuses `engine: vllm` with them)."""
    lora = spec.student.lora
    return lora is not None and bool(lora.modules_to_save)


CPU_ONE_THREAD_DECODE_MAX_TOKEN_PARAMS = 1_000_000
"""The largest CPU student (`ModelShape.token_params`) whose transformers decode steps run on one intra-op
thread (`decode_threads`): between the two sizes measured, where one thread gained more beside a busy
neighbour than it lost on a quiet host (0.46M) and where the two were even (2.23M)."""

CPU_SMALL_DECODE_THREADS = 1
"""The intra-op threads of those decode steps."""


def decode_threads(
    spec: DistillationJobSpec, engine: RolloutEngine, student: ModelShape | None
) -> int | None:
    """torch's intra-op threads in the transformers engine's decode steps: one on CPU for a student of at most
    CPU_ONE_THREAD_DECODE_MAX_TOKEN_PARAMS, else None (the process's own; on a GPU they only launch kernels).
    A decode step of such a student is a few dozen kernels of microseconds, each an OpenMP region that ends
    when its slowest thread does: whenever another process (a tenant of a shared host, the run's own Ray
    processes) takes one of the cores, every step waits for it. The prompts' forward, the teachers and the
    trainer keep every thread.

    Measured on the 2-core host (2026-12-04, `bench/rollout_engines.py --alternate`: the e2e bench's rollout
    of 32 prompts x 128 tokens, the two in turn in one process, medians, s/step, all threads against one):
    the 0.46M student 0.330 against 0.397 on a quiet host, 0.631 against 0.416 beside a process taking a
    core 5 ms in 10; the 2.23M one 0.767 against 1.034 quiet, 1.656 against 1.199 beside it. `distillery
    run` of the e2e bench's tiny job (`bench/README.md`, four runs each, alternating): a step level (medians
    0.800-1.047 s against 0.827-0.979 s), its 90th percentile lower (1.05-1.14 against 0.91-1.07 s)."""
    on_cpu = spec.student.pool.gpus_per_worker == 0
    small = student is not None and student.token_params <= CPU_ONE_THREAD_DECODE_MAX_TOKEN_PARAMS
    return CPU_SMALL_DECODE_THREADS if on_cpu and small and engine == RolloutEngine.TRANSFORMERS else None


def resolve_rollout(
    spec: DistillationJobSpec, student: ModelShape | None = None, *, in_trainer: bool = False
) -> RolloutSettings:
    """The rollout engines' settings of a spec; `student`: the student's shape where known (`rollout_engine`);
    `in_trainer`: `placement.rollout.rollout_in_trainer`'s decision."""
    rollout = spec.student.rollout
    engine = rollout_engine(spec, student)
    sleeps = spec.student.pool.gpus_per_worker > 0
    return RolloutSettings(
        engine=engine,
        precision=spec.student.precision,
        max_model_len=sequence_length(spec),
        seed=spec.schedule.seed,
        memory_fraction=rollout.memory_fraction,
        enforce_eager=rollout.enforce_eager,
        replicas=rollout_replicas(spec),
        tensor_parallel=rollout.tensor_parallel,
        logprobs_every=rollout_logprobs_every(spec),
        sleeps=sleeps,
        sleep_level=rollout_sleep_level(spec, engine, in_trainer=in_trainer),
        in_trainer=in_trainer,
        decode_attention=decode_attention(spec, engine),
        decode_threads=decode_threads(spec, engine, student),
        lora=resolve_lora(spec),
        max_logprobs=rollout_scoring_logprobs(spec),
    )


def rollout_sleep_level(
    spec: DistillationJobSpec, engine: RolloutEngine, *, in_trainer: bool = False
) -> SleepLevel:
    """How deep the rollout engine sleeps while the student trains (`sleep.sleep_level`): a vLLM engine on
    the student's GPUs discards its weights (level 2), as the weight sync after each wake-up overwrites
    them; the transformers engine and anything on CPU never sleep, and an engine in the trainer's process
    (`in_trainer`) samples with the trainer's own weights, which nothing syncs. A LoRA student's sync sends
    the adapter alone: its engine keeps the frozen base weights in host memory (level 1)."""
    on_gpu = spec.student.pool.gpus_per_worker > 0
    return sleep_level(
        sleeps=on_gpu and engine == RolloutEngine.VLLM,
        weights_synced_after_wake=not in_trainer and spec.student.lora is None,
    )


def rollout_replicas(spec: DistillationJobSpec) -> int:
    """`rollout.replicas`, else one engine per `tensorParallel` GPUs of the student's: an engine on GPU 0
    alone would leave the others idle through every rollout, though each already holds the engine's share
    of its memory (the memory plan reserves it on every trainer GPU). On CPU one: engines there share the
    same cores, and a second only splits them."""
    rollout, pool = spec.student.rollout, spec.student.pool
    if rollout.replicas is not None:
        return rollout.replicas
    if pool.gpus_per_worker == 0:
        return 1
    return max(1, pool.workers * pool.gpus_per_worker // rollout.tensor_parallel)


def rollout_logprobs_every(spec: DistillationJobSpec) -> int:
    """1 where the loss reads the rollout's log-probs, else LOGPROB_CHECK_EVERY (see RolloutSettings)."""
    loss = spec.loss
    needed = loss.objective == Objective.POLICY_GRADIENT or loss.task_reward_coef > 0
    return 1 if needed else LOGPROB_CHECK_EVERY


def rollout_executor(tensor_parallel: int, *, on_gpu: bool) -> str:
    """vLLM's executor for a rollout engine: its one worker in the engine's own process ("uni"), or, with
    tensor parallelism, a worker per rank: Ray actors on GPU ("ray": each takes a share of one GPU beside
    a trainer rank, as the budget says), processes on CPU ("mp")."""
    if tensor_parallel == 1:
        return "uni"
    return "ray" if on_gpu else "mp"


def trainer_world_size(spec: DistillationJobSpec) -> int:
    """Trainer ranks: one per student GPU, or one per worker on CPU."""
    pool = spec.student.pool
    return max(1, pool.workers * max(pool.gpus_per_worker, 1))
