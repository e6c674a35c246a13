"""The environments a tool-using student's episodes talk to: a Python class of the runtime image, one
instance per episode, or an HTTP service that names each episode. Both are driven as `EnvironmentSession`s
with a timeout on every call; anything that goes wrong in a call is an `EnvironmentFailure` that ends its
episode (the runner counts it), never the run."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import aiohttp

from distillery.plan.agents.episodes import EpisodeSettings
from distillery_runtime.tasks.graders import import_object

T = TypeVar("T")


class EnvironmentLoadError(ValueError):
    """spec.environment.module cannot be used (one line naming the field)."""


class EnvironmentFailure(Exception):
    """One call of an environment raised, timed out or answered what the protocol does not allow."""

    def __init__(self, call: str, reason: str) -> None:
        super().__init__(f"{call}: {reason}")
        self.call = call


@dataclass(frozen=True)
class Step:
    """The environment's answer to one turn."""

    observation: str
    done: bool
    error: bool = False
    """The turn misused the tool (a malformed call) and the tool said so: the episode goes on."""


def parse_step(value: Any) -> Step:
    """A step's answer as a module (a tuple) or a service (a JSON object) gives it; ValueError otherwise."""
    if isinstance(value, Step):
        return value
    if isinstance(value, dict):
        value = (value.get("observation", ""), value.get("done"), value.get("error", False))
    if isinstance(value, (tuple, list)) and len(value) in (2, 3):
        observation, done, *error = value
        if (
            isinstance(observation, str)
            and isinstance(done, bool)
            and all(isinstance(e, bool) for e in error)
        ):
            return Step(observation, done, bool(error and error[0]))
    raise ValueError(f"answered {value!r:.200}, not (observation: str, done: bool[, error: bool])")


def parse_reward(value: Any) -> float | None:
    """A reward in [0, 1] (a bool counts as 0 or 1), or None: the environment does not grade."""
    if value is None:
        return None
    if isinstance(value, dict):
        return parse_reward(value.get("reward"))
    if isinstance(value, (bool, int, float)) and not math.isnan(float(value)) and 0.0 <= float(value) <= 1.0:
        return float(value)
    raise ValueError(f"answered {value!r:.200}, not a reward in [0, 1]")


class EnvironmentSession(Protocol):
    """One episode's environment."""

    async def reset(self, prompt: str, answer: str | None) -> None: ...

    async def step(self, output: str) -> Step: ...

    async def reward(self) -> float | None: ...


async def _timed(call: str, timeout_s: float, work: Callable[[], Any]) -> Any:
    """`work()` awaited within the timeout; whatever goes wrong is an `EnvironmentFailure` naming `call`."""
    try:
        return await asyncio.wait_for(work(), timeout_s)
    except TimeoutError as error:
        raise EnvironmentFailure(
            call, f"took longer than {timeout_s:g} s (spec.environment.stepTimeoutSeconds)"
        ) from error
    except EnvironmentFailure:
        raise
    except Exception as error:  # the user's code, or the service, failed: this episode ends, the run goes on
        reason = (str(error).strip().splitlines() or [""])[0]
        raise EnvironmentFailure(call, f"{type(error).__name__}: {reason}") from error


def _parsed(call: str, parse: Callable[[Any], T], value: Any) -> T:
    """An answer as the protocol reads it; one it does not allow is an `EnvironmentFailure` naming `call`."""
    try:
        return parse(value)
    except ValueError as error:
        raise EnvironmentFailure(call, str(error)) from error


class ModuleSession:
    """An instance of the environment class; its calls run in a thread so a slow tool does not hold the
    loop (a call past its timeout is abandoned: its thread may run on, the episode does not wait)."""

    def __init__(self, cls: type, timeout_s: float) -> None:
        self._cls = cls
        self._instance: Any = None
        self._timeout_s = timeout_s

    async def reset(self, prompt: str, answer: str | None) -> None:
        def start() -> None:
            self._instance = self._cls()
            self._instance.reset(prompt, answer)

        await _timed("reset", self._timeout_s, lambda: asyncio.to_thread(start))

    async def step(self, output: str) -> Step:
        value = await _timed("step", self._timeout_s, lambda: asyncio.to_thread(self._instance.step, output))
        return _parsed("step", parse_step, value)

    async def reward(self) -> float | None:
        grade = getattr(self._instance, "reward", None)
        if grade is None:
            return None
        value = await _timed("reward", self._timeout_s, lambda: asyncio.to_thread(grade))
        return _parsed("reward", parse_reward, value)


class HttpSession:
    """One episode of an HTTP environment: POST {url}/reset, /step and /reward, each naming the episode."""

    def __init__(self, client: aiohttp.ClientSession, url: str, episode: str, timeout_s: float) -> None:
        self._client = client
        self._url = url.rstrip("/")
        self._episode = episode
        self._timeout_s = timeout_s

    async def _post(self, call: str, body: dict[str, Any]) -> Any:
        async def send() -> Any:
            async with self._client.post(
                f"{self._url}/{call}", json={"episode": self._episode, **body}
            ) as resp:
                if resp.status == 404 and call == "reward":
                    return None  # a service that does not grade
                if resp.status >= 400:
                    raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
                return await resp.json(content_type=None)

        return await _timed(call, self._timeout_s, send)

    async def reset(self, prompt: str, answer: str | None) -> None:
        await self._post("reset", {"prompt": prompt, "answer": answer})

    async def step(self, output: str) -> Step:
        return _parsed("step", parse_step, await self._post("step", {"output": output}))

    async def reward(self) -> float | None:
        return _parsed("reward", parse_reward, await self._post("reward", {}))


def load_environment_class(path: str) -> type:
    """The class `spec.environment.module` names, imported now: a module that cannot be used stops the job
    before anything loads, in one line naming the field."""
    found = import_object(path, "spec.environment.module", EnvironmentLoadError)
    if (
        not isinstance(found, type)
        or not callable(getattr(found, "reset", None))
        or not callable(getattr(found, "step", None))
    ):
        raise EnvironmentLoadError(
            f"spec.environment.module: {path!r} is not a class with reset(prompt, answer) and step(output)"
        )
    return found


class Environments:
    """Makes each episode's session, as the plan says: a class of the image or an HTTP service."""

    def __init__(self, settings: EpisodeSettings) -> None:
        self.settings = settings
        self._cls = load_environment_class(settings.module) if settings.module else None
        self._client: aiohttp.ClientSession | None = None

    def session(self, episode: str) -> EnvironmentSession:
        timeout = self.settings.step_timeout_s
        if self._cls is not None:
            return ModuleSession(self._cls, timeout)
        assert self.settings.url is not None
        if self._client is None:  # made on the loop's event loop, at first use
            self._client = aiohttp.ClientSession()
        return HttpSession(self._client, self.settings.url, episode, timeout)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None
