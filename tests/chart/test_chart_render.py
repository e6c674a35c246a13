"""The chart lints and renders for its defaults and every documented switch; every object it renders is
valid Kubernetes (kubernetes-validate strict for built-in kinds, the prometheus-operator models for
ServiceMonitor/PodMonitor/PrometheusRule); its CRDs are the generated ones; the operator pod meets the
restricted Pod Security Standard; the watch switch gives cluster-wide or per-namespace RBAC.
"""

from __future__ import annotations

import importlib.util
import json
import re
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml
from chart.helm_chart import CHART, NAMESPACE, ROOT, SCENARIOS, by_kind, render, render_objects
from cloudcoil.models.prometheus_operator import v1 as monitoring
from distillery_cli.main import build_parser
from distillery_operator.reconcile.controller import PULL_SECRETS_ENV, cluster_pull_secrets, cluster_settings
from distillery_operator.render import render_shared_teacher
from distillery_operator.teachers.loop import SharedTeacherSettings, scaled_by_hpa, scaling_interval

from distillery.api import DistillationTeacher
from distillery.plan.access.network import NetworkPolicySettings, Peer

# The chart's kubeVersion floor and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ("1.25", "1.37")
MONITORING_MODELS = {
    "ServiceMonitor": monitoring.ServiceMonitor,
    "PodMonitor": monitoring.PodMonitor,
    "PrometheusRule": monitoring.PrometheusRule,
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lint_strict(scenario: str) -> None:
    result = helm_python.lint(str(CHART), SCENARIOS[scenario], strict=True, namespace=NAMESPACE)
    assert result["errors"] == []
    assert [m for m in result["messages"] if m["severity"] > 1] == []  # 1 = INFO (e.g. "icon is recommended")


def _validate_monitoring(obj: dict[str, Any]) -> None:
    # The models ignore unknown keys, so strictness is a round trip: whatever they drop was unknown.
    model = MONITORING_MODELS[obj["kind"]].model_validate(obj)
    assert model.model_dump(by_alias=True, exclude_unset=True, mode="json") == obj


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_rendered_object_validates(scenario: str) -> None:
    objects = render_objects(SCENARIOS[scenario])
    assert objects
    for obj in objects:
        if obj["kind"] in MONITORING_MODELS:
            _validate_monitoring(obj)
            continue
        # ValidatingAdmissionPolicy v1 came with 1.30 (README "Admission policy"); everything else with 1.25.
        versions = (
            ("1.30", KUBE_VERSIONS[-1]) if obj["kind"].startswith("ValidatingAdmission") else KUBE_VERSIONS
        )
        for version in versions:
            kubernetes_validate.validate(obj, version, strict=True)


def test_strict_validation_catches_mistakes() -> None:
    # The validators the test above relies on reject a misspelt field, for both kinds of object.
    deployment = by_kind(render_objects(), "Deployment")[0]
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContex"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[-1], strict=True)
    monitor = by_kind(render_objects(SCENARIOS["monitoring"]), "ServiceMonitor")[0]
    monitor["spec"]["endpoints"][0]["intervall"] = "1m"
    with pytest.raises(AssertionError):
        _validate_monitoring(monitor)


def test_values_schema_rejects_unknown_keys() -> None:
    with pytest.raises(helm_python.HelmValuesError, match="clusterwide"):
        render({"watch": {"clusterwide": False}})
    with pytest.raises(helm_python.HelmValuesError):
        render({"watch": {"namespaces": ["Not_A_Namespace"]}})


def test_chart_crds_equal_generated_crds() -> None:
    chart_crds = {p.name: p.read_bytes() for p in (CHART / "crds").iterdir()}
    repo_crds = {p.name: p.read_bytes() for p in (ROOT / "crds").iterdir() if p.suffix == ".yaml"}
    assert chart_crds == repo_crds, "run: cp crds/*.yaml charts/distillery/crds/"
    # And Helm sees them as the chart's CRDs (installed before the templates).
    loaded = {c["name"] for c in helm_python.Chart.load(str(CHART)).crds}
    assert loaded == {f"crds/{name}" for name in repo_crds}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_operator_pod_is_restricted(scenario: str) -> None:
    (deployment,) = by_kind(render_objects(SCENARIOS[scenario]), "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert not any(key in spec for key in ("hostNetwork", "hostPID", "hostIPC"))
    assert all("hostPath" not in v for v in spec.get("volumes", []))
    for container in spec["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["capabilities"]["drop"] == ["ALL"]
        assert "add" not in context["capabilities"]
        assert context.get("privileged", False) is False
        assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        operator_values = SCENARIOS[scenario].get("operator", {})
        assert ports == {
            "metrics": operator_values.get("metricsPort", 8080),
            "health": operator_values.get("healthPort", 8081),
        }
        assert f"--metrics-port={ports['metrics']}" in container["args"]
        assert f"--health-port={ports['health']}" in container["args"]


def _args(objects: list[dict[str, Any]]) -> list[str]:
    return by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize("scenario", ["defaults", "namespaced", "tuned", "no-leader-election"])
def test_operator_args_are_what_the_cli_takes(scenario: str) -> None:
    # The image's entrypoint is `distillery`; the container args must parse with its real parser.
    args = build_parser().parse_args(_args(render_objects(SCENARIOS[scenario])))
    values = SCENARIOS[scenario]
    assert args.func.__name__ == "_operator"
    assert args.all_namespaces == values.get("watch", {}).get("clusterWide", True)
    assert args.namespace == values.get("watch", {}).get("namespaces", [])
    assert args.metrics_port == values.get("operator", {}).get("metricsPort", 8080)
    assert args.health_port == values.get("operator", {}).get("healthPort", 8081)
    assert args.verbose == values.get("operator", {}).get("verbose", False)
    elect = values.get("operator", {}).get("leaderElection", {}).get("enabled", True)
    assert args.leader_elect == elect
    assert args.leader_elect_namespace == (NAMESPACE if elect else None)


def test_replicas_take_turns_through_leader_election() -> None:
    # With leader election (the default) several replicas may run and a rolling update is safe: the new
    # pod stands by until the old one releases the Lease. Without it, one replica, replaced stop-first.
    (ha,) = by_kind(render_objects(SCENARIOS["tuned"]), "Deployment")
    assert ha["spec"]["replicas"] == 2 and ha["spec"]["strategy"]["type"] == "RollingUpdate"
    (single,) = by_kind(render_objects(SCENARIOS["no-leader-election"]), "Deployment")
    assert single["spec"]["replicas"] == 1 and single["spec"]["strategy"]["type"] == "Recreate"
    assert not [
        r
        for r in by_kind(render_objects(SCENARIOS["no-leader-election"]), "Role")
        if "leader" in r["metadata"]["name"]
    ]
    with pytest.raises(Exception, match=r"needs operator\.leaderElection\.enabled"):
        render({"operator": {"replicas": 2, "leaderElection": {"enabled": False}}})


def test_cluster_wide_watch() -> None:
    objects = render_objects()
    assert "--all-namespaces" in _args(objects)
    assert not any(a.startswith("--namespace") for a in _args(objects))
    (binding,) = by_kind(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == by_kind(objects, "ClusterRole")[0]["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "distillery-operator", "namespace": NAMESPACE}
    ]
    # Besides the trainers' RoleBindings, only the leader-election Lease's, in the release namespace.
    others = [rb for rb in by_kind(objects, "RoleBinding") if rb["metadata"]["name"] != "distillery-runtime"]
    assert [(rb["metadata"]["name"], rb["metadata"]["namespace"]) for rb in others] == [
        ("distillery-operator-leader-election", NAMESPACE)
    ]


def test_namespaced_watch_has_nothing_cluster_wide() -> None:
    objects = render_objects(SCENARIOS["namespaced"])
    args = _args(objects)
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]
    assert by_kind(objects, "ClusterRoleBinding") == [] and by_kind(objects, "ClusterRole") == []
    operator_bindings = [
        rb for rb in by_kind(objects, "RoleBinding") if rb["metadata"]["name"] == "distillery-operator"
    ]
    assert sorted(rb["metadata"]["namespace"] for rb in operator_bindings) == ["team-a", "team-b"]
    # The runtime's Role follows the watched namespaces unless runtime.namespaces says otherwise.
    runtime_roles = [r for r in by_kind(objects, "Role") if r["metadata"]["name"] == "distillery-runtime"]
    assert sorted(r["metadata"]["namespace"] for r in runtime_roles) == ["team-a", "team-b"]

    objects = render_objects(SCENARIOS["namespaced-release-ns"])
    assert [a for a in _args(objects) if a.startswith("--namespace")] == [f"--namespace={NAMESPACE}"]


def test_runtime_role_and_service_account() -> None:
    objects = render_objects(SCENARIOS["runtime-namespaces"])
    roles = [r for r in by_kind(objects, "Role") if "leader-election" not in r["metadata"]["name"]]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["ml-1", "ml-2"]
    for role in roles:
        assert role["metadata"]["name"] == "distillery-runtime"
        grants = {
            (res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]
        }
        assert grants == {
            ("distillationjobs", "get"),
            ("distillationjobs/status", "get"),
            ("distillationjobs/status", "patch"),
        }
    accounts = {
        (sa["metadata"]["namespace"], sa["metadata"]["name"]) for sa in by_kind(objects, "ServiceAccount")
    }
    assert {("ml-1", "distillery-runtime"), ("ml-2", "distillery-runtime")} <= accounts
    for binding in by_kind(objects, "RoleBinding"):
        if binding["metadata"]["name"] == "distillery-operator-leader-election":
            continue  # the operator's, in the release namespace
        namespace = binding["metadata"]["namespace"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "distillery-runtime", "namespace": namespace}
        ]


def test_no_rbac_switch_renders_no_rbac() -> None:
    objects = render_objects(SCENARIOS["no-rbac"])
    kinds = {o["kind"] for o in objects}
    assert kinds.isdisjoint({"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"})
    deployment = by_kind(objects, "Deployment")[0]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "existing"


def test_no_wildcards_and_secrets_only_by_name() -> None:
    for scenario in ("defaults", "namespaced"):
        for obj in render_objects(SCENARIOS[scenario]):
            for rule in obj.get("rules", []):
                assert (
                    "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
                )
                # An external teacher's key, read by name for its health checks, each job's teacher key, made,
                # and each shared teacher's clients Secret, made and patched: never listed or watched.
                if "secrets" in rule["resources"]:
                    assert rule["resources"] == ["secrets"] and rule["verbs"] == ["get", "create", "patch"]


def test_monitoring_objects_select_what_exists() -> None:
    objects = render_objects(SCENARIOS["monitoring"])
    (service,) = by_kind(objects, "Service")
    (monitor,) = by_kind(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    (deployment,) = by_kind(objects, "Deployment")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    (rule,) = by_kind(objects, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    dashboards = by_kind(objects, "ConfigMap")
    assert dashboards and all(d["metadata"]["namespace"] == "monitoring" for d in dashboards)


def test_dashboards_are_sidecar_configmaps() -> None:
    dashboards = by_kind(render_objects(), "ConfigMap")
    assert len(dashboards) == len(list((CHART / "dashboards").glob("*.json"))) >= 2
    uids = set()
    for config_map in dashboards:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"]["grafana_folder"] == "Distillery"
        ((key, text),) = config_map["data"].items()
        assert key.endswith(".json")
        dashboard = json.loads(text)
        uids.add(dashboard["uid"])
        assert dashboard["panels"]
    assert len(uids) == len(dashboards)
    assert by_kind(render_objects(SCENARIOS["no-extras"]), "ConfigMap") == []


def test_notes_tell_what_to_do_next() -> None:
    notes = render(SCENARIOS["namespaced"])["distillery/templates/NOTES.txt"]
    assert "rollout status deployment/distillery-operator" in notes
    assert "in: team-a, team-b" in notes
    assert "kubectl apply" in notes and "serviceAccountName: distillery-runtime" in notes


def _leaf_keys(values: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in {"resources", "requests", "limits"}:
            keys.extend(_leaf_keys(value, f"{path}."))
        else:
            keys.append(path)
    return keys


def test_every_value_is_documented_and_exercised() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()
    keys = _leaf_keys(values)
    assert [k for k in keys if f"`{k}`" not in readme] == []
    # Every top-level section is changed by at least one scenario, so every switch is rendered.
    changed = {key for scenario in SCENARIOS.values() for key in scenario}
    assert set(values) - changed <= {"fullnameOverride"}


def test_dashboards_are_what_the_generator_writes() -> None:
    spec = importlib.util.spec_from_file_location("dashboards_generate", CHART / "dashboards" / "generate.py")
    assert spec and spec.loader
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    written = {p.name: p.read_text() for p in (CHART / "dashboards").glob("*.json")}
    assert written == generate.render_all(), "run: python charts/distillery/dashboards/generate.py"
    # The generator is not part of the packaged chart (.helmignore), its output is.
    files = {f["name"] for f in helm_python.Chart.load(str(CHART)).files}
    assert "dashboards/job.json" in files and "dashboards/generate.py" not in files


def _trainer_head_pod() -> dict[str, Any]:
    (rayjob,) = _rendered("RayJob")
    return rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]


def _pod_monitor(component: str) -> dict[str, Any]:
    """The chart's PodMonitor of the trainers ("runtime") or of the standalone teachers ("teacher")."""
    monitors = by_kind(render_objects(SCENARIOS["monitoring"]), "PodMonitor")
    (monitor,) = [m for m in monitors if m["metadata"]["labels"]["app.kubernetes.io/component"] == component]
    return monitor


def _rendered(kind: str) -> list[dict[str, Any]]:
    """The objects of `kind` the operator renders for the standalone-teacher example."""
    from distillery_operator.render import render_manifest_stream

    docs = yaml.safe_load_all(
        render_manifest_stream(str(ROOT / "examples" / "standalone-teacher.yaml"), namespace="t")
    )
    return [d for d in docs if d and d["kind"] == kind]


def test_pod_monitor_selects_the_trainer_pods() -> None:
    monitor = _pod_monitor("runtime")
    head = _trainer_head_pod()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= head["metadata"]["labels"].items()
    relabel_sources = [r["sourceLabels"][0] for r in monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]]
    # distillery.io/job as Prometheus' service discovery spells a pod label.
    assert "__meta_kubernetes_pod_label_distillery_io_job" in relabel_sources
    assert "distillery.io/job" in head["metadata"]["labels"]


def test_trainer_declares_the_metrics_port_the_pod_monitor_scrapes() -> None:
    from distillery.runtime_config import RuntimeConfig

    monitor = _pod_monitor("runtime")
    port_name = monitor["spec"]["podMetricsEndpoints"][0]["port"]
    ports = {
        p["name"]: p["containerPort"]
        for c in _trainer_head_pod()["spec"]["containers"]
        for p in c.get("ports", [])
    }
    assert ports.get(port_name) == RuntimeConfig.model_fields["metrics_port"].default


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels and In expressions) against a pod's labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In"
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def test_teacher_pod_monitor_scrapes_each_teachers_metrics_standalone_or_shared() -> None:
    monitor = _pod_monitor("teacher")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    deployments = _rendered("Deployment")
    assert deployments  # the example has a standalone teacher
    shared = yaml.safe_load((ROOT / "examples" / "teachers" / "qwen-7b.yaml").read_text())
    shared["metadata"]["namespace"] = "t"
    deployments.append(
        render_shared_teacher(DistillationTeacher.model_validate(shared), namespace="t", replicas=1)[0]
    )
    for deployment in deployments:
        template = deployment["spec"]["template"]
        assert _selects(monitor["spec"]["selector"], template["metadata"]["labels"])
        # The runtime's trainers are not teachers.
        assert not _selects(
            monitor["spec"]["selector"],
            {**template["metadata"]["labels"], "app.kubernetes.io/component": "trainer"},
        )
        ports = {p["name"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
        assert endpoint["port"] in ports and endpoint["path"] == "/metrics"  # vLLM serves it on its API port
        # The labels the dashboards group by come from pod labels the teacher's pod carries.
        relabels = {r["targetLabel"]: r["sourceLabels"][0] for r in endpoint["relabelings"]}
        for target, pod_label in (
            *(
                [("distillery_job", "distillery.io/job")]
                if "distillery.io/job" in template["metadata"]["labels"]
                else []
            ),
            ("teacher", "distillery.io/teacher"),
        ):
            discovered = "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", pod_label)
            assert relabels[target] == discovered
            assert pod_label in template["metadata"]["labels"]


@pytest.mark.parametrize("file", ["operator.json", "job.json"])
def test_dashboard_layout_and_data_source(file: str) -> None:
    dashboard = json.loads((CHART / "dashboards" / file).read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        area = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"panel {panel['title']!r} overlaps another"
        cells |= area
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(set(refs)) == len(refs)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_operator_is_given_the_charts_pull_secrets(scenario: str) -> None:
    """The chart's `imagePullSecrets` pull the operator's image and, through the one variable the operator
    reads (`controller.cluster_pull_secrets`), every pod it makes."""
    (deployment,) = by_kind(render_objects(SCENARIOS[scenario]), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0].get("env", [])}
    names = [s["name"] for s in SCENARIOS[scenario].get("imagePullSecrets", [])]
    assert [s["name"] for s in pod.get("imagePullSecrets", [])] == names
    if names:
        assert cluster_pull_secrets(env) == tuple(names)
    else:
        assert PULL_SECRETS_ENV not in env


def test_network_policies_are_on_by_default_and_the_values_reach_the_operator() -> None:
    """`networkPolicy` becomes the operator's one variable (`controller.cluster_settings` parses it): on by
    default, with the chart's namespaces and this release's operator pods (the namespace and selector labels
    of its Deployment's pods) as a caller; `enabled: false` says `off`, and the operator makes none. RBAC
    for them is granted either way."""

    def settings(values: dict[str, Any] | None) -> NetworkPolicySettings | None:
        (deployment,) = by_kind(render_objects(values), "Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        return cluster_settings(env).network_policy

    objects = render_objects(None)
    (deployment,) = by_kind(objects, "Deployment")
    operator = Peer(NAMESPACE, deployment["spec"]["selector"]["matchLabels"])
    assert settings(None) == NetworkPolicySettings(
        kuberay=Peer("kuberay-system"), operator=operator, monitoring=Peer("monitoring")
    )
    on = {
        "networkPolicy": {
            "kuberayNamespace": "ray",
            "monitoringNamespace": "prom",
            "monitoringPodLabels": {"app.kubernetes.io/name": "prometheus"},
        }
    }
    assert settings(on) == NetworkPolicySettings(
        kuberay=Peer("ray"),
        operator=operator,
        monitoring=Peer("prom", {"app.kubernetes.io/name": "prometheus"}),
    )
    assert settings({"networkPolicy": {"enabled": False}}) is None
    for values in (None, {"networkPolicy": {"enabled": False}}):
        (role,) = [
            r for r in by_kind(render_objects(values), "ClusterRole") if "operator" in r["metadata"]["name"]
        ]
        assert any(
            "networkpolicies" in rule["resources"] and {"create", "patch"} <= set(rule["verbs"])
            for rule in role["rules"]
        )


def test_shared_teacher_scaling_values_reach_the_operator() -> None:
    """`sharedTeachers.scaling` and `.scalingIntervalSeconds` become the two variables that
    `shared_teachers.SharedTeacherSettings` reads."""

    def settings(values: dict[str, Any] | None) -> SharedTeacherSettings:
        (deployment,) = by_kind(render_objects(values), "Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
        return SharedTeacherSettings(interval=scaling_interval(env), hpa=scaled_by_hpa(env))

    assert settings(None) == SharedTeacherSettings(interval=15.0, hpa=False)
    assert settings(SCENARIOS["hpa-teachers"]) == SharedTeacherSettings(interval=5.0, hpa=True)
    with pytest.raises(ValueError, match="DISTILLERY_TEACHER_SCALING='keda': must be operator or hpa"):
        scaled_by_hpa({"DISTILLERY_TEACHER_SCALING": "keda"})
    with pytest.raises(ValueError, match="must be a positive number of seconds"):
        scaling_interval({"DISTILLERY_TEACHER_SCALING_INTERVAL": "0"})


@pytest.mark.parametrize(("scenario", "mode"), [("defaults", "token"), ("no-ray-auth", "disabled")])
def test_the_operator_is_given_the_charts_ray_auth(scenario: str, mode: str) -> None:
    """The chart's `rayAuth` reaches the operator through the one variable it reads
    (`controller.cluster_ray_auth`): token unless a platform turns it off."""
    (deployment,) = by_kind(render_objects(SCENARIOS[scenario]), "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert cluster_settings(env).ray_auth.value == mode
