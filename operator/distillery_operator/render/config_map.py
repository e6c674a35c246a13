"""The job's ConfigMap: the resolved runtime config every trainer pod reads."""

from __future__ import annotations

from typing import Any

from distillery.api import DistillationJob
from distillery.runtime_config import CONFIG_KEY, resolve_runtime_config
from distillery_operator import naming
from distillery_operator.render.common import RenderContext, metadata, stamp, user_labels


def render_config_map(job: DistillationJob, ctx: RenderContext) -> dict[str, Any]:
    config = resolve_runtime_config(job, ctx.namespace, in_cluster=True)
    data = config.model_dump_json(by_alias=True, exclude_none=True)
    labels = naming.child_labels(job.metadata.name, "config", user_labels(job))
    return stamp(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata(job, ctx, naming.config_map_name(job.metadata.name), labels),
            "data": {CONFIG_KEY: data},
        }
    )
