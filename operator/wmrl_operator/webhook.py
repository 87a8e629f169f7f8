"""The optional validating admission webhook's TLS: a self-signed certificate made at start-up.

kopf can self-sign with ``certbuilder``; we use ``cryptography`` (already present) instead so the
operator image needs no extra package. The certificate doubles as its own CA: kopf puts it into
the managed ValidatingWebhookConfiguration's ``caBundle``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import tempfile
from pathlib import Path
from typing import Any, Optional


def self_signed(hosts: list[str], directory: Path) -> tuple[Path, Path]:
    """Write ``cert.pem``/``key.pem`` valid for ``hosts`` (DNS names or IPs); returns their paths."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])])
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return cert_path, key_path


def webhook_server(port: int, host: Optional[str]) -> Any:
    """kopf's HTTPS webhook server on ``0.0.0.0:port`` with a fresh self-signed certificate."""
    import kopf

    hosts = [h for h in (host, "localhost", "127.0.0.1") if h]
    directory = Path(tempfile.mkdtemp(prefix="wmrl-webhook-"))
    cert, key = self_signed(hosts, directory)
    return kopf.WebhookServer(addr="0.0.0.0", port=port, host=hosts[0], certfile=str(cert), pkeyfile=str(key),
                              cafile=str(cert))
