"""The keys of `vdla.runtime.remote`: a shared key that authenticates the client, and a
TLS certificate that encrypts the connection and that the client pins.

    vdla serve --new-key DIR            # writes DIR/server.pem and DIR/client.key
    vdla serve --sim functional --key-dir DIR
    vdla run MODEL --remote HOST:PORT --key-file client.key    # a copy of DIR/client.key

`new_key` writes a folder of two files, each readable by its owner only (mode 0600,
written atomically):

- ``server.pem``: a self-signed certificate and its private key (ECDSA P-256), for the
  server's TLS (1.3 only). It stays on the server.
- ``client.key``: the shared key (32 random bytes, in hex) and the certificate's
  SHA-256 fingerprint. Every client holds a copy; the server reads its key from it too.

A client accepts a server only if its certificate has the fingerprint its key file
pins (no certificate authority is involved), then proves it holds the shared key by
the handshake of `vdla.runtime.remote_wire`, inside the encrypted connection.

Keys are the tool's own: a key file with a key under 128 bits, not in hex, or of
visibly low entropy (few distinct bytes) is refused, and so is a key file or
``server.pem`` that other users may read or write, naming the file, its mode and the
``chmod`` that fixes it.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import hmac
import os
import re
import secrets
import ssl
from pathlib import Path

from vdla._fileio import atomic_write

__all__ = ["CLIENT_KEY", "KEY_ENV", "RemoteKey", "SERVER_PEM", "ServerKey", "client_context",
           "new_key", "pin", "read_key", "read_server_key"]

#: The files of a key folder.
SERVER_PEM, CLIENT_KEY = "server.pem", "client.key"
#: The environment variable a client's key file may be named by instead of --key-file.
KEY_ENV = "VDLA_REMOTE_KEY_FILE"
#: Bytes of a key `new_key` writes, and the fewest a key file may hold (128 bits).
KEY_BYTES, MIN_KEY_BYTES = 32, 16
_HEX = re.compile(r"[0-9a-fA-F]+")


@dataclasses.dataclass(frozen=True, repr=False)
class RemoteKey:
    """What a client needs: the shared key and the server certificate's fingerprint.

    key : the shared key's bytes
    fingerprint : the SHA-256 of the server's certificate (DER), 64 hex digits
    path : the file it was read from ("" when made here)
    """

    key: bytes
    fingerprint: str
    path: str = ""

    def __repr__(self) -> str:      # never the key itself, in a log or a traceback
        return f"RemoteKey(fingerprint={self.fingerprint[:16]}..., path={self.path!r})"


@dataclasses.dataclass(frozen=True, repr=False)
class ServerKey:
    """What the server needs: the shared key and its TLS context (certificate loaded).

    key : the shared key's bytes
    fingerprint : its certificate's SHA-256 (what clients pin)
    context : the server's `ssl.SSLContext`, TLS 1.3 only
    """

    key: bytes
    fingerprint: str
    context: ssl.SSLContext

    def __repr__(self) -> str:
        return f"ServerKey(fingerprint={self.fingerprint[:16]}...)"


def new_key(folder: str | os.PathLike) -> RemoteKey:
    """Write a new key folder (module docstring) and return the client's key.

    folder : created (mode 0700) if missing; ValueError if it already holds a key's
        files (a new key would lock out every client of the old one: remove them first)
    ImportError naming what to do where the ``cryptography`` package is missing (a
    board: make the key on the workstation and copy the folder).
    """
    # Python's ssl cannot make a certificate, and has no TLS 1.3 pre-shared keys before
    # 3.13 (vdla supports 3.11), so the certificate comes from `cryptography`, made for
    # the job and maintained; the openssl command is not on every board. Imported here,
    # not at the top: heavy, and a board that serves with a key made on the workstation
    # needs only ssl.
    try:
        from cryptography import x509  # heavy (above)
        from cryptography.hazmat.primitives import hashes, serialization  # heavy (above)
        from cryptography.hazmat.primitives.asymmetric import ec  # heavy (above)
        from cryptography.x509.oid import NameOID  # heavy (above)
    except ImportError:
        raise ImportError("making a key needs the cryptography package (`pip install "
                          "cryptography`; vdla's install has it): on a board without it, run "
                          "`vdla serve --new-key DIR` on the workstation and copy DIR "
                          "over") from None
    folder = Path(folder)
    present = [name for name in (SERVER_PEM, CLIENT_KEY) if (folder / name).exists()]
    if present:
        raise ValueError(f"{os.fspath(folder)} already holds {' and '.join(present)}: a new "
                         "key replaces the one every client holds; remove them first, or "
                         "choose another folder")
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vdla serve")])
    now = datetime.datetime.now(datetime.timezone.utc)
    # The client pins the certificate itself and checks neither its names nor its dates.
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(private.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .sign(private, hashes.SHA256()))
    fingerprint = hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()
    pem = cert.public_bytes(serialization.Encoding.PEM) + private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption())
    key = RemoteKey(secrets.token_bytes(KEY_BYTES), fingerprint,
                    os.fspath(folder / CLIENT_KEY))
    atomic_write(folder / SERVER_PEM, pem, mode=0o600)
    atomic_write(folder / CLIENT_KEY, _key_file(key).encode(), mode=0o600)
    return key


def _key_file(key: RemoteKey) -> str:
    return ("# vdla remote key (`vdla serve --new-key`): the shared key and the SHA-256 of\n"
            "# the server's certificate. Clients: `vdla run MODEL --remote HOST:PORT\n"
            "# --key-file client.key`. Keep it private (chmod 600): whoever holds it can run\n"
            "# programs on the server.\n"
            f"key {key.key.hex()}\nfingerprint {key.fingerprint}\n")


def _check_private(path: Path) -> None:
    """ValueError for a secret file other users may read or write."""
    if os.name != "posix":
        return
    mode = path.stat().st_mode & 0o777
    if mode & 0o006:
        raise ValueError(f"{os.fspath(path)} has mode {mode:03o}: other users can "
                         f"{'read' if mode & 0o004 else 'write'} this secret; "
                         f"`chmod 600 {os.fspath(path)}` and try again")


def read_key(path: str | os.PathLike | None = None) -> RemoteKey:
    """A client's key: the key file at `path`, else the one ``$VDLA_REMOTE_KEY_FILE``
    names.

    path : a ``client.key`` that `new_key` wrote (or None)
    ValueError naming the file and what is wrong: missing, readable or writable by other
    users (with the chmod that fixes it), or not a key file of a key of 128 bits or more
    in hex and a 64-hex-digit fingerprint."""
    if path is None:
        path = os.environ.get(KEY_ENV)
    if not path:
        legacy = " ($VDLA_REMOTE_KEY, a key in the environment, is no longer read)" \
            if os.environ.get("VDLA_REMOTE_KEY") else ""
        raise ValueError(f"a key file is needed: --key-file PATH or ${KEY_ENV}{legacy}; "
                         "`vdla serve --new-key DIR` writes one (DIR/client.key)")
    path = Path(path)
    try:
        _check_private(path)
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"key file {os.fspath(path)!r}: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    fields = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition(" ")
        if name not in ("key", "fingerprint") or name in fields:
            raise ValueError(f"key file {os.fspath(path)!r}, line {number}: {name[:20]!r}; "
                             "a key file holds one `key HEX` and one `fingerprint HEX` "
                             "line (`vdla serve --new-key DIR` writes one)")
        fields[name] = value.strip()
    key, fingerprint = fields.get("key", ""), fields.get("fingerprint", "")
    if not (_HEX.fullmatch(key) and len(key) % 2 == 0 and len(key) >= 2 * MIN_KEY_BYTES):
        raise ValueError(f"key file {os.fspath(path)!r}: its key must be at least "
                         f"{MIN_KEY_BYTES} random bytes in hex ({2 * MIN_KEY_BYTES} hex "
                         f"digits), not {len(key)} characters"
                         f"{'' if not key or _HEX.fullmatch(key) else ' of text'}: make "
                         "one with `vdla serve --new-key DIR`")
    raw = bytes.fromhex(key)
    if len(set(raw)) < max(4, len(raw) // 4):
        raise ValueError(f"key file {os.fspath(path)!r}: its key has only {len(set(raw))} "
                         f"distinct bytes in {len(raw)}: not random; make one with "
                         "`vdla serve --new-key DIR`")
    if not (_HEX.fullmatch(fingerprint) and len(fingerprint) == 64):
        raise ValueError(f"key file {os.fspath(path)!r}: its fingerprint must be the "
                         "server certificate's SHA-256, 64 hex digits, not "
                         f"{fingerprint[:70]!r}")
    return RemoteKey(raw, fingerprint.lower(), os.fspath(path))


def read_server_key(folder: str | os.PathLike) -> ServerKey:
    """The server's key: ``server.pem`` and ``client.key`` of `folder` (`new_key`).

    folder : the key folder
    ValueError naming the file and what is wrong: missing, readable or writable by other
    users, not a certificate and private key, or a ``client.key`` that pins another
    certificate (files of two `new_key` runs)."""
    folder = Path(folder)
    key = read_key(folder / CLIENT_KEY)
    pem = folder / SERVER_PEM
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    try:
        _check_private(pem)
    except OSError as exc:
        raise ValueError(f"{os.fspath(pem)}: {exc.strerror or exc}") from None
    try:
        context.load_cert_chain(pem)
        text = pem.read_text()
        end = "-----END CERTIFICATE-----"
        der = ssl.PEM_cert_to_DER_cert(
            text[text.index("-----BEGIN CERTIFICATE-----"):text.index(end) + len(end)])
    except (OSError, ValueError) as exc:      # ssl.SSLError is an OSError
        raise ValueError(f"{os.fspath(pem)}: not the certificate and private key "
                         f"`vdla serve --new-key` writes ({exc})") from None
    fingerprint = hashlib.sha256(der).hexdigest()
    if not hmac.compare_digest(fingerprint, key.fingerprint):
        raise ValueError(f"{key.path} pins certificate {key.fingerprint[:16]}..., but "
                         f"{os.fspath(pem)} holds {fingerprint[:16]}...: the files are from "
                         "two `vdla serve --new-key` runs")
    return ServerKey(key.key, fingerprint, context)


def client_context() -> ssl.SSLContext:
    """A client's TLS context: TLS 1.3, no certificate authority (the server's
    certificate is pinned by `pin` after the handshake instead)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def pin(sock: ssl.SSLSocket, fingerprint: str, address: str) -> None:
    """ValueError unless the server at the other end of `sock` (after its handshake,
    which proved it holds the certificate's private key) has the certificate whose
    SHA-256 is `fingerprint`."""
    der = sock.getpeercert(binary_form=True) or b""
    found = hashlib.sha256(der).hexdigest()
    if not hmac.compare_digest(found, fingerprint):
        raise ValueError(f"{address}: the server's certificate has SHA-256 {found[:16]}..., "
                         f"the key file pins {fingerprint[:16]}...: not the server you meant, "
                         "or its key was made anew (`vdla serve --new-key`): copy its "
                         "client.key again")
