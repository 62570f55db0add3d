"""The wasmtime reference backend: whole-function calls, bit for bit.

Every other backend is compared against this one, so it must not lose a bit. wasmtime-py's
``Func.__call__`` converts f32/f64 through Python floats, and that trip quiets signalling
NaNs (f32 0x7fa00000 comes back as 0x7fe00000). Here arguments and results go through
wasmtime's C API instead: a ``wasmtime_val_t`` is a kind tag and a union, so writing the
bit pattern to the union's ``i32``/``i64`` member while the tag says f32/f64 hands wasmtime
the exact bits, and reading that member back returns them. Globals are read the same way.

Signatures come from the binary, not from wasmtime: its C API aborts the whole process
when asked the kind of a v128 or typed-reference value type. A v128 value itself crosses
the C API as its 16 bytes (kind ``WASMTIME_V128``), so v128 arguments, results, globals
and global imports are carried, with their exact bits; exports and imports of typed
references are refused (as an error result) before wasmtime is asked anything about them.

Imports are satisfied with stubs, so any module can be instantiated on its own: a global
gets zero of its type, a memory or table a fresh one of the declared type and limits, and a
function a host function that refuses to run. Calling into such a stub gives a
``CallResult`` with ``error`` set (not a trap: Wasm semantics say nothing about what the
import would have done, so there is no reference result to compare with).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import wasmtime
from wasmtime import _ffi as ffi
from wasmtime._func import enter_wasm

from tensorwasm.dialect.types import EXTERNREF, F32, F64, FUNCREF, I32, I64, V128, Type
from tensorwasm.runtime.values import TRAP_MESSAGES, CallResult, WasmValue, trap_kind_from_wasmtime
from tensorwasm.support.errors import TensorWasmError

# Numeric dialect type -> (C API kind tag, the union member of the same width as the bits).
_NUMERIC_KINDS: dict[Type, tuple[int, str]] = {
    I32: (ffi.WASMTIME_I32.value, "i32"),
    I64: (ffi.WASMTIME_I64.value, "i64"),
    F32: (ffi.WASMTIME_F32.value, "i32"),
    F64: (ffi.WASMTIME_F64.value, "i64"),
}
_KIND_TYPES: dict[int, Type] = {kind: ty for ty, (kind, _) in _NUMERIC_KINDS.items()}


class ReferenceBackendError(TensorWasmError):
    """wasmtime could not compile or instantiate a module for the reference backend."""


class MissingImport(TensorWasmError):
    """A stub for a function import was called: the module needs a host the reference lacks."""


def _signed(bits: int, width: int) -> int:
    return bits - (1 << width) if bits >> (width - 1) else bits


def _trap_text(trap: wasmtime.Trap) -> str:
    """The cause of a trap without a known kind: the last "wasm trap:" line, else the first."""
    lines = [line.strip() for line in trap.message.splitlines() if line.strip()]
    causes = [line.split("wasm trap:", 1)[1].strip() for line in lines if "wasm trap:" in line]
    return causes[-1] if causes else lines[0] if lines else "trap"


class _Reader:
    """Just enough of the binary format to read signatures from a module wasmtime validated."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def byte(self) -> int:
        self.pos += 1
        return self.data[self.pos - 1]

    def uleb(self) -> int:
        result = shift = 0
        while True:
            byte = self.byte()
            result |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return result

    def name(self) -> str:
        length = self.uleb()
        self.pos += length
        return self.data[self.pos - length : self.pos].decode("utf-8")

    def valtype(self) -> Type | None:
        """A value type; None for one the reference cannot carry (typed references)."""
        code = self.byte()
        if code in (_REF, _REF_NULL):
            heap = self.byte()
            if heap & 0x80:  # a multi-byte type index (s33): a typed reference
                while self.byte() & 0x80:
                    pass
                return None
            return _VALTYPE_CODES.get(heap) if code == _REF_NULL else None
        return _VALTYPE_CODES.get(code)

    def limits(self) -> None:
        flags = self.byte()
        self.uleb()
        if flags & 0x01:
            self.uleb()
        if flags & 0x08:  # custom page size
            self.uleb()


_VALTYPE_CODES = {0x7F: I32, 0x7E: I64, 0x7D: F32, 0x7C: F64, 0x7B: V128, 0x70: FUNCREF, 0x6F: EXTERNREF}
_REF, _REF_NULL = 0x64, 0x63
_TYPE_SECTION, _IMPORT_SECTION, _FUNCTION_SECTION, _EXPORT_SECTION = 1, 2, 3, 7

