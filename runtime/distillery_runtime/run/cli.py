"""`distillery run FILE [--output DIR] [--resume | --overwrite]`: one entry point for a laptop and a cluster.

FILE is a DistillationJob manifest (local run: the runtime starts an embedded Ray and the job's teachers
on loopback; its shared teachers are the servers that `--shared-teacher NAME=URL` names) or the resolved runtime config JSON the operator mounts at /etc/distillery (cluster run:
joins the Ray cluster, waits for the teachers with a bounded timeout, serves Prometheus metrics, patches
the job's status). Validation comes first: every problem is printed before any work starts. Ctrl-C stops
after the current step, saves a checkpoint and writes the report; a second Ctrl-C aborts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from distillery.plan.grader import GraderKind, resolve_grader
from distillery.plan.teachers.client import LocalAccess, LocalAccessError
from distillery.runtime_config import (
    RuntimeConfig,
    TeacherProtocol,
    UnservedSharedTeacher,
    resolve_runtime_config,
)
from distillery.validation import InvalidManifest, load_job
from distillery_runtime.run.local_gpus import LocalGpuPlan
from distillery_runtime.run.startup import (
    SEQUENTIAL_ENV,
    StartupClock,
    StartupPlan,
    startup_plan,
)

if TYPE_CHECKING:  # the run's machinery loads Ray and torch: imported where a run starts, not with the CLI
    from distillery_runtime.run.local import LocalTeachers
    from distillery_runtime.run.loop.components import Components
    from distillery_runtime.run.loop.loop import Loop
    from distillery_runtime.run.loop.state import RunOptions, RunResult

log = logging.getLogger("distillery.runtime")

EXIT_OK, EXIT_INVALID, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 130


def load_config(
    path: str,
    shared_teachers: Mapping[str, str] | None = None,
    local_gpus: int = 0,
    teacher_access: Mapping[str, LocalAccess] | None = None,
) -> tuple[RuntimeConfig, bool]:
    """(config, in_cluster): a resolved runtime config JSON, or a manifest resolved for a local run on a
    machine showing `local_gpus` CUDA GPUs, its shared teachers at the URLs of `shared_teachers`
    (DistillationTeacher name -> URL), its external teachers' keys and CA bundles where `teacher_access`
    says (`--teacher-api-key`, `--teacher-ca`)."""
    raw = Path(path).read_bytes()
    if path.endswith(".json"):
        try:
            document = orjson.loads(raw)
        except orjson.JSONDecodeError:
            document = None
        if isinstance(document, dict) and "jobName" in document:
            return RuntimeConfig.model_validate(document), True
    job = load_job(path)
    config = resolve_runtime_config(
        job,
        None,
        in_cluster=False,
        shared_teachers=shared_teachers,
        local_gpus=local_gpus,
        teacher_access=teacher_access,
    )
    return config, False


class Progress:
    """A live progress bar (rich) or plain log lines: step, loss, KL, tokens/s, ETA."""

    def __init__(self, total: int, start: int, plain: bool) -> None:
        self.total, self.plain = total, plain
        self.bar: Any = None
        self.started = time.monotonic()
        self.first = start
        if not plain:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self.bar = RichProgress(
                TextColumn("[bold]distill"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
                transient=False,
            )
            self.task = self.bar.add_task("steps", total=total, completed=start, info="starting")
            self.bar.start()

    def step(self, record: dict[str, Any]) -> None:
        loss, kl = record.get("loss"), record.get("kl")
        info = (
            f"loss {loss:.4f}  KL {kl if kl is None else f'{kl:.4f}'}  "
            f"{record['tokens_per_s']:.0f} tok/s  {record['time/step_s']:.2f} s/step"
            if loss is not None
            else ""
        )
        if self.bar is not None:
            self.bar.update(self.task, completed=record["step"], info=info)
        else:
            done = record["step"] - self.first
            eta = (time.monotonic() - self.started) / max(done, 1) * (self.total - record["step"])
            print(f"step {record['step']}/{self.total}  {info}  ETA {eta:.0f} s", flush=True)

    def event(self, message: str) -> None:
        if self.bar is not None:
            self.bar.console.print(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _install_interrupt(stop: threading.Event, say: Any) -> None:
    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        say(
            "interrupt: finishing this step, saving a checkpoint and writing the report (Ctrl-C again to abort)"
        )

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def root_cause(error: BaseException) -> BaseException:
    """The error an actor raised, without Ray's wrapping (whose text is the remote traceback)."""
    return getattr(error, "cause", None) or error


