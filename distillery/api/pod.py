"""What a platform team sets on a job's pods to place them: scheduling, metadata, env and volumes.

`PodSettings` is the set of fields that every pod section of the spec carries (`student.pool`,
`student.head`, each `teachers[].pool`): `priorityClassName`, `affinity`, `topologySpreadConstraints`,
`podLabels`, `podAnnotations`, `env`, `volumes` and `volumeMounts`. The operator applies them through its
one pod builder (`distillery_operator.render.pod_shape`), so no pod kind can miss them.

Typed models, not opaque objects: affinity, topology spread constraints, env sources and volume sources
are the commonly used subset of their Kubernetes types, written out field by field. A typed field is
bounded (the API server's CEL cost estimate needs every string, list and map bounded), CEL sees into it,
`kubectl explain` documents it, and a typo in a field name is refused by both `distillery validate` and
the API server's strict decoding, where an opaque `x-kubernetes-preserve-unknown-fields` object would
pass it to the pod and fail there, after the job was accepted. What is left out on purpose:
- volume sources other than configMap, secret, emptyDir, persistentVolumeClaim and csi (hostPath and the
  in-tree cloud disks are refused by Pod Security `restricted` or deprecated; a claim covers the rest);
- env `resourceFieldRef` (the plan sets the resources) and `envFrom`.

Names the operator itself uses are refused (one-line errors, CEL twins): env variables it sets, volume
names it mounts (`pvc-*` are the claims of pvc:// locations), mount paths it mounts, and pod labels it
sets or selects by.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from distillery.api.base import ApiModel, Rule
from distillery.api.bounds import (
    DNS_LABEL_RE,
    DNS_SUBDOMAIN_RE,
    MAX_INT,
    MAX_LABEL_VALUE,
    MAX_MAP,
    MAX_NAME,
    MAX_QUANTITY,
    POSITIVE_QUANTITY_RE,
    LabelValue,
    label_keys_rule,
)
from distillery.api.labels import RESERVED_LABEL_PREFIXES, reserved_labels_rule

MAX_TERMS = 8
"""Terms of an affinity (required or preferred), and topology spread constraints of a pod."""
MAX_EXPRESSIONS = 16
"""Match expressions of one term or selector."""
MAX_VALUES = 32
"""Values of one match expression."""
MAX_ENV = 64
MAX_ENV_NAME = 128
"""Env names and mount paths are compared pairwise by the uniqueness rules, in each of up to 32 teachers'
pools: the API server refused the CRD with 253 and 1024 (its estimated rule cost over the budget)."""
MAX_ENV_VALUE = 4096
MAX_VOLUMES = 32
MAX_MOUNTS = 32
MAX_PATH = 512
MAX_ANNOTATION_VALUE = 4096
"""An annotation value: 64 of them stay far below the API server's 256 KiB of annotations a pod."""
MAX_PULL_SECRETS = 16

QualifiedKey = Annotated[str, Field(min_length=1, max_length=MAX_NAME + 1 + MAX_LABEL_VALUE)]
"""A label, node-label or topology key ([prefix/]name)."""
SelectorValue = Annotated[str, Field(max_length=MAX_LABEL_VALUE)]
ObjectName = Annotated[str, Field(min_length=1, max_length=MAX_NAME, pattern=DNS_SUBDOMAIN_RE)]
"""A Secret, ConfigMap, PersistentVolumeClaim or PriorityClass name (a DNS subdomain)."""
VolumeName = Annotated[str, Field(min_length=1, max_length=MAX_LABEL_VALUE, pattern=DNS_LABEL_RE)]

