"""The `distillery` command: one entry point, a subcommand per job.

validate and crd need only the API; render and operator load the operator package, run loads the
runtime (torch, Ray, vLLM), each only when asked for, so that `distillery validate` stays instant. It is
the one package that may import all three (api, operator, runtime), so it lives above them, not in
`distillery/`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from distillery import __version__
from distillery.admission import load_settings as load_admission_settings
from distillery.admission import violations as admission_violations
from distillery.api.shared_teacher import DistillationTeacherSpec
from distillery.api.spec import DistillationJobSpec
from distillery.model_shapes import resolve_shape
from distillery.plan import resolve
from distillery.plan.agents.episodes import episode_lines
from distillery.plan.attention import attention_line
from distillery.plan.checkpoints.storage import checkpoint_storage
from distillery.plan.data.padding import padding_line
from distillery.plan.grader import pattern_refusal, resolve_grader
from distillery.plan.memory.features import job_memory_plan, resolve_memory_features
from distillery.plan.memory.gpu import refusal
from distillery.plan.memory.lora_report import lora_lines
from distillery.plan.placement.gpus import plan_gpu_placement
from distillery.plan.placement.rollout import rollout_line
from distillery.plan.pods.host_memory import host_memory_refusal, plan_host_memory
from distillery.plan.pods.model_cache import cache_lines
from distillery.plan.pods.resources import pod_resources
from distillery.plan.rollout.sleep import sleep_lines
from distillery.plan.rollout.student_base import student_base_lines
from distillery.plan.teachers.scoring_engine import scoring_engine_lines
from distillery.validation import InvalidManifest, load_jobs, load_manifests


def _validate(args: argparse.Namespace) -> int:
    failed = False
    settings = None
    if args.admission:
        try:
            settings = load_admission_settings(args.admission)
        except (OSError, ValueError) as error:
            print(error, file=sys.stderr)
            return 1
    for path in args.files:
        try:
            jobs, teachers = load_manifests(path)
        except InvalidManifest as error:
            failed = True
            for problem in error.problems:
                print(problem.format(error.source))
            continue
        refused = False
        for job in jobs:
            # Python's re judges a regex grader's pattern; the API server's RE2 cannot (distillery.plan.grader).
            why = pattern_refusal(resolve_grader(job.spec.data))
            if why:
                refused = failed = True
                print(f"{path}: spec.data.grader.pattern: {why}")
            # Not a rule of the API (the API server cannot know the model's shape): the CLI's own check.
            plan = job_memory_plan(job.spec)
            reason = refusal(plan) if plan is not None else None
            if plan is not None and reason:
                refused = failed = True
                print(f"{path}: {plan.refused_field}: {reason}")
            host = plan_host_memory(job.spec)
            host_refused = host_memory_refusal(job.spec, host) if host is not None else None
            if host_refused is not None:
                refused = failed = True
                print(f"{path}: {host_refused[0]}: {host_refused[1]}")
        # What the platform's admission policy (the chart's `admission` values) would refuse on apply.
        specs: list[DistillationJobSpec | DistillationTeacherSpec] = [j.spec for j in jobs]
        specs += [t.spec for t in teachers]
        for violation in [v for s in specs for v in admission_violations(s, settings)] if settings else []:
            refused = failed = True
            print(f"{path}: {violation.message}")
        if refused:
            continue
        if not args.quiet:
            names = ", ".join([job.metadata.name for job in jobs] + [t.metadata.name for t in teachers])
            print(f"{path}: valid ({names})", file=sys.stderr)
    return 1 if failed else 0


def _plan(args: argparse.Namespace) -> int:
    try:
        jobs = load_jobs(args.file)
    except InvalidManifest as error:
        print(error, file=sys.stderr)
        return 1
    fits = True
    for job in jobs:
        plan = job_memory_plan(job.spec)
        print(f"{job.metadata.name}: student {job.spec.student.model}")
        # Where the checkpoints and the final model go in a cluster (a local run writes to --output).
        print("\n".join(f"  {line}" for line in checkpoint_storage(job.metadata.name, job.spec).lines()))
        # How many rollout engines sample, on which GPUs.
        print(f"  {rollout_line(job.spec, resolve_shape(job.spec.student.model))}")
        # Which GPU of which worker each trainer rank, rollout engine and colocated teacher takes.
        placement = plan_gpu_placement(job.spec)
        if placement is not None:
            print("\n".join(f"  {line}" for line in placement.lines()))
        # Which engine computes each teacher's log-probs, in a cluster and in `distillery run`.
        print("\n".join(f"  {line}" for line in scoring_engine_lines(job.spec)))
        # How deep each engine on the student's GPUs sleeps while it trains, and why.
        print("\n".join(f"  {line}" for line in _sleep_lines(job.spec)))
        # Where each pod keeps what it downloads (HF_HOME), and how big.
        print("\n".join(f"  {line}" for line in cache_lines(job.spec)))
        # What each pod of it asks the cluster for (CPU, memory, GPUs) and why.
        print("\n".join(f"  {line}" for line in pod_resources(job.spec).lines()))
        # The memory features the plan chose (student.training: auto) and why, before the table.
        print("\n".join(f"  {line}" for line in resolve_memory_features(job.spec).lines()))
        # A LoRA student's adapter, its weight sync per step and its memory against full fine-tuning.
        # A tool-using student's episodes: turns, their budget, and which tokens the loss counts.
        # Teachers of the student's own base (no second copy) and teachers' contexts (context distillation).
        shape = resolve_shape(job.spec.student.model)
        for line in [*lora_lines(job.spec), *student_base_lines(job.spec, shape), *episode_lines(job.spec)]:
            print(f"  {line}")
        # The trainer's attention kernel (eager for narrow micro-batches of a bfloat16 CPU student).
        print(f"  {attention_line(job.spec)}")
        # How the trainer's micro-batches are grouped by length (cut further on CPU, where padding costs more).
        print(f"  {padding_line(job.spec)}")
        # Each worker pod's host memory by phase (load, training, checkpoint), which its memory must hold.
        host = plan_host_memory(job.spec)
        if host is not None:
            print("\n".join(f"  {line}" for line in host.lines()))
            host_refused = host_memory_refusal(job.spec, host)
            if host_refused is not None:
                print(f"  {host_refused[0]}: {host_refused[1]}")
                fits = False
        if plan is None:
            why = (
                "runs on CPU (student.pool.gpusPerWorker: 0)"
                if job.spec.student.pool.gpus_per_worker == 0
                else "its shape is unknown (not a local folder with config.json, nor a well-known model)"
            )
            print(f"  no memory plan: the student {why}")
            continue
        shape = plan.layout.shape
        print(
            f"  {shape.params / 1e9:.2f}B parameters ({shape.layers} layers, hidden {shape.hidden}), "
            f"{plan.layout.ranks} trainer rank(s), {plan.layout.sharding}"
        )
        print("\n".join("  " + line for line in plan.table().splitlines()))
        fits = fits and plan.fits
    return 0 if fits else 1


def _sleep_lines(spec: DistillationJobSpec) -> list[str]:
    """The plan's sleep levels (`distillery.plan.rollout.sleep`), the rollout engine's and the colocated teachers'."""
    plan = resolve(spec, student=resolve_shape(spec.student.model))
    teachers = {name: engine.sleep_level for name, engine in plan.engines.items()}
    return sleep_lines(plan.rollout.sleep_level, teachers, one_step_off=spec.schedule.one_step_off)


