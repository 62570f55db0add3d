"""Run a case on wasmtime and on a backend under test, and compare what Wasm defines.

Compared, call by call: the results (bit for bit; where the case says a float result may
come from arithmetic, see :class:`oracle.case.Call`, by Wasm's NaN rules instead: a
canonical NaN where wasmtime's is canonical, an arithmetic NaN where wasmtime's is another
arithmetic one, see :func:`same_value`), trap or not, and the trap message. After the last
call: linear memory 0 and every exported global. A call that traps half-way may leave
memory written: both sides must agree on that too.

A module may hold several generated programs (:class:`oracle.case.Case`); each is judged
by its own calls, and passes when every one of them was compared and agreed, and so did
the final state of the module wherever it was compared (not after a skip, see below).

Some outcomes are not mismatches but *skips*: a call our backend refuses with an error
(a function that reaches a host import is not compilable), a call that reaches an import
stub on the reference, and a call that hits a documented resource limit on one side only
(the GPU's call depth of 200 against wasmtime's stack). After such a call the two
instances may have diverged, so the rest of the case is skipped too.

A backend that raises anything other than a :class:`TensorWasmError` while decoding,
translating or compiling a module crashes: that is a failure of its own kind. A
TensorWasmError on a module of our own generators (which use only supported features) is
a failure too; on a ``wasm-tools smith`` module it is a skip (the module is unsupported).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tensorwasm.compiler.errors import UnsupportedFeature
from tensorwasm.compiler.lower import abi
from tensorwasm.compiler.traps import TrapKind, trap_message
from tensorwasm.dialect.types import F32, F64, Type
from tensorwasm.oracle.case import Call, Case
from tensorwasm.runtime.executor import Executor, GPUExecutor, HostExecutor
from tensorwasm.runtime.reference import ReferenceBackendError, ReferenceInstance
from tensorwasm.runtime.values import CallResult, NanPattern, WasmValue, matches
from tensorwasm.support import logs
from tensorwasm.support.errors import TensorWasmError

log = logs.get_logger(__name__)

STACK_EXHAUSTED = trap_message(TrapKind.STACK_OVERFLOW)

ExecutorFactory = Callable[[bytes], Executor]


def is_nan(ty: Type, bits: int) -> bool:
    """Whether ``bits`` is a NaN of float type ``ty`` (never for other types)."""
    if ty is F32:
        return bits & 0x7F800000 == 0x7F800000 and bits & 0x007FFFFF != 0
    if ty is F64:
        return bits & 0x7FF0000000000000 == 0x7FF0000000000000 and bits & 0x000FFFFFFFFFFFFF != 0
    return False


def same_value(expected: WasmValue, actual: WasmValue, exact: bool) -> bool:
    """Equal bits; or, unless ``exact`` (the value may come from float arithmetic), a NaN
    that Wasm allows in place of wasmtime's: canonical where wasmtime's NaN is canonical
    (no operand was a NaN, or the result is the bits of one that was), arithmetic (quiet bit
    set) where wasmtime's is another arithmetic NaN. A signalling NaN is never the result of
    arithmetic, so one from wasmtime, like any number, must be matched bit for bit."""
    (ty, want), (ty2, got) = expected, actual
    if ty is not ty2:
        return False
    if want == got:
        return True
    if exact or not is_nan(ty, want):
        return False
    for pattern in (NanPattern.CANONICAL, NanPattern.ARITHMETIC):
        if matches((ty, pattern), expected):
            return matches((ty, pattern), actual)
    return False


def describe(result: CallResult) -> str:
    if result.error is not None:
        return f"error: {result.error}"
    if result.trap is not None:
        return f"trap: {result.trap}"
    return "(" + ", ".join(f"{ty}:0x{bits:x}" for ty, bits in result.values) + ")"


def compare_call(call: Call, expected: CallResult, actual: CallResult) -> str | None:
    """Why ``actual`` differs from ``expected``; None when they agree."""
    if expected.trap != actual.trap or len(expected.values) != len(actual.values):
        return f"expected {describe(expected)}, got {describe(actual)}"
    for want, got in zip(expected.values, actual.values, strict=True):
        if not same_value(want, got, call.exact):
            return f"expected {describe(expected)}, got {describe(actual)}"
    return None


def is_resource_skip(expected: CallResult, actual: CallResult) -> bool:
    """One side ran out of call stack and the other did not: their limits differ, by design."""
    return (expected.trap == STACK_EXHAUSTED) != (actual.trap == STACK_EXHAUSTED)


@dataclass
class Outcome:
    """What running a case found: calls that agreed, were skipped, and the first mismatch;
    and, of its programs, how many passed (every call compared and agreed) and how many
    were skipped (some call not compared)."""

    passed: int = 0
    skipped: int = 0
    mismatch: str | None = None
    notes: list[str] = field(default_factory=list)
    programs_passed: int = 0
    programs_skipped: int = 0
    failed_call: int | None = None  # the index of the call that did not agree, if one did

    @property
    def failed(self) -> bool:
        return self.mismatch is not None


def make_factory(backend: str) -> ExecutorFactory:
    """The executor constructor for ``backend`` ("cpu" or "gpu")."""
    if backend == "cpu":
        return HostExecutor
    if backend == "gpu":
        return GPUExecutor
    if backend in ("offload-cpu", "offload-gpu"):
        from tensorwasm.oracle.offload import OffloadInstance

        device = backend.split("-")[1]
        # Linear memory page-locked on the GPU, as `tensorwasm run` has it: launches replay.
        gpu = device == "gpu"
        return lambda wasm: OffloadInstance(wasm, device, filters=True, pin=gpu, declines=gpu)
    if backend == "offload-sim":
        from tensorwasm.oracle.simulated import SimulatedOffloadInstance

        return lambda wasm: SimulatedOffloadInstance(wasm, filters=True, declines=True)
    raise ValueError(
        f"unknown backend {backend!r} (expected cpu, gpu, offload-cpu, offload-sim or offload-gpu)"
    )


def _memory_export(executor: Executor) -> str | None:
    names = executor.wasm.export_names("memory", 0)
    return names[0] if names else None


def _global_exports(executor: Executor) -> list[tuple[str, int]]:
    return [(e.name, e.index) for e in executor.wasm.exports if e.kind == "global"]


def run_case(case: Case, backend: str | ExecutorFactory = "cpu") -> Outcome:
    """Run every call of ``case`` on wasmtime and on ``backend``; compare; never raise."""
    outcome = Outcome()
    skipped = _run_case(case, make_factory(backend) if isinstance(backend, str) else backend, outcome)
    if not outcome.failed:
        outcome.programs_skipped = len(skipped)
        outcome.programs_passed = case.programs - len(skipped)
    return outcome


def _run_case(case: Case, factory: ExecutorFactory, outcome: Outcome) -> set[int]:
    """Compare into ``outcome``; the programs some of whose calls were not compared."""
    everything = set(range(case.programs))
    try:
        wasm = case.wasm
    except Exception as exc:  # the generator's own text does not assemble: a generator bug
        outcome.mismatch = f"the case does not assemble: {exc}"
        return everything
    try:
        reference: ReferenceInstance | None = ReferenceInstance(wasm)
        reference_error = None
    except ReferenceBackendError as exc:
        reference, reference_error = None, str(exc)
    try:
        executor = factory(wasm)
    except TensorWasmError as exc:
        if reference is None and "rejected the module" in str(reference_error):
            outcome.mismatch = f"invalid module (a generator bug): {reference_error}"
        elif reference is None:
            outcome.notes.append(f"both refused the module: {reference_error} / {exc}")
        elif getattr(exc, "crashed", False):  # NVIDIA's assembler died on the module: nothing ran
            outcome.skipped = len(case.calls)
            outcome.notes.append(f"ptxas crashed: {exc}")
        elif "instantiation failed" in str(exc) or "start function failed" in str(exc):
            outcome.mismatch = f"instantiation: wasmtime succeeded, backend failed: {exc}"
        elif case.generator != "smith" and not isinstance(exc, UnsupportedFeature):
            # Our generators use only what TensorWasm supports: refusing it is a bug.
            outcome.mismatch = f"the backend refused a supported module: {type(exc).__name__}: {exc}"
        else:
            outcome.skipped = len(case.calls)
            outcome.notes.append(f"unsupported: {exc}")
        return everything
    except Exception as exc:  # any other exception is the crash we look for
        outcome.mismatch = f"crash: {type(exc).__name__}: {exc}"
        return everything
    try:
        if reference is None:
            if reference_error and "import" in reference_error:
                outcome.skipped = len(case.calls)
            else:
                outcome.mismatch = f"instantiation: backend succeeded, wasmtime failed: {reference_error}"
            return everything
        return _compare_calls(case, reference, executor, outcome)
    finally:
        close = getattr(executor, "close", None)
        if close is not None:
            try:
                close()
            except Exception as exc:  # (a GPU lost to a fault may refuse to give memory back)
                outcome.notes.append(f"closing the backend failed: {type(exc).__name__}: {exc}")


def _compare_calls(
    case: Case, reference: ReferenceInstance, executor: Executor, outcome: Outcome
) -> set[int]:
    for index, call in enumerate(case.calls):
        expected = reference.call(call.func, list(call.args))
        try:
            actual = executor.call(call.func, list(call.args))
        except Exception as exc:  # a crash at run time is a failure too
            outcome.mismatch = f"call {index} {call.func}: crash: {type(exc).__name__}: {exc}"
            outcome.failed_call = index
            return set()
        if expected.error is not None or actual.error is not None or is_resource_skip(expected, actual):
            # The two instances may have diverged from here on: stop comparing.
            outcome.skipped += len(case.calls) - index
            outcome.notes.append(
                f"call {index} {call.func}: skipped: {describe(expected)} / {describe(actual)}"
            )
            return {c.program for c in case.calls[index:]}
        why = compare_call(call, expected, actual)
        if why is not None:
            args = ", ".join(f"{ty}:0x{bits:x}" for ty, bits in call.args)
            outcome.mismatch = f"call {index} {call.func}({args}): {why}"
            outcome.failed_call = index
            return set()
        outcome.passed += 1
    _compare_state(reference, executor, outcome)
    return set()


def _compare_state(reference: ReferenceInstance, executor: Executor, outcome: Outcome) -> None:
    name = _memory_export(executor)
    if name is not None:
        want = reference.memory(name)
        size = _memory_size(executor)
        if want is not None and size is not None and size != len(want):
            outcome.mismatch = f"final memory size {size} bytes, expected {len(want)}"
            return
        got = executor.memory()
        if want != got:
            outcome.mismatch = "final memory differs: " + _first_difference(want or b"", got or b"")
            return
    try:
        ref_globals = reference.globals()
    except ReferenceBackendError:  # a funcref global naming a function it cannot index
        return
    ours = executor.globals()
    for name, index in _global_exports(executor):
        if name not in ref_globals:
            continue
        ty, want = ref_globals[name]
        got = ours[index]
        if want != got:
            outcome.mismatch = (
                f"final global {name!r} (index {index}): expected {ty}:0x{want:x}, got 0x{got:x}"
            )
            return


def _memory_size(executor: Executor) -> int | None:
    """The memory size without copying the memory (which may be gigabytes)."""
    if executor.state.memory is None:
        return None
    if isinstance(executor, HostExecutor):
        return executor.ctx[abi.CTX_MEM_SIZE]
    if isinstance(executor, GPUExecutor):
        return executor._ctx_slot(abi.CTX_MEM_SIZE)
    return None


def _first_difference(want: bytes, got: bytes) -> str:
    if len(want) != len(got):
        return f"size {len(got)} bytes, expected {len(want)}"
    at = next(i for i in range(len(want)) if want[i] != got[i])
    return f"at byte {at}: expected {want[at : at + 8].hex()}, got {got[at : at + 8].hex()}"
