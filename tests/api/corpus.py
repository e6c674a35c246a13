"""The manifests both validators judge: a valid base, the invalid corpus, near misses that must be
accepted, and cases generated at each length/items/properties bound of the CRD schema.

Shared by the offline pre-checks (tests/api: pydantic, and the CRD through jsonschema + cel-python) and
by the judge, the real kube-apiserver (tests/cluster/test_invalid_corpus_on_server.py), so that all of
them see the same list. Cases marked "found by the server" are what the real server decided differently
from `distillery validate` or from the offline emulator before they were fixed.
"""

from __future__ import annotations

import copy
import itertools
import re
from typing import Any

from distillery.crd import build_crd

AGREE = "agree"
NOT_IN_SCHEMA = (
    "checked by the API server outside the CRD schema (routing by apiVersion/kind, metadata validation, "
    "strict decoding of the whole object), which the offline check does not see"
)

OPERATOR_ONLY = (
    "the CRD keeps a chat template variable untyped (a union of scalars has no structural schema, and CEL "
    "sees no type in an untyped value): the API server accepts it, the operator marks the job Invalid"
)

DELETE = object()

BASE: dict[str, Any] = {
    "apiVersion": "distillery.io/v1alpha1",
    "kind": "DistillationJob",
    "metadata": {"name": "base"},
    "spec": {
        "student": {"model": "Qwen/Qwen2.5-0.5B"},
        "teachers": [
            {"name": "math", "model": "Qwen/Qwen2.5-7B", "routes": ["math"]},
            {
                "name": "ext",
                "model": "big",
                "placement": "external",
                "endpoint": "http://t:8000",
                "default": True,
            },
        ],
        "data": {"train": {"path": "/data/train.jsonl"}},
        "loss": {"mode": "forward_kl_topk", "topK": 8},
    },
}


def split_path(path: str) -> list[str | int]:
    """'spec.teachers[1].endpoint' -> ['spec', 'teachers', 1, 'endpoint']."""
    return [int(p) if p.isdigit() else p for p in re.split(r"\.|\[|\]", path) if p]


def set_path(doc: dict[str, Any], path: str, value: Any) -> None:
    parts = split_path(path)
    node: Any = doc
    for part in parts[:-1]:
        node = node[part]
    if value is DELETE:
        del node[parts[-1]]
    else:
        node[parts[-1]] = value


