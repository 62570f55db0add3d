"""The host backend keeps to undo a trap only what a kernel that may trap overwrites.

A kernel whose ops cannot trap (its accesses proven by the guards, no division, no call)
runs in linear memory with nothing copied first, however much it writes (2 GiB and more);
one that may trap keeps a copy of what it writes, up to a limit past which the loop stays
on wasmtime, and a trap still leaves memory as wasmtime would. Its launch threads are
started before a launch needs them, where a run expects host launches.
"""

from __future__ import annotations

import threading
import time

import pytest
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


@pytest.mark.parametrize(
    ("division", "traps"),
    [
        ("i32.div_u (local.get $i) (i32.const 2100)", False),  # PolyBench's (i + j) % n, n inlined
        ("i32.rem_u (local.get $i) (i32.const 7)", False),
        ("i32.div_s (local.get $i) (i32.const -3)", False),
        ("i32.rem_s (local.get $i) (i32.const -1)", False),  # MIN rem -1 is 0 in Wasm
        ("i32.div_s (local.get $i) (i32.const -1)", True),  # MIN / -1 overflows
        ("i32.div_u (local.get $i) (i32.const 0)", True),
        ("i32.rem_s (local.get $i) (local.get $n)", True),  # a divisor known only at run time
    ],
)
def test_a_division_by_a_constant_that_makes_it_total_cannot_trap(division: str, traps: bool) -> None:
    # Such a kernel runs in place on the host, keeping nothing to undo: PolyBench's init
    # loops took 43 ms instead of 2 to keep 32 MiB of untouched memory first.
    text = DIVIDE.replace("i32.div_u (local.get $i) (local.get $d)", division)
    (loop,) = prepare_offload(wat(text.format(pages=1))).prepared.loops
    assert loop.may_trap is traps


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


# cols(n, m): out[j] = the recurrence acc = 3 * acc + in[i][j] down column j of an m x n
# matrix of i32, for each of n columns: few iterations, each running a long inner loop.
COLUMNS = """(module (memory (export "memory") 16)
  (func (export "cols") (param $n i32) (param $m i32) (local $i i32) (local $j i32) (local $acc i32)
    (block $done (loop $col
      (br_if $done (i32.ge_u (local.get $j) (local.get $n)))
      (local.set $acc (i32.const 0))
      (local.set $i (i32.const 0))
      (block $end (loop $row
        (br_if $end (i32.ge_u (local.get $i) (local.get $m)))
        (local.set $acc (i32.add (i32.mul (local.get $acc) (i32.const 3))
          (i32.load (i32.shl (i32.add (i32.mul (local.get $i) (local.get $n)) (local.get $j)) (i32.const 2)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $row)))
      (i32.store (i32.add (i32.const 524288) (i32.shl (local.get $j) (i32.const 2))) (local.get $acc))
      (local.set $j (i32.add (local.get $j) (i32.const 1)))
      (br $col)))))"""


def test_few_iterations_with_long_inner_loops_are_spread_over_host_threads(monkeypatch) -> None:
    """Threads are counted by the work, not only by the iterations: 64 columns of a
    2,000-step recurrence run on every host thread (they ran on one: PolyBench's deriche,
    2,160 columns of 4,096 steps, took longer there than on wasmtime)."""
    import struct

    from tensorwasm.runtime import host_device, profit

    monkeypatch.setattr(host_device, "CPUS", 4)
    monkeypatch.setattr(profit, "cpu_seconds_per_op", lambda: 1e-9)
    launches = HostLaunches(None)
    assert len(launches.chunks(64, 1, ops=64 * 2000 * 8)) == 10  # ~1 ms of wasmtime's time: 4 threads, 10 ranges
    assert len(launches.chunks(64, 1, ops=64 * 10)) == 1  # a few microseconds: one thread
    assert len(launches.chunks(64, 1)) == 1  # (by iterations alone)

    text = COLUMNS
    store, instance = _instance(text)
    exports = instance.exports(store)
    n, m = 64, 2000
    exports["memory"].write(store, struct.pack(f"<{n * m}i", *range(n * m)), 0)
    exports["cols"](store, n, m)
    plain_store = wasmtime.Store()
    plain = wasmtime.Instance(plain_store, wasmtime.Module(plain_store.engine, wat(text)), [])
    plain.exports(plain_store)["memory"].write(plain_store, struct.pack(f"<{n * m}i", *range(n * m)), 0)
    plain.exports(plain_store)["cols"](plain_store, n, m)
    ours = exports["memory"].read(store, 524288, 524288 + 4 * n)
    assert ours == plain.exports(plain_store)["memory"].read(plain_store, 524288, 524288 + 4 * n)
    (loop,) = [lp for lp in tensorwasm.report(instance).loops if lp.offloaded]
    assert loop.threads == 4


