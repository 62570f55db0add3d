"""Replays in native code: an offloaded loop's host function without Python.

An arrival that brings a loop the live-ins of its last launch, where that launch ran from
a recorded CUDA graph with nothing to upload (:meth:`runtime.device_replay.DeviceReplays.replay`),
needs no decision: the guards' outcome, the launch and its results are known. What is left
is to check that nothing it relied on changed, launch the graph, wait, check that the
kernel did not trap, and move the staged results into linear memory. In Python that costs
~15 us a call (wasmtime's call into Python, then the Python around the launch), more than
the launch itself. Here one function compiled once per process with llvmlite does it, as
the host function wasmtime calls (its "unchecked" callback ABI), reading everything from
an :class:`Arm` that the Python side fills.

What the native side checks on each call: the arm is armed, the module's generation word
is the one it was armed at (the Python side bumps it on anything that changes the device's
state: a launch, a region's flush, a reset, closing), its budget of replays is not spent
(auto mode: every so many replays go through Python, which decides again and records
their time), the live-ins are the recorded ones, and linear memory has the recorded base
and size. Anything else, or a failed driver call, or a kernel that wrote its scratch (a
trap, say), hands the call to the Python host function (the arm's ``fallback``); after a
launch, ``pending`` says what the Python side must finish (see :data:`PENDING_ERROR`).

wasmtime calls a host function through a fixed pointer, so the rewritten module calls the
loops' host functions through a table of its own (:mod:`compiler.rewrite`): each loop's
entry starts as its Python function and becomes the native one once its arrivals replay
(see ``DeviceReplays.NATIVE_AFTER`` in :mod:`runtime.device_replay`).
"""

from __future__ import annotations

import ctypes
import functools
import threading

# The arm's words, in order (all 64-bit): what one loop's native host function reads.
FIELDS = (
    "armed",  # 1 while the native path may replay
    "generation",  # the module's generation word when armed ...
    "generation_at",  # ... and its address
    "budget",  # replays left before one goes through Python
    "fallback",  # the Python host function's callback, and its env
    "fallback_env",
    "n_live", "live", "masks",  # live-ins recorded (u64 each, masked) and their masks
    "export_get", "memory_data", "memory_size",  # wasmtime's C functions
    "store_context", "export_name", "export_len",  # the memory's export name
    "base", "size",  # linear memory as the arrival ran with it
    "ctx_set_current", "cu_context",  # cuCtxSetCurrent and the context
    "graph_launch", "graph", "stream",  # cuGraphLaunch, the recorded graph, its stream
    "stream_sync",  # cuStreamSynchronize
    "memcmp", "clock",  # libc's memcmp and clock_gettime
    "staging", "image", "back_bytes",  # the staging buffer's scratch against what a launch leaves
    "n_staged", "staged",  # (offset in linear memory, staging address, bytes) triples
    "n_results", "results",  # the host function's results as raw words
    "replays", "kernel_ns", "transfer_ns",  # counts since the Python side last folded them
    "pending", "error", "error_call",  # what a native call left for the Python side
)  # fmt: skip
FIELD = {name: i for i, name in enumerate(FIELDS)}

PENDING_ERROR = 1  # a driver call failed: ``error`` is its CUresult, ``error_call`` which call
PENDING_SCRATCH = 2  # the launch ran but left its scratch changed: the kernel trapped, or folded
CALLS = {1: "cuCtxSetCurrent", 2: "cuGraphLaunch", 3: "cuStreamSynchronize"}


class Arm(ctypes.Structure):
    """One loop's native host function's state, in one store."""

    _fields_ = [(name, ctypes.c_uint64) for name in FIELDS]


_CLOCK_MONOTONIC = 1
_RAW_BYTES = 16  # a wasmtime_val_raw_t


