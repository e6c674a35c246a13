"""The one translation of a teacher's client settings (`plan.teacher_client`) into what an HTTP client takes:
a TLS context and the Authorization header. The runtime's scoring clients and the operator's probe both call
it, with the CA bundle and key each reads from its own side (a file and a variable in the trainer pods, the
API for the operator), so they check certificates and send keys alike.
"""

from __future__ import annotations

import ssl


class AccessMaterialError(ValueError):
    """A CA bundle or API key that cannot be used as it is: one line saying where it came from and why."""


def tls_context(ca_pem: str | None, origin: str) -> ssl.SSLContext:
    """Certificates checked against the host name (SNI sent), chained to the CAs of `ca_pem` alone where
    given (a private CA's bundle, as `curl --cacert`), else to the system's. `origin` names the bundle in
    the error."""
    try:
        if ca_pem is None:
            return ssl.create_default_context()
        return ssl.create_default_context(cadata=ca_pem)
    except (ssl.SSLError, ValueError) as error:
        raise AccessMaterialError(f"{origin} holds no usable PEM certificate: {error}") from None


def authorization(key: str, origin: str) -> dict[str, str]:
    """The header that carries an API key. A Secret made from a file often ends in a newline: trimmed."""
    key = key.strip()
    if not key:
        raise AccessMaterialError(f"{origin} is empty")
    if any(c in key for c in "\r\n\0"):
        # A line break would end the header and start another one.
        raise AccessMaterialError(f"{origin} holds a line break inside the key")
    return {"Authorization": f"Bearer {key}"}
