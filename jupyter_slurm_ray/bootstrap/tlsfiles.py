"""The cluster's own certificate authority, and each node's certificate, for Ray's TLS.

With ``RAY_USE_TLS=1`` every gRPC channel of Ray (the GCS, the raylets and object managers,
the agents, Ray Client's proxier and its per-client servers) is mutual TLS: each side shows a
certificate that the cluster's CA signed, or the handshake fails before a byte of the request
(and of the token in its metadata) is sent. A neighbour who binds the port of a node that
died receives a ClientHello and nothing else. The token stays as a second factor.

The CA is made once per job dir, by the first of the cluster's processes that needs it (the
head, before Ray starts), under a lock: ``tls/ca.key`` never leaves the job dir (0600 in a
0700 dir that only the user can change, ``trust.check_job_dir``). Beside it a client
certificate (``client.crt``/``client.key``) lets the user's kernels connect with Ray Client.
Each node makes its own key and a certificate naming its address, and loopback (where its
own processes and Ray Client's per-client servers are reached), in its private temp dir,
signed by the CA: Ray's clients check the server's address against the certificate.

openssl(1) does the work: the bootstrap imports nothing outside the standard library.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import secrets
import subprocess
from pathlib import Path

from jsr_base import BootstrapError, command_path
from jsr_wire import (
    TLS_CA_CERT,
    TLS_CA_KEY,
    TLS_CLIENT_CERT,
    TLS_CLIENT_KEY,
    TLS_DIR,
    TlsFiles,
)

NODE_CERT = "node.crt"  # in a node's temp dir, under TLS_DIR
NODE_KEY = "node.key"
DAYS = "400"  # longer than any walltime; the CA dies with its job dir anyway
CURVE = "P-256"
TIMEOUT = 30.0


def openssl() -> str:
    return command_path(
        "openssl",
        "the `openssl` command is not on the node's PATH: it makes the cluster's TLS "
        "certificates (install it, or set tls = false to run Ray without TLS)",
    )


def run_openssl(*args: str, stdin: bytes | None = None) -> bytes:
    """openssl's stdout; BootstrapError with its words when it fails."""
    try:
        done = subprocess.run(
            [openssl(), *args],
            input=stdin,
            capture_output=True,
            timeout=TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise BootstrapError(f"openssl {args[0]} failed: {exc}") from None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise BootstrapError(f"openssl {args[0]} exited with status {done.returncode}", said)
    return done.stdout


def write_private(path: Path, data: bytes) -> None:
    """``path`` written whole (0600, a new file renamed into place)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def new_key() -> bytes:
    return run_openssl("genpkey", "-algorithm", "EC", "-pkeyopt", f"ec_paramgen_curve:{CURVE}")


def extensions(usage: str, names: list[str] | None) -> str:
    """An extension section for ``openssl x509 -extfile``: a leaf for ``usage``, naming
    ``names`` (addresses and host names) when given."""
    lines = ["basicConstraints=critical,CA:FALSE", f"extendedKeyUsage={usage}"]
    lines.append("keyUsage=critical,digitalSignature,keyEncipherment")
    if names:
        lines.append("subjectAltName=" + ",".join(subject_names(names)))
    return "\n".join(lines) + "\n"


def subject_names(names: list[str]) -> list[str]:
    """``IP:…`` for addresses, ``DNS:…`` for host names, each once, in order."""
    found: list[str] = []
    for name in names:
        try:
            entry = f"IP:{ipaddress.ip_address(name)}"
        except ValueError:
            entry = f"DNS:{name}"
        if entry not in found:
            found.append(entry)
    return found


def sign(directory: Path, key: bytes, subject: str, ext: str, ca_dir: Path) -> bytes:
    """A certificate for ``key`` signed by the CA in ``ca_dir`` (a random serial: nodes sign
    at the same time, with no serial file to share)."""
    request = run_openssl("req", "-new", "-key", "/dev/stdin", "-subj", subject, stdin=key)
    ext_file = directory / f".ext-{os.getpid()}-{secrets.token_hex(4)}.cnf"
    ext_file.write_text(ext)
    try:
        return run_openssl(
            "x509", "-req", "-in", "/dev/stdin", "-sha256", "-days", DAYS,
            "-CA", str(ca_dir / TLS_CA_CERT), "-CAkey", str(ca_dir / TLS_CA_KEY),
            "-set_serial", f"0x{secrets.token_hex(16)}", "-extfile", str(ext_file),
            stdin=request,
        )  # fmt: skip
    finally:
        with contextlib.suppress(OSError):
            ext_file.unlink()


def authority_dir(job_dir: Path) -> Path:
    """The job dir's ``tls/`` with the cluster's CA and the clients' certificate, made once
    (by the first process that needs it; the others wait for it on a lock)."""
    directory = job_dir / TLS_DIR
    directory.mkdir(mode=0o700, exist_ok=True)
    if (directory / TLS_CLIENT_CERT).exists():
        return directory
    with open(directory / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / TLS_CLIENT_CERT).exists():
            make_authority(directory, job_dir.name)
    return directory


def make_authority(directory: Path, cluster: str) -> None:
    """The CA (self-signed, for this cluster only), then the clients' certificate."""
    ca_key = new_key()
    write_private(directory / TLS_CA_KEY, ca_key)
    ca_cert = run_openssl(
        "req", "-x509", "-new", "-key", "/dev/stdin", "-sha256", "-days", DAYS,
        "-subj", f"/CN=jupyter-slurm-ray cluster {cluster} CA",
        "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        stdin=ca_key,
    )  # fmt: skip
    write_private(directory / TLS_CA_CERT, ca_cert)
    client_key = new_key()
    ext = extensions("clientAuth", None)
    client_cert = sign(directory, client_key, f"/CN={cluster} client", ext, directory)
    write_private(directory / TLS_CLIENT_KEY, client_key)
    write_private(directory / TLS_CLIENT_CERT, client_cert)  # last: its presence says done


def node_files(job_dir: Path, temp_dir: Path, ip: str, host: str) -> TlsFiles:
    """This node's key and certificate (its address, its host name and loopback) in its
    private temp dir, signed by the cluster's CA (made first if need be)."""
    ca_dir = authority_dir(job_dir)
    files = made_node_files(job_dir, temp_dir)
    files.cert.parent.mkdir(mode=0o700, exist_ok=True)
    names = [ip, "127.0.0.1", "::1", "localhost", host]
    ext = extensions("serverAuth,clientAuth", names)
    node_key = new_key()
    write_private(files.key, node_key)
    write_private(files.cert, sign(files.cert.parent, node_key, f"/CN={host}", ext, ca_dir))
    return files


def made_node_files(job_dir: Path, temp_dir: Path) -> TlsFiles:
    """Where ``node_files`` puts a node's certificate (the node whose temp dir it is)."""
    directory = temp_dir / TLS_DIR
    return TlsFiles(directory / NODE_CERT, directory / NODE_KEY, job_dir / TLS_DIR / TLS_CA_CERT)
