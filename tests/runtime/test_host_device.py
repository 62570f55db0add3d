"""The host backend keeps to undo a trap only what a kernel that may trap overwrites.

A kernel whose ops cannot trap (its accesses proven by the guards, no division, no call)
runs in linear memory with nothing copied first, however much it writes (2 GiB and more);
one that may trap keeps a copy of what it writes, up to a limit past which the loop stays
on wasmtime, and a trap still leaves memory as wasmtime would.
"""

from __future__ import annotations

import wasmtime

import tensorwasm
from tensorwasm.compiler.prepare import prepare_offload
from tensorwasm.runtime.host_device import HostLaunches
from tensorwasm.runtime.offload import OffloadModule
from tests.conftest import wat

# fill(n): memory[4i] = i + 7 for i < n, as i32 stores of a counted loop.
FILL = """(module (memory (export "memory") {pages})
  (func (export "fill") (param $n i32) (local $i i32)
    (block $done (loop $l
      (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
      (i32.store (i32.shl (local.get $i) (i32.const 2)) (i32.add (local.get $i) (i32.const 7)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l)))))"""
# div(n, d): memory[4i] = i / d: a division, so the kernel may trap (d = 0).
DIVIDE = """(module (memory (export "memory") {pages})
  (func (export "div") (param $n i32) (param $d i32) (local $i i32)
    (block $done (loop $l
      (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
      (i32.store (i32.shl (local.get $i) (i32.const 2)) (i32.div_u (local.get $i) (local.get $d)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $l)))))"""


def test_the_compiler_says_which_kernels_may_trap() -> None:
    (fill,) = prepare_offload(wat(FILL.format(pages=1))).prepared.loops
    (divide,) = prepare_offload(wat(DIVIDE.format(pages=1))).prepared.loops
    assert not fill.may_trap
    assert divide.may_trap


def _instance(text: str):
    store = wasmtime.Store()
    instance = tensorwasm.instantiate(store, wat(text), [], device="cpu", offload="always")
    return store, instance


def test_a_kernel_that_cannot_trap_writes_more_than_2_gib_in_place() -> None:
    pages = (2 << 30) // 65536 + 2
    store, instance = _instance(FILL.format(pages=pages))
    exports = instance.exports(store)
    n = (2 << 30) // 4 + 1024  # past 2**31 bytes written
    exports["fill"](store, n)
    memory = exports["memory"]
    for i in (0, 1, n // 2, n - 1):
        assert int.from_bytes(memory.read(store, 4 * i, 4 * i + 4), "little") == i + 7
    assert memory.read(store, 4 * n, 4 * n + 4) == b"\0\0\0\0"
    (loop,) = tensorwasm.report(instance).loops
    assert loop.offloaded == 1


def test_a_kernel_that_may_trap_and_writes_past_the_undo_limit_stays_on_wasmtime(monkeypatch) -> None:
    monkeypatch.setattr(HostLaunches, "UNDO_LIMIT", 4096)
    offload = OffloadModule(wat(DIVIDE.format(pages=1)), device="cpu", mode="always")
    store = wasmtime.Store()
    linker = wasmtime.Linker(store.engine)
    offload.define(linker, store)
    instance = linker.instantiate(store, offload.compiled(store.engine))
    exports = instance.exports(store)
    exports["div"](store, 1024, 3)  # writes 4 KiB: within the limit, offloaded
    exports["div"](store, 2048, 3)  # writes 8 KiB: past it, wasmtime runs the loop
    (loop,) = offload.loops
    assert loop.stats.offloaded == 1
    (reason,) = loop.stats.declined
    assert "the kernel may trap and writes" in reason
    memory = exports["memory"]
    assert [int.from_bytes(memory.read(store, 4 * i, 4 * i + 4), "little") for i in (5, 2047)] == [1, 682]


def test_a_trap_leaves_memory_as_wasmtime_does() -> None:
    text = DIVIDE.format(pages=1)
    store, instance = _instance(text)
    exports = instance.exports(store)
    exports["div"](store, 64, 1)
    try:
        exports["div"](store, 64, 0)
    except wasmtime.Trap as exc:
        assert "integer divide by zero" in str(exc)
    else:
        raise AssertionError("the division by zero did not trap")
    plain_store = wasmtime.Store()
    plain = wasmtime.Instance(plain_store, wasmtime.Module(plain_store.engine, wat(text)), [])
    plain.exports(plain_store)["div"](plain_store, 64, 1)
    try:
        plain.exports(plain_store)["div"](plain_store, 64, 0)
    except wasmtime.Trap:
        pass
    ours = exports["memory"].read(store, 0, 1024)
    theirs = plain.exports(plain_store)["memory"].read(plain_store, 0, 1024)
    assert ours == theirs
