"""Reads what a symbol check needs from a 64-bit Mach-O dylib and from Apple's .tbd text stubs. Standard library only.

- ``read_macho(path)``: CPU type, load commands (dylibs in ordinal order, install name, rpaths, minimum OS, code
  signature), the binds (symbol -> library ordinal) from the dyld info opcodes or the chained-fixups import table,
  and the export trie (with re-exports: ordinal and the name in the other library).
- ``read_tbd(path)``: every document of a tbd v4 stub for arm64-macos: install name, re-exported libraries, exports.
Formats: <mach-o/loader.h> and <mach-o/fixup-chains.h> of Apple's cctools/dyld (Apple Public Source License).
"""

from __future__ import annotations

import dataclasses
import re
import struct

MH_MAGIC_64 = 0xFEEDFACF
FAT_MAGIC = 0xCAFEBABE
CPU_TYPE_ARM64 = 0x0100000C
CPU_TYPE_X86_64 = 0x01000007
LC_REQ_DYLD = 0x80000000
LC_ID_DYLIB = 0xD
LC_LOAD_DYLIB = 0xC
LC_LOAD_WEAK_DYLIB = 0x18 | LC_REQ_DYLD
LC_REEXPORT_DYLIB = 0x1F | LC_REQ_DYLD
LC_LAZY_LOAD_DYLIB = 0x20
LC_LOAD_UPWARD_DYLIB = 0x23 | LC_REQ_DYLD
DYLIB_LOAD_COMMANDS = (LC_LOAD_DYLIB, LC_LOAD_WEAK_DYLIB, LC_REEXPORT_DYLIB, LC_LAZY_LOAD_DYLIB, LC_LOAD_UPWARD_DYLIB)
LC_RPATH = 0x1C | LC_REQ_DYLD
LC_CODE_SIGNATURE = 0x1D
LC_DYLD_INFO = 0x22
LC_DYLD_INFO_ONLY = 0x22 | LC_REQ_DYLD
LC_BUILD_VERSION = 0x32
LC_VERSION_MIN_MACOSX = 0x24
LC_DYLD_EXPORTS_TRIE = 0x33 | LC_REQ_DYLD
LC_DYLD_CHAINED_FIXUPS = 0x34 | LC_REQ_DYLD
PLATFORM_MACOS = 1
EXPORT_SYMBOL_FLAGS_REEXPORT = 0x08
EXPORT_SYMBOL_FLAGS_STUB_AND_RESOLVER = 0x10
# Special library ordinals of a bind: not a library of the load commands.
ORDINAL_SELF, ORDINAL_MAIN_EXECUTABLE, ORDINAL_FLAT_LOOKUP, ORDINAL_WEAK_LOOKUP = 0, -1, -2, -3


class MachOError(ValueError):
    """The file is not a Mach-O image this reader understands."""


@dataclasses.dataclass(frozen=True)
class Bind:
    symbol: str
    ordinal: int  # 1-based index into Image.dylibs, or one of the ORDINAL_* values
    weak_import: bool
    table: str  # "bind", "lazy_bind", "weak_bind" or "chained"


@dataclasses.dataclass
class Export:
    flags: int
    reexport_ordinal: int = 0  # EXPORT_SYMBOL_FLAGS_REEXPORT: the library (1-based) and the name it has there
    reexport_name: str = ""


@dataclasses.dataclass
class Image:
    path: str
    cputype: int
    filetype: int
    install_name: str | None
    dylibs: list  # install names, in load-command (= ordinal) order
    reexported_dylibs: list
    rpaths: list
    minos: str | None
    sdk: str | None
    has_code_signature: bool
    binds: list
    exports: dict  # name -> Export


def _version(v: int) -> str:
    major, minor, patch = v >> 16, (v >> 8) & 0xFF, v & 0xFF
    return f"{major}.{minor}" + (f".{patch}" if patch else "")