def mutated(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(base)
    for path, value in changes.items():
        set_path(doc, path, value)
    return doc


def _teachers(count: int, routes: int, length: int) -> list[dict[str, Any]]:
    """`count` teachers with `routes` distinct route values of `length` characters each."""
    return [
        {
            "name": f"t{i}",
            "model": "m",
            "routes": [(f"{i:03d}-{j:03d}-" + "r" * length)[:length] for j in range(routes)],
        }
        for i in range(count)
    ]


CASES: list[tuple[str, dict[str, Any], str, str]] = [
    # (id, {path: value}, field path the CLI must name, CRD verdict)
    ("student-model-missing", {"spec.student.model": DELETE}, "spec.student.model", AGREE),
    ("student-model-empty", {"spec.student.model": ""}, "spec.student.model", AGREE),
    ("student-missing", {"spec.student": DELETE}, "spec.student", AGREE),
    ("teachers-empty", {"spec.teachers": []}, "spec.teachers", AGREE),
    ("teachers-missing", {"spec.teachers": DELETE}, "spec.teachers", AGREE),
    ("teachers-not-a-list", {"spec.teachers": {"name": "x"}}, "spec.teachers", AGREE),
    ("teacher-names-duplicate", {"spec.teachers[1].name": "math"}, "spec.teachers", AGREE),
    ("external-without-endpoint", {"spec.teachers[1].endpoint": DELETE}, "spec.teachers[1].endpoint", AGREE),
    (
        "standalone-with-endpoint",
        {"spec.teachers[0].endpoint": "http://x:1"},
        "spec.teachers[0].endpoint",
        AGREE,
    ),
    ("placement-unknown", {"spec.teachers[0].placement": "remote"}, "spec.teachers[0].placement", AGREE),
    # The transformers forward runs in the job's processes: a served teacher is vLLM.
    (
        "standalone-transformers-engine",
        {"spec.teachers[0].inference": {"engine": "transformers"}},
        "spec.teachers[0].inference.engine",
        AGREE,
    ),
    (
        "external-transformers-engine",
        {"spec.teachers[1].inference": {"engine": "transformers"}},
        "spec.teachers[1].inference.engine",
        AGREE,
    ),
    (
        "teacher-engine-unknown",
        {"spec.teachers[0].inference": {"engine": "sglang"}},
        "spec.teachers[0].inference.engine",
        AGREE,
    ),
    # Shared teachers (issue 28): teacherRef is to shared what endpoint is to external.
    (
        "shared-without-teacher-ref",
        {"spec.teachers[0].placement": "shared"},
        "spec.teachers[0].teacherRef",
        AGREE,
    ),
    (
        "standalone-with-teacher-ref",
        {"spec.teachers[0].teacherRef": {"name": "big"}},
        "spec.teachers[0].teacherRef",
        AGREE,
    ),
    (
        "external-with-teacher-ref",
        {"spec.teachers[1].teacherRef": {"name": "big"}},
        "spec.teachers[1].teacherRef",
        AGREE,
    ),
    (
        "shared-with-endpoint",
        {
            "spec.teachers[0].placement": "shared",
            "spec.teachers[0].teacherRef": {"name": "big"},
            "spec.teachers[0].endpoint": "http://x:1",
        },
        "spec.teachers[0].endpoint",
        AGREE,
    ),
    (
        "teacher-ref-name-not-dns",
        {"spec.teachers[0].placement": "shared", "spec.teachers[0].teacherRef": {"name": "Big_T"}},
        "spec.teachers[0].teacherRef.name",
        AGREE,
    ),
    (
        "teacher-ref-without-name",
        {"spec.teachers[0].placement": "shared", "spec.teachers[0].teacherRef": {}},
        "spec.teachers[0].teacherRef.name",
        AGREE,
    ),
    # External teachers' TLS and API key (issue 51): for external teachers, a CA bundle for https only.
    (
        "standalone-with-external",
        {"spec.teachers[0].external": {"apiKeySecret": {"name": "k", "key": "api-key"}}},
        "spec.teachers[0].external",
        AGREE,
    ),
    (
        "ca-bundle-over-plain-http",
        {"spec.teachers[1].external": {"caBundle": {"configMapName": "ca"}}},
        "spec.teachers[1].external.caBundle",
        AGREE,
    ),
    (
        "ca-bundle-from-both",
        {
            "spec.teachers[1].endpoint": "https://t",
            "spec.teachers[1].external": {"caBundle": {"configMapName": "ca", "secretName": "ca"}},
        },
        "spec.teachers[1].external.caBundle",
        AGREE,
    ),
    (
        "ca-bundle-from-neither",
        {
            "spec.teachers[1].endpoint": "https://t",
            "spec.teachers[1].external": {"caBundle": {"key": "ca.crt"}},
        },
        "spec.teachers[1].external.caBundle",
        AGREE,
    ),
    (
        "ca-bundle-key-with-a-slash",
        {
            "spec.teachers[1].endpoint": "https://t",
            "spec.teachers[1].external": {"caBundle": {"secretName": "ca", "key": "a/b"}},
        },
        "spec.teachers[1].external.caBundle.key",
        AGREE,
    ),
    (
        "api-key-secret-without-key",
        {"spec.teachers[1].external": {"apiKeySecret": {"name": "k"}}},
        "spec.teachers[1].external.apiKeySecret.key",
        AGREE,
    ),
    ("teacher-name-uppercase", {"spec.teachers[0].name": "Math"}, "spec.teachers[0].name", AGREE),
    ("teacher-name-too-long", {"spec.teachers[0].name": "t" * 41}, "spec.teachers[0].name", AGREE),
    ("endpoint-not-http", {"spec.teachers[1].endpoint": "ftp://x"}, "spec.teachers[1].endpoint", AGREE),
    ("two-defaults", {"spec.teachers[0].default": True}, "spec.teachers", AGREE),
    ("no-route-no-default", {"spec.teachers[1].default": False}, "spec.teachers", AGREE),
    (
        "route-listed-twice",
        {"spec.teachers[1].routes": ["math"], "spec.teachers[1].default": False},
        "spec.teachers",
        AGREE,
    ),
    ("teacher-replicas-negative", {"spec.teachers[0].replicas": -1}, "spec.teachers[0].replicas", AGREE),
    (
        "teacher-gpus-not-multiple-of-tp",
        {"spec.teachers[0].pool": {"gpusPerReplica": 3, "tensorParallel": 2}},
        "spec.teachers[0].pool.gpusPerReplica",
        AGREE,
    ),
    (
        "hf-secret-without-key",
        {"spec.teachers[0].inference": {"hfTokenSecret": {"name": "hf"}}},
        "spec.teachers[0].inference.hfTokenSecret.key",
        AGREE,
    ),
    (
        "toleration-operator",
        {"spec.teachers[0].pool": {"tolerations": [{"key": "a", "operator": "Maybe"}]}},
        "spec.teachers[0].pool.tolerations[0].operator",
        AGREE,
    ),
    (
        "colocated-without-student-gpus",
        {
            "spec.teachers[1]": {"name": "co", "model": "m", "placement": "colocated", "default": True},
            "spec.student.pool": {"gpusPerWorker": 0},
        },
        "spec.teachers",
        AGREE,
    ),
    (
        "colocated-memory-over-the-gpu",
        {
            "spec.teachers[1]": {
                "name": "co",
                "model": "m",
                "placement": "colocated",
                "default": True,
                "inference": {"memoryFraction": 0.5},
            },
            "spec.student.rollout": {"memoryFraction": 0.5},
        },
        "spec.teachers",
        AGREE,
    ),
    (
        "colocated-default-share-left-empty",
        {
            "spec.teachers[1]": {"name": "co", "model": "m", "placement": "colocated", "default": True},
            "spec.student.rollout": {"memoryFraction": 0.88},
        },
        "spec.teachers",
        AGREE,
    ),
    ("pvc-without-path", {"spec.student.model": "pvc://models"}, "spec.student.model", AGREE),
    ("pvc-tokenizer-empty-claim", {"spec.student.tokenizer": "pvc:///tok"}, "spec.student.tokenizer", AGREE),
    ("pvc-claim-uppercase", {"spec.data.train.path": "pvc://Data/x.jsonl"}, "spec.data.train.path", AGREE),
    ("pvc-teacher-model", {"spec.teachers[0].model": "pvc://-models/x"}, "spec.teachers[0].model", AGREE),
    ("loss-mode-unknown", {"spec.loss.mode": "kl"}, "spec.loss.mode", AGREE),
    ("topk-zero-forward-kl", {"spec.loss.topK": 0}, "spec.loss.topK", AGREE),
    ("topk-zero-jsd", {"spec.loss": {"mode": "jsd", "topK": 0}}, "spec.loss.topK", AGREE),
    ("topk-too-large", {"spec.loss.topK": 5000}, "spec.loss.topK", AGREE),
    ("k1-direct", {"spec.loss": {"mode": "k1", "objective": "direct"}}, "spec.loss.objective", AGREE),
    ("pg-with-topk-mode", {"spec.loss.objective": "policy_gradient"}, "spec.loss.objective", AGREE),
    ("beta-above-one", {"spec.loss": {"mode": "jsd", "topK": 8, "beta": 1.5}}, "spec.loss.beta", AGREE),
    ("beta-negative", {"spec.loss": {"mode": "jsd", "topK": 8, "beta": -0.1}}, "spec.loss.beta", AGREE),
    ("loss-temperature-zero", {"spec.loss.temperature": 0}, "spec.loss.temperature", AGREE),
    ("add-tail-with-k3", {"spec.loss": {"mode": "k3", "addTail": True}}, "spec.loss.addTail", AGREE),
    ("reduction-unknown", {"spec.loss.reduction": "mean"}, "spec.loss.reduction", AGREE),
    ("lambda-without-responses", {"spec.loss.onPolicyFraction": 0.5}, "spec.loss.onPolicyFraction", AGREE),
    ("lambda-above-one", {"spec.loss.onPolicyFraction": 2.0}, "spec.loss.onPolicyFraction", AGREE),
    ("clamp-negative", {"spec.loss.lossMaxClamp": -1.0}, "spec.loss.lossMaxClamp", AGREE),
    ("steps-zero", {"spec.schedule": {"steps": 0}}, "spec.schedule.steps", AGREE),
    ("steps-string", {"spec.schedule": {"steps": "ten"}}, "spec.schedule.steps", AGREE),
    ("steps-numeric-string", {"spec.schedule": {"steps": "10"}}, "spec.schedule.steps", AGREE),
    (
        "micro-batch-above-step",
        {"spec.schedule": {"promptsPerStep": 4, "microBatchSize": 8}},
        "spec.schedule.microBatchSize",
        AGREE,
    ),
    (
        "offload-without-fsdp",
        {"spec.student.training": {"sharding": "replicate", "cpuOffload": True}},
        "spec.student.training.cpuOffload",
        AGREE,
    ),
    (
        "micro-batch-tokens-tiny",
        {"spec.schedule": {"microBatchTokens": 8}},
        "spec.schedule.microBatchTokens",
        AGREE,
    ),
    (
        "rollout-replicas-above-gpus",
        {"spec.student.rollout": {"replicas": 3}, "spec.student.pool": {"workers": 1, "gpusPerWorker": 2}},
        "spec.student.rollout.replicas",
        AGREE,
    ),
    (
        "rollout-tensor-parallel-replicas-above-gpus",
        {
            "spec.student.rollout": {"replicas": 2, "tensorParallel": 2},
            "spec.student.pool": {"workers": 1, "gpusPerWorker": 2},
        },
        "spec.student.rollout.replicas",
        AGREE,
    ),
    (
        "rollout-tensor-parallel-across-workers",
        {
            "spec.student.rollout": {"tensorParallel": 4},
            "spec.student.pool": {"workers": 2, "gpusPerWorker": 2},
        },
        "spec.student.rollout.tensorParallel",
        AGREE,
    ),
    (
        "rollout-tensor-parallel-transformers",
        {"spec.student.rollout": {"engine": "transformers", "tensorParallel": 2}},
        "spec.student.rollout.tensorParallel",
        AGREE,
    ),
    ("gpu-memory-zero", {"spec.student.pool": {"gpuMemoryGiB": 0}}, "spec.student.pool.gpuMemoryGiB", AGREE),
    ("lora-rank-zero", {"spec.student.lora": {"rank": 0}}, "spec.student.lora.rank", AGREE),
    ("lora-rank-past-vllm", {"spec.student.lora": {"rank": 1024}}, "spec.student.lora.rank", AGREE),
    ("lora-dropout-one", {"spec.student.lora": {"dropout": 1.0}}, "spec.student.lora.dropout", AGREE),
    ("lora-alpha-zero", {"spec.student.lora": {"alpha": 0}}, "spec.student.lora.alpha", AGREE),
    (
        "lora-targets-empty",
        {"spec.student.lora": {"targetModules": []}},
        "spec.student.lora.targetModules",
        AGREE,
    ),
    (
        "lora-target-twice",
        {"spec.student.lora": {"targetModules": ["q_proj", "v_proj", "q_proj"]}},
        "spec.student.lora.targetModules",
        AGREE,
    ),
    (
        "lora-target-bad-name",
        {"spec.student.lora": {"targetModules": ["q_proj; rm"]}},
        "spec.student.lora.targetModules[0]",
        AGREE,
    ),
    (
        "lora-module-adapted-and-saved",
        {"spec.student.lora": {"targetModules": ["q_proj", "lm_head"], "modulesToSave": ["lm_head"]}},
        "spec.student.lora.modulesToSave",
        AGREE,
    ),
    (
        "lora-modules-to-save-tensor-parallel",
        {"spec.student.lora": {"modulesToSave": ["lm_head"]}, "spec.student.rollout": {"tensorParallel": 2}},
        "spec.student.lora.modulesToSave",
        AGREE,
    ),
    (
        "lora-modules-to-save-with-vllm",
        {"spec.student.lora": {"modulesToSave": ["lm_head"]}, "spec.student.rollout": {"engine": "vllm"}},
        "spec.student.lora.modulesToSave",
        AGREE,
    ),
    # Teachers of the student's own base, and teachers' contexts (issue 54).
    (
        "teacher-student-placement-without-lora",
        {"spec.teachers[0].placement": "student", "spec.teachers[0].model": "Qwen/Qwen2.5-0.5B"},
        "spec.teachers",
        AGREE,
    ),
    (
        "teacher-student-placement-another-model",
        {"spec.student.lora": {"rank": 8}, "spec.teachers[0].placement": "student"},
        "spec.teachers",
        AGREE,
    ),
    (
        "teacher-student-placement-own-engine",
        {
            "spec.student.lora": {"rank": 8},
            "spec.teachers[0].placement": "student",
            "spec.teachers[0].model": "Qwen/Qwen2.5-0.5B",
            "spec.teachers[0].inference": {"engine": "vllm"},
        },
        "spec.teachers[0].inference.engine",
        AGREE,
    ),
    (
        "teacher-context-without-template",
        {"spec.teachers[0].systemPrompt": "Think first.", "spec.data.chatTemplate": "none"},
        "spec.teachers",
        AGREE,
    ),
    ("teacher-context-empty", {"spec.teachers[0].systemPrompt": ""}, "spec.teachers[0].systemPrompt", AGREE),
    # A tool-using student's environment (issue 55).
    (
        "environment-module-and-url",
        {"spec.environment": {"module": "tools.env:Calc", "url": "http://calc:8000"}},
        "spec.environment.module",
        AGREE,
    ),
    ("environment-neither", {"spec.environment": {"maxTurns": 4}}, "spec.environment.module", AGREE),
    (
        "environment-module-not-a-path",
        {"spec.environment": {"module": "tools env"}},
        "spec.environment.module",
        AGREE,
    ),
    ("environment-url-not-http", {"spec.environment": {"url": "calc:8000"}}, "spec.environment.url", AGREE),
    (
        "environment-stop-sequence-without-stop",
        {"spec.environment": {"module": "t:C", "toolCallFormat": "stop_sequence"}},
        "spec.environment.stop",
        AGREE,
    ),
    (
        "environment-chat-template-with-stop",
        {"spec.environment": {"module": "t:C", "stop": ["]"]}},
        "spec.environment.stop",
        AGREE,
    ),
    (
        "environment-turns-zero",
        {"spec.environment": {"module": "t:C", "maxTurns": 0}},
        "spec.environment.maxTurns",
        AGREE,
    ),
    (
        "environment-off-policy-mix",
        {
            "spec.environment": {"module": "t:C"},
            "spec.loss.onPolicyFraction": 0.5,
            "spec.data.responseField": "response",
        },
        "spec.loss.onPolicyFraction",
        AGREE,
    ),
    ("eval-every-without-eval", {"spec.schedule": {"evalEvery": 5}}, "spec.schedule.evalEvery", AGREE),
    ("checkpoint-keep-zero", {"spec.checkpoint": {"keep": 0}}, "spec.checkpoint.keep", AGREE),
    ("checkpoint-uri", {"spec.checkpoint": {"path": "s3://bucket/ckpt"}}, "spec.checkpoint.path", AGREE),
    ("checkpoint-relative", {"spec.checkpoint": {"path": "ckpt"}}, "spec.checkpoint.path", AGREE),
    ("resume-policy-unknown", {"spec.checkpoint": {"resume": "sometimes"}}, "spec.checkpoint.resume", AGREE),
    ("model-dtype-unknown", {"spec.checkpoint": {"modelDtype": "int8"}}, "spec.checkpoint.modelDtype", AGREE),
    (
        "student-hf-secret-without-key",
        {"spec.student.hfTokenSecret": {"name": "hf"}},
        "spec.student.hfTokenSecret.key",
        AGREE,
    ),
    ("checkpoint-pvc-bad-name", {"spec.checkpoint": {"pvc": "My_PVC"}}, "spec.checkpoint.pvc", AGREE),
    # The operator's claim (issue 25): an existing claim is the user's, and ephemeral has none.
    *(
        (
            f"checkpoint-{field}-with-{other}",
            {"spec.checkpoint": {**settings, field: value}},
            f"spec.checkpoint.{field}",
            AGREE,
        )
        for other, settings in (("pvc", {"pvc": "ckpt"}), ("ephemeral", {"ephemeral": True}))
        for field, value in (("size", "10Gi"), ("storageClassName", "fast"), ("deleteWithJob", True))
    ),
    (
        "checkpoint-ephemeral-with-pvc",
        {"spec.checkpoint": {"pvc": "ckpt", "ephemeral": True}},
        "spec.checkpoint.ephemeral",
        AGREE,
    ),
    (
        "model-cache-size-with-pvc",
        {"spec.modelCache": {"pvc": "hf-cache", "sizeLimit": "50Gi"}},
        "spec.modelCache.sizeLimit",
        AGREE,
    ),
    (
        "model-cache-disabled-with-pvc",
        {"spec.modelCache": {"pvc": "hf-cache", "enabled": False}},
        "spec.modelCache.enabled",
        AGREE,
    ),
    ("model-cache-size-zero", {"spec.modelCache": {"sizeLimit": "0Gi"}}, "spec.modelCache.sizeLimit", AGREE),
    (
        "shared-memory-not-a-quantity",
        {"spec.student.pool": {"sharedMemory": "lots"}},
        "spec.student.pool.sharedMemory",
        AGREE,
    ),
    ("model-cache-claim-name", {"spec.modelCache": {"pvc": "Not_A_Name"}}, "spec.modelCache.pvc", AGREE),
    ("checkpoint-size-zero", {"spec.checkpoint": {"size": "0Gi"}}, "spec.checkpoint.size", AGREE),
    ("checkpoint-size-negative", {"spec.checkpoint": {"size": "-10Gi"}}, "spec.checkpoint.size", AGREE),
    ("checkpoint-size-milli", {"spec.checkpoint": {"size": "100m"}}, "spec.checkpoint.size", AGREE),
    ("checkpoint-size-not-a-quantity", {"spec.checkpoint": {"size": "10GB"}}, "spec.checkpoint.size", AGREE),
    ("checkpoint-size-a-number", {"spec.checkpoint": {"size": 100}}, "spec.checkpoint.size", AGREE),
    (
        "checkpoint-class-bad-name",
        {"spec.checkpoint": {"storageClassName": "Fast_SSD"}},
        "spec.checkpoint.storageClassName",
        AGREE,
    ),
    ("top-p-zero", {"spec.student.rollout": {"topP": 0}}, "spec.student.rollout.topP", AGREE),
    (
        "rollout-temperature-negative",
        {"spec.student.rollout": {"temperature": -1}},
        "spec.student.rollout.temperature",
        AGREE,
    ),
    (
        "max-new-tokens-zero",
        {"spec.student.rollout": {"maxNewTokens": 0}},
        "spec.student.rollout.maxNewTokens",
        AGREE,
    ),
    ("top-k-below-off", {"spec.student.rollout": {"topK": -2}}, "spec.student.rollout.topK", AGREE),
    ("stop-string-empty", {"spec.student.rollout": {"stop": [""]}}, "spec.student.rollout.stop[0]", AGREE),
    ("stop-not-a-list", {"spec.student.rollout": {"stop": "\n\n"}}, "spec.student.rollout.stop", AGREE),
    (
        "rollout-engine-unknown",
        {"spec.student.rollout": {"engine": "sglang"}},
        "spec.student.rollout.engine",
        AGREE,
    ),
    ("lr-zero", {"spec.student.optimizer": {"lr": 0}}, "spec.student.optimizer.lr", AGREE),
    ("lr-string", {"spec.student.optimizer": {"lr": "fast"}}, "spec.student.optimizer.lr", AGREE),
    (
        "betas-wrong-length",
        {"spec.student.optimizer": {"betas": [0.9]}},
        "spec.student.optimizer.betas",
        AGREE,
    ),
    ("workers-zero", {"spec.student.pool": {"workers": 0}}, "spec.student.pool.workers", AGREE),
    (
        "node-selector-not-strings",
        {"spec.student.pool": {"nodeSelector": {"a": 1}}},
        "spec.student.pool.nodeSelector.a",
        AGREE,
    ),
    ("data-train-missing", {"spec.data.train": DELETE}, "spec.data.train", AGREE),
    ("data-format-unknown", {"spec.data.train.format": "csv"}, "spec.data.train.format", AGREE),
    ("max-prompt-tokens-zero", {"spec.data.maxPromptTokens": 0}, "spec.data.maxPromptTokens", AGREE),
    ("overlong-policy-unknown", {"spec.data.overlongPrompts": "skip"}, "spec.data.overlongPrompts", AGREE),
    ("chat-template-unknown", {"spec.data.chatTemplate": "chatml"}, "spec.data.chatTemplate", AGREE),
    (
        "messages-without-template",
        {"spec.data.messagesField": "messages", "spec.data.chatTemplate": "none"},
        "spec.data.chatTemplate",
        AGREE,
    ),
    (
        "system-prompt-without-template",
        {"spec.data.systemPrompt": "Be brief.", "spec.data.chatTemplate": "none"},
        "spec.data.systemPrompt",
        AGREE,
    ),
    ("system-prompt-empty", {"spec.data.systemPrompt": ""}, "spec.data.systemPrompt", AGREE),
    (
        "template-kwargs-without-template",
        {"spec.data.chatTemplateKwargs": {"enable_thinking": False}, "spec.data.chatTemplate": "none"},
        "spec.data.chatTemplateKwargs",
        AGREE,
    ),
    (
        "template-kwargs-object-value",
        {"spec.data.chatTemplateKwargs": {"tools": {"name": "calculator"}}},
        "spec.data.chatTemplateKwargs",
        OPERATOR_ONLY,
    ),
    (
        "template-kwargs-list-value",
        {"spec.data.chatTemplateKwargs": {"tools": ["calculator"]}},
        "spec.data.chatTemplateKwargs",
        OPERATOR_ONLY,
    ),
    (
        "template-kwargs-long-string",
        {"spec.data.chatTemplateKwargs": {"persona": "x" * 1025}},
        "spec.data.chatTemplateKwargs",
        OPERATOR_ONLY,
    ),
    ("split-empty", {"spec.data.train.split": ""}, "spec.data.train.split", AGREE),
    ("subset-on-a-file", {"spec.data.train.subset": "main"}, "spec.data.train.subset", AGREE),
    (
        "hub-dataset-without-org",
        {"spec.data.train.path": "hf://datasets/gsm8k"},
        "spec.data.train.path",
        AGREE,
    ),
    (
        "hub-dataset-with-a-file-path",
        {"spec.data.train.path": "hf://datasets/openai/gsm8k/main/train.parquet"},
        "spec.data.train.path",
        AGREE,
    ),
    ("grader-name-unknown", {"spec.data.grader": {"name": "f1"}}, "spec.data.grader.name", AGREE),
    ("grader-not-an-object", {"spec.data.grader": "gsm8k"}, "spec.data.grader", AGREE),
    (
        "grader-regex-without-pattern",
        {"spec.data.grader": {"name": "regex"}},
        "spec.data.grader.pattern",
        AGREE,
    ),
    (
        "grader-regex-empty-pattern",
        {"spec.data.grader": {"name": "regex", "pattern": ""}},
        "spec.data.grader.pattern",
        AGREE,
    ),
    (
        "grader-pattern-without-regex",
        {"spec.data.grader": {"name": "gsm8k", "pattern": "#### (.*)"}},
        "spec.data.grader.pattern",
        AGREE,
    ),
    (
        "grader-module-without-function",
        {"spec.data.grader": {"name": "module"}},
        "spec.data.grader.function",
        AGREE,
    ),
    (
        "grader-function-without-module",
        {"spec.data.grader": {"name": "exact", "function": "graders:exact"}},
        "spec.data.grader.function",
        AGREE,
    ),
    (
        "grader-function-without-colon",
        {"spec.data.grader": {"name": "module", "function": "my_graders.grade"}},
        "spec.data.grader.function",
        AGREE,
    ),
    (
        "grader-function-a-path",
        {"spec.data.grader": {"name": "module", "function": "/app/graders.py:grade"}},
        "spec.data.grader.function",
        AGREE,
    ),
    ("suspend-not-bool", {"spec.suspend": "yes"}, "spec.suspend", AGREE),
    ("backoff-negative", {"spec.backoffLimit": -1}, "spec.backoffLimit", AGREE),
    # Found on a real node (issue 14): a retry is a new pod, and checkpoints outside a claim went with the old one.
    (
        "retries-with-ephemeral-checkpoints",
        {"spec.backoffLimit": 1, "spec.checkpoint": {"ephemeral": True}},
        "spec.backoffLimit",
        AGREE,
    ),
    ("deadline-zero", {"spec.activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds", AGREE),
    ("labels-not-strings", {"spec.labels": {"team": 7}}, "spec.labels.team", AGREE),
    # Found by the real server on a child object (a 422 after the job was accepted): now both refuse it.
    ("labels-bad-key", {"spec.labels": {"team name": "ml"}}, "spec.labels", AGREE),
    ("labels-bad-value", {"spec.labels": {"team": "m l"}}, "spec.labels.team", AGREE),
    ("labels-long-prefix", {"spec.labels": {"a" * 254 + "/k": "v"}}, "spec.labels", AGREE),
    # Reserved for the operator (distillery.api.labels): the policies, Services and KubeRay select on them.
    ("labels-uses-teacher", {"spec.labels": {"distillery.io/uses-teacher-v": "true"}}, "spec.labels", AGREE),
    ("labels-ray", {"spec.labels": {"ray.io/cluster": "other"}}, "spec.labels", AGREE),
    ("labels-created-by", {"spec.labels": {"app.kubernetes.io/created-by": "x"}}, "spec.labels", AGREE),
    ("labels-managed-by", {"spec.labels": {"app.kubernetes.io/managed-by": "x"}}, "spec.labels", AGREE),
    (
        "node-selector-bad-key",
        {"spec.student.pool": {"nodeSelector": {"-gpu": "a100"}}},
        "spec.student.pool.nodeSelector",
        AGREE,
    ),
    # Pod settings (issue 26): names and paths the operator uses are refused, mounts name a volume.
    *(
        (f"{where}-{cid}", {path: {key: value}}, f"{path}.{field}", AGREE)
        for where, path in (
            ("pool", "spec.student.pool"),
            ("head", "spec.student.head"),
            ("teacher-pool", "spec.teachers[0].pool"),
        )
        for cid, key, value, field in (
            ("env-operators-name", "env", [{"name": "DISTILLERY_CONFIG", "value": "x"}], "env[0].name"),
            (
                "env-teacher-key-name",
                "env",
                [{"name": "DISTILLERY_TEACHER_T_API_KEY", "value": "x"}],
                "env[0].name",
            ),
            ("env-bad-name", "env", [{"name": "1X", "value": "x"}], "env[0].name"),
            (
                "env-value-and-value-from",
                "env",
                [{"name": "A", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                "env[0].valueFrom",
            ),
            ("env-two-sources", "env", [{"name": "A", "valueFrom": {}}], "env[0].valueFrom"),
            ("env-duplicate", "env", [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}], "env"),
            (
                "volume-operators-name",
                "volumes",
                [{"name": "checkpoints", "emptyDir": {}}],
                "volumes[0].name",
            ),
            ("volume-claim-prefix", "volumes", [{"name": "pvc-data", "emptyDir": {}}], "volumes[0].name"),
            ("volume-no-source", "volumes", [{"name": "a"}], "volumes[0]"),
            (
                "volume-two-sources",
                "volumes",
                [{"name": "a", "emptyDir": {}, "persistentVolumeClaim": {"claimName": "c"}}],
                "volumes[0]",
            ),
            ("volume-hostpath", "volumes", [{"name": "a", "hostPath": {"path": "/"}}], "volumes[0].hostPath"),
            ("mount-undeclared", "volumeMounts", [{"name": "a", "mountPath": "/a"}], "volumeMounts"),
            ("pod-labels-operators", "podLabels", {"distillery.io/job": "x"}, "podLabels"),
            ("pod-labels-kueue", "podLabels", {"kueue.x-k8s.io/queue-name": "q"}, "podLabels"),
            ("pod-labels-ray", "podLabels", {"ray.io/node-type": "head"}, "podLabels"),
            ("pod-labels-bad-key", "podLabels", {"-team": "x"}, "podLabels"),
            ("pod-annotations-bad-key", "podAnnotations", {"a b": "x"}, "podAnnotations"),
            ("priority-class-uppercase", "priorityClassName", "High", "priorityClassName"),
            (
                "affinity-operator-unknown",
                "affinity",
                {
                    "nodeAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "weight": 1,
                                "preference": {"matchExpressions": [{"key": "a", "operator": "Near"}]},
                            }
                        ]
                    }
                },
                "affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].preference"
                ".matchExpressions[0].operator",
            ),
            (
                "affinity-weight-zero",
                "affinity",
                {
                    "podAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {"weight": 0, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
                        ]
                    }
                },
                "affinity.podAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
            ),
            ("affinity-misspelt", "affinity", {"nodeAfinity": {}}, "affinity.nodeAfinity"),
            (
                "spread-unsatisfiable-unknown",
                "topologySpreadConstraints",
                [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Maybe"}],
                "topologySpreadConstraints[0].whenUnsatisfiable",
            ),
            (
                "spread-skew-zero",
                "topologySpreadConstraints",
                [{"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}],
                "topologySpreadConstraints[0].maxSkew",
            ),
        )
    ),
    (
        "mount-operators-path",
        {
            "spec.student.pool": {
                "volumes": [{"name": "a", "emptyDir": {}}],
                "volumeMounts": [{"name": "a", "mountPath": "/dev/shm"}],
            }
        },
        "spec.student.pool.volumeMounts[0].mountPath",
        AGREE,
    ),
    (
        "mount-relative-path",
        {
            "spec.student.pool": {
                "volumes": [{"name": "a", "emptyDir": {}}],
                "volumeMounts": [{"name": "a", "mountPath": "cache"}],
            }
        },
        "spec.student.pool.volumeMounts[0].mountPath",
        AGREE,
    ),
    (
        # A mount names a volume of its own section: the head's mounts do not see the pool's volumes.
        "head-mount-of-a-pool-volume",
        {
            "spec.student.pool": {"volumes": [{"name": "a", "emptyDir": {}}]},
            "spec.student.head": {"volumeMounts": [{"name": "a", "mountPath": "/a"}]},
        },
        "spec.student.head.volumeMounts",
        AGREE,
    ),
    (
        "head-node-selector-bad-key",
        {"spec.student.head": {"nodeSelector": {"-gpu": "x"}}},
        "spec.student.head.nodeSelector",
        AGREE,
    ),
    (
        "head-resources-not-a-map",
        {"spec.student.head": {"resources": {"requests": "2"}}},
        "spec.student.head.resources.requests",
        AGREE,
    ),
    (
        "image-pull-secret-bad-name",
        {"spec.imagePullSecrets": ["Team_Registry"]},
        "spec.imagePullSecrets[0]",
        AGREE,
    ),
    (
        "image-pull-secrets-objects",
        {"spec.imagePullSecrets": [{"name": "regcred"}]},
        "spec.imagePullSecrets[0]",
        AGREE,
    ),
    ("unknown-spec-field", {"spec.studnet": {"model": "x"}}, "spec.studnet", AGREE),
    ("unknown-loss-field", {"spec.loss.topk": 8}, "spec.loss.topk", AGREE),
    ("unknown-teacher-field", {"spec.teachers[1].endpont": "http://x"}, "spec.teachers[1].endpont", AGREE),
    ("api-version-wrong", {"apiVersion": "distillery.io/v1"}, "apiVersion", NOT_IN_SCHEMA),
    ("kind-wrong", {"kind": "DistillJob"}, "kind", NOT_IN_SCHEMA),
    ("name-missing", {"metadata.name": DELETE}, "metadata.name", NOT_IN_SCHEMA),
    # Found by the server: what it decided differently before the fix (see each comment).
    # A Go (RE2) `$` is the end of the text; Python's re also matched before a trailing newline, so
    # `pvc.is_valid` passed this (a YAML `|` block ends with one) and the offline regexes passed the next two.
    ("pvc-trailing-newline", {"spec.student.model": "pvc://models/qwen\n"}, "spec.student.model", AGREE),
    (
        "endpoint-trailing-newline",
        {"spec.teachers[1].endpoint": "http://t:8000\n"},
        "spec.teachers[1].endpoint",
        AGREE,
    ),
    ("teacher-name-trailing-newline", {"spec.teachers[0].name": "math\n"}, "spec.teachers[0].name", AGREE),
    # RE2's \s is [\t\n\f\r ] only: the server took a vertical tab in a URL that we refused; the pattern
    # now names its characters, the same in every engine.
    (
        "endpoint-vertical-tab",
        {"spec.teachers[1].endpoint": "http://t\x0b:8000"},
        "spec.teachers[1].endpoint",
        AGREE,
    ),
    # The server decodes integers as int64; we accepted (or crashed on) larger ones.
    ("seed-above-int64", {"spec.schedule": {"seed": 2**63}}, "spec.schedule.seed", AGREE),
    # Every integer is now bounded by 2^53 - 1: a CRD bound of 2^63 - 1 is refused by the server.
    ("seed-above-the-bound", {"spec.schedule": {"seed": 2**53}}, "spec.schedule.seed", AGREE),
    ("seed-above-uint64", {"spec.schedule": {"seed": 2**64}}, "spec.schedule.seed", AGREE),
    (
        "toleration-seconds-below-int64",
        {"spec.teachers[0].pool": {"tolerations": [{"key": "a", "tolerationSeconds": -(2**63) - 1}]}},
        "spec.teachers[0].pool.tolerations[0].tolerationSeconds",
        AGREE,
    ),
    ("seed-float-at-2^53", {"spec.schedule": {"seed": 2.0**53}}, "spec.schedule.seed", AGREE),
    ("steps-fractional", {"spec.schedule": {"steps": 10.5}}, "spec.schedule.steps", AGREE),
    # int-or-string: the offline check did not type it at all.
    (
        "quantity-fractional",
        {"spec.student.pool": {"resources": {"requests": {"cpu": 1.5}}}},
        "spec.student.pool.resources.requests.cpu",
        AGREE,
    ),
    (
        "quantity-bool",
        {"spec.student.pool": {"resources": {"requests": {"cpu": True}}}},
        "spec.student.pool.resources.requests.cpu",
        AGREE,
    ),
    # The route-uniqueness rule costs (routes in all)^2: 1024 routes exceeded the server's per-call CEL
    # cost limit at admission ("actual cost limit exceeded") although the CRD's static estimate passed.
    ("routes-too-many-in-all", {"spec.teachers": _teachers(16, 64, 16)}, "spec.teachers", AGREE),
    ("route-null", {"spec.teachers[0].routes": [None]}, "spec.teachers[0].routes[0]", AGREE),
    ("spec-null", {"spec": None}, "spec", AGREE),
    # Metadata: the server validates it as ObjectMeta; we let anything through.
    ("metadata-unknown-field", {"metadata.lables": {"a": "b"}}, "metadata.lables", NOT_IN_SCHEMA),
    ("metadata-name-double-dot", {"metadata.name": "a..b"}, "metadata.name", NOT_IN_SCHEMA),
    ("metadata-name-dot-dash", {"metadata.name": "a.-b"}, "metadata.name", NOT_IN_SCHEMA),
    ("metadata-name-too-long", {"metadata.name": "a" * 254}, "metadata.name", NOT_IN_SCHEMA),
    ("metadata-label-key", {"metadata.labels": {"bad key": "x"}}, "metadata.labels", NOT_IN_SCHEMA),
    ("metadata-label-value", {"metadata.labels": {"k": "bad value"}}, "metadata.labels", NOT_IN_SCHEMA),
    ("metadata-label-value-too-long", {"metadata.labels": {"k": "v" * 64}}, "metadata.labels", NOT_IN_SCHEMA),
    (
        "metadata-label-prefix-too-long",
        {"metadata.labels": {"a" * 254 + "/k": "v"}},
        "metadata.labels",
        NOT_IN_SCHEMA,
    ),
    (
        "metadata-annotation-key",
        {"metadata.annotations": {"bad key": "x"}},
        "metadata.annotations",
        NOT_IN_SCHEMA,
    ),
    ("metadata-null", {"metadata": None}, "metadata.name", NOT_IN_SCHEMA),
    # Strict decoding covers the whole object, status included (whose values a create then drops).
    ("status-unknown-field", {"status": {"phse": "Running"}}, "status.phse", NOT_IN_SCHEMA),
    (
        "status-nested-unknown-field",
        {"status": {"progress": {"stp": 1}}},
        "status.progress.stp",
        NOT_IN_SCHEMA,
    ),
    ("top-level-unknown-field", {"extra": 1}, "extra", NOT_IN_SCHEMA),
]

ACCEPTED: list[tuple[str, dict[str, Any]]] = [
    (
        "colocated-transformers-engine",
        {"spec.teachers[0].placement": "colocated", "spec.teachers[0].inference": {"engine": "transformers"}},
    ),
    ("standalone-vllm-engine", {"spec.teachers[0].inference": {"engine": "vllm"}}),
    ("lora-defaults", {"spec.student.lora": {}}),
    ("environment-chat-template", {"spec.environment": {"url": "http://calc.tools.svc:8000/env"}}),
    (
        "environment-stop-sequence",
        {
            "spec.environment": {
                "module": "distillery_runtime.tasks.problems.tools:Calculator",
                "toolCallFormat": "stop_sequence",
                "stop": ["]"],
                "maxTurns": 3,
                "maxTokens": 48,
                "stepTimeoutSeconds": 2.5,
            }
        },
    ),
    (
        "lora-whole",
        {
            "spec.student.lora": {
                "rank": 512,
                "alpha": 16,
                "dropout": 0.05,
                "targetModules": ["q_proj", "v_proj", "model.layers.0.mlp.down_proj"],
                "modulesToSave": ["lm_head"],
            },
            "spec.student.rollout": {"engine": "transformers"},
        },
    ),
    (
        "shared-teacher",
        {"spec.teachers[0].placement": "shared", "spec.teachers[0].teacherRef": {"name": "qwen-7b.shared"}},
    ),
    # Pod settings (issue 26): each section with all of them, and the head's own placement.
    *(
        (
            f"pod-settings-{where}",
            {
                path: {
                    "priorityClassName": "training-high",
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {"key": "gpu", "operator": "In", "values": ["h100"]}
                                        ]
                                    }
                                ]
                            }
                        },
                        "podAntiAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "weight": 100,
                                    "podAffinityTerm": {
                                        "labelSelector": {
                                            "matchLabels": {"app.kubernetes.io/name": "distillery"}
                                        },
                                        "topologyKey": "kubernetes.io/hostname",
                                    },
                                }
                            ]
                        },
                    },
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "topology.kubernetes.io/zone",
                            "whenUnsatisfiable": "ScheduleAnyway",
                        }
                    ],
                    "podLabels": {"team": "ml", "example.com/cost-center": "c42"},
                    "podAnnotations": {"sidecar.istio.io/inject": "false"},
                    "env": [
                        {"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
                        {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    ],
                    "volumes": [
                        {"name": "cache", "emptyDir": {"sizeLimit": "10Gi"}},
                        {"name": "certs", "secret": {"secretName": "ca", "defaultMode": 292}},
                        {"name": "store", "csi": {"driver": "secrets-store.csi.k8s.io", "readOnly": True}},
                    ],
                    "volumeMounts": [
                        {"name": "cache", "mountPath": "/cache"},
                        {"name": "certs", "mountPath": "/etc/ssl/site", "readOnly": True},
                        {"name": "store", "mountPath": "/mnt/secrets"},
                    ],
                }
            },
        )
        for where, path in (
            ("pool", "spec.student.pool"),
            ("head", "spec.student.head"),
            ("teacher-pool", "spec.teachers[0].pool"),
        )
    ),
    (
        "head-placement-of-its-own",
        {
            "spec.student.pool": {"nodeSelector": {"gpu": "h100"}},
            "spec.student.head": {
                "nodeSelector": {},
                "tolerations": [],
                "resources": {"requests": {"cpu": "2"}},
            },
        },
    ),
    ("image-pull-secrets", {"spec.imagePullSecrets": ["regcred", "team.registry"]}),
    ("retries-with-checkpoint-claim", {"spec.backoffLimit": 2, "spec.checkpoint": {"pvc": "ckpt"}}),
    # The operator's claim (issue 25): retries resume from it, and its settings next to their edges.
    ("retries-with-the-operators-claim", {"spec.backoffLimit": 2}),
    (
        "checkpoint-claim-settings",
        {
            "spec.checkpoint": {
                "size": "1.5Ti",
                "storageClassName": "nfs.csi.example.com",
                "deleteWithJob": True,
            }
        },
    ),
    ("checkpoint-size-exponent", {"spec.checkpoint": {"size": "5e11"}}),
    ("checkpoint-size-bytes", {"spec.checkpoint": {"size": "1073741824"}}),
    ("checkpoint-size-fraction", {"spec.checkpoint": {"size": "0.5Gi"}}),
    ("checkpoint-ephemeral", {"spec.checkpoint": {"ephemeral": True}}),
    ("model-cache-claim", {"spec.modelCache": {"pvc": "hf-cache"}}),
    ("shared-memory-sizes", {"spec.student.pool": {"sharedMemory": "32Gi"}}),
    ("model-cache-size", {"spec.modelCache": {"sizeLimit": "200Gi"}}),
    ("model-cache-off", {"spec.modelCache": {"enabled": False}}),
    (
        "checkpoint-pvc-with-the-flags-off",
        {"spec.checkpoint": {"pvc": "ckpt", "deleteWithJob": False, "ephemeral": False}},
    ),
    # (id, {path: value}): valid manifests next to an edge, accepted by both. Found by the server (we
    # refused each before the fix) unless marked.
    ("base", {}),
    # The memory features left to the plan (auto) may be set one at a time: offload implies FSDP2.
    ("offload-with-auto-sharding", {"spec.student.training": {"cpuOffload": True}}),
    (
        "memory-features-explicit",
        {"spec.student.training": {"sharding": "fsdp", "activationCheckpointing": False}},
    ),
    ("labels-qualified-keys", {"spec.labels": {"example.com/team": "ml", "a.b_c-d": ""}}),
    # JSON has one number type: the server takes an integral number for an integer (2^53 - 1 at most).
    ("steps-integral-float", {"spec.schedule": {"steps": 10.0}}),
    ("seed-float-2^53-minus-1", {"spec.schedule": {"seed": 2.0**53 - 1}}),
    ("quantity-integral-float", {"spec.student.pool": {"resources": {"requests": {"cpu": 2.0}}}}),
    ("grad-clip-beyond-int64", {"spec.student.optimizer": {"gradClip": 2**64}}),
    ("seed-at-the-bound", {"spec.schedule": {"seed": 2**53 - 1}}),
    # A null field is the field left out: the server prunes it (or puts its default there).
    ("loss-null", {"spec.loss": None}),
    ("steps-null", {"spec.schedule": {"steps": None}}),
    ("label-value-null", {"spec.labels": {"a": None, "b": "x"}}),
    ("inference-null", {"spec.teachers[0].inference": None}),
    ("node-selector-null", {"spec.student.pool": {"nodeSelector": None}}),
    ("tokenizer-null", {"spec.student.tokenizer": None}),  # the offline check refused these three
    ("enforce-eager-null", {"spec.student.rollout": {"enforceEager": None}}),
    ("rollout-stop-and-top-k", {"spec.student.rollout": {"stop": ["\n\n", "</answer>"], "topK": -1}}),
    ("rollout-top-k-on", {"spec.student.rollout": {"topK": 50, "engine": "transformers"}}),
    ("hf-token-secret-null", {"spec.teachers[0].inference": {"hfTokenSecret": None}}),
    ("student-hf-token-secret", {"spec.student.hfTokenSecret": {"name": "hf", "key": "token"}}),
    ("model-dtype-float32", {"spec.checkpoint": {"modelDtype": "float32"}}),
    ("grader-null", {"spec.data.grader": None}),
    (
        "chat-data",
        {
            "spec.data.messagesField": "messages",
            "spec.data.systemPrompt": "You are a careful tutor.",
            "spec.data.chatTemplateKwargs": {
                "enable_thinking": False,
                "max_turns": 3,
                "temp": 0.5,
                "mode": "x",
            },
            "spec.data.overlongPrompts": "drop",
        },
    ),
    ("raw-text-prompts", {"spec.data.chatTemplate": "none", "spec.data.overlongPrompts": "truncate"}),
    (
        "hub-dataset",
        {"spec.data.train": {"path": "hf://datasets/openai/gsm8k", "subset": "main", "split": "train[:90%]"}},
    ),
    ("split-of-a-saved-folder", {"spec.data.train": {"path": "/data/chat", "split": "test"}}),
    # off-policy responses from the conversations' last assistant turns
    ("off-policy-from-messages", {"spec.data.messagesField": "messages", "spec.loss.onPolicyFraction": 0.5}),
    ("grader-empty", {"spec.data.grader": {}}),
    ("grader-regex", {"spec.data.grader": {"name": "regex", "pattern": "answer: (-?[0-9]+)"}}),
    (
        "grader-module-method",
        {"spec.data.grader": {"name": "module", "function": "my_pkg.graders:Scorer.grade"}},
    ),
    ("metadata-annotation-null", {"metadata.annotations": {"a": None}}),
    ("endpoint-non-ascii-space", {"spec.teachers[1].endpoint": "http://t\u00a0x:8000"}),
    # An API key over plain http (a vLLM with --api-key inside the cluster); a private CA over https.
    ("api-key-over-http", {"spec.teachers[1].external": {"apiKeySecret": {"name": "k", "key": "api-key"}}}),
    (
        "https-with-a-private-ca-and-a-key",
        {
            "spec.teachers[1].endpoint": "https://teacher.example.com/v1",
            "spec.teachers[1].external": {
                "caBundle": {"configMapName": "corp-ca", "key": "bundle.pem"},
                "apiKeySecret": {"name": "k", "key": "api-key"},
            },
        },
    ),
    # The CEL rule counts the teachers listing a route, so one teacher may repeat its own.
    ("route-repeated-by-its-teacher", {"spec.teachers[0].routes": ["math", "math"]}),
    ("metadata-generate-name", {"metadata.name": DELETE, "metadata.generateName": "job-"}),
    ("metadata-qualified-labels", {"metadata.labels": {"kueue.x-k8s.io/queue-name": "q", "a": ""}}),
    # Outside the reserved set: other app.kubernetes.io/ keys (the operator's own override them) and a
    # key that only starts like a reserved prefix.
    (
        "labels-near-reserved",
        {"spec.labels": {"app.kubernetes.io/version": "1", "distillery.io.example/a": "b"}},
    ),
    # metadata.labels is not the spec's: reserved keys there are dropped by the operator, not refused.
    ("metadata-reserved-labels", {"metadata.labels": {"app.kubernetes.io/managed-by": "Helm"}}),
    ("status-values-of-any-type", {"status": {"progress": 5}}),  # a create drops the status it is given
    ("routes-cost-worst-case", {"spec.teachers": _teachers(32, 16, 128)}),
    (
        "colocated-memory-at-the-limit",
        {
            "spec.teachers[1]": {
                "name": "co",
                "model": "m",
                "placement": "colocated",
                "default": True,
                "inference": {"memoryFraction": 0.45},
            },
            "spec.student.rollout": {"memoryFraction": 0.5},
        },
    ),
]


