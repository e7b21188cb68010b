"""The filesystem, tightened, without a cluster: ACLs read from their binary attributes and
judged (POSIX access and default ACLs, NFSv4 ACLs), the bootstrap's trust check and the
client's probe of the job dir root refusing a grant, and the job script given to sbatch on
its stdin (what is queued is the text that was rendered, not whatever a path holds later)."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from jupyter_slurm_ray.errors import SpecError
from jupyter_slurm_ray.job.directory import probe_site
from jupyter_slurm_ray.slurm.client import SlurmClient
from jupyter_slurm_ray.transport import LocalTransport

from ..helpers.bootstrap import bootstrap_module

acls = bootstrap_module("acls")
trust = bootstrap_module("trust")

SETFACL = shutil.which("setfacl")  # found before a test narrows PATH
STRANGER = 54321  # a uid no one on this machine has: setfacl takes numeric ids
# ``setfacl -m u:bob:rwx`` on a 0700 directory, as the kernel stores it (read on Debian 12)
BOB_RWX = bytes.fromhex(
    "02000000" "01000700ffffffff" "02000700ea030000" "04000000ffffffff"
    "10000700ffffffff" "20000000ffffffff"
)  # fmt: skip


def posix_acl(*entries: tuple[int, int, int]) -> bytes:
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def nfs4_acl(*aces: tuple[int, int, int, str]) -> bytes:
    data = struct.pack(">I", len(aces))
    for kind, flag, mask, who in aces:
        name = who.encode()
        data += struct.pack(">IIII", kind, flag, mask, len(name)) + name.ljust(
            (len(name) + 3) // 4 * 4, b"\0"
        )
    return data


# ----------------------------------------------------------------------- the binary formats


def test_a_posix_acl_is_read_from_its_binary_attribute() -> None:
    assert acls.parse_posix_acl(BOB_RWX) == [
        acls.AclEntry(acls.USER_OBJ, 7, None),
        acls.AclEntry(acls.USER, 7, 1002),
        acls.AclEntry(acls.GROUP_OBJ, 0, None),
        acls.AclEntry(acls.MASK, 7, None),
        acls.AclEntry(acls.OTHER, 0, None),
    ]


@pytest.mark.parametrize(
    "data",
    [b"", b"\x02\x00\x00\x00\x01\x00", struct.pack("<I", 1), posix_acl((0x40, 7, 0))],
    ids=["empty", "torn entry", "version 1", "unknown tag"],
)
def test_what_is_not_a_posix_acl_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        acls.parse_posix_acl(data)


def test_a_named_users_write_counts_only_through_the_mask() -> None:
    mine = frozenset({1001, 0})
    user_rwx = (acls.USER, 7, STRANGER)
    assert (
        acls.posix_grants(acls.parse_posix_acl(posix_acl(user_rwx, (acls.MASK, 5, 0))), mine) == []
    )
    granted = acls.posix_grants(acls.parse_posix_acl(posix_acl(user_rwx, (acls.MASK, 7, 0))), mine)
    assert granted == [f"user {STRANGER} (uid {STRANGER}) (user:{STRANGER}:rwx, mask rwx)"]
    to_me = posix_acl((acls.USER, 7, 1001), (acls.MASK, 7, 0))  # the user's own uid: harmless
    assert acls.posix_grants(acls.parse_posix_acl(to_me), mine) == []


def test_the_owning_group_and_others_count_too() -> None:
    entries = acls.parse_posix_acl(
        posix_acl((acls.USER_OBJ, 7, 0), (acls.GROUP_OBJ, 6, 0), (acls.OTHER, 2, 0))
    )
    assert acls.posix_grants(entries, frozenset({0})) == [
        "the owning group (group::rw-)",
        "every other user (other::-w-)",
    ]


def test_an_nfs4_acl_is_harmless_only_when_no_one_but_the_owner_may_write() -> None:
    write, read = 0x2 | 0x4, 0x1
    trivial = nfs4_acl(
        (0, 0, write | read, "OWNER@"), (0, 0, read, "GROUP@"), (0, 0, read, "EVERYONE@")
    )
    assert acls.nfs4_grants(acls.parse_nfs4_acl(trivial)) == []
    denied = nfs4_acl((1, 0, write, "EVERYONE@"))  # a deny entry grants nothing
    assert acls.nfs4_grants(acls.parse_nfs4_acl(denied)) == []
    shared = nfs4_acl((0, 0, read, "OWNER@"), (0, 0x40, 0x40, "lab@example.org"))
    assert acls.nfs4_grants(acls.parse_nfs4_acl(shared)) == ["lab@example.org (allow mask 0x40)"]


def test_a_torn_nfs4_acl_is_refused() -> None:
    with pytest.raises(ValueError):
        acls.parse_nfs4_acl(nfs4_acl((0, 0, 2, "EVERYONE@"))[:-6])
    with pytest.raises(ValueError):
        acls.parse_nfs4_acl(b"\x00\x00")


def test_an_nfs4_acl_that_lets_others_write_is_refused_naming_them(monkeypatch, tmp_path) -> None:
    """As on an NFSv4 mount (the kernel shows the ACL as ``system.nfs4_acl``)."""
    lab = nfs4_acl((0, 0, 0x7, "OWNER@"), (0, 0, 0x6, "EVERYONE@"))
    monkeypatch.setattr(acls.os, "listxattr", lambda path: [acls.NFS4])
    monkeypatch.setattr(acls.os, "getxattr", lambda path, name: lab)
    problem = acls.acl_problem(str(tmp_path), os.getuid())
    assert problem is not None and problem.startswith(f"{tmp_path} has an NFSv4 ACL that lets")
    assert "EVERYONE@ (allow mask 0x6)" in problem and f"nfs4_getfacl {tmp_path}" in problem
    monkeypatch.setattr(acls.os, "getxattr", lambda path, name: b"\x00\x00\x00\x09")
    assert "cannot be read here" in (acls.acl_problem(str(tmp_path), os.getuid()) or "")


def test_an_acl_of_an_unknown_kind_is_not_taken_as_harmless(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(acls.os, "listxattr", lambda path: ["system.nfs4_acl_xdr"])
    problem = acls.acl_problem(str(tmp_path), os.getuid()) or ""
    assert "cannot read (system.nfs4_acl_xdr)" in problem


# ----------------------------------------------------------------------- real ACLs (setfacl)


def setfacl(*argv: str) -> None:
    subprocess.run([SETFACL or "setfacl", *argv], check=True, capture_output=True)


@pytest.fixture
def acl_dir(tmp_path: Path) -> Path:
    """A 0700 directory on a filesystem that keeps POSIX ACLs (skipped where none does)."""
    if SETFACL is None:
        pytest.skip("setfacl is not installed (Debian: apt-get install acl)")
    directory = tmp_path / "root"
    directory.mkdir(mode=0o700)
    try:
        setfacl("-m", f"u:{STRANGER}:r", str(directory))
        setfacl("-b", str(directory))
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"{tmp_path} keeps no ACLs here: {exc.stderr.decode().strip()}")
    return directory


def test_the_bootstrap_refuses_a_parent_that_grants_write_through_an_acl(acl_dir) -> None:
    job = acl_dir / "cluster-1"
    job.mkdir(mode=0o700)
    assert trust.path_problem(job, os.getuid()) is None
    setfacl("-m", f"u:{STRANGER}:rwx", str(acl_dir))
    assert trust.path_problem(job, os.getuid()) == (
        f"{acl_dir} grants write through an ACL to user {STRANGER} (uid {STRANGER}) "
        f"(user:{STRANGER}:rwx, mask rwx); remove it with `setfacl -b {acl_dir}`"
    )
    setfacl("-b", str(acl_dir))
    setfacl("-m", f"u:{STRANGER}:rx", str(acl_dir))  # reading and entering only: harmless
    assert trust.path_problem(job, os.getuid()) is None


def test_a_default_acl_counts_where_things_are_created(acl_dir) -> None:
    job = acl_dir / "cluster-1"
    job.mkdir(mode=0o700)
    setfacl("-d", "-m", f"g:{STRANGER}:rwx", str(acl_dir))
    assert trust.path_problem(job, os.getuid()) is None  # created before: it has no ACL
    setfacl("-d", "-m", f"g:{STRANGER}:rwx", str(job))
    problem = trust.path_problem(job, os.getuid()) or ""
    assert problem.startswith(f"{job} has a default ACL that grants write in whatever is created")
    assert f"group {STRANGER} (gid {STRANGER}) (group:{STRANGER}:rwx, mask rwx)" in problem


async def test_the_probe_refuses_a_job_dir_root_whose_parent_grants_write(acl_dir) -> None:
    root = acl_dir / "jobs"
    transport = LocalTransport()
    assert (await probe_site(transport, str(root))).job_dir_root == str(root)
    setfacl("-m", f"u:{STRANGER}:rwx", str(acl_dir))
    with pytest.raises(SpecError) as error:
        await probe_site(transport, str(root))
    assert error.value.field == "job_dir_root"
    assert f"{acl_dir} grants write through an ACL to user {STRANGER}" in str(error.value)
    assert f"setfacl -b {acl_dir}" in str(error.value)


async def test_the_probe_checks_the_packs_dir_and_a_default_acl_of_the_root(acl_dir) -> None:
    packs = acl_dir / "packs"
    packs.mkdir(mode=0o700)
    setfacl("-m", f"u:{STRANGER}:rwx", str(packs))
    with pytest.raises(SpecError, match=f"{packs} grants write through an ACL"):
        await probe_site(LocalTransport(), str(acl_dir))
    setfacl("-b", str(packs))
    setfacl("-d", "-m", f"u:{STRANGER}:rwx", str(acl_dir))  # every new job dir would get it
    with pytest.raises(SpecError, match=f"{acl_dir} has a default ACL"):
        await probe_site(LocalTransport(), str(acl_dir))


async def test_without_python3_the_probe_refuses_any_acl(acl_dir, tmp_path, monkeypatch) -> None:
    """A login node without python3: an ACL that ls shows (+) cannot be judged: refused."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "realpath", "id", "dirname", "ls", "stat", "env", "printf"):
        (bin_dir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    monkeypatch.setenv("PATH", str(bin_dir))
    assert (await probe_site(LocalTransport(), str(acl_dir))).job_dir_root == str(acl_dir)
    setfacl("-m", f"u:{STRANGER}:r", str(acl_dir))
    with pytest.raises(SpecError, match=r"has an ACL \(ls -ld shows \+\) and no python3"):
        await probe_site(LocalTransport(), str(acl_dir))


# ----------------------------------------------------------------------- sbatch's stdin

CAPTURING_SBATCH = """#!/bin/sh
cat > "$(dirname "$0")/sbatch-stdin"
echo "$#" > "$(dirname "$0")/sbatch-arguments"
echo 4343
"""


async def test_the_job_script_reaches_sbatch_on_its_stdin(tmp_path, monkeypatch) -> None:
    """The package's submit program runs for real: sbatch gets the text, no path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(CAPTURING_SBATCH)
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    script = "#!/bin/bash\n#SBATCH --time=5\nexec true\n"
    assert await SlurmClient(LocalTransport()).submit(script) == "4343"
    assert (bin_dir / "sbatch-stdin").read_text() == script
    assert (bin_dir / "sbatch-arguments").read_text() == "1\n"  # --parsable only
    kept = tmp_path / "workers.sbatch"  # a path (worker jobs): read through the same stdin
    kept.write_text(script.replace("true", "false"))
    assert await SlurmClient(LocalTransport()).submit(str(kept)) == "4343"
    assert (bin_dir / "sbatch-stdin").read_text() == kept.read_text()
