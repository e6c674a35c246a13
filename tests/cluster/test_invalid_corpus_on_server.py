"""The real kube-apiserver judges the corpus, and `distillery validate` must agree with it on every manifest.

Every manifest of tests/api/corpus.py (the invalid corpus, the near misses that must be accepted, the
cases generated at each maxLength/maxItems/maxProperties of the spec schema) and every example is sent
to the server as a dry-run create in this module's namespace (the `kubernetes` client with the admin
kubeconfig, strict field validation as kubectl does; ~10 ms a manifest), and given to the validation
function of `distillery validate` (`parse_job`). Both accept, or both refuse; a refused manifest's field
is named by both; and every field the server names (its `spec.teachers[0].model` form, from the causes
or from a strict-decoding message) is named by ours, at that path or inside it.
"""

from __future__ import annotations

import copy
import json
import re
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))

from api.corpus import ACCEPTED, BASE, CASES, NOT_IN_SCHEMA, OPERATOR_ONLY, boundary_cases, mutated
from harness import REPO, Installation
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from distillery.api import GROUP, PLURAL, VERSION
from distillery.validation import InvalidManifest, parse_job

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
BOUNDS = boundary_cases()

# (id, manifest, field the server and ours must name; None = both accept, outside_spec, the field only
# ours names: the server accepts the manifest and the operator refuses it)
Case = tuple[str, dict[str, Any], str | None, bool, str | None]
ALL: list[Case] = [
    *(
        (cid, mutated(BASE, changes), None, False, field)
        if crd == OPERATOR_ONLY
        else (cid, mutated(BASE, changes), field, crd == NOT_IN_SCHEMA, None)
        for cid, changes, field, crd in CASES
    ),
    *((cid, mutated(BASE, changes), None, False, None) for cid, changes in ACCEPTED),
    *((cid, doc, field, False, None) for cid, doc, field in BOUNDS),
    *(
        (f"example:{path.name}:{i}", doc, None, False, None)
        for path in EXAMPLES
        for i, doc in enumerate(yaml.safe_load_all(path.read_text()))
    ),
]

NOT_CHECKED = "some validation rules were not checked because the object was invalid"


@dataclass
class Server:
    api: client.CustomObjectsApi
    namespace: str

    def refuses(self, manifest: dict[str, Any]) -> list[str] | None:
        """None if a dry-run create is accepted, else the field paths the server names (maybe none)."""
        doc = copy.deepcopy(manifest)
        if isinstance(doc.get("metadata"), dict):
            doc["metadata"]["namespace"] = self.namespace
        try:
            self.api.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, doc, dry_run="All", field_validation="Strict"
            )
        except ApiException as error:
            if error.status not in (400, 422):
                raise
            return server_paths(json.loads(error.body))
        return None


def server_paths(status: dict[str, Any]) -> list[str]:
    """The fields a Status names, in our form (`spec.teachers[0].model`, which the server uses too)."""
    paths: list[str] = []
    message = status.get("message", "")
    for cause in (status.get("details") or {}).get("causes") or []:
        field, text = cause.get("field", ""), cause.get("message", "")
        if field and field != "<nil>":
            paths.append(field)
        elif NOT_CHECKED not in text:
            # A type check the schema library reports without a field: "... in spec.schedule.steps".
            paths += re.findall(r" in ((?:spec|metadata|status)[\w.\[\]]*)$", text)
    # Strict decoding: 'strict decoding error: unknown field "spec.studnet", unknown field "..."'.
    paths += re.findall(r'unknown field "([^"]+)"', message)
    # A body of another version: 'DistillationJob in version "v1" cannot be handled as a DistillationJob'.
    found = re.search(r'in version "([^"]+)" cannot be handled', message)
    if found and found.group(1) != VERSION:
        paths = ["apiVersion"]
    return paths


def our_paths(manifest: dict[str, Any]) -> list[str] | None:
    """None if `distillery validate` accepts the manifest, else the field paths of its problems."""
    try:
        parse_job(copy.deepcopy(manifest), source="case.yaml")
    except InvalidManifest as error:
        return [p.path for p in error.problems]
    return None


def inside_refused(paths: list[str], field: str) -> bool:
    """A field the server names inside a value ours refuses whole (`teachers: {name: x}`: the server's
    strict decoding reports `spec.teachers.name` unknown, ours that `spec.teachers` is not a list)."""
    return any(field.startswith(p + ".") for p in paths if p.count(".") >= 1)


