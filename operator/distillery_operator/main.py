"""`distillery operator`: kopf with Distillery's handlers, the reconcile workers, metrics and health endpoints.

`run` is the whole operator as a coroutine (tests run it in their event loop); `run_operator` is the CLI.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Collection

import kopf

from distillery_operator import handlers, naming
from distillery_operator.controller import Controller, ControllerSettings
from distillery_operator.kube import Kube, load_configuration
from distillery_operator.serving import health_app, metrics_app, serve

log = logging.getLogger("distillery.operator")


def kopf_settings() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    # Namespaces are given (or the whole cluster): no scanning of CRDs and namespaces at runtime.
    settings.scanning.disabled = True
    # Only our children, filtered by the API server: a cluster's other ConfigMaps are never sent to us.
    for resource in handlers.CHILD_RESOURCES.values():
        selector = f"{naming.MANAGED_BY_LABEL}={naming.MANAGED_BY}"
        settings.watching.label_selectors[resource] = selector  # type: ignore[index]
    # kopf's per-object log lines become Events at WARNING only; our own Events are explicit.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 600
    return settings


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
) -> None:
    """Runs until `stop_flag` is set (or the task is cancelled)."""
    # The handlers register themselves with kopf's default registry on import.
    assert handlers.OURS
    kube = Kube(load_configuration(kubeconfig))
    controller = Controller(kube, controller_settings or ControllerSettings())
    runners = []
    if metrics_port is not None:
        runners.append(await serve(metrics_app(), host, metrics_port))
    if health_port is not None:
        runners.append(await serve(health_app(controller.ready.is_set), host, health_port))
    try:
        await kopf.operator(
            settings=kopf_settings(),
            standalone=True,
            clusterwide=clusterwide,
            namespaces=list(namespaces),
            memo=kopf.Memo(controller=controller),
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        for runner in runners:
            await runner.cleanup()
        kube.close()


def run_operator(
    *,
    namespaces: list[str],
    all_namespaces: bool,
    metrics_port: int,
    health_port: int,
    verbose: bool,
) -> int:
    """The `distillery operator` command."""
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
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await run(
            namespaces=namespaces,
            clusterwide=all_namespaces,
            metrics_port=metrics_port,
            health_port=health_port,
            stop_flag=stop,
        )

    asyncio.run(main())
    return 0
