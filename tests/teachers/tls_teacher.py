"""A teacher as hosted endpoints serve one: HTTPS with a certificate of a private CA, and an API key.

`TestCA` makes a self-signed CA and a server certificate for `localhost` and 127.0.0.1 (the `cryptography`
package); `TlsTeacher` is a real aiohttp server behind TLS that wants `Authorization: Bearer KEY` on `/v1`
(as vLLM's `--api-key` does, /health open to anyone) and forwards to a real teacher server, or, with no
upstream, answers `/v1/models` itself (enough for health checks).
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

MODEL = "tiny-teacher"


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass
class TestCA:
    """A CA of its own and a server certificate it signed, as PEM files in `directory`."""

    directory: Path
    name: str = "distillery-test-teacher-ca"
    ca_file: Path = field(init=False)
    cert_file: Path = field(init=False)
    key_file: Path = field(init=False)

    __test__ = False  # not a test class, for pytest

    def __post_init__(self) -> None:
        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = (
            x509.CertificateBuilder()
            .subject_name(_name(self.name))
            .issuer_name(_name(self.name))
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                    encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )  # fmt: skip
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name("localhost"))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ca_file = self.directory / "ca.crt"
        self.cert_file = self.directory / "server.crt"
        self.key_file = self.directory / "server.key"
        self.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self.key_file.write_bytes(_pem_key(key))

    @property
    def ca_pem(self) -> str:
        return self.ca_file.read_text()

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_file, self.key_file)
        return context


class TlsTeacher:
    """An HTTPS teacher on loopback that checks an API key; `url` is https://localhost:PORT (the name its
    certificate carries: the client must send it as SNI and check it)."""

    def __init__(self, ca: TestCA, api_key: str, upstream: str | None = None) -> None:
        self.ca, self.api_key, self.upstream = ca, api_key, upstream
        self.url = ""
        self.refused = 0
        """Requests answered 401 (a missing or wrong key)."""
        self.seen_sni: set[str | None] = set()
        self._runner: web.AppRunner | None = None
        self._client: aiohttp.ClientSession | None = None

    async def start(self) -> TlsTeacher:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        context = self.ca.server_context()
        context.sni_callback = lambda _sock, name, _ctx: self.seen_sni.add(name)  # type: ignore[assignment]
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"https://localhost:{port}"
        return self

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if (
            request.path.startswith("/v1")
            and request.headers.get("Authorization") != f"Bearer {self.api_key}"
        ):
            self.refused += 1
            # vLLM's --api-key answer.
            return web.json_response({"error": "Unauthorized"}, status=401)
        if self.upstream is None:
            if request.path in ("/health", "/v1/models"):
                return web.json_response({"data": [{"id": MODEL, "max_model_len": 512}]})
            return web.json_response({"error": "not found"}, status=404)
        if self._client is None:
            self._client = aiohttp.ClientSession()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "accept")}
        async with self._client.request(
            request.method, self.upstream + request.path_qs, data=await request.read(), headers=headers
        ) as answer:
            body = await answer.read()
            return web.Response(body=body, status=answer.status, content_type=answer.content_type)
