"""A real Prometheus (Debian's `prometheus` package) on loopback, for the observability tests.

It scrapes the given targets every second, evaluates the given rule files every second, and answers
PromQL through its HTTP API. Its TSDB lives in a temporary directory that goes with the process.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
INSTALL_HINT = "Debian's prometheus package: apt-get install -y prometheus (scripts/setup.sh --dev does it)"


@dataclass(frozen=True)
class Target:
    """A scrape target: a `job` name, host:port, and labels added to every series (as relabeling would)."""

    job: str
    address: str
    labels: dict[str, str]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape_config(targets: list[Target], rule_files: list[Path]) -> dict[str, Any]:
    jobs: dict[str, list[dict[str, Any]]] = {}
    for target in targets:
        jobs.setdefault(target.job, []).append({"targets": [target.address], "labels": target.labels})
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {"job_name": job, "metrics_path": "/metrics", "static_configs": configs}
            for job, configs in jobs.items()
        ],
    }


class Prometheus:
    """Client of a running server: instant queries, targets and alerts through the HTTP API."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _get(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
                body = orjson.loads(response.read())
        except urllib.error.HTTPError as error:  # 400/422 carry the PromQL error as JSON
            body = orjson.loads(error.read())
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The series (vector) or points (scalar/matrix) an instant query returns."""
        data = self._get("/api/v1/query", query=expr)
        result = data["result"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return list(result)

    def label_values(self, label: str, match: str) -> list[str]:
        return list(self._get(f"/api/v1/label/{label}/values", **{"match[]": match}))

    def targets(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/targets")["activeTargets"])

    def alerts(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/alerts")["alerts"])

    def wait_for(self, predicate: Any, timeout: float = 30.0, what: str = "condition") -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(0.5)
        raise AssertionError(f"Prometheus: timed out waiting for {what} (last: {last!r})")


@contextmanager
def run_prometheus(workdir: Path, targets: list[Target], rule_files: list[Path] = ()) -> Iterator[Prometheus]:  # type: ignore[assignment]
    """Start Prometheus with a config scraping `targets`; stop it on exit."""
    if PROMETHEUS is None:
        raise RuntimeError(f"no prometheus on PATH: install {INSTALL_HINT}")
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(targets, list(rule_files))))
    port = free_port()
    log = (workdir / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {(workdir / 'prometheus.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:  # not listening yet, or 503 while starting
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("prometheus did not become ready in 60 s")
            time.sleep(0.2)
        yield Prometheus(url)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    if PROMTOOL is None:
        raise RuntimeError(f"no promtool on PATH: install {INSTALL_HINT}")
    return subprocess.run([PROMTOOL, *args], input=stdin, capture_output=True, text=True, timeout=60)