ENV_NAME_RE = "^[-._a-zA-Z][-._a-zA-Z0-9]*$"
"""The API server's rule for an env variable name (a C identifier with '-' and '.' allowed)."""
OPERATOR_ENV = (
    "DISTILLERY_CONFIG",
    "POD_NAMESPACE",
    "HF_TOKEN",
    "VLLM_NO_USAGE_STATS",
    "DO_NOT_TRACK",
    "VLLM_CPU_KVCACHE_SPACE",
    "HF_HOME",
    "VLLM_API_KEY",
)
"""Env variables the operator sets on its pods (tests/operator/test_pod_settings.py checks the rendered
pods against this list): a second one of the same name would silently win or lose."""
OPERATOR_ENV_PREFIX = "DISTILLERY_TEACHER_"
"""The prefix of the head pod's teacher key variables (`DISTILLERY_TEACHER_<NAME>_API_KEY`,
`distillery.plan.teachers.client.api_key_env_name`): a user's variable of that name could replace a key."""
OPERATOR_VOLUMES = ("distillery-config", "checkpoints", "dshm", "model-cache")
OPERATOR_VOLUME_PREFIX = "pvc-"
"""The claims of pvc:// locations are mounted as volumes `pvc-CLAIM` (`distillery.pvc.volume_name`)."""
OPERATOR_MOUNT_PATHS = ("/dev/shm", "/etc/distillery", "/mnt/distillery", "/var/cache/huggingface")
"""Where the operator mounts /dev/shm, the runtime config, the pvc:// claims and the model cache
(`distillery.plan.pods.model_cache.HF_HOME`), and anything under them."""
OPERATOR_LABEL_PREFIXES = (*RESERVED_LABEL_PREFIXES, "app.kubernetes.io/", "kueue.x-k8s.io/")
"""Label prefixes a pod section's podLabels may not set: the reserved ones (`distillery.api.labels`: the
policies and KubeRay select by them), and on pods the operator's app.kubernetes.io/ ones (the Services and
the PodMonitor select by them) and Kueue's (a queue label belongs on the job, which passes it to Kueue)."""


def _quoted(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


# ---------------------------------------------------------------------------------------------- affinity


class NodeSelectorRequirement(ApiModel):
    """A node label (or field) compared with values."""

    key: QualifiedKey
    operator: str = Field(pattern="^(In|NotIn|Exists|DoesNotExist|Gt|Lt)$", max_length=12)
    """In, NotIn, Exists, DoesNotExist, Gt or Lt."""
    values: list[SelectorValue] = Field(default_factory=list, max_length=MAX_VALUES)


class NodeSelectorTerm(ApiModel):
    """Requirements a node must all meet."""

    match_expressions: list[NodeSelectorRequirement] = Field(default_factory=list, max_length=MAX_EXPRESSIONS)
    match_fields: list[NodeSelectorRequirement] = Field(default_factory=list, max_length=MAX_EXPRESSIONS)


class NodeSelector(ApiModel):
    """Terms of which a node must meet one."""

    node_selector_terms: list[NodeSelectorTerm] = Field(min_length=1, max_length=MAX_TERMS)


class PreferredSchedulingTerm(ApiModel):
    """A node term the scheduler prefers, with its weight."""

    weight: int = Field(ge=1, le=100)
    preference: NodeSelectorTerm


class NodeAffinity(ApiModel):
    """Which nodes the pods must (required) or should (preferred) run on."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] = Field(
        default_factory=list, max_length=MAX_TERMS
    )


class LabelSelectorRequirement(ApiModel):
    """A pod label compared with values."""

    key: QualifiedKey
    operator: str = Field(pattern="^(In|NotIn|Exists|DoesNotExist)$", max_length=12)
    """In, NotIn, Exists or DoesNotExist."""
    values: list[SelectorValue] = Field(default_factory=list, max_length=MAX_VALUES)


class LabelSelector(ApiModel):
    """A Kubernetes label selector."""

    match_labels: dict[str, LabelValue] = Field(default_factory=dict, max_length=MAX_MAP)
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=MAX_EXPRESSIONS
    )

    rules = (label_keys_rule("matchLabels", "match_labels"),)


class PodAffinityTerm(ApiModel):
    """Pods (by label) that must or should share, or not share, a topology domain with ours."""

    label_selector: LabelSelector | None = None
    namespaces: list[ObjectName] = Field(default_factory=list, max_length=MAX_TERMS)
    """Namespaces of the selected pods; none: the job's."""
    namespace_selector: LabelSelector | None = None
    topology_key: QualifiedKey
    """The node label whose value is the domain (`kubernetes.io/hostname`, `topology.kubernetes.io/zone`)."""


class WeightedPodAffinityTerm(ApiModel):
    """A pod affinity term the scheduler prefers, with its weight."""

    weight: int = Field(ge=1, le=100)
    pod_affinity_term: PodAffinityTerm


class PodAffinity(ApiModel):
    """Pod (anti-)affinity: required terms and preferred ones."""

    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] = Field(
        default_factory=list, max_length=MAX_TERMS
    )
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] = Field(
        default_factory=list, max_length=MAX_TERMS
    )