def _crd(args: argparse.Namespace) -> int:
    from distillery.crd import render_crd_yaml

    sys.stdout.write(render_crd_yaml(args.kind))
    return 0


def _render(args: argparse.Namespace) -> int:
    from distillery_operator.render import render_manifest_stream

    try:
        sys.stdout.write(render_manifest_stream(args.file, namespace=args.namespace))
    except InvalidManifest as error:
        print(error, file=sys.stderr)
        return 1
    return 0


def _operator(args: argparse.Namespace) -> int:
    from distillery_operator.k8s.leader import LeaseSettings, default_identity
    from distillery_operator.main import run_operator

    lease = None
    if args.leader_elect:
        namespace = args.leader_elect_namespace or os.environ.get("POD_NAMESPACE") or "default"
        lease = LeaseSettings(
            namespace=namespace,
            identity=default_identity(),
            name=args.leader_elect_lease,
            lease_seconds=args.leader_elect_lease_duration,
            renew_deadline_seconds=args.leader_elect_renew_deadline,
            retry_seconds=args.leader_elect_retry_period,
        )
    return run_operator(
        namespaces=args.namespace,
        all_namespaces=args.all_namespaces,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        verbose=args.verbose,
        leader_election=lease,
    )


def _run(args: argparse.Namespace) -> int:
    from distillery_runtime.run.cli import run_command

    return run_command(args)


def _serve_teacher(args: argparse.Namespace) -> int:
    from distillery_runtime.run.serve_teacher import serve_teacher_command

    return serve_teacher_command(args)


def _name_url(value: str) -> tuple[str, str]:
    """`--shared-teacher NAME=URL` as (NAME, URL); which teachers it serves is the runtime config's to say."""
    name, equals, url = value.partition("=")
    if not equals or not name or not url.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(
            f"expected NAME=URL (a DistillationTeacher's name and http URL), got {value!r}"
        )
    return name, url


