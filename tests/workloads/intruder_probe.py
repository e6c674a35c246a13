"""Run inside the intruder pod (`python - TARGETS_JSON < intruder_probe.py`): a pod of the job's namespace
that holds none of its credentials tries each of the job's endpoints and prints one JSON line of what each
answered. It uses the runtime image's own Ray and HTTP clients, as an attacker with the job's image would.

Targets (all optional): `dashboard` (host:port of the head's dashboard and Jobs API), `gcs` (host:port of
its GCS), `teacher` (base URL of a teacher server; with `keys`, the keys to send, each also with another
job's name in `X-Distillery-Job`), `metrics` (a URL to GET). Each result is an HTTP status, a gRPC status
name, or `unreachable: ...`.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from typing import Any

TIMEOUT = 10


def http(url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> str:
    request = urllib.request.Request(url, data=body, headers=headers or {}, method="POST" if body else "GET")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return str(response.status)
    except urllib.error.HTTPError as error:
        return str(error.code)
    except OSError as error:
        return f"unreachable: {error}"


def submit_job(dashboard: str) -> str:
    """A Ray job through the Jobs API: what would run any code on the student's GPUs."""
    body = json.dumps({"entrypoint": "python -c 'print(\"pwned\")'"}).encode()
    return http(f"http://{dashboard}/api/jobs/", body, {"Content-Type": "application/json"})


def read_gcs(gcs: str) -> str:
    """The cluster's node table from the GCS, as any Ray client starts."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    channel = grpc.insecure_channel(gcs)
    try:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        stub.GetAllNodeInfo(gcs_service_pb2.GetAllNodeInfoRequest(), timeout=TIMEOUT)
        return "OK"
    except grpc.RpcError as error:
        return error.code().name
    finally:
        channel.close()


def score(teacher: str, key: str | None = None, job: str | None = None) -> str:
    """One sequence through the compact scoring wire."""
    body = json.dumps({"top_k": 1, "sequences": [{"id": "x", "prompt_len": 1, "token_ids": [1, 2]}]}).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if job is not None:
        headers["X-Distillery-Job"] = job
    return http(f"{teacher}/distillery/v1/score", body, headers)


def main(targets: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "dashboard" in targets:
        out["dashboard_submit"] = submit_job(targets["dashboard"])
    if "gcs" in targets:
        out["gcs"] = read_gcs(targets["gcs"])
    if "teacher" in targets:
        teacher, claim = targets["teacher"], targets.get("claim", "some-namespace/another-job")
        out["teacher_no_key"] = score(teacher)
        out["teacher_claiming_a_job"] = score(teacher, job=claim)
        out["teacher_wrong_key"] = score(teacher, key="not-the-key")
        for i, key in enumerate(targets.get("keys", [])):
            out[f"teacher_key_{i}_claiming_a_job"] = score(teacher, key=key, job=claim)
    if "metrics" in targets:
        out["metrics"] = http(targets["metrics"])
    return out


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