class Affinity(ApiModel):
    """A Kubernetes affinity (the commonly used subset), passed through to the pods."""

    node_affinity: NodeAffinity | None = None
    pod_affinity: PodAffinity | None = None
    pod_anti_affinity: PodAffinity | None = None


class TopologySpreadConstraint(ApiModel):
    """How the pods spread over a topology (zones, nodes)."""

    max_skew: int = Field(ge=1, le=MAX_INT)
    topology_key: QualifiedKey
    when_unsatisfiable: str = Field(pattern="^(DoNotSchedule|ScheduleAnyway)$", max_length=14)
    """DoNotSchedule or ScheduleAnyway."""
    label_selector: LabelSelector | None = None
    """The pods counted; unset: none are (select the job's pods by `app.kubernetes.io/instance`)."""
    min_domains: int | None = Field(default=None, ge=1, le=MAX_INT)
    match_label_keys: list[QualifiedKey] = Field(default_factory=list, max_length=MAX_EXPRESSIONS)
    node_affinity_policy: str | None = Field(default=None, pattern="^(Honor|Ignore)$", max_length=6)
    node_taints_policy: str | None = Field(default=None, pattern="^(Honor|Ignore)$", max_length=6)


# ---------------------------------------------------------------------------------------------- env


class KeySelector(ApiModel):
    """A key of a Secret or ConfigMap in the job's namespace; its value is never copied into any object."""

    name: ObjectName
    key: str = Field(min_length=1, max_length=MAX_NAME, pattern="^[-._a-zA-Z0-9]+$")
    optional: bool | None = None
    """The pod starts without the variable when the object or key is missing."""


class FieldSelector(ApiModel):
    """A field of the pod (`metadata.name`, `status.podIP`, `spec.nodeName`...)."""

    field_path: str = Field(min_length=1, max_length=MAX_NAME)
    api_version: str | None = Field(default=None, max_length=MAX_LABEL_VALUE)


class EnvVarSource(ApiModel):
    """Where an env variable's value comes from: exactly one of the three."""

    secret_key_ref: KeySelector | None = None
    config_map_key_ref: KeySelector | None = None
    field_ref: FieldSelector | None = None

    rules = (
        Rule(
            check=lambda s: (
                sum(x is not None for x in (s.secret_key_ref, s.config_map_key_ref, s.field_ref)) == 1
            ),
            cel="[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef)]"
            ".filter(x, x).size() == 1",
            message="exactly one of secretKeyRef, configMapKeyRef or fieldRef",
        ),
    )


class EnvVar(ApiModel):
    """An env variable of the pod's container: a value, or a reference."""

    name: str = Field(min_length=1, max_length=MAX_ENV_NAME, pattern=ENV_NAME_RE)
    value: str | None = Field(default=None, max_length=MAX_ENV_VALUE)
    value_from: EnvVarSource | None = None

    rules = (
        Rule(
            check=lambda e: e.value is None or e.value_from is None,
            cel="!has(self.value) || !has(self.valueFrom)",
            message="value or valueFrom, not both",
            field="valueFrom",
        ),
        Rule(
            check=lambda e: e.name not in OPERATOR_ENV,
            cel=f"!(self.name in {_quoted(OPERATOR_ENV)})",
            message=f"the operator sets this variable itself ({', '.join(OPERATOR_ENV)})",
            field="name",
        ),
        Rule(
            check=lambda e: not e.name.startswith(OPERATOR_ENV_PREFIX),
            cel=f"!self.name.startsWith('{OPERATOR_ENV_PREFIX}')",
            message=f"the operator sets the {OPERATOR_ENV_PREFIX}* variables itself (teachers' API keys)",
            field="name",
        ),
    )


# ---------------------------------------------------------------------------------------------- volumes


class KeyToPath(ApiModel):
    """A key of a ConfigMap or Secret, projected to a file."""

    key: str = Field(min_length=1, max_length=MAX_NAME)
    path: str = Field(min_length=1, max_length=MAX_PATH)
    """A relative path inside the volume."""
    mode: int | None = Field(default=None, ge=0, le=0o777)


