"""Renders charts/distillery with the Helm SDK (helm-python-sdk, i.e. `helm template`) for the chart tests.

No `helm` binary exists on these machines; the SDK is Helm v4's own Go code as a library, so lint, the
values schema and the templates behave as with `helm lint` / `helm template`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "distillery"
RELEASE = "distillery"
NAMESPACE = "distillery-system"

# Every documented switch of values.yaml that changes what is rendered, with a name for the test id.
# Each is rendered, linted and validated; README.md documents each key.
SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced": {"watch": {"clusterWide": False, "namespaces": ["team-a", "team-b"]}},
    "namespaced-release-ns": {"watch": {"clusterWide": False}},
    "runtime-namespaces": {"runtime": {"namespaces": ["ml-1", "ml-2"]}},
    "no-rbac": {
        "rbac": {"create": False},
        "serviceAccount": {"create": False, "name": "existing"},
        "runtime": {"rbac": {"create": False}, "serviceAccount": {"create": False}},
    },
    "monitoring": {
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
            "podMonitor": {"enabled": True},
        },
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "dashboards": {"namespace": "monitoring"},
        "networkPolicy": {"enabled": True},
    },
    "no-extras": {"metrics": {"service": {"enabled": False}}, "dashboards": {"enabled": False}},
    "no-leader-election": {"operator": {"leaderElection": {"enabled": False}}},
    "no-ray-auth": {"rayAuth": "disabled"},
    "admission": {
        "admission": {
            "enabled": True,
            "allowedImagePrefixes": ["ghcr.io/distillery-ai/", "registry.example.com/ml/"],
            "allowedServiceAccounts": ["distillery-runtime"],
            "allowSecretVolumes": False,
            "validationActions": ["Warn", "Audit"],
            "namespaceSelector": {"matchLabels": {"distillery.io/bounded": "true"}},
        }
    },
    "hpa-teachers": {"sharedTeachers": {"scaling": "hpa", "scalingIntervalSeconds": 5}},
    "tuned": {
        "image": {"tag": "0.1.0-rc1", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "operator": {
            "replicas": 2,
            "verbose": True,
            "metricsPort": 9090,
            "healthPort": 9091,
            "extraEnv": [{"name": "TZ", "value": "UTC"}],
            "podAnnotations": {"a": "b"},
            "podLabels": {"team": "ml"},
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["infra"]}]}
                        ]
                    }
                }
            },
            "priorityClassName": "system-cluster-critical",
        },
        "metrics": {"service": {"port": 9090}},
        "nameOverride": "dist",
    },
}


def load_chart() -> helm_python.Chart:
    return helm_python.Chart.load(str(CHART))


def render(values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE) -> dict[str, str]:
    """Template file -> rendered text, as `helm template RELEASE charts/distillery -n NAMESPACE`."""
    return load_chart().render(values or {}, name=RELEASE, namespace=namespace)


def render_objects(
    values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    """Every Kubernetes object the templates produce (NOTES.txt and empty documents left out)."""
    objects: list[dict[str, Any]] = []
    for path, text in sorted(render(values, namespace=namespace).items()):
        if not path.endswith((".yaml", ".yml")):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]