Signature = tuple[tuple[Type, ...], tuple[Type, ...]] | None
"""A function's parameter and result types; None where one of them has no dialect type."""


@dataclass
class _Shape:
    """What the reference must know without asking wasmtime for a value type.

    wasmtime's C API aborts the process (a Rust panic, not an exception) when asked the
    kind of a v128 or typed-reference value type, so signatures and global types are
    read from the binary instead and such values are refused before wasmtime sees them.
    """

    func_sigs: list[Signature] = field(default_factory=list)
    global_imports: list[Type | None] = field(default_factory=list)
    table_imports: list[Type | None] = field(default_factory=list)
    exported_funcs: dict[str, int] = field(default_factory=dict)


def _read_shape(wasm: bytes) -> _Shape:
    shape = _Shape()
    types: list[Signature] = []
    r = _Reader(wasm, 8)
    while r.pos < len(wasm):
        section = r.byte()
        end = r.uleb()
        end += r.pos
        if section == _TYPE_SECTION:
            for _ in range(r.uleb()):
                types.extend(_read_rec_group(r))
        elif section == _IMPORT_SECTION:
            for _ in range(r.uleb()):
                r.name()
                r.name()
                kind = r.byte()
                if kind == 0x00:
                    shape.func_sigs.append(types[r.uleb()])
                elif kind == 0x01:
                    shape.table_imports.append(r.valtype())
                    r.limits()
                elif kind == 0x02:
                    r.limits()
                elif kind == 0x03:
                    shape.global_imports.append(r.valtype())
                    r.byte()
                else:  # a tag: attribute, type index
                    r.byte()
                    r.uleb()
        elif section == _FUNCTION_SECTION:
            shape.func_sigs.extend(types[r.uleb()] for _ in range(r.uleb()))
        elif section == _EXPORT_SECTION:
            for _ in range(r.uleb()):
                name = r.name()
                kind = r.byte()
                index = r.uleb()
                if kind == 0x00:
                    shape.exported_funcs[name] = index
        r.pos = end
    return shape


def _all_known(types: list[Type | None]) -> tuple[Type, ...] | None:
    known = tuple(ty for ty in types if ty is not None)
    return known if len(known) == len(types) else None


def _read_rec_group(r: _Reader) -> list[Signature]:
    """The types of one type-section entry (GC's rec groups hold several); None for non-functions."""
    count = 1
    if r.data[r.pos] == 0x4E:
        r.byte()
        count = r.uleb()
    signatures: list[Signature] = []
    for _ in range(count):
        form = r.byte()
        if form in (0x50, 0x4F):  # a subtype: its supertypes, then the composite type
            for _ in range(r.uleb()):
                r.uleb()
            form = r.byte()
        if form == 0x60:
            params = _all_known([r.valtype() for _ in range(r.uleb())])
            results = _all_known([r.valtype() for _ in range(r.uleb())])
            signatures.append((params, results) if params is not None and results is not None else None)
            continue
        for _ in range(r.uleb() if form == 0x5F else 1):  # struct fields, or the array's element
            if r.data[r.pos] in (0x78, 0x77):  # packed i8/i16
                r.byte()
            else:
                r.valtype()
            r.byte()
        signatures.append(None)
    return signatures


