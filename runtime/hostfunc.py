"""Host functions called by the guest at raw-value cost: wasmtime's "unchecked" calls.

A ``wasmtime.Func`` made from a Python callable converts every parameter and result
through a ``Val`` and looks the function's type up again on each call: about 20 us for
the offload hook's five or six i32 values, more than the rest of a small launch. Here the
callback receives the raw argument array itself (``wasmtime_func_new_unchecked``): the
values are unpacked from it and the results packed into it by one ``struct`` call each,
through a view of the array kept per address, and the caller's linear memory is found with
four C calls, ~2 us in all.

This leans on private parts of wasmtime-py (pinned in ``pyproject.toml``): its ctypes
library handle, ``Store._context``, ``Func._from_raw``, and ``wasmtime._func.LAST_EXCEPTION``,
through which an exception raised by a host function reaches the Python code that called
into Wasm, as it does for a ``wasmtime.Func`` (the guest sees a trap).
"""

from __future__ import annotations

import ctypes
import itertools
import struct
from collections.abc import Callable, Sequence
from ctypes import CFUNCTYPE, c_bool, c_char_p, c_size_t, c_void_p

import wasmtime
import wasmtime._func
from wasmtime import _ffi as ffi

from tensorwasm.compiler.rewrite import MEMORY_EXPORT
from tensorwasm.dialect.types import Type

_dll = ffi.dll
# Prototypes of our own (wasmtime-py's carry argtypes that build a ctypes object per call).
_export_get = CFUNCTYPE(c_bool, c_void_p, c_char_p, c_size_t, c_void_p)(("wasmtime_caller_export_get", _dll))
_caller_context = CFUNCTYPE(c_void_p, c_void_p)(("wasmtime_caller_context", _dll))
_memory_data = CFUNCTYPE(c_void_p, c_void_p, c_void_p)(("wasmtime_memory_data", _dll))
_memory_size = CFUNCTYPE(c_size_t, c_void_p, c_void_p)(("wasmtime_memory_data_size", _dll))
_trap_new = CFUNCTYPE(c_void_p, c_char_p, c_size_t)(("wasmtime_trap_new", _dll))
_global_get = CFUNCTYPE(None, c_void_p, c_void_p, c_void_p)(("wasmtime_global_get", _dll))
_global_set = CFUNCTYPE(c_void_p, c_void_p, c_void_p, c_void_p)(("wasmtime_global_set", _dll))
_error_delete = CFUNCTYPE(None, c_void_p)(("wasmtime_error_delete", _dll))
_CALLBACK = CFUNCTYPE(c_size_t, c_void_p, c_void_p, c_void_p, c_size_t)
_FINALIZER = CFUNCTYPE(None, c_void_p)
_func_new = CFUNCTYPE(None, c_void_p, c_void_p, c_void_p, c_void_p, _FINALIZER, c_void_p)(
    ("wasmtime_func_new_unchecked", _dll)
)
_MEMORY_OFFSET = ffi.wasmtime_extern_t.of.offset  # where the memory handle sits in an extern
_MEMORY_KIND = ffi.WASMTIME_EXTERN_MEMORY.value
_TRAP_MESSAGE = b"python exception"

# A ``wasmtime_val_raw_t`` is 16 bytes; an i32 or i64 sits in its low bytes, little-endian.
_RAW_FORMAT = {"i32": "i12x", "i64": "q8x"}

# The live host functions by the key the C side holds (their ``env``); the finalizer drops one
# when its store goes. Native ones keep what their code reads in ``_KEPT``, by its address
# (their ``env``).
_FUNCTIONS: dict[int, Callable[[int, int], None]] = {}
_KEPT: dict[int, object] = {}
_keys = itertools.count(1)


@_CALLBACK
def _trampoline(env: int, caller: int, values: int, count: int) -> int:
    try:
        _FUNCTIONS[env](caller, values)
        return 0
    except BaseException as exc:  # the guest traps; the caller of Wasm gets the exception
        wasmtime._func.LAST_EXCEPTION = exc
        return _trap_new(_TRAP_MESSAGE, len(_TRAP_MESSAGE))


# The C address of the Python functions' callback.
TRAMPOLINE = ctypes.cast(_trampoline, c_void_p).value


@_FINALIZER
def _finalize(env: int) -> None:
    functions, kept = _FUNCTIONS, _KEPT
    if functions is not None:  # None: the interpreter is shutting down, its stores with it
        functions.pop(env, None)
        kept.pop(env, None)


def raw_layout(types: Sequence[Type]) -> struct.Struct:
    """The struct that reads or writes values of ``types`` (i32/i64) in a raw value array."""
    return struct.Struct("<" + "".join(_RAW_FORMAT[t.name] for t in types))