def _name_value(what: str) -> Callable[[str], tuple[str, str]]:
    """`NAME=VALUE` as (NAME, VALUE), `what` saying what VALUE is in the error."""

    def parse(value: str) -> tuple[str, str]:
        name, equals, rest = value.partition("=")
        if not equals or not name or not rest:
            raise argparse.ArgumentTypeError(f"expected NAME={what}, got {value!r}")
        return name, rest

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distillery", description="On-policy LLM distillation on Kubernetes."
    )
    parser.add_argument("--version", action="version", version=f"distillery {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="check DistillationJob manifests; one line per problem")
    p.add_argument("files", nargs="+")
    p.add_argument("-q", "--quiet", action="store_true", help="print problems only")
    p.add_argument(
        "--admission",
        metavar="VALUES",
        help="also check what the cluster's admission policy allows: the distillery chart's values file the "
        "platform installed it with (its `admission` section)",
    )
    p.set_defaults(func=_validate)

    p = sub.add_parser("plan", help="print the per-GPU memory plan of a job (exit 1 if it does not fit)")
    p.add_argument("file")
    p.set_defaults(func=_plan)

    p = sub.add_parser("crd", help="print a CustomResourceDefinition (the DistillationJob's by default)")
    p.add_argument("--kind", choices=["DistillationJob", "DistillationTeacher"], default="DistillationJob")
    p.set_defaults(func=_crd)

    p = sub.add_parser("render", help="print the Kubernetes objects the operator creates for a job")
    p.add_argument("file")
    p.add_argument("-n", "--namespace", default="default")
    p.set_defaults(func=_render)

    p = sub.add_parser("operator", help="run the operator (kopf)")
    p.add_argument("-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="watch the whole cluster")
    p.add_argument("--metrics-port", type=int, default=8080)
    p.add_argument("--health-port", type=int, default=8081)
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument(
        "--leader-elect",
        action="store_true",
        help="run several replicas: only the holder of a coordination.k8s.io Lease reconciles",
    )
    p.add_argument("--leader-elect-namespace", help="the Lease's namespace (default: $POD_NAMESPACE)")
    p.add_argument("--leader-elect-lease", default="distillery-operator", help="the Lease's name")
    p.add_argument("--leader-elect-lease-duration", type=float, default=15.0, metavar="SECONDS")
    p.add_argument("--leader-elect-renew-deadline", type=float, default=10.0, metavar="SECONDS")
    p.add_argument("--leader-elect-retry-period", type=float, default=2.0, metavar="SECONDS")
    p.set_defaults(func=_operator)

    p = sub.add_parser("run", help="run a job: locally with an embedded Ray, or as a RayJob entrypoint")
    p.add_argument("file", help="DistillationJob manifest, or a resolved runtime config (JSON) in a cluster")
    p.add_argument("-o", "--output", default=None, help="output directory (default runs/<job name>)")
    p.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start fresh in an output folder that holds checkpoints of an earlier run, deleting them",
    )
    p.add_argument("--steps", type=int, default=None, help="override schedule.steps")
    p.add_argument("--ray-address", default=None, help="join this Ray cluster instead of starting one")
    p.add_argument("--no-progress", action="store_true", help="plain log lines instead of a progress bar")
    p.add_argument(
        "--shared-teacher",
        action="append",
        type=_name_url,
        default=[],
        metavar="NAME=URL",
        help="locally: DistillationTeacher NAME (a teacherRef) is served at URL, e.g. by serve-teacher (repeatable)",
    )
    p.add_argument(
        "--teacher-api-key",
        action="append",
        type=_name_value("VAR"),
        default=[],
        metavar="NAME=VAR",
        help="locally: external teacher NAME's API key is in environment variable VAR (a cluster reads "
        "external.apiKeySecret; repeatable)",
    )
    p.add_argument(
        "--teacher-ca",
        action="append",
        type=_name_value("PATH"),
        default=[],
        metavar="NAME=PATH",
        help="locally: external teacher NAME's certificate chains to the CAs of PEM file PATH (a cluster "
        "reads external.caBundle; repeatable)",
    )
    p.set_defaults(func=_run)

    p = sub.add_parser(
        "serve-teacher", help="serve a DistillationTeacher on this machine for local runs (until Ctrl-C)"
    )
    p.add_argument("file", help="DistillationTeacher manifest")
    p.add_argument("--port", type=int, default=None, help="loopback port (default 8000; 0: a free one)")
    p.set_defaults(func=_serve_teacher)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
