"""`distillery serve-teacher TEACHER.yaml [--port N]`: a DistillationTeacher served on this machine.

The same server module and flags as the operator's Deployment (`shared_teacher_engine(...).server_args()`),
started as a local run starts its standalone teachers (`local.launch_teacher_server`: on loopback, eager,
on CPU). Local jobs reach it with `distillery run JOB --shared-teacher NAME=URL`, as jobs in a cluster
reach the DistillationTeacher's Service. Runs until Ctrl-C (or SIGTERM), which stops the server.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from distillery.plan.shared_teacher import shared_teacher_engine
from distillery.runtime_config import TEACHER_PORT
from distillery.validation import InvalidManifest, load_teacher

EXIT_OK, EXIT_INVALID, EXIT_FAILED = 0, 1, 2


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def serve_teacher_command(args: argparse.Namespace) -> int:
    """Serve the DistillationTeacher of `args.file` on `args.port` (0: a free one) until interrupted."""
    from distillery_runtime.run.local import launch_teacher_server
    from distillery_runtime.run.workers import free_port

    try:
        teacher = load_teacher(args.file)
    except InvalidManifest as error:
        for problem in error.problems:
            print(problem.format(error.source), file=sys.stderr)
        return EXIT_INVALID
    name = teacher.metadata.name
    port = args.port if args.port is not None else TEACHER_PORT
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    engine = shared_teacher_engine(name, teacher.spec)

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    process = launch_teacher_server(engine, teacher.spec.model, port, None)
    # The URL first, at once: a script can start its jobs now (they wait for the teacher to answer).
    print(f"serving DistillationTeacher {name} at {url}", flush=True)
    print(f"  distillery run JOB.yaml --shared-teacher {name}={url}", flush=True)
    try:
        while not _healthy(url):
            if process.poll() is not None:
                print(f"teacher server exited with code {process.returncode}", file=sys.stderr)
                return EXIT_FAILED
            time.sleep(1.0)
        print(f"ready: {name} at {url}", flush=True)
        code = process.wait()
        print(f"teacher server exited with code {code}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