def _build_ir(extern_bytes: int, memory_offset: int, memory_kind: int) -> str:
    """The native host function ``tw_replay(env, caller, values, count)`` in LLVM IR."""
    from llvmlite import ir

    i1, i8, i32, i64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
    i8p = i8.as_pointer()
    module = ir.Module("tensorwasm_replay")
    fn = ir.Function(module, ir.FunctionType(i8p, [i8p, i8p, i8p, i64]), "tw_replay")
    env, caller, values, count = fn.args
    entry = fn.append_basic_block("entry")
    b = ir.IRBuilder(entry)
    arm = b.bitcast(env, i64.as_pointer())
    extern = b.alloca(ir.ArrayType(i8, extern_bytes))
    extern.align = 8
    clock = b.alloca(ir.ArrayType(i64, 2))
    fallback = fn.append_basic_block("fallback")

    def const(value: int, ty=i64):
        return ir.Constant(ty, value)

    def slot(name: str):
        return b.gep(arm, [const(FIELD[name])])

    def get(name: str):
        return b.load(slot(name))

    def put(name: str, value) -> None:
        b.store(value, slot(name))

    def call(name: str, ret, *args):
        """Call the C function whose address is the arm's ``name``."""
        fnty = ir.FunctionType(ret, [a.type for a in args])
        return b.call(b.inttoptr(get(name), fnty.as_pointer()), list(args))

    def word(base, index):
        """The i64 at ``base`` (an address word) + 8 * ``index``."""
        return b.gep(b.inttoptr(base, i64.as_pointer()), [index])

    def raw(index):
        """The low word of ``values[index]``."""
        return b.bitcast(b.gep(values, [b.mul(index, const(_RAW_BYTES))]), i64.as_pointer())

    def counted(name: str, n, body) -> None:
        """``body(i)`` for i in [0, n); leaves the builder after the loop."""
        head, loop, done = (fn.append_basic_block(f"{name}.{s}") for s in ("head", "body", "done"))
        before = b.block
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(i64)
        i.add_incoming(const(0), before)
        b.cbranch(b.icmp_unsigned("<", i, n), loop, done)
        b.position_at_end(loop)
        body(i)
        i.add_incoming(b.add(i, const(1)), b.block)
        b.branch(head)
        b.position_at_end(done)

    def or_fall_back(ok) -> None:
        go_on = fn.append_basic_block()
        b.cbranch(ok, go_on, fallback)
        b.position_at_end(go_on)

    def now():
        call("clock", i32, const(_CLOCK_MONOTONIC, i32), b.bitcast(clock, i8p))
        seconds = b.load(b.gep(clock, [const(0), const(0, i32)]))
        nanos = b.load(b.gep(clock, [const(0), const(1, i32)]))
        return b.add(b.mul(seconds, const(1_000_000_000)), nanos)

    # Armed, at the module's generation, with budget left?
    current = b.load(b.inttoptr(get("generation_at"), i64.as_pointer()))
    ok = b.and_(
        b.icmp_unsigned("!=", get("armed"), const(0)), b.icmp_unsigned("==", current, get("generation"))
    )
    or_fall_back(b.and_(ok, b.icmp_unsigned("!=", get("budget"), const(0))))

    # The recorded live-ins?
    def same_live_in(i) -> None:
        value = b.and_(b.load(raw(i)), b.load(word(get("masks"), i)))
        or_fall_back(b.icmp_unsigned("==", value, b.load(word(get("live"), i))))

    counted("live", get("n_live"), same_live_in)

    # Linear memory where and as large as it was?
    handle = b.gep(extern, [const(0), const(memory_offset, i32)])
    found = call("export_get", i8, caller, b.inttoptr(get("export_name"), i8p), get("export_len"),
                 b.bitcast(extern, i8p))  # fmt: skip
    or_fall_back(b.icmp_unsigned("!=", found, const(0, i8)))
    kind = b.load(b.gep(extern, [const(0), const(0, i32)]))
    or_fall_back(b.icmp_unsigned("==", kind, const(memory_kind, i8)))
    context = b.inttoptr(get("store_context"), i8p)
    base = b.ptrtoint(call("memory_data", i8p, context, handle), i64)
    size = call("memory_size", i64, context, handle)
    same = b.and_(b.icmp_unsigned("==", base, get("base")), b.icmp_unsigned("==", size, get("size")))
    or_fall_back(same)

    # Launch and wait; a failed call is left for the Python side.
    checks_done = b.block
    failed = fn.append_basic_block("failed")
    b.position_at_end(failed)
    code = b.phi(i32)
    which = b.phi(i64)
    put("error", b.zext(code, i64))
    put("error_call", which)
    put("pending", const(PENDING_ERROR))
    put("armed", const(0))
    b.branch(fallback)
    b.position_at_end(checks_done)

    started = now()

    def checked(result, call_id: int) -> None:
        go_on = fn.append_basic_block()
        code.add_incoming(result, b.block)
        which.add_incoming(const(call_id), b.block)
        b.cbranch(b.icmp_unsigned("!=", result, const(0, i32)), failed, go_on)
        b.position_at_end(go_on)

    checked(call("ctx_set_current", i32, b.inttoptr(get("cu_context"), i8p)), 1)
    stream = b.inttoptr(get("stream"), i8p)
    checked(call("graph_launch", i32, b.inttoptr(get("graph"), i8p), stream), 2)
    checked(call("stream_sync", i32, stream), 3)
    waited = now()
    put("kernel_ns", b.add(get("kernel_ns"), b.sub(waited, started)))

    # The scratch as a launch that did not trap leaves it?
    differs = call(
        "memcmp", i32, b.inttoptr(get("staging"), i8p), b.inttoptr(get("image"), i8p), get("back_bytes")
    )
    changed = fn.append_basic_block("scratch_changed")
    unchanged = fn.append_basic_block("scratch_unchanged")
    b.cbranch(b.icmp_unsigned("!=", differs, const(0, i32)), changed, unchanged)
    b.position_at_end(changed)
    put("pending", const(PENDING_SCRATCH))
    put("armed", const(0))
    b.branch(fallback)
    b.position_at_end(unchanged)

    # The staged results into linear memory, the host function's results into ``values``.
    memmove = module.declare_intrinsic("llvm.memmove", [i8p, i8p, i64])

    def move(i) -> None:
        triple = b.mul(i, const(3))
        lo = b.load(word(get("staged"), triple))
        at = b.load(word(get("staged"), b.add(triple, const(1))))
        nbytes = b.load(word(get("staged"), b.add(triple, const(2))))
        b.call(memmove, [b.inttoptr(b.add(base, lo), i8p), b.inttoptr(at, i8p), nbytes, ir.Constant(i1, 0)])

    counted("staged", get("n_staged"), move)

    def result(i) -> None:
        cell = raw(i)
        b.store(b.load(word(get("results"), i)), cell)
        b.store(const(0), b.gep(cell, [const(1)]))

    counted("results", get("n_results"), result)
    put("transfer_ns", b.add(get("transfer_ns"), b.sub(now(), waited)))
    put("replays", b.add(get("replays"), const(1)))
    put("budget", b.sub(get("budget"), const(1)))
    b.ret(ir.Constant(i8p, None))

    b.position_at_end(fallback)
    fnty = ir.FunctionType(i8p, [i8p, i8p, i8p, i64])
    target = b.inttoptr(get("fallback"), fnty.as_pointer())
    b.ret(b.call(target, [b.inttoptr(get("fallback_env"), i8p), caller, values, count]))
    return str(module)


_lock = threading.Lock()


@functools.cache
def entry() -> int:
    """The address of the native host function (compiled at the first call in a process)."""
    from wasmtime import _ffi as ffi

    from tensorwasm.compiler.target import HostTarget

    with _lock:
        ir_text = _build_ir(
            ctypes.sizeof(ffi.wasmtime_extern_t),
            ffi.wasmtime_extern_t.of.offset,
            ffi.WASMTIME_EXTERN_MEMORY.value,
        )
        code = HostTarget().jit(ir_text)
        _KEPT.append(code)  # the code lives as long as the process
        return code.address("tw_replay")


_KEPT: list = []


@functools.cache
def libc_calls() -> tuple[int, int]:
    """The addresses of libc's ``memcmp`` and ``clock_gettime``."""
    libc = ctypes.CDLL(None)
    return (ctypes.cast(libc.memcmp, ctypes.c_void_p).value,
            ctypes.cast(libc.clock_gettime, ctypes.c_void_p).value)  # fmt: skip
