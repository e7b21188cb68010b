"""Who else may write to a directory through an ACL: POSIX ACLs and NFSv4 ACLs, read from the
directory's extended attributes and judged here (no ``getfacl`` needed).

Standard library only, Python >= 3.7 (the login node's ``python3`` runs it too): the bootstrap
imports it (``trust.py``), and the client's check of the job dir root runs this file as a
program, ``python3 -I -S -c SOURCE PATH...`` (``jobdir.probe_site``): exit status 6 and the
problem on stderr when a directory on a PATH grants someone else write.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
import struct
import sys
from typing import NamedTuple

POSIX_ACCESS = "system.posix_acl_access"
POSIX_DEFAULT = "system.posix_acl_default"  # directories: copied to what is created inside
NFS4 = "system.nfs4_acl"
KNOWN = (POSIX_ACCESS, POSIX_DEFAULT, NFS4)
# listxattr's errors for "this filesystem keeps no extended attributes": no ACL there.
NO_XATTRS = frozenset({errno.ENOTSUP, errno.EOPNOTSUPP})
UNTRUSTED_EXIT = 6

POSIX_ACL_VERSION = 2
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
TAG_NAMES = {USER_OBJ: "user", USER: "user", GROUP_OBJ: "group", GROUP: "group",
             MASK: "mask", OTHER: "other"}  # fmt: skip
READ, WRITE, EXECUTE = 4, 2, 1

NFS4_ALLOW = 0
# The access bits that change a directory's content, names or permissions (RFC 7530 6.2.1):
# WRITE_DATA/ADD_FILE, APPEND_DATA/ADD_SUBDIRECTORY, DELETE_CHILD, DELETE, WRITE_ACL, WRITE_OWNER.
NFS4_WRITE_BITS = 0x2 | 0x4 | 0x40 | 0x10000 | 0x40000 | 0x80000
NFS4_OWNER = "OWNER@"


class AclEntry(NamedTuple):
    """One entry of a POSIX ACL: its tag (USER, GROUP, ...), rwx bits and, for USER and
    GROUP, the uid or gid it names."""

    tag: int
    perm: int
    id: int | None


class Nfs4Ace(NamedTuple):
    """One access control entry of an NFSv4 ACL."""

    type: int
    flag: int
    mask: int
    who: str


def parse_posix_acl(data: bytes) -> list[AclEntry]:
    """The entries of a ``system.posix_acl_*`` attribute: a little-endian u32 version (2),
    then 8 bytes per entry (u16 tag, u16 perm, u32 id); ValueError when it is not one."""
    if len(data) < 4 or (len(data) - 4) % 8:
        raise ValueError(f"{len(data)} bytes are not a POSIX ACL")
    (version,) = struct.unpack_from("<I", data)
    if version != POSIX_ACL_VERSION:
        raise ValueError(f"POSIX ACL version {version}, not {POSIX_ACL_VERSION}")
    entries = []
    for offset in range(4, len(data), 8):
        tag, perm, ident = struct.unpack_from("<HHI", data, offset)
        if tag not in TAG_NAMES:
            raise ValueError(f"unknown POSIX ACL tag {tag:#x}")
        entries.append(AclEntry(tag, perm & 7, ident if tag in (USER, GROUP) else None))
    return entries


def parse_nfs4_acl(data: bytes) -> list[Nfs4Ace]:
    """The entries of a ``system.nfs4_acl`` attribute (XDR, big-endian): a u32 count, then per
    entry u32 type, flag and access mask and the principal (u32 length, bytes padded to 4)."""
    try:
        (count,) = struct.unpack_from(">I", data)
        offset, aces = 4, []
        for _ in range(count):
            kind, flag, mask, length = struct.unpack_from(">IIII", data, offset)
            offset += 16
            if offset + length > len(data):
                raise ValueError("a principal runs past the end")
            who = data[offset : offset + length].decode("utf-8", "replace")
            offset += (length + 3) // 4 * 4
            aces.append(Nfs4Ace(kind, flag, mask, who))
    except struct.error as exc:
        raise ValueError(f"not an NFSv4 ACL: {exc}") from None
    return aces


def posix_grants(entries: list[AclEntry], trusted: frozenset[int]) -> list[str]:
    """Who, besides the owner and the ``trusted`` uids, may write through these entries
    (the mask applied as the kernel does), each as ``who (entry)``."""
    mask = next((e.perm for e in entries if e.tag == MASK), None)
    found = []
    for entry in entries:
        limit = mask if entry.tag in (USER, GROUP_OBJ, GROUP) else None
        effective = entry.perm if limit is None else entry.perm & limit
        if entry.tag in (USER_OBJ, MASK) or not effective & WRITE:
            continue
        if entry.tag == USER and entry.id in trusted:
            continue
        shown = _entry_text(entry) + ("" if limit is None else f", mask {_perm_text(limit)}")
        found.append(f"{_who(entry)} ({shown})")
    return found


def nfs4_grants(aces: list[Nfs4Ace]) -> list[str]:
    """Who, besides the owner, an NFSv4 ACL may let write: every ALLOW entry with a write
    bit for another principal (deny entries and their order are not relied on)."""
    return [
        f"{ace.who} (allow mask {ace.mask:#x})"
        for ace in aces
        if ace.type == NFS4_ALLOW and ace.mask & NFS4_WRITE_BITS and ace.who != NFS4_OWNER
    ]


def acl_problem(path: str, uid: int, *, created_here: bool = False) -> str | None:
    """Why an ACL on the directory ``path`` lets someone other than ``uid`` (or root) write
    there, or None. ``created_here``: also its default ACL (what new files and directories
    inside get). A root-owned sticky directory (like /tmp) may grant write, as its mode may."""
    try:
        info = os.stat(path)
        names = set(os.listxattr(path))
    except OSError as exc:
        if getattr(exc, "errno", None) in NO_XATTRS:
            return None
        return f"{path} cannot be checked for ACLs: {exc.strerror or exc}"
    sticky_root = info.st_uid == 0 and info.st_mode & stat.S_ISVTX
    trusted = frozenset({uid, 0})
    fix = f"remove it with `setfacl -b {path}`"
    try:
        access = _posix_grants(path, POSIX_ACCESS, names, trusted)
        default = _posix_grants(path, POSIX_DEFAULT, names, trusted) if created_here else []
    except (OSError, ValueError) as exc:
        return f"{path} has a POSIX ACL that cannot be read here ({exc}); {fix}"
    if access and not sticky_root:
        return f"{path} grants write through an ACL to {_listed(access)}; {fix}"
    if default:
        return (
            f"{path} has a default ACL that grants write in whatever is created there to "
            f"{_listed(default)}; {fix}"
        )
    if NFS4 in names and not sticky_root:
        return _nfs4_problem(path)
    unknown = sorted(n for n in names if n.startswith("system.") and "acl" in n and n not in KNOWN)
    if unknown:
        return (
            f"{path} has an ACL of a kind this check cannot read ({', '.join(unknown)}), so who "
            "may write there is not known; use a directory without one"
        )
    return None


def tree_problem(path: str, uid: int) -> str | None:
    """The first ACL problem of ``path`` (its default ACL too) or one of its parents."""
    directory = os.path.abspath(path)
    created_here = True
    while True:
        problem = acl_problem(directory, uid, created_here=created_here)
        if problem or directory == "/":
            return problem
        directory, created_here = os.path.dirname(directory), False


def _nfs4_problem(path: str) -> str | None:
    try:
        grants = nfs4_grants(parse_nfs4_acl(os.getxattr(path, NFS4)))
    except (OSError, ValueError) as exc:
        return (
            f"{path} has an NFSv4 ACL that cannot be read here ({exc}), so who may write there "
            f"is not known; check it with `nfs4_getfacl {path}`"
        )
    if not grants:
        return None
    return (
        f"{path} has an NFSv4 ACL that lets {_listed(grants)} write there; remove those entries "
        f"(`nfs4_getfacl {path}`, then `nfs4_setfacl -x ENTRY {path}`)"
    )


def _posix_grants(path: str, name: str, names: set[str], trusted: frozenset[int]) -> list[str]:
    """The write grants of the POSIX ACL ``name`` of ``path`` (none when it has none)."""
    if name not in names:
        return []
    try:
        data = os.getxattr(path, name)
    except OSError as exc:
        if exc.errno == errno.ENODATA:  # removed since it was listed
            return []
        raise
    return posix_grants(parse_posix_acl(data), trusted)


def _who(entry: AclEntry) -> str:
    if entry.tag == USER:
        return f"user {_name(pwd.getpwuid, entry.id)} (uid {entry.id})"
    if entry.tag == GROUP:
        return f"group {_name(grp.getgrgid, entry.id)} (gid {entry.id})"
    if entry.tag == GROUP_OBJ:
        return "the owning group"
    return "every other user"


def _name(lookup: object, ident: int | None) -> str:
    try:
        return str(lookup(ident)[0])  # type: ignore[operator]
    except (KeyError, TypeError, OverflowError):
        return str(ident)


def _entry_text(entry: AclEntry) -> str:
    """The entry as getfacl writes it: ``user:bob:rwx``, ``group::rw-``, ``other::rwx``."""
    qualifier = ""
    if entry.tag == USER:
        qualifier = _name(pwd.getpwuid, entry.id)
    elif entry.tag == GROUP:
        qualifier = _name(grp.getgrgid, entry.id)
    return f"{TAG_NAMES[entry.tag]}:{qualifier}:{_perm_text(entry.perm)}"


def _perm_text(perm: int) -> str:
    return "".join(
        c if perm & bit else "-" for c, bit in (("r", READ), ("w", WRITE), ("x", EXECUTE))
    )


def _listed(grants: list[str]) -> str:
    return ", ".join(grants)


def main(paths: list[str]) -> int:
    """The program: 0 when no directory on any of ``paths`` grants write to another user
    through an ACL, else UNTRUSTED_EXIT with the problem on stderr."""
    for path in paths:
        problem = tree_problem(path, os.getuid())
        if problem:
            print(problem, file=sys.stderr)
            return UNTRUSTED_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
