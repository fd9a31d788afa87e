"""Keep only one GPU architecture's code in a CUDA extension's fat binaries (used by `harness.gpu.bundle`).

vLLM's CUDA wheels carry, in each extension's `.nv_fatbin` section, device code for every GPU generation they
support; the GPU machine has one (sm_90: H100/H200) and a call carries at most 64 MiB. A fat binary is a run of
containers (a 16-byte header: magic, version, header size, size of what follows) each holding entries (an entry
header: kind 1 = PTX or 2 = ELF/SASS, its own header size, payload size, the architecture at byte 28, flags at
byte 40). `prune` zeroes the payload of every entry that GPU cannot run, in place: headers, offsets and the file's
layout stay as they were, so the dynamic loader and the CUDA runtime read the file as before and pick the entry
they always picked; the zeros compress away. Kept: ELF entries for the architecture, and PTX for an architecture
at or below it only in a container with no ELF entry for it (the runtime would compile that PTX).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0xBA55ED50
PTX, ELF = 1, 2


@dataclass(frozen=True)
class Entry:
    kind: int
    arch: int
    payload_at: int
    payload_size: int


def _fatbin_section(buf: bytes | bytearray) -> tuple[int, int] | None:
    """(offset, size) of the ELF64 `.nv_fatbin` section, or None when the file has none."""
    if buf[:4] != b"\x7fELF" or buf[4] != 2:
        return None
    (shoff,) = struct.unpack_from("<Q", buf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", buf, 0x3A)
    if not shoff or shstrndx >= shnum:
        return None

    def section(i: int) -> tuple[int, int, int]:
        name, _type, _flags, _addr, offset, size = struct.unpack_from("<IIQQQQ", buf, shoff + i * shentsize)
        return name, offset, size

    _n, names_at, _s = section(shstrndx)
    for i in range(shnum):
        name, offset, size = section(i)
        end = buf.index(b"\0", names_at + name)
        if bytes(buf[names_at + name : end]) == b".nv_fatbin":
            return offset, size
    return None


def containers(buf: bytes | bytearray) -> list[list[Entry]]:
    """The entries of each fat-binary container in the file's `.nv_fatbin` section."""
    found = _fatbin_section(buf)
    if found is None:
        return []
    pos, end = found[0], found[0] + found[1]
    out: list[list[Entry]] = []
    while pos + 16 <= end:
        magic, _version, header_size, body_size = struct.unpack_from("<IHHQ", buf, pos)
        if magic != MAGIC:  # containers are 8-byte aligned; the gaps are padding
            pos += 8
            continue
        entries: list[Entry] = []
        at, stop = pos + header_size, pos + header_size + body_size
        while at < stop:
            kind, _v, entry_header, payload = struct.unpack_from("<HHIQ", buf, at)
            (arch,) = struct.unpack_from("<I", buf, at + 28)
            if entry_header == 0:
                break
            entries.append(Entry(kind, arch, at + entry_header, payload))
            at += entry_header + payload
        out.append(entries)
        pos = stop
    return out


def keep(entries: list[Entry], arch: int) -> set[Entry]:
    """The entries a GPU of `arch` can use (see the module's docstring)."""
    sass = {e for e in entries if e.kind == ELF and e.arch == arch}
    if sass:
        return sass
    return {e for e in entries if e.kind == PTX and e.arch <= arch}


def prune(path: Path, arch: int = 90) -> tuple[int, int]:
    """Zero the unusable entries of `path` in place; (bytes zeroed, entries kept). A file without fat binaries is
    left as it is."""
    buf = bytearray(path.read_bytes())
    zeroed = kept = 0
    for entries in containers(buf):
        usable = keep(entries, arch)
        kept += len(usable)
        for e in entries:
            if e not in usable:
                buf[e.payload_at : e.payload_at + e.payload_size] = bytes(e.payload_size)
                zeroed += e.payload_size
    if zeroed:
        path.write_bytes(bytes(buf))
    return zeroed, kept