def _leb128(data: bytes, pos: int, signed: bool = False):
    """(value, next position) of the LEB128 number at `pos` (signed: sign-extended from its last byte's bit 6)."""
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            if signed and b & 0x40:
                result -= 1 << shift
            return result, pos


def _uleb(data: bytes, pos: int):
    return _leb128(data, pos)


def _sleb(data: bytes, pos: int):
    return _leb128(data, pos, signed=True)


def _cstring(data: bytes, pos: int):
    end = data.index(b"\0", pos)
    return data[pos:end].decode("utf-8", "replace"), end + 1


def _thin_slice(data: bytes, cputype: int):
    """The arm64 (or cputype) slice of a universal file, or data itself."""
    if struct.unpack_from(">I", data, 0)[0] != FAT_MAGIC:
        return data
    (n,) = struct.unpack_from(">I", data, 4)
    for i in range(n):
        ctype, _, offset, size, _ = struct.unpack_from(">iiIII", data, 8 + 20 * i)
        if ctype & 0xFFFFFFFF == cputype:
            return data[offset:offset + size]
    raise MachOError("universal file without a slice of CPU type 0x%x" % cputype)


def parse_binds(data: bytes, table: str) -> list:
    """The (symbol, ordinal) binds of one dyld-info opcode stream (bind, weak_bind or lazy_bind)."""
    binds, pos, ordinal, symbol, flags = [], 0, 0, "", 0
    while pos < len(data):
        byte = data[pos]
        pos += 1
        op, imm = byte & 0xF0, byte & 0x0F
        if op == 0x00:  # DONE (lazy binds: the end of one entry)
            if table != "lazy_bind":
                break
        elif op == 0x10:  # SET_DYLIB_ORDINAL_IMM
            ordinal = imm
        elif op == 0x20:  # SET_DYLIB_ORDINAL_ULEB
            ordinal, pos = _uleb(data, pos)
        elif op == 0x30:  # SET_DYLIB_SPECIAL_IMM: 0, -1, -2, -3 (sign-extended)
            ordinal = 0 if imm == 0 else (imm | 0xF0) - 0x100
        elif op == 0x40:  # SET_SYMBOL_TRAILING_FLAGS_IMM
            flags = imm
            symbol, pos = _cstring(data, pos)
        elif op == 0x50:  # SET_TYPE_IMM
            pass
        elif op == 0x60:  # SET_ADDEND_SLEB
            _, pos = _sleb(data, pos)
        elif op in (0x70, 0x80):  # SET_SEGMENT_AND_OFFSET_ULEB, ADD_ADDR_ULEB
            _, pos = _uleb(data, pos)
        elif op in (0x90, 0xA0, 0xB0, 0xC0):  # DO_BIND, ..._ADD_ADDR_ULEB, ..._IMM_SCALED, ..._ULEB_TIMES_SKIPPING
            if op == 0xA0:
                _, pos = _uleb(data, pos)
            elif op == 0xC0:
                _, pos = _uleb(data, pos)
                _, pos = _uleb(data, pos)
            binds.append(Bind(symbol, ordinal, bool(flags & 0x1), table))
        elif op == 0xD0:  # THREADED: SET_BIND_ORDINAL_TABLE_SIZE_ULEB (imm 0) or APPLY (imm 1)
            if imm == 0:
                _, pos = _uleb(data, pos)
        else:
            raise MachOError(f"unknown bind opcode 0x{byte:02x} in {table}")
    return binds


