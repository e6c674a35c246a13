"""A corpus of invalid manifests (tests/api/corpus.py): the CLI rejects each naming the field, and an
offline check of the CRD agrees.

The judge is the real API server: tests/cluster/test_invalid_corpus_on_server.py sends every manifest of
the corpus to a kube-apiserver and requires `distillery validate` to agree with it. These tests are the
fast pre-check that runs without one: the generated CRD checked offline with jsonschema + cel-python
(tests/support/openapi.py), an emulator that has passed manifests the server refuses (see the corpus).
`crd` says what the offline check does with each: AGREE means it rejects it at the same field path;
otherwise the string says why it cannot see the problem.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from api.corpus import ACCEPTED, AGREE, BASE, CASES, DELETE, boundary_cases
from api.corpus import mutated as _mutated
from distillery_cli.main import main as cli_main
from support.openapi import validate as crd_validate

from distillery.validation import InvalidManifest, parse_job


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)


def test_base_manifest_is_valid(base_manifest: dict[str, Any], crd_schema: dict[str, Any]) -> None:
    parse_job(base_manifest)
    assert crd_validate(base_manifest, crd_schema) == []


@pytest.mark.parametrize(("case", "changes", "field", "crd"), CASES, ids=[c[0] for c in CASES])
def test_cli_rejects_naming_the_field(
    base_manifest: dict[str, Any], case: str, changes: dict[str, Any], field: str, crd: str
) -> None:
    with pytest.raises(InvalidManifest) as raised:
        parse_job(_mutated(base_manifest, changes), source=f"{case}.yaml")
    paths = [p.path for p in raised.value.problems]
    # An error may name an element (betas[1]) or a map key (labels.KEY); it still names the field.
    assert any(p == field or p.startswith((field + "[", field + ".")) for p in paths), (
        f"{case}: expected {field}, got {raised.value}"
    )
    assert all(p.reason for p in raised.value.problems)


@pytest.mark.parametrize(("case", "changes", "field", "crd"), CASES, ids=[c[0] for c in CASES])
def test_crd_schema_agrees(
    base_manifest: dict[str, Any],
    crd_schema: dict[str, Any],
    case: str,
    changes: dict[str, Any],
    field: str,
    crd: str,
) -> None:
    doc = _mutated(base_manifest, changes)
    errors = crd_validate(
        {k: v for k, v in doc.items() if k in ("spec",)} | {"metadata": doc.get("metadata", {})}, crd_schema
    )
    if crd == AGREE:
        paths = [e.path for e in errors]
        # jsonschema reports a missing required property at its parent object.
        parent = field.rsplit(".", 1)[0] if "." in field else ""
        assert field in paths or parent in paths, f"{case}: CRD errors {errors} do not name {field}"
    else:
        # The schema alone accepts it; the reason it still never reaches the operator is documented above.
        assert errors == [], errors


def test_unknown_field_suggests_nearest(base_manifest: dict[str, Any]) -> None:
    with pytest.raises(InvalidManifest) as raised:
        parse_job(_mutated(base_manifest, {"spec.loss.topk": 8}))
    assert "did you mean 'topK'?" in str(raised.value)


def test_validate_cli_prints_one_line_per_problem(
    tmp_path: Path, base_manifest: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    bad = _mutated(base_manifest, {"spec.teachers[1].endpoint": DELETE, "spec.loss.beta": 3.0})
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(base_manifest))
    assert cli_main(["validate", str(good)]) == 0
    assert cli_main(["validate", str(good), str(path)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert sorted(lines) == sorted(
        [
            f"{path}: spec.teachers[1].endpoint: is required for placement external and not allowed for the other placements",
            f"{path}: spec.loss.beta: Input should be less than or equal to 1",
        ]
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("spec:\n  student: {model: x\n", "YAML syntax error: line 3, column 1"),
        ("spec:\n\tstudent: 1\n", "YAML syntax error: line 2, column 1"),
        ("", "no YAML document in the file"),
        ("- a\n- b\n", "expected a mapping"),
    ],
    ids=["unclosed-flow", "tab-indent", "empty-file", "not-a-mapping"],
)
def test_bad_yaml_names_line_and_column(
    tmp_path: Path, text: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    assert cli_main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{path}: ") and expected in out, out


@pytest.mark.parametrize(("case", "changes"), ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_near_misses_are_accepted(crd_schema: dict[str, Any], case: str, changes: dict[str, Any]) -> None:
    """Valid manifests next to an edge (the server accepts each: tests/cluster)."""
    doc = _mutated(BASE, changes)
    parse_job(doc)
    if "metadata" not in case and "status" not in case:
        assert crd_validate({"metadata": doc["metadata"], "spec": doc["spec"]}, crd_schema) == []


BOUNDS = boundary_cases()


@pytest.mark.parametrize(("case", "doc", "field"), BOUNDS, ids=[c[0] for c in BOUNDS])
def test_bounds_agree_offline(
    crd_schema: dict[str, Any], case: str, doc: dict[str, Any], field: str | None
) -> None:
    errors = crd_validate({"metadata": doc["metadata"], "spec": doc["spec"]}, crd_schema)
    if field is None:
        parse_job(doc)
        assert errors == []
    else:
        with pytest.raises(InvalidManifest) as raised:
            parse_job(doc)
        assert any(p.path == field for p in raised.value.problems), raised.value
        assert field in [e.path for e in errors], errors


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")], ids=["inf", "-inf", "nan"])
def test_a_number_json_cannot_carry_is_refused(base_manifest: dict[str, Any], value: float) -> None:
    """YAML's .inf/.nan: kubectl cannot send them; dropped silently they would become the default."""
    with pytest.raises(InvalidManifest) as raised:
        parse_job(_mutated(base_manifest, {"spec.student.optimizer": {"lr": value}}))
    assert [p.path for p in raised.value.problems] == ["spec.student.optimizer.lr"]
