"""Each testbed node's view of this machine's cores, for slurmd (HWLOC_XMLFILE).

Every node of the testbed runs on the same few cores. Under ConstrainCores each slurmd gives a
job the first free core of its own list, so with the machine's own order every node's first
1-CPU job (a Ray head, most often) lands on CPU 0 while the other CPUs idle. Node I is given
the machine's topology with its PUs' OS indexes rotated by I-1: abstract core 0 of node 2 is
CPU 1, and so on. Only the indexes move (hwloc sorts objects by cpuset on import, so moving
whole cores would be undone); Slurm maps abstract cores to CPUs by the PUs' OS index.

Usage (the flavour's Python, where its slurmd's libhwloc is): topology.py DIR NODES
writes DIR/hwloc-nodeI.xml for every node I whose rotation is not 0.
"""

import copy
import ctypes
import ctypes.util
import os
import sys
import tempfile
import xml.etree.ElementTree as ET


def machine_topology() -> ET.ElementTree:
    """This machine's topology, exported by hwloc as slurmd would see it."""
    lib = ctypes.CDLL(ctypes.util.find_library("hwloc") or "libhwloc.so.15")
    topology = ctypes.c_void_p()
    if lib.hwloc_topology_init(ctypes.byref(topology)) != 0:
        raise SystemExit("hwloc_topology_init failed")
    try:
        if lib.hwloc_topology_load(topology) != 0:
            raise SystemExit("hwloc_topology_load failed")
        with tempfile.TemporaryDirectory() as scratch:
            path = os.path.join(scratch, "machine.xml")
            if lib.hwloc_topology_export_xml(topology, path.encode(), 0) != 0:
                raise SystemExit("hwloc_topology_export_xml failed")
            return ET.parse(path)
    finally:
        lib.hwloc_topology_destroy(topology)


def write_rotated(machine: ET.ElementTree, shift: int, path: str) -> None:
    """The machine's topology with its PUs' OS indexes rotated by ``shift``, atomically."""
    rotated = copy.deepcopy(machine)
    pus = [obj for obj in rotated.iter("object") if obj.get("type") == "PU"]
    indexes = [pu.get("os_index") for pu in pus]
    for pu, index in zip(pus, indexes[shift:] + indexes[:shift], strict=True):
        pu.set("os_index", str(index))
    rotated.write(path + ".new", xml_declaration=True, encoding="UTF-8")
    os.chmod(path + ".new", 0o644)
    os.replace(path + ".new", path)


def main(directory: str, nodes: int) -> None:
    machine = machine_topology()
    cpus = sum(1 for obj in machine.iter("object") if obj.get("type") == "PU")
    for node in range(2, nodes + 1):
        shift = (node - 1) % cpus
        if shift:
            write_rotated(machine, shift, os.path.join(directory, f"hwloc-node{node}.xml"))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