def parse_chained_imports(data: bytes) -> list:
    """The binds of an LC_DYLD_CHAINED_FIXUPS payload: its import table (DYLD_CHAINED_IMPORT{,_ADDEND,_ADDEND64})."""
    _, _, _, imports_offset, symbols_offset, imports_count, imports_format, _ = struct.unpack_from("<8I", data, 0)
    binds = []
    for i in range(imports_count):
        if imports_format == 1:  # DYLD_CHAINED_IMPORT: lib_ordinal:8 weak_import:1 name_offset:23
            (raw,) = struct.unpack_from("<I", data, imports_offset + 4 * i)
            ordinal, weak, name_off = raw & 0xFF, (raw >> 8) & 1, raw >> 9
            ordinal = ordinal - 0x100 if ordinal > 0xF0 else ordinal
        elif imports_format == 2:  # ..._ADDEND: the same word and an int32 addend
            (raw,) = struct.unpack_from("<I", data, imports_offset + 8 * i)
            ordinal, weak, name_off = raw & 0xFF, (raw >> 8) & 1, raw >> 9
            ordinal = ordinal - 0x100 if ordinal > 0xF0 else ordinal
        elif imports_format == 3:  # ..._ADDEND64: lib_ordinal:16 weak_import:1 reserved:15 name_offset:32, addend
            (raw,) = struct.unpack_from("<Q", data, imports_offset + 16 * i)
            ordinal, weak, name_off = raw & 0xFFFF, (raw >> 16) & 1, raw >> 32
            ordinal = ordinal - 0x10000 if ordinal > 0xFFF0 else ordinal
        else:
            raise MachOError(f"unknown chained imports format {imports_format}")
        name, _ = _cstring(data, symbols_offset + name_off)
        binds.append(Bind(name, ordinal, bool(weak), "chained"))
    return binds


def parse_export_trie(data: bytes) -> dict:
    """name -> Export of an export trie (iterative walk; each node: terminal info, then edges)."""
    exports, stack, seen = {}, [(0, "")], set()
    while stack:
        node, prefix = stack.pop()
        if node in seen or node >= len(data):
            raise MachOError("malformed export trie (a loop or an edge past its end)")
        seen.add(node)
        size, pos = _uleb(data, node)
        if size:
            flags, p = _uleb(data, pos)
            if flags & EXPORT_SYMBOL_FLAGS_REEXPORT:
                ordinal, p = _uleb(data, p)
                name, p = _cstring(data, p)
                exports[prefix] = Export(flags, ordinal, name or prefix)
            else:
                exports[prefix] = Export(flags)
        pos += size
        count = data[pos]
        pos += 1
        for _ in range(count):
            edge, pos = _cstring(data, pos)
            child, pos = _uleb(data, pos)
            stack.append((child, prefix + edge))
    return exports


def read_macho(path: str, cputype: int = CPU_TYPE_ARM64) -> Image:
    with open(path, "rb") as f:
        data = _thin_slice(f.read(), cputype)
    if len(data) < 32 or struct.unpack_from("<I", data, 0)[0] != MH_MAGIC_64:
        raise MachOError(f"{path}: not a 64-bit little-endian Mach-O file")
    _, ctype, _, filetype, ncmds, _, _, _ = struct.unpack_from("<IiiIIIII", data, 0)
    img = Image(path, ctype & 0xFFFFFFFF, filetype, None, [], [], [], None, None, False, [], {})
    pos = 32
    for _ in range(ncmds):
        cmd, cmdsize = struct.unpack_from("<II", data, pos)

        def lc_str(field_offset):
            (off,) = struct.unpack_from("<I", data, pos + field_offset)
            return _cstring(data[:pos + cmdsize], pos + off)[0]

        if cmd in DYLIB_LOAD_COMMANDS:
            img.dylibs.append(lc_str(8))
            if cmd == LC_REEXPORT_DYLIB:
                img.reexported_dylibs.append(img.dylibs[-1])
        elif cmd == LC_ID_DYLIB:
            img.install_name = lc_str(8)
        elif cmd == LC_RPATH:
            img.rpaths.append(lc_str(8))
        elif cmd == LC_CODE_SIGNATURE:
            img.has_code_signature = True
        elif cmd == LC_BUILD_VERSION:
            platform, minos, sdk = struct.unpack_from("<III", data, pos + 8)
            if platform == PLATFORM_MACOS:
                img.minos, img.sdk = _version(minos), _version(sdk)
        elif cmd == LC_VERSION_MIN_MACOSX:
            minos, sdk = struct.unpack_from("<II", data, pos + 8)
            img.minos, img.sdk = _version(minos), _version(sdk)
        elif cmd in (LC_DYLD_INFO, LC_DYLD_INFO_ONLY):
            fields = struct.unpack_from("<10I", data, pos + 8)
            for table, (off, size) in zip(("bind", "weak_bind", "lazy_bind"), (fields[2:4], fields[4:6], fields[6:8])):
                if size:
                    img.binds += parse_binds(data[off:off + size], table)
            if fields[9]:
                img.exports = parse_export_trie(data[fields[8]:fields[8] + fields[9]])
        elif cmd == LC_DYLD_EXPORTS_TRIE:
            off, size = struct.unpack_from("<II", data, pos + 8)
            img.exports = parse_export_trie(data[off:off + size]) if size else {}
        elif cmd == LC_DYLD_CHAINED_FIXUPS:
            off, size = struct.unpack_from("<II", data, pos + 8)
            img.binds += parse_chained_imports(data[off:off + size])
        pos += cmdsize
    return img