# ---------------------------------------------------------------------------------------------- bounds

# Where a bounded field is put when the first list item or a fresh map key would break a rule.
_TARGETS = {
    "spec.teachers[].endpoint": "spec.teachers[1].endpoint",
    # `external` is for the external teacher.
    "spec.teachers[].external.caBundle.secretName": "spec.teachers[1].external.caBundle.secretName",
    "spec.teachers[].external.caBundle.configMapName": "spec.teachers[1].external.caBundle.configMapName",
    "spec.teachers[].external.caBundle.key": "spec.teachers[1].external.caBundle.key",
    "spec.teachers[].external.apiKeySecret.name": "spec.teachers[1].external.apiKeySecret.name",
    "spec.teachers[].external.apiKeySecret.key": "spec.teachers[1].external.apiKeySecret.key",
}
# A bounded field that a rule allows only beside a sibling's value: the sibling is set to it too.
_SIBLINGS = {
    "spec.data.grader.pattern": ("spec.data.grader.name", "regex"),
    "spec.data.grader.function": ("spec.data.grader.name", "module"),
    "spec.data.train.subset": ("spec.data.train.path", "hf://datasets/openai/gsm8k"),
    "spec.data.eval.subset": ("spec.data.eval.path", "hf://datasets/openai/gsm8k"),
    "spec.teachers[0].teacherRef.name": ("spec.teachers[0].placement", "shared"),
    # A CA bundle checks a TLS certificate: its endpoint is https.
    "spec.teachers[1].external.caBundle.secretName": ("spec.teachers[1].endpoint", "https://t:8000"),
    "spec.teachers[1].external.caBundle.configMapName": ("spec.teachers[1].endpoint", "https://t:8000"),
    "spec.teachers[1].external.caBundle.key": ("spec.teachers[1].endpoint", "https://t:8000"),
}
_STOP_SEQUENCE = [("spec.environment.module", "t:C"), ("spec.environment.toolCallFormat", "stop_sequence")]
_MORE_SIBLINGS: dict[str, list[tuple[str, Any]]] = {
    # An environment's stop strings belong to the stop_sequence format, and an environment names its module.
    "spec.environment.stop": _STOP_SEQUENCE,
    "spec.environment.stop[0]": _STOP_SEQUENCE,
}
"""Paths that need more than one sibling set."""


