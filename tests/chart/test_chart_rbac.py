"""The chart's RBAC as rendered: it grants exactly the list documented in the chart's README (both watch
modes), nothing more.

Whether that list is what the operator really uses is judged by a real API server, from its audit log:
tests/cluster/test_rbac_on_server.py (the operator and the runtime under their real tokens). The emulator
versions of those tests are gone: kmock neither authorises requests nor runs admission, so it passed a
chart whose operator could create no child at all on a cluster with OwnerReferencesPermissionEnforcement.
"""

from __future__ import annotations

import pytest
from chart.helm_chart import CHART, SCENARIOS, by_kind, render_objects
from chart.operator_scenario import NAMESPACE

Grant = tuple[str, str]
"""(verb, "group:resource") with the core group spelt "core"."""


def documented_grants() -> set[Grant]:
    """The rows of the README's RBAC table (the one after the `rbac-table` marker)."""
    text = (CHART / "README.md").read_text()
    table = text.split("<!-- rbac-table", 1)[1].split("\n\n", 1)[0]
    grants: set[Grant] = set()
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        group = cells[0].strip("`").strip('"') or "core"
        resource = cells[1].strip("`")
        grants |= {(verb.strip(), f"{group}:{resource}") for verb in cells[2].split(",")}
    return grants


def chart_grants(values: dict) -> set[Grant]:
    """What the operator's ServiceAccount is granted by the rendered chart (through any binding)."""
    objects = render_objects(values)
    roles = {("ClusterRole", r["metadata"]["name"], ""): r for r in by_kind(objects, "ClusterRole")}
    roles |= {
        ("Role", r["metadata"]["name"], r["metadata"]["namespace"]): r for r in by_kind(objects, "Role")
    }
    bindings = by_kind(objects, "ClusterRoleBinding") + by_kind(objects, "RoleBinding")
    grants: set[Grant] = set()
    for binding in bindings:
        if not any(s["name"] == "distillery-operator" for s in binding["subjects"]):
            continue
        ref = binding["roleRef"]
        # A Role binds only in its own namespace: a binding to one that is not there grants nothing.
        namespace = binding["metadata"]["namespace"] if ref["kind"] == "Role" else ""
        for rule in roles[(ref["kind"], ref["name"], namespace)]["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    grants |= {(verb, f"{group or 'core'}:{resource}") for verb in rule["verbs"]}
    return grants


def test_readme_table_parses() -> None:
    grants = documented_grants()
    assert ("patch", "distillery.io:distillationjobs/status") in grants
    assert ("create", "core:events") in grants
    assert ("update", "distillery.io:distillationjobs/finalizers") in grants  # blockOwnerDeletion
    assert ("create", "rbac.authorization.k8s.io:roles") in grants  # the trainer's identity per job
    # Secrets: the ones a job names, by name, each job's teacher key, made, and each shared teacher's clients
    # Secret, made and patched; never listed or watched (the operator would hold them all).
    assert {verb for verb, resource in grants if resource == "core:secrets"} == {"get", "create", "patch"}


@pytest.mark.parametrize("mode", ["defaults", "namespaced"])
def test_chart_grants_exactly_the_documented_list(mode: str) -> None:
    assert chart_grants(SCENARIOS[mode]) == documented_grants()


def test_namespaced_binding_covers_the_scenario_namespace() -> None:
    objects = render_objects({"watch": {"clusterWide": False, "namespaces": [NAMESPACE]}})
    bindings = [
        rb for rb in by_kind(objects, "RoleBinding") if rb["metadata"]["name"] == "distillery-operator"
    ]
    assert [rb["metadata"]["namespace"] for rb in bindings] == [NAMESPACE]


WORKLOADS = {"ray.io:rayjobs", "apps:deployments", "core:serviceaccounts", "rbac.authorization.k8s.io:roles"}
"""What runs code or grants rights: a job's pods come from these (and the trainer's identity from the last)."""


def test_namespaced_install_is_least_privilege() -> None:
    """`watch.clusterWide: false` (README "Least-privilege install"): the operator's rules are a Role in each
    watched namespace, bound there; nothing cluster-scoped grants it anything, workloads least of all."""
    objects = render_objects(SCENARIOS["namespaced"])
    assert by_kind(objects, "ClusterRole") == [] and by_kind(objects, "ClusterRoleBinding") == []
    roles = [r for r in by_kind(objects, "Role") if r["metadata"]["name"] == "distillery-operator"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for binding in by_kind(objects, "RoleBinding"):
        if binding["metadata"]["name"] == "distillery-operator":
            assert binding["roleRef"]["kind"] == "Role"
    creates = {resource for verb, resource in chart_grants(SCENARIOS["namespaced"]) if verb == "create"}
    assert creates >= WORKLOADS  # the same rules as cluster-wide, only bound per namespace
    # Cluster-wide, the one ClusterRole is what creates workloads everywhere: the reason for the namespaced mode.
    (cluster_role,) = by_kind(render_objects(SCENARIOS["defaults"]), "ClusterRole")
    assert roles[0]["rules"] == cluster_role["rules"]
