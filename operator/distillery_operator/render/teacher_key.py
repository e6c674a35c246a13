"""The job's teacher key Secret (`distillery.plan.access.auth`): its standalone teachers want the key on every
request, and the trainer's head pod sends it.

Rendered without its value: a render is pure and goes into `distillery render`, goldens and the spec hash,
none of which may hold a key. The controller puts a fresh random key in at the one moment the Secret is
made (`with_new_key`), and never writes it again (no patch, no read: the pods take it by secretKeyRef).
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

from distillery.api import DistillationJob
from distillery.plan.access.auth import TEACHER_KEY, needs_teacher_key, teacher_key_secret_name
from distillery_operator import naming
from distillery_operator.render.common import RenderContext, metadata, stamp, user_labels

KEY_BYTES = 32
"""256 random bits, URL-safe base64: a header value without any character that needs quoting."""


def render_teacher_key_secret(job: DistillationJob, ctx: RenderContext) -> dict[str, Any] | None:
    """The job's teacher key Secret, without its value; None when the job runs no standalone teacher."""
    if not needs_teacher_key(job.spec):
        return None
    labels = naming.child_labels(job.metadata.name, "teacher-key", user_labels(job))
    return stamp(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata(job, ctx, teacher_key_secret_name(job.metadata.name), labels),
            "type": "Opaque",
        }
    )


def with_new_key(secret: dict[str, Any]) -> dict[str, Any]:
    """The rendered Secret with a fresh random key as its data: the body of its create, used at once and
    kept nowhere."""
    key = secrets.token_urlsafe(KEY_BYTES)
    return {**secret, "data": {TEACHER_KEY: base64.b64encode(key.encode()).decode()}}