def _schema_nodes(node: dict[str, Any], path: str = "spec") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)]
    for name, sub in node.get("properties", {}).items():
        out.extend(_schema_nodes(sub, f"{path}.{name}"))
    if isinstance(node.get("items"), dict):
        out.extend(_schema_nodes(node["items"], f"{path}[]"))
    if isinstance(node.get("additionalProperties"), dict):
        out.extend(_schema_nodes(node["additionalProperties"], f"{path}{{}}"))
    return out


def _concrete(schema_path: str) -> str:
    """spec.teachers[].routes[] -> spec.teachers[0].routes[0]; a map value -> key `k`."""
    return _TARGETS.get(schema_path, schema_path.replace("[]", "[0]").replace("{}", ".k"))


def _string(node: dict[str, Any], length: int) -> str | None:
    """A string of exactly `length` characters that the node's pattern accepts, if we can make one."""
    pattern = node.get("pattern")
    alternatives = re.findall(r"[A-Za-z]+", pattern) if pattern and "|" in pattern else []
    # An absolute path first: it is a valid value of every free-form field (checkpoint.path must be one).
    candidates = [
        "/" + "a" * (length - 1),
        "a" * length,
        "http://" + "a" * (length - 7),
        "a" * (length - 2) + ":a",
        "1" * length,  # a quantity (checkpoint.size)
    ]
    for candidate in [*candidates, *alternatives]:
        if len(candidate) == length and (pattern is None or re.fullmatch(pattern, candidate)):
            return candidate
    return None