def func(store: wasmtime.Store, params: Sequence[Type], results: Sequence[Type],
         body: Callable[[int, tuple[int, ...]], Sequence[int]]) -> wasmtime.Func:  # fmt: skip
    """A host function of i32/i64 ``params`` and ``results`` in ``store``:
    ``body(caller, values)`` gets the raw caller (for :func:`memory`) and the parameters as
    signed ints, and returns the results as signed ints."""
    return keyed_func(store, params, results, body)[0]


def keyed_func(store: wasmtime.Store, params: Sequence[Type], results: Sequence[Type],
               body: Callable[[int, tuple[int, ...]], Sequence[int]]) -> tuple[wasmtime.Func, int]:  # fmt: skip
    """:func:`func`, and the ``env`` its callback gets: with :data:`TRAMPOLINE`, what a
    native host function calls to hand a call to it."""
    read, write = raw_layout(params), raw_layout(results)
    array = ctypes.c_char * max(read.size, write.size)
    views: dict[int, ctypes.Array] = {}  # the value array, by address (a few recur)

    def call(caller: int, values: int) -> None:
        view = views.get(values)
        if view is None:
            if len(views) >= 64:
                views.clear()
            view = views[values] = array.from_address(values)
        write.pack_into(view, 0, *body(caller, read.unpack_from(view)))

    key = next(_keys)
    _FUNCTIONS[key] = call
    return _new(store, params, results, TRAMPOLINE, key), key


def native_func(store: wasmtime.Store, params: Sequence[Type], results: Sequence[Type], callback: int,
                env: ctypes.Structure) -> wasmtime.Func:  # fmt: skip
    """A host function whose callback is native code at address ``callback`` (wasmtime's
    unchecked callback ABI), called with the address of ``env``, kept alive with the store."""
    address = ctypes.addressof(env)
    _KEPT[address] = env
    return _new(store, params, results, callback, address)


def _new(store, params, results, callback: int, env: int) -> wasmtime.Func:
    ty = wasmtime.FuncType([_valtype(t) for t in params], [_valtype(t) for t in results])
    raw = ffi.wasmtime_func_t()
    _func_new(
        ctypes.cast(store._context(), c_void_p), ctypes.cast(ty.ptr(), c_void_p), callback, env,
        _finalize, ctypes.addressof(raw),
    )  # fmt: skip
    return wasmtime.Func._from_raw(raw)


def native_calls() -> tuple[int, int, int]:
    """For native host functions: the addresses of wasmtime's ``wasmtime_caller_export_get``,
    ``wasmtime_memory_data`` and ``wasmtime_memory_data_size`` (see :func:`memory`)."""
    return tuple(ctypes.cast(f, c_void_p).value for f in (_export_get, _memory_data, _memory_size))


def store_context(store: wasmtime.Store) -> int:
    """The address of ``store``'s context: what ``wasmtime_caller_context`` answers for every
    call of a host function of that store (so a caller need not ask, see :func:`memory`)."""
    return ctypes.cast(store._context(), c_void_p).value


def memory(
    caller: int, export: bytes = MEMORY_EXPORT.encode(), context: int | None = None
) -> tuple[int, int] | None:
    """``(base address, bytes)`` of the calling instance's memory exported as ``export``
    (the rewritten module exports its memory 0 so), or None where there is no (unshared)
    linear memory by that name. ``context``: the caller's store's (:func:`store_context`),
    where known."""
    item = ffi.wasmtime_extern_t()
    address = ctypes.addressof(item)
    if not _export_get(caller, export, len(export), address) or item.kind != _MEMORY_KIND:
        return None
    if context is None:
        context = _caller_context(caller)
    handle = address + _MEMORY_OFFSET
    return _memory_data(context, handle) or 0, _memory_size(context, handle)


def _valtype(ty: Type) -> wasmtime.ValType:
    return {"i32": wasmtime.ValType.i32, "i64": wasmtime.ValType.i64}[ty.name]()


class I64Global:
    """A mutable i64 global of an instance, read and written at C cost, from a host call of
    its store too: through the store's context (:func:`store_context`), which a host call
    of that store may use as its caller's."""

    def __init__(self, glob: wasmtime.Global) -> None:
        self._handle = ffi.wasmtime_global_t()
        ctypes.memmove(
            ctypes.addressof(self._handle), ctypes.addressof(glob._global), ctypes.sizeof(self._handle)
        )
        self._value = ffi.wasmtime_val_t()
        self._value.kind = ffi.WASMTIME_I64.value
        self._handle_at = ctypes.addressof(self._handle)
        self._value_at = ctypes.addressof(self._value)

    def get(self, context: int) -> int:
        _global_get(context, self._handle_at, self._value_at)
        return self._value.of.i64

    def set(self, context: int, value: int) -> None:
        self._value.kind = ffi.WASMTIME_I64.value
        self._value.of.i64 = value
        error = _global_set(context, self._handle_at, self._value_at)
        if error:  # a global of another type or store: a bug here, never the guest's
            _error_delete(error)
            raise ValueError("cannot set the global: not a mutable i64 of this store")
