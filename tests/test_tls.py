"""TLS on both ports with Triton's flags, mutual TLS, and certificates that
rotate under a running server (as cert-manager rotates a mounted Secret).

The certificates are made here with `cryptography`: a CA, server
certificates for 127.0.0.1, and a client certificate.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import time
from pathlib import Path

import pytest
import requests
import tritonclient.grpc as grpcclient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from helpers import EXAMPLES_MODELS, HOST, NereidServer


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _certificate(subject: str, issuer_key, issuer: str | None, *, ca: bool = False, server: bool = False):
    """A certificate and its key: a self-signed CA, or one signed by `issuer_key`."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer or subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))]), critical=False
        )
    if not ca:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    cert = builder.sign(issuer_key or key, hashes.SHA256())
    return cert, key


def _write(path: Path, cert, key=None) -> None:
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        path.with_suffix(".key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )


class Pki:
    """A folder of PEM files and the CA key that signed them."""

    def __init__(self, folder: Path, ca_key) -> None:
        self.folder = folder
        self.ca_key = ca_key

    def __truediv__(self, name: str) -> Path:
        return self.folder / name


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca, ca_key = _certificate("nereid test CA", None, None, ca=True)
    _write(d / "ca", ca)
    server, server_key = _certificate("nereid-server", ca_key, "nereid test CA", server=True)
    _write(d / "server", server, server_key)
    client, client_key = _certificate("a client", ca_key, "nereid test CA")
    _write(d / "client", client, client_key)
    return Pki(d, ca_key)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory, pki):
    log = tmp_path_factory.mktemp("logs", numbered=True) / "tls.log"
    args = []
    for port in ("http", "grpc"):
        args += [
            f"--{port}-use-ssl",
            f"--{port}-server-cert", str(pki / "server.crt"),
            f"--{port}-server-key", str(pki / "server.key"),
        ]
    # gRPC additionally requires client certificates.
    args += ["--grpc-use-ssl-mutual", "--grpc-root-cert", str(pki / "ca.crt"), "--exit-timeout-secs", "10"]
    srv = NereidServer([EXAMPLES_MODELS], args, log_path=log, wait_for="ports").start()
    yield srv
    srv.stop_and_check()


def _peer_serial(port: int, ca: Path) -> int:
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection((HOST, port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname=HOST) as tls:
            der = tls.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).serial_number


def test_https_serves_with_the_certificate(tls_server, pki):
    url = f"https://{HOST}:{tls_server.http_port}/v2/health/ready"
    assert requests.get(url, verify=str(pki / "ca.crt"), timeout=10).status_code == 200
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
    r = requests.post(
        f"https://{HOST}:{tls_server.http_port}/v2/models/identity/infer",
        json=body, verify=str(pki / "ca.crt"), timeout=10,
    )
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [1.0, 2.0]
    # Plain HTTP on the TLS port gets nowhere.
    with pytest.raises(requests.RequestException):
        requests.get(f"http://{HOST}:{tls_server.http_port}/v2/health/ready", timeout=5)


def test_mutual_grpc_needs_a_client_certificate(tls_server, pki):
    with_cert = grpcclient.InferenceServerClient(
        tls_server.grpc_url, ssl=True,
        root_certificates=str(pki / "ca.crt"),
        private_key=str(pki / "client.key"),
        certificate_chain=str(pki / "client.crt"),
    )
    try:
        assert with_cert.is_server_ready()
        assert with_cert.is_model_ready("identity")
    finally:
        with_cert.close()
    without = grpcclient.InferenceServerClient(tls_server.grpc_url, ssl=True, root_certificates=str(pki / "ca.crt"))
    try:
        with pytest.raises(Exception):
            without.is_server_ready(client_timeout=5)
    finally:
        without.close()


def test_a_rotated_certificate_is_served_without_a_restart(tls_server, pki):
    before = _peer_serial(tls_server.http_port, pki / "ca.crt")
    rotated, rotated_key = _certificate("nereid-server", pki.ca_key, "nereid test CA", server=True)
    # A rotation writes the key and the certificate one after the other; the
    # server keeps the old pair until the new one loads.
    _write(pki / "server", rotated, rotated_key)
    deadline = time.monotonic() + 10
    while (serial := _peer_serial(tls_server.http_port, pki / "ca.crt")) == before and time.monotonic() < deadline:
        time.sleep(0.3)
    assert serial == rotated.serial_number, "the new certificate was not picked up"
    # A broken rotation keeps the current certificate serving.
    (pki / "server.key").write_text("not a key")
    time.sleep(1.5)
    assert _peer_serial(tls_server.http_port, pki / "ca.crt") == rotated.serial_number
    deadline = time.monotonic() + 5  # the log reader thread catches up
    while "keeping the previous ones" not in tls_server.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "keeping the previous ones" in tls_server.output()
    _write(pki / "server", rotated, rotated_key)