# Objects whose minimal value must hold more than their required fields to pass their rules: a volume
# has exactly one source, an env source exactly one reference.
_MINIMAL_OBJECTS = {
    ("name", "emptyDir", "configMap", "secret"): {"name": "x", "emptyDir": {}},
    ("secretName", "configMapName", "key"): {"secretName": "x"},
    ("secretKeyRef", "configMapKeyRef", "fieldRef"): {"fieldRef": {"fieldPath": "metadata.name"}},
}


def _minimal(node: dict[str, Any]) -> Any:
    """The smallest valid value of a node (required fields only): used for parents a case creates."""
    kind = node.get("type")
    if kind == "object":
        properties = node.get("properties", {})
        for keys, value in _MINIMAL_OBJECTS.items():
            if set(keys) <= set(properties):
                return copy.deepcopy(value)
        return {name: _minimal(properties[name]) for name in node.get("required", [])}
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return node.get("minimum", 1)
    if kind == "boolean":
        return False
    for length in range(max(1, node.get("minLength", 1)), 16):
        value = _string(node, length)
        if value is not None:
            return value
    return "x"


def _place(doc: dict[str, Any], schema: dict[str, Any], path: str, value: Any) -> None:
    """Sets `path` (concrete) to `value`, creating the missing parents as their minimal valid value."""
    parts = split_path(path)[1:]
    node: Any = doc["spec"]
    sub = schema
    for part, following in itertools.pairwise(parts):
        if isinstance(part, int):
            sub = sub["items"]
            while len(node) <= part:
                node.append(_minimal(sub))
        else:
            sub = sub.get("properties", {}).get(part) or sub["additionalProperties"]
            if part not in node:
                node[part] = [] if isinstance(following, int) else _minimal(sub)
        node = node[part]
    last = parts[-1]
    if isinstance(last, int) and len(node) <= last:
        node.append(value)
    else:
        node[last] = value