def check_teacher_tokenizers(config: RuntimeConfig, student_tokenizer: Any) -> None:
    """Refuse, before anything starts, a teacher whose files are a folder here and whose vocabulary does not
    extend the student's (`tokenizer_compat`). The others are checked once they run: served ones by what
    their server reports (`check_served_tokenizers`), in-process ones (colocated, a local run's CPU
    standalone) by what their engine loaded (`loop.start_components`)."""
    from transformers import AutoTokenizer

    from distillery_runtime.teachers.checks.tokenizer_compat import check_vocabulary, tokenizer_vocabulary

    student = tokenizer_vocabulary(student_tokenizer)
    for index, teacher in enumerate(config.spec.teachers):
        location = _local_folder(teacher)
        if location is not None:
            teacher_vocabulary = tokenizer_vocabulary(AutoTokenizer.from_pretrained(location))
            check_vocabulary(student, teacher_vocabulary, teacher_name=_teacher_label(index, teacher.name))


def _local_folder(teacher: Any) -> str | None:
    """The teacher's model folder when it is one on this machine (not served elsewhere, not a hub id)."""
    from distillery.api.spec import SERVED_ELSEWHERE
    from distillery_runtime.data.uris import resolve_location

    if teacher.placement in SERVED_ELSEWHERE:
        return None
    location = resolve_location(teacher.model)
    return location if Path(location).is_dir() else None


def _teacher_label(index: int, name: str) -> str:
    return f"spec.teachers[{index}] ({name})"


