"""The chart's admission policy is the one `distillery.admission` defines: its CEL file is the module's
output, and the policies rendered from the values are the ones the module builds from the same settings.

Whether the API server runs that CEL as `distillery validate` does: tests/cluster/test_admission_on_server.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from chart.helm_chart import SCENARIOS, by_kind, render_objects

from distillery.admission import POLICIES, POLICIES_FILE, AdmissionSettings, policies_file, policy_spec


def test_policies_file_is_what_the_module_writes() -> None:
    assert POLICIES_FILE.read_text() == policies_file(), "stale: run `python -m distillery.admission`"


def test_disabled_by_default_renders_nothing() -> None:
    objects = render_objects()
    assert by_kind(objects, "ValidatingAdmissionPolicy") == []
    assert by_kind(objects, "ValidatingAdmissionPolicyBinding") == []


@pytest.mark.parametrize(
    "values",
    [
        SCENARIOS["admission"]["admission"],
        {"enabled": True},
        {"enabled": True, "allowedImagePrefixes": ["a/<b>&c"], "allowedServiceAccounts": ["x", "y.z"]},
    ],
    ids=["scenario", "empty-lists", "escaped"],
)
def test_rendered_policies_are_the_modules(values: dict[str, Any]) -> None:
    objects = render_objects({"admission": values})
    settings = AdmissionSettings.model_validate(values)
    policies = {p["metadata"]["name"]: p for p in by_kind(objects, "ValidatingAdmissionPolicy")}
    assert set(policies) == {f"distillery-{p.resource}" for p in POLICIES.values()}
    for kind, policy in POLICIES.items():
        assert policies[f"distillery-{policy.resource}"]["spec"] == policy_spec(kind, settings)
    bindings = by_kind(objects, "ValidatingAdmissionPolicyBinding")
    assert {b["spec"]["policyName"] for b in bindings} == set(policies)
    for binding in bindings:
        assert binding["spec"]["validationActions"] == settings.validation_actions
        selector = binding["spec"].get("matchResources", {}).get("namespaceSelector")
        assert selector == (values.get("namespaceSelector") or None)


def test_values_schema_refuses_a_misspelt_setting() -> None:
    with pytest.raises(Exception, match="allowedImages"):
        render_objects({"admission": {"enabled": True, "allowedImages": ["x/"]}})