def _items(path: str, node: dict[str, Any], count: int) -> list[Any]:
    if path == "spec.teachers":
        return _teachers(count, 1, 8)
    item = node["items"]
    if item.get("type") == "string":
        return [f"v{i}" for i in range(count)]
    if item.get("type") == "number":
        return [0.5] * count
    items = [_minimal(item) for _ in range(count)]
    # Items with a name or a mount path must differ in it (uniqueness rules).
    for i, each in enumerate(items):
        if isinstance(each, dict) and "name" in each and "mountPath" not in each:
            each["name"] = f"x{i}"
        if isinstance(each, dict) and "mountPath" in each:
            each["mountPath"] = f"/m{i}"
    return items


def _entries(node: dict[str, Any], count: int) -> dict[str, Any]:
    # A map of untyped values (x-kubernetes-preserve-unknown-fields, no additionalProperties) takes strings.
    value: Any = 1 if node.get("additionalProperties", {}).get("x-kubernetes-int-or-string") else "v"
    return {f"k{i}": value for i in range(count)}


_ONE_OF = (
    {"emptyDir", "configMap", "secret", "persistentVolumeClaim", "csi"},
    {"secretKeyRef", "configMapKeyRef", "fieldRef"},
    {"secretName", "configMapName"},
)
"""Fields of which an object holds exactly one (a volume's source, an env variable's reference)."""


