"""`distillery operator`: kopf with Distillery's handlers, the reconcile workers, metrics and health endpoints.

`run` is the whole operator as a coroutine (tests run it in their event loop); `run_operator` is the CLI.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Collection
from typing import Any

import kopf
from kopf._core.engines.peering import Identity  # kopf exports the type only here

from distillery_operator import handlers, naming
from distillery_operator.k8s.client import Kube, load_configuration
from distillery_operator.k8s.leader import LeaderElector, LeaseSettings, default_identity
from distillery_operator.reconcile.controller import Controller, ControllerSettings
from distillery_operator.serving import health_app, metrics_app, serve
from distillery_operator.teachers.loop import SharedTeachers, SharedTeacherSettings

log = logging.getLogger("distillery.operator")


def kopf_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # Namespaces are given (or the whole cluster): no scanning of CRDs and namespaces at runtime.
    settings.scanning.disabled = True
    # Only our children, filtered by the API server: a cluster's other ConfigMaps are never sent to us.
    for resource in (*handlers.CHILD_RESOURCES.values(), handlers.CLAIMS):
        selector = f"{naming.MANAGED_BY_LABEL}={naming.MANAGED_BY}"
        settings.watching.label_selectors[resource] = selector  # type: ignore[index]
    # kopf's per-object log lines become Events at WARNING only; our own Events are explicit.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 600
    return settings


class LeadershipLost(RuntimeError):
    """This replica could not renew its Lease in time; another may lead now, so it must stop."""


async def _wait_flag(flag: asyncio.Event | threading.Event | None) -> None:
    if flag is None:
        await asyncio.Future()  # forever
    elif isinstance(flag, asyncio.Event):
        await flag.wait()
    else:
        while not flag.is_set():
            await asyncio.sleep(0.05)


KOPF_WATCH_STREAM = "infinite_watch"
"""kopf's generator of a watch-stream's events (kopf/_cogs/clients/watching.py)."""


def quiet_watch_finalizer(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's exception handler while the operator stops: a kopf watch-stream finalized by
    asyncio's last clean-up is a debug line, anything else goes to asyncio's default handler.

    When a SIGTERM stops kopf mid-watch, it can leave a watch-stream's async generator for `asyncio.run` to
    close (`shutdown_asyncgens`). Closing it then raised `RuntimeError: generator didn't stop after
    athrow()` from kopf's `streaming_block` (found in CI, about one run in ten), after the Lease was
    released and every task had ended: nothing is lost, but the ERROR and its traceback said otherwise."""
    generator = context.get("asyncgen")
    if getattr(generator, "__name__", None) == KOPF_WATCH_STREAM and isinstance(
        context.get("exception"), RuntimeError
    ):
        log.debug("a kopf watch-stream closed at shutdown: %s", context.get("exception"))
        return
    loop.default_exception_handler(context)


def _take_signals(handler: Callable[[], None]) -> None:
    """SIGTERM and SIGINT call `handler` (idempotent) instead of kopf's handlers.

    kopf's handlers set the result of a one-shot future and stay installed: a second signal (Ctrl-C after
    a SIGTERM, a supervisor signalling again) while the operator stops made asyncio log a traceback of
    `InvalidStateError`. Only the main thread's loop has signal handlers (in-process tests run elsewhere).
    """
    if threading.current_thread() is not threading.main_thread():
        return
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, handler)


async def _signals_once_kopf_started(controller: Controller, stopped: asyncio.Event) -> None:
    # kopf installs its handlers before it runs the startup handler that makes the controller ready.
    await controller.ready.wait()
    _take_signals(stopped.set)