class ConfigMapVolume(ApiModel):
    """A ConfigMap of the job's namespace as files."""

    name: ObjectName
    items: list[KeyToPath] = Field(default_factory=list, max_length=MAX_VOLUMES)
    default_mode: int | None = Field(default=None, ge=0, le=0o777)
    optional: bool | None = None


class SecretVolume(ApiModel):
    """A Secret of the job's namespace as files."""

    secret_name: ObjectName
    items: list[KeyToPath] = Field(default_factory=list, max_length=MAX_VOLUMES)
    default_mode: int | None = Field(default=None, ge=0, le=0o777)
    optional: bool | None = None


class EmptyDirVolume(ApiModel):
    """Scratch space that lives as long as the pod."""

    medium: str | None = Field(default=None, pattern="^(|Memory)$", max_length=6)
    """'' (the node's disk) or Memory (counts toward the container's memory limit)."""
    size_limit: str | None = Field(default=None, pattern=POSITIVE_QUANTITY_RE, max_length=MAX_QUANTITY)


class ClaimVolume(ApiModel):
    """A PersistentVolumeClaim of the job's namespace."""

    claim_name: ObjectName
    read_only: bool | None = None


class SecretReference(ApiModel):
    """A Secret of the job's namespace, by name."""

    name: ObjectName


class CsiVolume(ApiModel):
    """An inline CSI volume (a secrets store, a node-local cache)."""

    driver: ObjectName
    read_only: bool | None = None
    fs_type: str | None = Field(default=None, max_length=MAX_LABEL_VALUE)
    volume_attributes: dict[str, Annotated[str, Field(max_length=MAX_ANNOTATION_VALUE)]] = Field(
        default_factory=dict, max_length=MAX_MAP
    )
    node_publish_secret_ref: SecretReference | None = None
    """A Secret of the job's namespace passed to the driver when it mounts the volume."""


class Volume(ApiModel):
    """A volume of the pods: a name and exactly one source."""

    name: VolumeName
    """A DNS label; not one the operator mounts (distillery-config, checkpoints, dshm, model-cache, pvc-*)."""
    config_map: ConfigMapVolume | None = None
    secret: SecretVolume | None = None
    empty_dir: EmptyDirVolume | None = None
    persistent_volume_claim: ClaimVolume | None = None
    csi: CsiVolume | None = None

    rules = (
        Rule(
            check=lambda v: (
                sum(
                    s is not None
                    for s in (v.config_map, v.secret, v.empty_dir, v.persistent_volume_claim, v.csi)
                )
                == 1
            ),
            cel="[has(self.configMap), has(self.secret), has(self.emptyDir), has(self.persistentVolumeClaim),"
            " has(self.csi)].filter(x, x).size() == 1",
            message="exactly one source: configMap, secret, emptyDir, persistentVolumeClaim or csi",
        ),
        Rule(
            check=lambda v: v.name not in OPERATOR_VOLUMES and not v.name.startswith(OPERATOR_VOLUME_PREFIX),
            cel=f"!(self.name in {_quoted(OPERATOR_VOLUMES)}) && !self.name.startsWith('{OPERATOR_VOLUME_PREFIX}')",
            message=f"the operator mounts volumes of this name ({', '.join(OPERATOR_VOLUMES)}, "
            f"{OPERATOR_VOLUME_PREFIX}*)",
            field="name",
        ),
    )


def _under_operator_mount(path: str) -> bool:
    return any(path.rstrip("/") == p or path.startswith(p + "/") for p in OPERATOR_MOUNT_PATHS)


class VolumeMount(ApiModel):
    """Where a volume of the same section is mounted in the pod's container."""

    name: VolumeName
    """A volume of the same section's `volumes`."""
    mount_path: str = Field(min_length=2, max_length=MAX_PATH, pattern="^/.*$")
    """An absolute path, not /dev/shm, /etc/distillery, /var/cache/huggingface or under /mnt/distillery (the
    operator's)."""
    sub_path: str | None = Field(default=None, max_length=MAX_PATH)
    read_only: bool | None = None

    rules = (
        Rule(
            check=lambda m: not _under_operator_mount(m.mount_path),
            cel=" && ".join(
                f"self.mountPath != '{p}' && self.mountPath != '{p}/' && !self.mountPath.startsWith('{p}/')"
                for p in OPERATOR_MOUNT_PATHS
            ),
            message=f"the operator mounts {', '.join(OPERATOR_MOUNT_PATHS)}: choose another path",
            field="mountPath",
        ),
    )