def names(paths: list[str], field: str) -> bool:
    """`paths` name `field`: that path or one inside it (an element, a key of a map)."""
    return any(p == field or p.startswith((field + ".", field + "[")) for p in paths)


@pytest.fixture(scope="module")
def server(installation: Installation) -> Iterator[Server]:
    """A namespace of this module's own (one for ~270 dry runs: a namespace per test costs more than the
    test), and a client authenticated as the admin."""
    name = f"t-corpus-{uuid.uuid4().hex[:6]}"
    installation.admin("create", "namespace", name)
    api_client = config.new_client_from_config(config_file=str(installation.plane.admin_kubeconfig))
    try:
        yield Server(client.CustomObjectsApi(api_client), name)
    finally:
        api_client.close()
        installation.admin("delete", "namespace", name, "--wait=false", check=False)


def test_the_corpus_covers_every_kind_of_case() -> None:
    assert len(CASES) >= 90 and len(ACCEPTED) >= 20 and len(EXAMPLES) >= 5
    kinds = {cid.split("-", 1)[0] for cid, *_ in BOUNDS}
    assert kinds == {"maxLength", "maxItems", "maxProperties"}
    assert len({case[0] for case in ALL}) == len(ALL)


def test_server_paths_reads_each_form_the_server_uses() -> None:
    """The mapping from the server's Status to field paths; a wrong one would make agreement vacuous."""
    invalid = {
        "message": "...",
        "details": {
            "causes": [
                {"field": "spec.teachers[0].name", "message": "Too long"},
                {
                    "field": "<nil>",
                    "message": 'Invalid value: "": Checked value must be of type integer '
                    "(default format) in spec.schedule.steps",
                },
                {
                    "field": "<nil>",
                    "message": f"Invalid value: null: {NOT_CHECKED}; correct the existing errors",
                },
            ]
        },
    }
    assert server_paths(invalid) == ["spec.teachers[0].name", "spec.schedule.steps"]
    strict = {"message": 'strict decoding error: unknown field "spec.a", unknown field "metadata.b"'}
    assert server_paths(strict) == ["spec.a", "metadata.b"]
    other = {"message": 'DistillationJob in version "v1" cannot be handled as a DistillationJob: x'}
    assert server_paths(other) == ["apiVersion"]
    assert names(["spec.labels.a b"], "spec.labels") and not names(["spec.labelsx"], "spec.labels")
    assert inside_refused(["spec.teachers"], "spec.teachers.name") and not inside_refused(["spec"], "spec.x")


@pytest.mark.parametrize(
    ("case", "manifest", "field", "outside_spec", "operator_only"), ALL, ids=[c[0] for c in ALL]
)
def test_the_server_and_distillery_validate_agree(
    server: Server,
    case: str,
    manifest: dict[str, Any],
    field: str | None,
    outside_spec: bool,
    operator_only: str | None,
) -> None:
    theirs = server.refuses(manifest)
    ours = our_paths(manifest)
    if operator_only is not None:
        assert theirs is None, f"{case}: the server refuses it ({theirs}); the corpus says only ours can"
        assert ours is not None and names(ours, operator_only), (
            f"{case}: ours names {ours}, not {operator_only}"
        )
        return
    if field is None:
        assert theirs is None, f"{case}: the server refuses a manifest meant to be valid: {theirs}"
        assert ours is None, f"{case}: the server accepts it, distillery validate refuses: {ours}"
        return
    assert theirs is not None, f"{case}: the server accepts it, expected a refusal naming {field}"
    assert ours is not None, f"{case}: the server refuses it ({theirs}), distillery validate accepts it"
    assert names(theirs, field), f"{case}: the server names {theirs}, not {field}"
    assert names(ours, field), f"{case}: distillery validate names {ours}, not {field}"
    if not outside_spec:
        # Outside the spec (apiVersion, kind, metadata) the server may add errors of its own making: an
        # object of another kind is not defaulted, so its CEL rules then miss keys.
        missing = [p for p in theirs if not names(ours, p) and not inside_refused(ours, p)]
        assert not missing, f"{case}: the server names {missing}, distillery validate only {ours}"
