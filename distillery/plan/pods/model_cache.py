"""The model cache of each pod kind (pure): the volume mounted as `HF_HOME`, and its size.

A pod that downloads a model from the Hugging Face Hub (vLLM for a standalone teacher; `from_pretrained`
and the rollout engines in the Ray pods for the student, its tokenizer and colocated teachers) writes the
weights under `HF_HOME`. Without a volume there, they go to the container's writable layer: lost at every
container restart, and a download slower than the startup probe then restarts from zero forever. So:

- `modelCache.pvc`: that claim in every pod (a cache shared by pods and jobs);
- otherwise, for each pod kind that downloads something, an emptyDir (which survives container restarts,
  not the pod) with a `sizeLimit` and an equal `ephemeral-storage` request (`pod_resources`): the
  scheduler then places the pod where the disk is, and the kubelet does not evict it for using the
  space it said it would. Its size is `modelCache.sizeLimit`, else the weights it downloads (the files'
  bytes, bfloat16, from the model's shape, with CACHE_HEADROOM) plus CACHE_EXTRA_GIB for tokenizers and
  configs, or UNKNOWN_MODEL_CACHE_GIB a model of unknown size;
- pods that download nothing (every model on a claim or in the image) get no cache volume, unless the
  user sizes one (`modelCache.sizeLimit`: every pod, as with a claim).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from distillery.api.spec import DistillationJobSpec, Placement
from distillery.model_shapes import resolve_shape

GIB = 1024**3
HF_HOME = "/var/cache/huggingface"
"""Where the cache is mounted, and the pods' HF_HOME (the Hub client and vLLM write under it)."""
VOLUME_NAME = "model-cache"
FILE_BYTES = 2
"""Bytes a parameter of the downloaded safetensors (bfloat16, as models ship)."""
CACHE_HEADROOM = 1.1
CACHE_EXTRA_GIB = 1
UNKNOWN_MODEL_CACHE_GIB = 100
TRAINER = "trainer"
"""The pod kind of the Ray head and workers (every teacher's pods are keyed by the teacher's name)."""


@dataclass(frozen=True)
class CacheVolume:
    """The cache of one pod kind: a claim, or an emptyDir of `size_limit`."""

    claim: str | None
    size_limit: str | None
    reason: str

    def volume(self) -> dict[str, object]:
        if self.claim is not None:
            return {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": self.claim}}
        return {"name": VOLUME_NAME, "emptyDir": {"sizeLimit": self.size_limit}}


def downloads(location: str | None) -> bool:
    """A Hugging Face Hub id (`org/name`): no scheme, not a path. pvc://, s3://, local folders are not
    downloaded into the cache."""
    if not location or "://" in location or location.startswith(("/", ".", "~")):
        return False
    return location.count("/") <= 1


def _downloaded(spec: DistillationJobSpec) -> dict[str, list[str]]:
    """The Hub models each pod kind downloads."""
    trainer: list[str | None] = [spec.student.model, spec.student.tokenizer]
    trainer += [t.model for t in spec.teachers if t.placement == Placement.COLOCATED]
    kinds: dict[str, list[str | None]] = {TRAINER: trainer}
    for teacher in spec.teachers:
        if teacher.placement == Placement.STANDALONE:
            kinds[teacher.name] = [teacher.model]
    return {
        kind: sorted({m for m in models if m is not None and downloads(m)}) for kind, models in kinds.items()
    }


def _estimate(models: list[str]) -> tuple[int, str]:
    gib = float(CACHE_EXTRA_GIB)
    unknown = []
    for model in models:
        shape = resolve_shape(model)
        if shape is None:
            unknown.append(model)
            gib += UNKNOWN_MODEL_CACHE_GIB
        else:
            gib += CACHE_HEADROOM * FILE_BYTES * shape.params / GIB
    why = f"the weights of {', '.join(models)}"
    if unknown:
        why += f" ({UNKNOWN_MODEL_CACHE_GIB} GiB for each of unknown size: {', '.join(unknown)})"
    return math.ceil(gib), why


def model_cache(spec: DistillationJobSpec) -> dict[str, CacheVolume]:
    """The cache of each pod kind that has one: `TRAINER` (Ray head and workers) and standalone teachers by
    name (the module's rules)."""
    cache = spec.model_cache
    if not cache.enabled:
        return {}
    kinds = _downloaded(spec)
    if cache.pvc is not None:
        why = "modelCache.pvc: shared by every pod"
        return {kind: CacheVolume(cache.pvc, None, why) for kind in kinds}
    out = {}
    for kind, models in kinds.items():
        if cache.size_limit is not None:
            # Asked for: every pod gets one, as with a claim (what it keeps there is the user's affair).
            out[kind] = CacheVolume(None, cache.size_limit, "modelCache.sizeLimit")
        elif models:
            gib, why = _estimate(models)
            out[kind] = CacheVolume(None, f"{gib}Gi", why)
    return out


def server_cache(model: str) -> CacheVolume | None:
    """The cache of a DistillationTeacher's replicas: an emptyDir the size of its weights where it downloads
    its model from the Hub (it has no modelCache settings of its own: a claim of the user's is mounted
    through pool.volumes)."""
    if not downloads(model):
        return None
    gib, why = _estimate([model])
    return CacheVolume(None, f"{gib}Gi", why)


def cache_lines(spec: DistillationJobSpec) -> list[str]:
    """One line a pod kind, for `distillery plan`."""
    caches = model_cache(spec)
    if not caches:
        return ["model cache: none (no pod downloads a model, or modelCache.enabled: false)"]
    return [
        f"model cache: {kind}: "
        + (f"claim {c.claim}" if c.claim else f"emptyDir {c.size_limit}")
        + f" at {HF_HOME} ({c.reason})"
        for kind, c in caches.items()
    ]