async def check_served_tokenizers(config: RuntimeConfig, student_tokenizer: Any, say: Any) -> None:
    """Served teachers whose files are not at hand here (external ones, a hub id served in the cluster):
    their vocabulary as their server reports it must extend the student's. Distillery's teacher server
    reports every id; another server only what its `/tokenize` says of a probe text (`tokenizer_compat`)."""
    import aiohttp

    from distillery_runtime.teachers.access import client_access
    from distillery_runtime.teachers.checks.tokenizer_compat import (
        check_vocabulary,
        served_vocabulary,
        tokenizer_vocabulary,
    )

    resolved = {t.name: t for t in config.teachers}
    student = tokenizer_vocabulary(student_tokenizer)
    for index, teacher in enumerate(config.spec.teachers):
        if (
            resolved[teacher.name].protocol == TeacherProtocol.IN_PROCESS
            or _local_folder(teacher) is not None
        ):
            continue  # checked from its files before anything started, or by its engine
        served = resolved[teacher.name]
        try:
            reported = await served_vocabulary(
                served.endpoints[0],
                served.served_model_name,
                student_tokenizer,
                access=client_access(served.name, served.client, served.endpoints),
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            say(f"teacher {teacher.name}: its tokenizer could not be checked against the student's ({error})")
            continue
        if reported is None:
            say(f"teacher {teacher.name}: its server reports no vocabulary, so its tokenizer is not checked")
            continue
        vocabulary, complete = reported
        if not complete:
            say(f"teacher {teacher.name}: its server has no vocabulary route; checked on a probe text only")
        check_vocabulary(
            student, vocabulary, teacher_name=_teacher_label(index, teacher.name), complete=complete
        )


def report_references(config: RuntimeConfig) -> dict[str, float]:
    """The teachers' held-out accuracies where known (a synthetic task's build measured them on the job's
    eval prompts): the lines the report's accuracy plot shows the student climbing toward. None when the job
    grades with another grader than the task's own (`auto`, or the built-in the task grades with, as gsm8k
    for chat-math): the build measured the teachers by the task's."""
    from distillery_runtime.tasks import task_for, teacher_accuracy
    from distillery_runtime.tasks.graders import BUILT_IN

    eval_path = config.spec.data.eval.path if config.spec.data.eval else None
    plan = resolve_grader(config.spec.data)
    if plan.kind != GraderKind.TASK and not (
        eval_path and BUILT_IN.get(plan.kind) is task_for(eval_path).grade
    ):
        return {}
    teachers = config.spec.teachers
    out: dict[str, float] = {}
    for teacher in teachers:
        try:
            accuracy = teacher_accuracy(teacher.model, eval_path)
        except (OSError, KeyError, ValueError) as error:  # the report of a finished run must not fail
            log.warning("teacher %s: its held-out accuracy could not be read (%s)", teacher.name, error)
            continue
        if accuracy is not None:
            out["teacher" if len(teachers) == 1 else f"teacher {teacher.name}"] = accuracy
    return out


def _first_step_mark(
    on_step: Callable[[dict[str, Any]], None], clock: StartupClock, say: Callable[[str], None]
) -> Callable[[dict[str, Any]], None]:
    """`on_step`, which also prints the start-up line once the run's first step is done."""

    def step(record: dict[str, Any]) -> None:
        on_step(record)
        if "first step" not in clock.marks:
            clock.mark("first step")
            say(clock.line())

    return step


@dataclass
class _Started:
    """What a run started and must stop however it ends: the local teacher servers and the run's actors."""

    teachers: LocalTeachers | None = None
    components: Components | None = None


async def _run(
    config: RuntimeConfig,
    in_cluster: bool,
    args: argparse.Namespace,
    out_dir: Path,
    gpus: LocalGpuPlan | None,
    local_gpus: int = 0,
) -> int:
    """`local_gpus`: the CUDA GPUs a local run's machine shows it (its plan's `scoring_engine` reads them)."""
    from distillery_runtime.run.loop.components import stop_components

    stop = threading.Event()
    options = _run_options(config, in_cluster, args, out_dir, local_gpus, stop)
    clock = StartupClock()
    plan = startup_plan(in_cluster, sequential=os.environ.get(SEQUENTIAL_ENV) == "1")
    started = time.monotonic()
    running = _Started()
    config, loop = _load_job(config, options, out_dir, gpus, plan, clock, running)
    for note in loop.notes:
        print(f"data: {note}", flush=True)
    if gpus is not None and (gpus.student or gpus.teachers):
        print(gpus.describe(), flush=True)
    progress = Progress(loop.total, loop.step_done, plain=args.no_progress or not sys.stdout.isatty())
    options.on_step, options.on_event = _first_step_mark(progress.step, clock, progress.event), progress.event
    _install_interrupt(stop, progress.event)
    failure: Exception | None = None
    try:
        if loop.finished:
            # Nothing starts: no Ray, no engine, no wait for teachers that may have gone with the finished
            # job (on a cluster, KubeRay retries a driver whose pod failed after the run's last step).
            progress.event(f"already finished at step {loop.step_done} of {loop.total}: nothing to run")
            result = loop.result(stopped=False)
        else:
            config, result, failure = await _start_and_run(
                config, loop, args, in_cluster, out_dir, gpus, plan, clock, progress, stop, running
            )
    finally:
        progress.close()
        if running.components is not None:
            await stop_components(running.components)
        if running.teachers is not None:
            running.teachers.stop()
    _report(config, loop, result, failure, out_dir, started)
    if failure is not None:
        raise failure
    return EXIT_INTERRUPTED if result.stopped else EXIT_OK


def _run_options(
    config: RuntimeConfig,
    in_cluster: bool,
    args: argparse.Namespace,
    out_dir: Path,
    local_gpus: int,
    stop: threading.Event,
) -> RunOptions:
    """The loop's options from the command line; in a cluster, metrics are served and the job's status
    reported."""
    from distillery_runtime.observe.metrics import RuntimeMetrics
    from distillery_runtime.run.loop.state import RunOptions

    metrics = RuntimeMetrics()
    status = None
    if in_cluster:
        metrics.serve(config.metrics_port)
        if config.status_target is not None:
            from distillery_runtime.observe.status import StatusReporter

            status = StatusReporter(
                config.status_target.namespace, config.status_target.name, claim=config.checkpoint_claim
            )
    return RunOptions(
        output_dir=out_dir,
        resume=args.resume,
        overwrite=args.overwrite,
        steps=args.steps,
        local=not in_cluster,
        local_gpus=local_gpus,
        stop=stop,
        metrics=metrics,
        status=status,
        on_event=lambda message: print(message, flush=True),
    )


def _load_job(
    config: RuntimeConfig,
    options: RunOptions,
    out_dir: Path,
    gpus: LocalGpuPlan | None,
    plan: StartupPlan,
    clock: StartupClock,
    running: _Started,
) -> tuple[RuntimeConfig, Loop]:
    """The job loaded (data, tokenizer, checkpoints), with the local teacher servers booting meanwhile where
    the start-up plan starts them first; they are stopped again if the job fails to load or is finished."""
    from distillery_runtime.run import local
    from distillery_runtime.run.loop.loop import Loop

    try:
        if plan.teachers_first:
            # The teacher servers boot (subprocesses, tens of seconds) while this process loads the job; they
            # write only to their logs, and a job that fails to load stops them before anything else starts.
            config, running.teachers = local.start_local_teachers(config, out_dir / "logs", gpus)
        # Before Ray: a job whose data, tokenizer, grader or folders are wrong fails with its one line in
        # seconds, and no Ray was started to shut down again.
        loop = Loop(config, options)  # data and tokenizer problems surface here
        check_teacher_tokenizers(config, loop.tokenizer)
        loop.restore()
        if not loop.finished:  # a finished run writes no checkpoint
            loop.preflight()
        clock.mark("job loaded")
        if loop.finished and running.teachers is not None:
            running.teachers.stop()  # nothing will score
            running.teachers = None
    except BaseException:
        if running.teachers is not None:
            running.teachers.stop()
        raise
    return config, loop


async def _start_and_run(
    config: RuntimeConfig,
    loop: Loop,
    args: argparse.Namespace,
    in_cluster: bool,
    out_dir: Path,
    gpus: LocalGpuPlan | None,
    plan: StartupPlan,
    clock: StartupClock,
    progress: Progress,
    stop: threading.Event,
    running: _Started,
) -> tuple[RuntimeConfig, RunResult, Exception | None]:
    """Start what the run needs (teachers, Ray, the actors), wait for the teachers and check them, then run
    the loop: (the config, the run's result, the failure that ended it after its finished steps were kept)."""
    from distillery_runtime.checkpoints.checkpoint import CheckpointWriteError
    from distillery_runtime.run import local
    from distillery_runtime.run.loop.components import start_components
    from distillery_runtime.teachers.checks.consistency import check_teacher_replicas
    from distillery_runtime.teachers.checks.served_limits import check_served_limits
    from distillery_runtime.teachers.clients.outage import TeacherOutageError

    if not in_cluster and not plan.teachers_first:
        config, running.teachers = local.start_local_teachers(config, out_dir / "logs", gpus)
    loop.config = config
    local.init_ray(
        args.ray_address or ("auto" if in_cluster else None),
        gpus.student if gpus else None,
        model_locations=config.spec.loaded_models(),
    )
    clock.mark("ray")
    # ray.init installs its own SIGTERM handler in the driver (it logs a stack and aborts): ours again,
    # so that a SIGTERM (a pod's deletion, the preStop hook) finishes the step and saves a checkpoint.
    _install_interrupt(stop, progress.event)
    components_task = asyncio.create_task(start_components(loop, config))
    components_task.add_done_callback(lambda _task: clock.mark("components ready"))
    timeout = config.spec.teacher_ready_timeout_seconds
    served = [
        f"{t.name} at {', '.join(t.endpoints)}"
        for t in config.teachers
        if t.protocol != TeacherProtocol.IN_PROCESS
    ]
    if served:
        progress.event(f"waiting up to {timeout:.0f} s for teachers: {'; '.join(served)}")
    waited = await local.wait_for_teachers(
        config, timeout, running.teachers, interval=plan.poll_interval_s, stop=stop
    )
    if stop.is_set():
        # Interrupted while starting (a pod deleted or preempted before its teachers answered): no step
        # has begun, so nothing is left to save, and the run ends now rather than after the wait (a
        # pod's preStop hook waited out its grace period, holding the pool, for a driver that only
        # reacted once the teachers were up).
        components_task.cancel()  # still starting; started ones are stopped below like any run's
        with contextlib.suppress(asyncio.CancelledError, Exception):
            running.components = await components_task
        progress.event(
            f"interrupt: stopped while starting, before step {loop.step_done + 1}; nothing to save"
        )
        return config, loop.result(stopped=True), None
    clock.mark("teachers ready")
    progress.event(f"teachers ready after {waited:.1f} s")
    # A shared teacher was started with its own maxLogprobs and context, not this job's.
    await check_served_limits(config)
    await check_served_tokenizers(config, loop.tokenizer, progress.event)
    # Here, not in start_components (which runs while the teachers boot): every replica answers now.
    await check_teacher_replicas(config, loop.plan, loop.tokenizer, progress.event)
    running.components = await components_task
    try:
        return config, await loop.run(running.components), None
    except (TeacherOutageError, CheckpointWriteError) as error:
        # What is finished is kept (the loop saved it, or it was saved before the disk filled): the
        # report shows it, then the run fails with the one line of what went wrong.
        return config, loop.result(stopped=True), error


def _report(
    config: RuntimeConfig,
    loop: Loop,
    result: RunResult,
    failure: Exception | None,
    out_dir: Path,
    started: float,
) -> None:
    """The end of a run, however it ended: report.md with its summary, and the held-out accuracy, the model
    and the report's path on the terminal."""
    import torch

    from distillery_runtime.observe.report import accuracy_label, graded_evals, write_report

    summary = {
        "job": config.job_name,
        "steps": f"{result.steps_done}/{result.total_steps}" + (" (stopped)" if result.stopped else ""),
        "wall time": f"{time.monotonic() - started:.1f} s",
        "loss mode": config.spec.loss.mode.value,
        "teachers": ", ".join(f"{t.name} ({t.placement.value})" for t in config.spec.teachers),
        "rollout engine": loop.plan.rollout.engine.value,
        # A float32 curve depends on the kernels' summation order: a report says which path computed it
        # (this process's, which the run's actors inherit; ATEN_CPU_CAPABILITY narrows it).
        "CPU kernels": torch.backends.cpu.get_cpu_capability(),
        "last checkpoint": result.last_checkpoint,
        **({"failed": str(root_cause(failure))} if failure is not None else {}),
        "prompts": f"{len(loop.train_data.records)} train"
        + (f", {len(loop.eval_data.records)} eval" if loop.eval_data else "")
        + (f"; {'; '.join(loop.notes)}" if loop.notes else ""),
    }
    report = write_report(
        out_dir,
        job_name=config.job_name,
        records=result.records,
        evals=result.evals,
        summary=summary,
        references=report_references(config),
        model=result.model,
        model_dtype=loop.plan.export.dtype.value,
    )
    graded = graded_evals(result.evals)
    if graded:
        first, last = graded[0], graded[-1]
        print(
            f"held-out {accuracy_label(result.evals)}: {first['eval_accuracy']:.1%} (step {first['step']}) -> "
            f"{last['eval_accuracy']:.1%} (step {last['step']})",
            flush=True,
        )
    if result.model:
        print(
            f"model: {result.model} ({loop.plan.export.dtype.value}; vllm serve and from_pretrained load it)",
            flush=True,
        )
    print(f"report: {report}", flush=True)


def output_dir(config: RuntimeConfig, in_cluster: bool, requested: str | None) -> Path:
    """Where metrics.jsonl, eval.jsonl and the report go: `--output`, else runs/JOB here, or in a cluster
    beside the checkpoints (a pod's own folder is gone with the pod, and a retry resumes the same file)."""
    if requested:
        return Path(requested)
    if in_cluster:
        return Path(config.spec.checkpoint.path) / "runs" / config.job_name
    return Path("runs") / config.job_name


def local_teacher_access(
    api_keys: list[tuple[str, str]], ca_files: list[tuple[str, str]]
) -> dict[str, LocalAccess]:
    """`--teacher-api-key NAME=VAR` and `--teacher-ca NAME=PATH` by teacher name."""
    keys, cas = dict(api_keys), dict(ca_files)
    return {name: LocalAccess(api_key_env=keys.get(name), ca_file=cas.get(name)) for name in {*keys, *cas}}


def run_command(args: argparse.Namespace) -> int:
    """`distillery run`: validate, then run locally or in the cluster; returns the exit code."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from distillery_runtime.run.local import visible_gpus

    # The GPUs a local run places its parts on (none where it joins a Ray cluster: its teachers then run here).
    visible = [] if args.ray_address else visible_gpus()
    try:
        shared = dict(getattr(args, "shared_teacher", None) or [])
        access = local_teacher_access(
            getattr(args, "teacher_api_key", None) or [], getattr(args, "teacher_ca", None) or []
        )
        config, in_cluster = load_config(args.file, shared, local_gpus=len(visible), teacher_access=access)
    except (UnservedSharedTeacher, LocalAccessError) as error:
        for line in str(error).splitlines():
            print(f"{args.file}: {line}", file=sys.stderr)
        return EXIT_INVALID
    except InvalidManifest as error:
        for problem in error.problems:
            print(problem.format(error.source), file=sys.stderr)
        return EXIT_INVALID
    except (OSError, ValueError) as error:
        print(f"{args.file}: {error}", file=sys.stderr)
        return EXIT_INVALID
    gpus = None
    if not in_cluster and not args.ray_address:
        from distillery_runtime.run.local_gpus import NotEnoughGpus, plan_local_gpus

        try:
            gpus = plan_local_gpus(config.spec, visible)
        except NotEnoughGpus as error:
            print(f"{args.file}: spec.{error.field}: {error}", file=sys.stderr)
            return EXIT_INVALID
    out_dir = output_dir(config, in_cluster, args.output)
    if not in_cluster:
        from distillery_runtime.run.loop.state import earlier_run_refusal

        refusal = earlier_run_refusal(out_dir, resume=args.resume, overwrite=args.overwrite)
        if refusal:
            print(f"{args.file}: {refusal}", file=sys.stderr)
            return EXIT_INVALID
    out_dir.mkdir(parents=True, exist_ok=True)
    from distillery_runtime.agents.environments import EnvironmentLoadError
    from distillery_runtime.agents.observations import ObservationError
    from distillery_runtime.checkpoints.checkpoint import (
        CheckpointReadError,
        CheckpointWriteError,
        PreflightError,
    )
    from distillery_runtime.data.data import DataError
    from distillery_runtime.data.uris import UnresolvableLocation
    from distillery_runtime.run.local import TeachersNotReady
    from distillery_runtime.run.loop.checkpointing import ResumeError
    from distillery_runtime.tasks.graders import GraderError
    from distillery_runtime.teachers.checks.served_limits import ServedLimitsError
    from distillery_runtime.teachers.types import TeacherError

    try:
        return asyncio.run(_run(config, in_cluster, args, out_dir, gpus, len(visible)))
    except DataError as error:
        print(f"data: {error}", file=sys.stderr)
        return EXIT_INVALID
    except (
        UnresolvableLocation,
        PreflightError,
        ResumeError,
        GraderError,
        EnvironmentLoadError,
        ObservationError,
    ) as error:
        print(f"{args.file}: {error}", file=sys.stderr)
        return EXIT_INVALID
    except ServedLimitsError as error:
        for line in str(error).splitlines():
            print(f"{args.file}: {line}", file=sys.stderr)
        return EXIT_INVALID
    except (TeachersNotReady, TeacherError) as error:
        print(f"teachers: {error}", file=sys.stderr)
        return EXIT_FAILED
    except (CheckpointWriteError, CheckpointReadError) as error:  # the latter: a resume's trainer.pt refused
        print(f"checkpoint: {root_cause(error)}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("aborted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        try:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        except ImportError:  # pragma: no cover
            pass
