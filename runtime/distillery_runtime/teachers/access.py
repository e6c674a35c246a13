"""A teacher's client settings (`distillery.plan.teachers.client`) made usable in the runtime: the CA bundle
read from its file, the API key from its environment variable, both turned into a TLS context and headers
by the translation the operator's probe uses too (`distillery.teacher_tls`); and the one-line errors for a
certificate or a key the teacher does not accept.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from distillery.plan.teachers.client import TeacherClient, endpoint_client
from distillery.teacher_tls import AccessMaterialError, authorization, tls_context
from distillery_runtime.teachers.types import TeacherAccessError


@dataclass(frozen=True)
class ClientAccess:
    """What every request to one teacher carries: its TLS context and its headers (the key: kept out of
    the repr, so that no log or traceback of this object shows it)."""

    name: str
    settings: TeacherClient
    ssl: ssl.SSLContext | bool = True
    """aiohttp's `ssl`: a context for https (True for plain http, where it is unused)."""
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    def certificate_error(
        self, url: str, error: aiohttp.ClientConnectorCertificateError
    ) -> TeacherAccessError:
        reason = getattr(error.certificate_error, "verify_message", None) or str(error.certificate_error)
        host = urlsplit(url).netloc
        return TeacherAccessError(
            f"teacher {self.name}: the TLS certificate of {host} is not trusted ({reason}); "
            f"checked against {self.settings.ca_origin()}"
        )

    def refused(self, url: str, status: int, body: bytes) -> TeacherAccessError:
        text = " ".join(body[:200].decode("utf-8", "replace").split())
        return TeacherAccessError(
            f"teacher {self.name}: {url} answered HTTP {status}, refusing {self.settings.key_origin()}: {text}"
        )


def client_access(
    name: str,
    settings: TeacherClient | None,
    endpoints: Sequence[str],
    environ: Mapping[str, str] | None = None,
) -> ClientAccess:
    """The access of teacher `name` at `endpoints` with `settings` (None: a config resolved without them,
    which asks for no CA bundle and no key). TeacherAccessError, one line, where the bundle or the key is
    not where the settings say."""
    settings = settings or endpoint_client(f"teacher {name}", endpoints)
    environ = os.environ if environ is None else environ
    try:
        headers: dict[str, str] = {}
        if settings.api_key_env is not None:
            key = environ.get(settings.api_key_env)
            if key is None:
                where = (
                    f"the trainer pods get it from {settings.key_origin()}"
                    if settings.api_key_secret is not None
                    else "--teacher-api-key names it"
                )
                raise AccessMaterialError(f"${settings.api_key_env} is not set ({where})")
            headers = authorization(key, f"${settings.api_key_env}")
        context: ssl.SSLContext | bool = True
        if settings.tls:
            pem = None
            if settings.ca_file is not None:
                try:
                    pem = Path(settings.ca_file).read_text()
                except (OSError, UnicodeDecodeError) as error:
                    raise AccessMaterialError(
                        f"{settings.ca_origin()}: cannot read {settings.ca_file}: {error}"
                    ) from None
            context = tls_context(pem, settings.ca_origin())
    except AccessMaterialError as error:
        raise TeacherAccessError(f"teacher {name}: {error}") from None
    return ClientAccess(name, settings, context, headers)