# ---------------------------------------------------------------------------------------------- settings


def _mounts_rule() -> Rule:
    return Rule(
        check=lambda s: all(any(v.name == m.name for v in s.volumes or []) for m in s.volume_mounts or []),
        cel="!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && "
        "self.volumes.exists(v, v.name == m.name))",
        message="each mount names a volume of the same section's volumes",
        field="volumeMounts",
    )


def _unique_rule(field: str, attr: str, key: str, key_attr: str, what: str) -> Rule:
    """No two items of the list `field` (`attr`) with the same `key` (`key_attr`)."""
    return Rule(
        check=lambda s: (
            len({getattr(x, key_attr) for x in getattr(s, attr) or []}) == len(getattr(s, attr) or [])
        ),
        cel=f"!has(self.{field}) || self.{field}.all(x, self.{field}.exists_one(y, y.{key} == x.{key}))",
        message=f"{what} must be unique",
        field=field,
        cel_reason="FieldValueDuplicate",
    )


POD_SETTINGS_RULES: tuple[Rule, ...] = (
    label_keys_rule("podLabels", "pod_labels"),
    label_keys_rule("podAnnotations", "pod_annotations"),
    reserved_labels_rule("podLabels", "pod_labels", OPERATOR_LABEL_PREFIXES),
    _mounts_rule(),
    _unique_rule("env", "env", "name", "name", "env names"),
    _unique_rule("volumes", "volumes", "name", "name", "volume names"),
    _unique_rule("volumeMounts", "volume_mounts", "mountPath", "mount_path", "mount paths"),
)
"""The rules of every section that carries pod settings (each model lists them in its `rules`)."""

PriorityClassName = Annotated[str, Field(min_length=1, max_length=MAX_NAME, pattern=DNS_SUBDOMAIN_RE)]
AnnotationValue = Annotated[str, Field(max_length=MAX_ANNOTATION_VALUE)]
PullSecretName = Annotated[str, Field(min_length=1, max_length=MAX_NAME, pattern=DNS_SUBDOMAIN_RE)]


class PodSettings(ApiModel):
    """The pod settings every pod section carries (`student.pool`, `student.head`, `teachers[].pool`).

    Unset is not the same as empty on `student.head`: an unset field follows the student pool, an empty
    one (`[]`, `{}`) means none for the head."""

    priority_class_name: PriorityClassName | None = None
    """PriorityClass of the pods (the cluster's; preemption and queue order follow it)."""
    affinity: Affinity | None = None
    """Node affinity and pod (anti-)affinity of the pods."""
    topology_spread_constraints: list[TopologySpreadConstraint] | None = Field(
        default=None, max_length=MAX_TERMS
    )
    """How the pods spread over zones or nodes."""
    pod_labels: dict[str, LabelValue] | None = Field(default=None, max_length=MAX_MAP)
    """Labels added to the pods only (not to the Deployment, RayJob or Services); not under the operator's
    prefixes distillery.io/, ray.io/, app.kubernetes.io/, kueue.x-k8s.io/."""
    pod_annotations: dict[str, AnnotationValue] | None = Field(default=None, max_length=MAX_MAP)
    """Annotations of the pods (a service mesh's, a log shipper's, cluster-autoscaler's)."""
    env: list[EnvVar] | None = Field(default=None, max_length=MAX_ENV)
    """Env variables of the pods' container (a proxy, a cache folder); not those the operator sets."""
    volumes: list[Volume] | None = Field(default=None, max_length=MAX_VOLUMES)
    """Volumes of the pods, mounted by volumeMounts."""
    volume_mounts: list[VolumeMount] | None = Field(default=None, max_length=MAX_MOUNTS)
    """Mounts of the pods' container; each names one of the same section's volumes."""

    rules: ClassVar[tuple[Rule, ...]] = POD_SETTINGS_RULES
