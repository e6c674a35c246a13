"""A local run's embedded Ray: started again where its start timed out (`local.start_embedded_ray`), and
with no idle workers beside the run's own (`local.EMBEDDED_RAY_SYSTEM_CONFIG`).

Ray's own start is replaced in the first two tests: its timeout (the raylet aborting while its dashboard
agent imports on a busy host) cannot be made to happen on demand. `bench/ray_startup.py` starts the real one
under load. The last test starts a real one."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import ray
from distillery_runtime.run import local

TIMED_OUT = "The current node timed out during startup. This could happen because some of the raylet failed"


class FakeStarts:
    """`ray.init` that fails with `errors` in turn (each start leaving a process behind, as Ray's GCS is),
    then succeeds."""

    def __init__(self, errors: list[Exception]) -> None:
        self.errors, self.calls, self.left = errors, [], []

    def __call__(self, **options: object) -> None:
        self.calls.append(options)
        if len(self.calls) <= len(self.errors):
            self.left.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
            raise self.errors[len(self.calls) - 1]


@pytest.fixture
def starts(monkeypatch: pytest.MonkeyPatch):
    def make(errors: list[Exception]) -> FakeStarts:
        fake = FakeStarts(errors)
        monkeypatch.setattr(ray, "init", fake)
        monkeypatch.setattr(ray, "shutdown", lambda: None)
        return fake

    return make


def test_a_start_that_timed_out_is_cleaned_up_and_made_again(starts) -> None:
    fake = starts([Exception(TIMED_OUT), Exception(TIMED_OUT)])
    local.start_embedded_ray(num_cpus=4, include_dashboard=False)
    assert fake.calls == [{"num_cpus": 4, "include_dashboard": False}] * 3
    # What each failed start left is gone before the next.
    assert all(process.wait(timeout=10) is not None for process in fake.left)


def test_another_failure_is_raised_at_once_and_a_third_timeout_too(starts) -> None:
    fake = starts([ValueError("num_cpus must be positive")])
    with pytest.raises(ValueError, match="num_cpus"):
        local.start_embedded_ray(num_cpus=-1)
    assert len(fake.calls) == 1
    fake = starts([Exception(TIMED_OUT)] * local.RAY_STARTS)
    with pytest.raises(Exception, match="timed out during startup"):
        local.start_embedded_ray()
    assert len(fake.calls) == local.RAY_STARTS
    for process in fake.left:
        process.kill()


IDLE_WORKERS_BESIDE_AN_ACTOR = """
import psutil, ray
from distillery_runtime.run.local import init_ray

init_ray(None)

@ray.remote(num_cpus=0)
class Actor:
    def pid(self):
        import os
        return os.getpid()

actor = Actor.remote()
pid = ray.get(actor.pid.remote())
tree = psutil.Process().children(recursive=True)
print(pid in {p.pid for p in tree}, sum(p.name().startswith("ray::IDLE") for p in tree))
ray.shutdown()
"""


def test_an_embedded_ray_is_its_own_and_starts_no_idle_workers_beside_the_actors_it_is_asked_for() -> None:
    # Ray's defaults prestart idle workers for the first driver (two on the 2-core host, there by the time
    # ray.init returns) that no actor of the run's runtime environment ever starts in.
    # And a Ray found on the machine is not joined: ray.init without an address takes RAY_ADDRESS (or the
    # last `ray start`'s address), which here points at nothing: joining it would fail the start.
    env = {**os.environ, "RAY_ADDRESS": "127.0.0.1:1"}
    out = subprocess.run(
        [sys.executable, "-c", IDLE_WORKERS_BESIDE_AN_ACTOR],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    actor_in_tree, idle_workers = out.stdout.split()
    assert (actor_in_tree, idle_workers) == ("True", "0")