class ReferenceInstance:
    """One instance of a module on wasmtime (its own Engine and Store), called by export name."""

    def __init__(self, wasm: bytes, host_funcs=None) -> None:
        """``host_funcs(store)``, if given, returns functions for some imports by
        (module, name): the offload runtime's, for a rewritten module."""
        wasm = bytes(wasm)
        self._engine = wasmtime.Engine()
        self._store = wasmtime.Store(self._engine)
        try:
            module = wasmtime.Module(self._engine, wasm)
            self._shape = _read_shape(wasm)
            globals_ = iter(self._shape.global_imports)
            tables = iter(self._shape.table_imports)
            provided = host_funcs(self._store) if host_funcs is not None else {}
            imports = [
                provided.get((imp.module, imp.name)) or self._stub(imp, globals_, tables)
                for imp in module.imports
            ]
            instance = wasmtime.Instance(self._store, module, imports)
        except MissingImport as exc:
            raise ReferenceBackendError(f"the start function called an import: {exc}") from None
        except wasmtime.Trap as trap:
            kind = trap_kind_from_wasmtime(trap)
            message = TRAP_MESSAGES[kind] if kind is not None else _trap_text(trap)
            raise ReferenceBackendError(f"instantiation trapped: {message}") from None
        except wasmtime.WasmtimeError as exc:
            raise ReferenceBackendError(f"wasmtime rejected the module: {exc}") from None
        self._exports: dict[str, Any] = dict(instance.exports(self._store).items())
        # Function index <-> the exported wasmtime function, to encode funcrefs as index + 1.
        self._funcs_by_index: dict[int, wasmtime.Func] = {}
        self._index_by_func: dict[bytes, int] = {}
        for name, index in self._shape.exported_funcs.items():
            func = self._exports[name]
            self._funcs_by_index[index] = func
            self._index_by_func[bytes(func._func)] = index

    def _stub(
        self, imp: wasmtime.ImportType, globals_: Iterator[Type | None], tables: Iterator[Type | None]
    ) -> Any:
        """A stand-in for one import; ``globals_``/``tables`` yield the imports' value types in order."""
        ty = imp.type
        where = f"{imp.module}.{imp.name}"
        if isinstance(ty, wasmtime.FuncType):

            def missing(*_args: object) -> None:
                raise MissingImport(f"host import {where} is not available")

            return wasmtime.Func(self._store, ty, missing)
        if isinstance(ty, wasmtime.MemoryType):
            return wasmtime.Memory(self._store, ty)
        if isinstance(ty, wasmtime.GlobalType | wasmtime.TableType):
            content = next(globals_ if isinstance(ty, wasmtime.GlobalType) else tables)
            if content is None:
                raise ReferenceBackendError(
                    f"import {where} holds values of a type the reference backend cannot carry "
                    "(a typed reference)"
                )
            if isinstance(ty, wasmtime.TableType):
                return wasmtime.Table(self._store, ty, None)
            if content is V128:  # (wasmtime-py would ask the type's kind: the C API aborts)
                return self._v128_global(ty)
            zero: Any = None if content.is_ref else 0.0 if content.is_float else 0
            return wasmtime.Global(self._store, ty, zero)
        raise ReferenceBackendError(f"import {where} is of a kind the reference backend cannot stub")

    def _v128_global(self, ty: wasmtime.GlobalType) -> wasmtime.Global:
        """A global of v128 type ``ty`` holding zero, made through the C API."""
        zero = self._to_raw((V128, 0))
        made = ffi.wasmtime_global_t()
        error = ffi.wasmtime_global_new(
            self._store._context(), ty.ptr(), ctypes.byref(zero), ctypes.byref(made)
        )
        if error:
            raise wasmtime.WasmtimeError._from_ptr(error)
        return wasmtime.Global._from_raw(made)

    def exports(self) -> list[str]:
        """The names of the instance's exports."""
        return list(self._exports)

    def call(self, export: str, args: Sequence[WasmValue]) -> CallResult:
        """Call ``export`` with raw bit patterns; results, trap or error as a :class:`CallResult`."""
        func = self._exports.get(export)
        if func is None:
            names = ", ".join(sorted(self._exports)) or "none"
            return CallResult(error=f"no export named {export!r} (exports: {names})")
        if not isinstance(func, wasmtime.Func):
            return CallResult(error=f"export {export!r} is a {type(func).__name__.lower()}, not a function")
        signature = self._shape.func_sigs[self._shape.exported_funcs[export]]
        if signature is None:
            return CallResult(
                error=f"{export} has a parameter or result of a type the reference backend cannot carry "
                "(a typed reference)"
            )
        params, results = signature
        if len(args) != len(params):
            return CallResult(
                error=f"{export} takes {len(params)} argument(s) ({', '.join(map(str, params))}), "
                f"given {len(args)}"
            )
        for i, ((ty, bits), want) in enumerate(zip(args, params)):
            if ty is not want:
                return CallResult(error=f"argument {i} of {export} is {want}, given {ty}")
            if not isinstance(bits, int) or not 0 <= bits < 1 << ty.bits:
                return CallResult(error=f"argument {i} of {export}: {bits!r} is not a {ty.bits}-bit pattern")

        raw_params = (ffi.wasmtime_val_t * len(args))()
        raw_results = (ffi.wasmtime_val_t * len(results))()
        made = 0
        try:
            for value in args:
                raw_params[made] = self._to_raw(value)
                made += 1
            with enter_wasm(self._store) as trap:
                error = ffi.wasmtime_func_call(
                    self._store._context(),
                    ctypes.byref(func._func),
                    raw_params,
                    len(args),
                    raw_results,
                    len(results),
                    trap,
                )
                if error:
                    raise wasmtime.WasmtimeError._from_ptr(error)
        except (MissingImport, ReferenceBackendError) as exc:
            return CallResult(error=str(exc))
        except wasmtime.Trap as trap:
            kind = trap_kind_from_wasmtime(trap)
            return CallResult(trap=TRAP_MESSAGES[kind] if kind is not None else _trap_text(trap))
        except wasmtime.WasmtimeError as exc:
            return CallResult(error=f"wasmtime could not call {export}: {exc}")
        finally:
            for i in range(made):
                ffi.wasmtime_val_unroot(ctypes.byref(raw_params[i]))
        try:
            return CallResult(values=tuple(self._from_raw(raw_results[i]) for i in range(len(results))))
        except ReferenceBackendError as exc:
            return CallResult(error=str(exc))

    def memory(self, name: str = "memory") -> bytes | None:
        """A copy of the exported memory ``name``'s bytes; None if there is no such memory."""
        memory = self._exports.get(name)
        if not isinstance(memory, wasmtime.Memory):
            return None
        return ctypes.string_at(memory.data_ptr(self._store), memory.data_len(self._store))

    def globals(self) -> dict[str, WasmValue]:
        """The exported globals' current values, as raw bits; GC-typed globals are left out."""
        carried = {
            *_KIND_TYPES,
            ffi.WASMTIME_V128.value,
            ffi.WASMTIME_FUNCREF.value,
            ffi.WASMTIME_EXTERNREF.value,
        }
        values = {}
        for name, extern in self._exports.items():
            if isinstance(extern, wasmtime.Global):
                raw = ffi.wasmtime_val_t()
                ffi.wasmtime_global_get(
                    self._store._context(), ctypes.byref(extern._global), ctypes.byref(raw)
                )
                if raw.kind in carried:
                    values[name] = self._from_raw(raw)
                else:
                    ffi.wasmtime_val_unroot(ctypes.byref(raw))
        return values

    def _to_raw(self, value: WasmValue) -> Any:
        """A C API value carrying ``value``'s exact bits."""
        ty, bits = value
        if ty in _NUMERIC_KINDS:
            kind, member = _NUMERIC_KINDS[ty]
            raw = ffi.wasmtime_val_t(kind=kind)
            setattr(raw.of, member, _signed(bits, ty.bits))
            return raw
        if ty is V128:
            raw = ffi.wasmtime_val_t(kind=ffi.WASMTIME_V128.value)
            raw.of.v128[:] = bits.to_bytes(16, "little")
            return raw
        if ty is EXTERNREF:
            # The handle itself is the host data, so it comes back unchanged.
            return wasmtime.Val.externref(bits or None)._new_raw(self._store)
        if bits == 0:
            return wasmtime.Val.funcref(None)._new_raw(self._store)
        func = self._funcs_by_index.get(bits - 1)
        if func is None:
            raise ReferenceBackendError(
                f"funcref {bits} (function {bits - 1}) cannot be passed: "
                "the reference backend only reaches exported functions"
            )
        return wasmtime.Val.funcref(func)._new_raw(self._store)

    def _from_raw(self, raw: Any) -> WasmValue:
        """The value of a C API value, exact bits; releases the value's root."""
        ty = _KIND_TYPES.get(raw.kind)
        if ty is not None:
            _, member = _NUMERIC_KINDS[ty]
            return ty, getattr(raw.of, member) & ((1 << ty.bits) - 1)
        if raw.kind == ffi.WASMTIME_V128.value:
            return V128, int.from_bytes(bytes(raw.of.v128), "little")
        value = wasmtime.Val._from_raw(self._store, raw).value
        if raw.kind == ffi.WASMTIME_EXTERNREF.value:
            return EXTERNREF, 0 if value is None else int(value)
        if value is None:
            return FUNCREF, 0
        index = self._index_by_func.get(bytes(value._func))
        if index is None:
            raise ReferenceBackendError(
                "a funcref result names a function that is not exported: "
                "the reference backend cannot tell its index"
            )
        return FUNCREF, index + 1
