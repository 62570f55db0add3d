"""The decoded Wasm module: plain records of every section, as the binary has them.

Function, table, memory and global index spaces count imports first, as in Wasm; the
helpers here answer "what type has function i" without callers redoing that arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tensorwasm.compiler.frontend.opcodes import Opcode
from tensorwasm.dialect.ir import FuncSig
from tensorwasm.dialect.types import Type

if TYPE_CHECKING:
    from tensorwasm.compiler.errors import DecodeError


class Instr:
    """One decoded instruction.

    ``imm`` holds its immediates (an int, a tuple, or None); ``offset`` is its byte offset in
    the module; ``match`` is, for ``block``/``loop``/``if``, the index of its ``end``.
    """

    __slots__ = ("imm", "match", "offset", "op")

    def __init__(self, op: Opcode, imm, offset: int):
        self.op = op
        self.imm = imm
        self.offset = offset
        self.match = -1

    def __repr__(self) -> str:
        return f"<{self.op.name} {self.imm!r} @0x{self.offset:x}>"


@dataclass(frozen=True)
class Limits:
    min: int
    max: int | None


@dataclass(frozen=True)
class TableType:
    elem: Type
    limits: Limits


@dataclass(frozen=True)
class GlobalType:
    type: Type
    mutable: bool


@dataclass
class Import:
    module: str
    name: str
    kind: str  # "func", "table", "memory", "global"
    desc: int | TableType | Limits | GlobalType  # a type index for functions


@dataclass
class Global:
    type: GlobalType
    init: list[Instr]


@dataclass
class Export:
    name: str
    kind: str
    index: int


@dataclass
class ElementSegment:
    """``mode`` is "active", "passive" or "declarative"; ``items`` are constant expressions."""

    mode: str
    type: Type
    items: list[list[Instr]]
    table: int = 0
    offset_expr: list[Instr] | None = None


@dataclass
class DataSegment:
    mode: str  # "active" or "passive"
    data: bytes
    memory: int = 0
    offset_expr: list[Instr] | None = None


@dataclass
class BodyParts:
    """What reading a function body gives: its locals and instructions, what keeps it from
    translation (None: nothing), and whether every instruction could be read (else
    ``instrs`` is empty)."""

    locals: list[Type | None]
    instrs: list[Instr]
    unsupported: DecodeError | None = None
    readable: bool = True


class Code:
    """A function body: declared locals (beyond the parameters) and instructions.

    ``offset`` and ``size`` delimit it in the module (after its size field). A body
    decoded lazily (:meth:`deferred`) is read at the first use of ``locals``, ``body``,
    ``unsupported`` or ``readable``; a strict read raises its errors there.
    """

    __slots__ = ("_parts", "_read", "func_index", "offset", "size")

    def __init__(self, locals_: list[Type], body: list[Instr], offset: int, size: int):
        self.offset = offset
        self.size = size
        self.func_index: int | None = None
        self._parts: BodyParts | None = BodyParts(locals_, body)
        self._read: Callable[[Code], BodyParts] | None = None

    @classmethod
    def deferred(cls, offset: int, size: int, func_index: int, read: Callable[[Code], BodyParts]) -> Code:
        """A body that ``read`` decodes when it is first needed."""
        code = cls.__new__(cls)
        code.offset, code.size, code.func_index = offset, size, func_index
        code._parts, code._read = None, read
        return code

    def load(self) -> BodyParts:
        """The decoded body (decoded now if it was not)."""
        if self._parts is None:
            self._parts = self._read(self)
            self._read = None
        return self._parts

    @property
    def locals(self) -> list[Type]:
        return self.load().locals  # type: ignore[return-value]  # (None only where unsupported)

    @property
    def body(self) -> list[Instr]:
        return self.load().instrs

    @property
    def unsupported(self) -> DecodeError | None:
        """Why the function cannot be translated (read leniently), or None."""
        return self.load().unsupported

    @property
    def readable(self) -> bool:
        """Whether its instructions could all be read (so the rewriter can copy them)."""
        return self.load().readable


@dataclass
class CustomSection:
    name: str
    data: bytes
    offset: int


@dataclass
class WasmModule:
    types: list[FuncSig] = field(default_factory=list)
    imports: list[Import] = field(default_factory=list)
    funcs: list[int] = field(default_factory=list)  # type index of each defined function
    tables: list[TableType] = field(default_factory=list)
    memories: list[Limits] = field(default_factory=list)
    globals: list[Global] = field(default_factory=list)
    exports: list[Export] = field(default_factory=list)
    start: int | None = None
    elements: list[ElementSegment] = field(default_factory=list)
    data_count: int | None = None
    codes: list[Code] = field(default_factory=list)
    data: list[DataSegment] = field(default_factory=list)
    customs: list[CustomSection] = field(default_factory=list)
    func_names: dict[int, str] = field(default_factory=dict)
    size: int = 0
    raw: bytes = b""
    # (section id, payload start, payload end), in the order of the binary.
    sections: list[tuple[int, int, int]] = field(default_factory=list)
    # Decoded with ``degrade``: what keeps the whole module from offload (it runs on
    # wasmtime as it is); the sections from the one it is in on were not decoded.
    blocked: DecodeError | None = None

    def untranslatable(self) -> dict[int, DecodeError]:
        """The defined functions the compiler cannot translate, by index, with the reason
        (only a module decoded with ``degrade`` has any)."""
        first = self.num_imported_funcs
        return {
            first + n: code.unsupported for n, code in enumerate(self.codes) if code.unsupported is not None
        }

    def offload_blocker(self) -> DecodeError | None:
        """What keeps every loop of the module from offload: a module-level use of a
        proposal, or a body the rewriter cannot carry through (it renumbers every call)."""
        if self.blocked is not None:
            return self.blocked
        return next((code.unsupported for code in self.codes if not code.readable), None)

    def imported(self, kind: str) -> list[Import]:
        return [imp for imp in self.imports if imp.kind == kind]

    @property
    def num_imported_funcs(self) -> int:
        return sum(1 for imp in self.imports if imp.kind == "func")

    @property
    def num_funcs(self) -> int:
        return self.num_imported_funcs + len(self.funcs)

    def func_type_index(self, index: int) -> int:
        imported = self.imported("func")
        if index < len(imported):
            return imported[index].desc  # type: ignore[return-value]
        return self.funcs[index - len(imported)]

    def func_sig(self, index: int) -> FuncSig:
        return self.types[self.func_type_index(index)]

    def global_types(self) -> list[GlobalType]:
        return [imp.desc for imp in self.imported("global")] + [g.type for g in self.globals]  # type: ignore[misc]

    def table_types(self) -> list[TableType]:
        return [imp.desc for imp in self.imported("table")] + list(self.tables)  # type: ignore[misc]

    def memory_limits(self) -> list[Limits]:
        return [imp.desc for imp in self.imported("memory")] + list(self.memories)  # type: ignore[misc]

    def func_name(self, index: int) -> str:
        """A readable name: the debug name, else the first export name, else ``f<index>``."""
        name = self.func_names.get(index)
        if name:
            return name
        exported = self.__dict__.get("_first_export")
        if exported is None or exported[0] != len(self.exports):
            # Each function's first export name, made once (and again if exports were added).
            names: dict[int, str] = {}
            for export in self.exports:
                if export.kind == "func":
                    names.setdefault(export.index, export.name)
            exported = self.__dict__["_first_export"] = (len(self.exports), names)
        return exported[1].get(index, f"f{index}")

    def export_names(self, kind: str, index: int) -> list[str]:
        return [e.name for e in self.exports if e.kind == kind and e.index == index]