async def run(
    *,
    namespaces: Collection[str] = (),
    clusterwide: bool = False,
    metrics_port: int | None = 8080,
    health_port: int | None = 8081,
    host: str = "0.0.0.0",
    controller_settings: ControllerSettings | None = None,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
    kubeconfig: str | None = None,
    leader_election: LeaseSettings | None = None,
    shared_teacher_settings: SharedTeacherSettings | None = None,
) -> None:
    """Runs until `stop_flag` is set (or the task is cancelled).

    With `leader_election`, kopf starts only once this replica holds the Lease, and the call raises
    `LeadershipLost` if the Lease cannot be renewed (the process should exit: it restarts as a standby).
    """
    # The handlers register themselves with kopf's default registry on import.
    assert handlers.OURS
    configuration = load_configuration(kubeconfig)
    kube = Kube(configuration)
    controller = Controller(kube, controller_settings or ControllerSettings())
    shared_teachers = SharedTeachers(kube, controller, shared_teacher_settings or SharedTeacherSettings())
    elector = LeaderElector(configuration, leader_election) if leader_election else None

    def ready() -> bool:
        # A standby is ready: it serves nothing until it leads, and a rolling update must be able to
        # replace the leader with it. The leader is ready once its watches are listed and workers run.
        return controller.ready.is_set() or (elector is not None and not elector.leading)

    runners = []
    if metrics_port is not None:
        runners.append(await serve(metrics_app(), host, metrics_port))
    if health_port is not None:
        runners.append(await serve(health_app(ready), host, health_port))
    tasks: list[asyncio.Task[None]] = []
    lost = asyncio.Event()
    # kopf stops when this is set: on our stop flag, on a lost Lease, or by our cleanup handler when kopf
    # stops on a signal (kopf replaces our signal handlers while it runs).
    stopped = asyncio.Event()
    try:
        stopping = asyncio.create_task(_wait_flag(stop_flag))
        stopping.add_done_callback(lambda _: stopped.set())
        tasks.append(stopping)
        if elector is not None:
            if not await elector.acquire(stopping.done):
                return
            log.info("leading as %s", elector.settings.identity)
            hold = asyncio.create_task(elector.hold())
            tasks.append(hold)
            hold.add_done_callback(lambda task: None if task.cancelled() else lost.set())
            hold.add_done_callback(lambda _: stopped.set())
        # A signal then stops kopf through its stop flag (the same path as our stop flag).
        tasks.append(asyncio.create_task(_signals_once_kopf_started(controller, stopped)))
        await kopf.operator(
            settings=kopf_settings(),
            standalone=True,
            clusterwide=clusterwide,
            namespaces=list(namespaces),
            memo=kopf.Memo(controller=controller, shared_teachers=shared_teachers, stopped=stopped),
            # kopf would name itself from the user's passwd entry, which images running as a bare uid
            # (the chart's 65532, OpenShift's random uids) lack: it raised KeyError before the first watch.
            identity=Identity(elector.settings.identity if elector is not None else default_identity()),
            stop_flag=stopped,
            ready_flag=ready_flag,
        )
    finally:
        # kopf's handlers outlive it: signals during the cleanup below must find ours.
        _take_signals(stopped.set)
        for task in tasks:
            task.cancel()
        if elector is not None:
            if elector.leading and not lost.is_set():
                await asyncio.to_thread(elector.release)
            elector.close()
        for runner in runners:
            await runner.cleanup()
        kube.close()
    if lost.is_set():
        raise LeadershipLost("the Lease could not be renewed in time")


def run_operator(
    *,
    namespaces: list[str],
    all_namespaces: bool,
    metrics_port: int,
    health_port: int,
    verbose: bool,
    leader_election: LeaseSettings | None = None,
) -> int:
    """The `distillery operator` command; exit 1 when the Lease is lost (the pod restarts as a standby)."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not verbose:
        logging.getLogger("kopf").setLevel(logging.WARNING)
    if not namespaces and not all_namespaces:
        namespaces = ["default"]
        log.warning("no --namespace and no --all-namespaces: watching the namespace 'default'")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(quiet_watch_finalizer)
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await run(
            namespaces=namespaces,
            clusterwide=all_namespaces,
            metrics_port=metrics_port,
            health_port=health_port,
            stop_flag=stop,
            leader_election=leader_election,
        )

    try:
        asyncio.run(main())
    except LeadershipLost as error:
        log.error("%s: exiting", error)
        return 1
    return 0