def _keep_one_of(doc: dict[str, Any], path: str) -> None:
    """Along `path`, an object that holds one of a `_ONE_OF` set keeps only the member the path goes through."""
    node: Any = doc
    parts = split_path(path)
    for part, following in zip(parts, [*parts[1:], None], strict=True):
        node = node[part]
        if isinstance(node, dict):
            for members in _ONE_OF:
                if following in members:
                    for other in members - {following}:
                        node.pop(other, None)


def _declare_mounted_volumes(doc: dict[str, Any], path: str) -> None:
    """A mount names a volume of its section (a rule): a case that makes mounts declares the volumes."""
    if ".volumeMounts" not in path:
        return
    section: Any = doc
    for part in split_path(path.split(".volumeMounts")[0]):
        section = section[part]
    names = {m.get("name") for m in section.get("volumeMounts") or [] if isinstance(m, dict)}
    section["volumes"] = [{"name": n, "emptyDir": {}} for n in sorted(n for n in names if isinstance(n, str))]


def boundary_cases() -> list[tuple[str, dict[str, Any], str | None]]:
    """(id, manifest, field) at and just over every maxLength/maxItems/maxProperties of the spec schema:
    at the bound both sides accept (field None), one over both refuse naming `field`. The bounds exist
    for the API server's CEL cost estimate, so they are ours to keep, not only the server's."""
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    cases: list[tuple[str, dict[str, Any], str | None]] = []

    def add(name: str, path: str, at: Any, over: Any, enum: bool = False) -> None:
        for label, value, field in (("at", at, None), ("over", over, path)):
            if label == "at" and enum:
                continue  # an enum's maxLength is its longest value; the corpus covers its values
            doc = copy.deepcopy(BASE)
            _place(doc, schema, path, value)
            if path in _SIBLINGS:
                set_path(doc, *_SIBLINGS[path])
            for sibling in _MORE_SIBLINGS.get(path, []):
                set_path(doc, *sibling)
            _keep_one_of(doc, path)
            _declare_mounted_volumes(doc, path)
            cases.append((f"{name}-{label}:{path}", doc, field))

    for schema_path, node in _schema_nodes(schema):
        path = _concrete(schema_path)
        if "maxLength" in node:
            n = node["maxLength"]
            if "enum" in node:
                add("maxLength", path, None, max(node["enum"], key=len) + "x", enum=True)
                continue
            at = _string(node, n)
            if at is None:
                raise ValueError(f"{schema_path}: no string of length {n} matches {node.get('pattern')}")
            add("maxLength", path, at, at + "a")
        if "maxItems" in node:
            n = node["maxItems"]
            add("maxItems", path, _items(schema_path, node, n), _items(schema_path, node, n + 1))
        if "maxProperties" in node:
            n = node["maxProperties"]
            add("maxProperties", path, _entries(node, n), _entries(node, n + 1))
    return cases
