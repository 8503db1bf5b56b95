"""The request path's own HTTP client over TLS: verified, kept alive, and refused when untrusted.

A real TLS server on a loopback port (tests/gateway/raw_upstream.py with an SSL context) and a
certificate made by the ``openssl`` command for ``127.0.0.1``. The client verifies with the
system's trust store, which ``SSL_CERT_FILE`` extends (how an operator trusts an internal CA).
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.upstream.connection import ConnectFailed
from gateway.upstream.pool import UpstreamPool
from tests.gateway.raw_upstream import RawUpstream, answer

PATH = "/v1/chat/completions"
HEADERS = {"Content-Type": "application/json"}
BIG = b"x" * (1 << 20)  # more than one TLS record and more than the socket buffers


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    openssl = shutil.which("openssl")
    assert openssl is not None, "the openssl command is needed to make a test certificate"
    where = tmp_path_factory.mktemp("tls")
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
async def tls_server(certificate: tuple[Path, Path]) -> AsyncIterator[RawUpstream]:
    """An HTTPS server answering ``ok`` (or 1 MiB for a request to ``/big``), keeping the
    connection open."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)

    async def respond(n: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        request = server.requests[n - 1]
        writer.write(answer(BIG if b" /big " in request.split(b"\r\n", 1)[0] else b"ok"))
        await writer.drain()
        return True

    server = RawUpstream(respond, tls=context)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _refused(server: RawUpstream, base_url: str, reason: str) -> None:
    """A POST to ``base_url`` fails to connect for ``reason``; ``server`` got no request."""
    pool = UpstreamPool()
    try:
        with pytest.raises(ConnectFailed, match=reason):
            await pool.post(base_url + PATH, b"{}", HEADERS)
        assert server.requests == []
    finally:
        await pool.close()


async def test_https_backend_is_verified_and_kept_alive(
    tls_server: RawUpstream, certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trusted through SSL_CERT_FILE: answers read whole, big and small, on one connection."""
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    pool = UpstreamPool()
    try:
        for path in (PATH, "/big", PATH):
            response = await pool.post(tls_server.url + path, b"{}", HEADERS)
            assert response.status == 200
            body = await response.read()
            assert body == (BIG if path == "/big" else b"ok")
            response.release()
        assert tls_server.connections == 1  # keep-alive over TLS
        assert len(tls_server.requests) == 3
    finally:
        await pool.close()


async def test_untrusted_certificate_is_refused_before_anything_is_sent(
    tls_server: RawUpstream, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A backend whose certificate no trusted CA signed fails as a connect failure (the
    request path retries another replica); no request bytes reach it."""
    empty = tmp_path / "no-ca.pem"
    empty.write_text("")
    monkeypatch.setenv("SSL_CERT_FILE", str(empty))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))
    await _refused(tls_server, tls_server.url, "CERTIFICATE_VERIFY_FAILED")


async def test_a_name_the_certificate_does_not_carry_is_refused(
    tls_server: RawUpstream, certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Host names are checked: a trusted certificate for 127.0.0.1 does not serve localhost."""
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))
    await _refused(tls_server, tls_server.url.replace("127.0.0.1", "localhost"), "mismatch")
