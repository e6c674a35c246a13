"""A job that sets every pod setting (issue 26), shared by the render tests (tests/operator) and the
admission test on a real API server (tests/cluster)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]

TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpu.example.com/class", "operator": "In", "values": ["h100"]}]}
            ]
        }
    },
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": 50,
                "podAffinityTerm": {
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "distillery"}},
                    "topologyKey": "kubernetes.io/hostname",
                },
            }
        ]
    },
}
SPREAD = [
    {
        "maxSkew": 1,
        "topologyKey": "topology.kubernetes.io/zone",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "qwen-7b-to-1p5b"}},
    }
]
ENV = [
    {"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"},
    {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}}},
    {"name": "REGION", "valueFrom": {"configMapKeyRef": {"name": "site", "key": "region", "optional": True}}},
    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
]
VOLUMES = [
    {"name": "cache", "emptyDir": {"sizeLimit": "10Gi"}},
    {"name": "certs", "secret": {"secretName": "ca-bundle", "defaultMode": 0o444}},
    {"name": "site", "configMap": {"name": "site", "items": [{"key": "hosts", "path": "hosts"}]}},
    {"name": "shared", "persistentVolumeClaim": {"claimName": "shared-data", "readOnly": True}},
]
MOUNTS = [
    {"name": "cache", "mountPath": "/cache"},
    {"name": "certs", "mountPath": "/etc/ssl/site", "readOnly": True},
    {"name": "site", "mountPath": "/etc/site"},
    {"name": "shared", "mountPath": "/shared", "readOnly": True},
]


def pod_settings(priority: str = "training-high") -> dict[str, Any]:
    """Every pod setting at once, as a section of the spec holds them."""
    return {
        "priorityClassName": priority,
        "affinity": copy.deepcopy(AFFINITY),
        "topologySpreadConstraints": copy.deepcopy(SPREAD),
        "podLabels": {"team": "ml", "cost-center": "c42"},
        "podAnnotations": {"sidecar.istio.io/inject": "false", "example.com/owner": "ml platform"},
        "env": copy.deepcopy(ENV),
        "volumes": copy.deepcopy(VOLUMES),
        "volumeMounts": copy.deepcopy(MOUNTS),
    }


def job_with_settings(priority: str = "training-high") -> dict[str, Any]:
    """standalone-teacher.yaml with every pod setting on the student pool and the teacher's pool."""
    doc = yaml.safe_load((ROOT / "examples" / "standalone-teacher.yaml").read_text())
    doc["spec"]["student"]["pool"].update(nodeSelector={"gpu": "h100"}, tolerations=[TOLERATION])
    doc["spec"]["student"]["pool"].update(pod_settings(priority))
    doc["spec"]["teachers"][0]["pool"].update(pod_settings(priority))
    doc["spec"]["imagePullSecrets"] = ["team-registry", "cluster-registry"]
    return doc