# ---- .tbd text stubs (tbd-version 4) ----------------------------------------------------------------------------
@dataclasses.dataclass
class Stub:
    install_name: str
    reexported_libraries: list
    exports: set


_TOP_KEY = re.compile(r"^([A-Za-z-]+):", re.M)
_FLOW_LIST = re.compile(r"([A-Za-z-]+):\s*\[(.*?)\]", re.S)
# How a tbd lists Objective-C symbols (arm64/x86_64 macOS: the non-fragile ABI).
_OBJC_PREFIXES = {"objc-classes": ("_OBJC_CLASS_$_", "_OBJC_METACLASS_$_"), "objc-eh-types": ("_OBJC_EHTYPE_$_",),
                  "objc-ivars": ("_OBJC_IVAR_$_",)}


def _items(text: str) -> list:
    return [t.strip().strip("'\"") for t in text.split(",") if t.strip()]


def _entries(block: str):
    """The key -> list mappings of a block's "- targets: [...]  key: [...]" entries."""
    for entry in re.split(r"\n\s*-\s+", "\n" + block)[1:]:
        yield {k: _items(v) for k, v in _FLOW_LIST.findall(entry)}


def read_tbd(path: str, target: str = "arm64-macos") -> list:
    """Every document of the stub (a stub may describe a library and the libraries it re-exports) for target."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    stubs = []
    for doc in re.split(r"^--- !tapi-tbd.*$", text, flags=re.M)[1:]:
        doc = doc.split("\n...", 1)[0]
        keys = [(m.group(1), m.start(), m.end()) for m in _TOP_KEY.finditer(doc)]
        blocks = {name: doc[end:(keys[i + 1][1] if i + 1 < len(keys) else len(doc))]
                  for i, (name, _, end) in enumerate(keys)}
        install = blocks.get("install-name", "").strip().strip("'\"")
        reexported, exports = [], set()
        for entry in _entries(blocks.get("reexported-libraries", "")):
            if target in entry.get("targets", []):
                reexported += entry.get("libraries", [])
        for key in ("exports", "reexports"):
            for entry in _entries(blocks.get(key, "")):
                if target not in entry.get("targets", []):
                    continue
                for kind, names in entry.items():
                    if kind in ("symbols", "weak-symbols", "thread-local-symbols"):
                        exports.update(names)
                    elif kind in _OBJC_PREFIXES:
                        exports.update(p + n for n in names for p in _OBJC_PREFIXES[kind])
        if not install:
            raise MachOError(f"{path}: a tbd document without install-name")
        stubs.append(Stub(install, reexported, exports))
    if not stubs:
        raise MachOError(f"{path}: no tbd v4 document")
    return stubs