def test_a_launch_with_the_work_for_it_is_cut_into_more_ranges_than_threads(monkeypatch) -> None:
    """A triangular nest's rows differ in length: ranges taken by the threads as they come
    free share its work where one range a thread would leave one thread the longest rows."""
    from tensorwasm.runtime import host_device, profit

    monkeypatch.setattr(host_device, "CPUS", 2)
    monkeypatch.setattr(profit, "cpu_seconds_per_op", lambda: 1e-9)
    launches = HostLaunches(None)
    ranges = launches.chunks(2000, 1, ops=10**9)  # ~1 s of wasmtime's time
    assert len(ranges) == 2 * HostLaunches.RANGES_PER_THREAD
    assert ranges[0] == (0, 250) and ranges[-1] == (1750, 2000)  # every iteration once, in order
    assert len(launches.chunks(2000, 1, ops=300_000)) == 3  # ~0.3 ms: three ranges of 100 us
    assert launches.chunks(3, 1, ops=10**9) == [(0, 1), (1, 2), (2, 3)]  # no more ranges than iterations


def _fresh_launch_threads(monkeypatch, cpus: int):
    """The host backend's launch threads as a new process has them: none yet, ``cpus``
    processors."""
    from tensorwasm.runtime import host_device

    monkeypatch.setattr(host_device, "CPUS", cpus)
    monkeypatch.setattr(host_device, "_POOL", None)
    monkeypatch.setattr(host_device, "_WARMING", None)
    return host_device


def test_the_launch_threads_are_started_before_a_launch_needs_them_once_per_process(monkeypatch) -> None:
    host_device = _fresh_launch_threads(monkeypatch, 4)
    host_device.warm_launch_threads()
    warming = host_device._WARMING
    warming.join(5)
    assert not warming.is_alive()
    pool = host_device.launch_threads()
    # Every thread started: none left for a launch to start.
    assert len(pool.threads) == 3 and all(t.is_alive() for t in pool.threads)
    host_device.warm_launch_threads()
    assert host_device._WARMING is warming  # once per process
    # A launch's four ranges then run on those threads and the launching one, four at once.
    meet = threading.Barrier(4)
    ran = []
    pool.run(lambda: ran.append((meet.wait(5), threading.get_ident())[1]), [()] * 4)
    assert set(ran) == {t.ident for t in pool.threads} | {threading.get_ident()}


def test_a_launch_runs_each_range_once_and_returns_when_all_have_run(monkeypatch) -> None:
    host_device = _fresh_launch_threads(monkeypatch, 3)
    host_device.warm_launch_threads(wait=True)
    done = []

    def call(i: int) -> None:
        time.sleep(0.002 * (i % 3))
        done.append(i)

    host_device.launch_threads().run(call, [(i,) for i in range(40)])
    assert sorted(done) == list(range(40))  # every one, once, all before run returned
    host_device.launch_threads().run(call, [])  # (no range: nothing to wait for)


def test_a_range_that_raises_is_raised_on_the_launching_thread_after_the_others_ran(monkeypatch) -> None:
    host_device = _fresh_launch_threads(monkeypatch, 3)
    host_device.warm_launch_threads(wait=True)
    done = []

    def call(i: int) -> None:
        if i == 2:
            raise ValueError("range 2")
        time.sleep(0.01)
        done.append(i)

    with pytest.raises(ValueError, match="range 2"):
        host_device.launch_threads().run(call, [(i,) for i in range(6)])
    assert sorted(done) == [0, 1, 3, 4, 5]


def test_launches_make_do_with_the_threads_the_process_could_start(monkeypatch) -> None:
    host_device = _fresh_launch_threads(monkeypatch, 4)
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if thread.name.startswith(f"{host_device.LAUNCH_THREADS}-1"):
            raise RuntimeError("can't start new thread")
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    pool = host_device.launch_threads()
    pool.start()
    assert len(pool.threads) == 1 and pool.count == 1  # the second could not start: no more are tried
    done = []
    pool.run(done.append, [(i,) for i in range(10)])
    assert sorted(done) == list(range(10))


def test_one_processor_starts_no_launch_threads(monkeypatch) -> None:
    host_device = _fresh_launch_threads(monkeypatch, 1)
    host_device.warm_launch_threads()
    assert host_device._WARMING is None and host_device._POOL is None
    done = []
    host_device.launch_threads().run(done.append, [(1,), (2,)])  # the launching thread runs them
    assert sorted(done) == [1, 2] and not host_device.launch_threads().threads
