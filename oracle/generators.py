"""Hypothesis strategies that generate test cases (:class:`oracle.case.Case`).

A generated module batches *programs*, each generated on its own and exercised by calls
of its own (:func:`batch`): one compilation, ours and wasmtime's, serves them all, and a
failure shrinks to a module of the one program that fails. Four families, by name in
:data:`GENERATORS`:

``numeric``
    Modules of several functions (a program each), each one random expression tree over
    every scalar op of the opcode table (plain numeric signatures) and ``select``, called
    with argument vectors biased to edge values: zeros, signs, INT_MIN/MAX, NaN payloads
    (signalling ones too), infinities, subnormals and the limits of every float-to-int
    conversion.
``control``
    Functions (a program each) of statements: locals, globals, nested block/loop/if (loops
    with bounded trip counts), br_if and br_table out of blocks, calls between functions
    (to lower indices only, so there is no recursion), call_indirect through a table with
    null, out of range and wrongly typed slots, loads and stores of every width at
    addresses near the bounds, memory.size/grow/fill/copy. Each function is called in
    turn, and memory, globals and table carry state from call to call.
``loops``
    Loop kernels (a program each) from a small grammar: ``for i in [0, n)`` (and nested
    ``j``, or ``j`` and ``k``, in ``[0, m)``) over affine accesses ``a[s*i + o]`` of buffers of mixed element types, with an
    optional conditional in the body and an optional reduction into a local; or one of
    PolyBench's shapes (:data:`SHAPES`): triangular and trapezoidal nests, imperfect nests
    (gemm's), time loops over 1-D and 2-D stencils, loops unrolled by four as clang does,
    doitgen's temporary written before it is read in every iteration (privatised; or, so
    that it must stay sequential, read where the iteration did not write it), loops exiting
    in the middle of their body as clang unrolls by two, and gramschmidt's updates of a
    matrix column by column through pointers (a second pointer's column sometimes one that
    another iteration writes).
    Buffers are laid out one after another or against the end of memory, and trip counts
    are chosen to fit exactly, to overrun by one, or at random. The case's ``meta`` holds
    the buffers' base addresses and sizes and the trip counts, for a later offload mode.
``smith``
    Random valid modules (a program each, alone in its module) from ``wasm-tools smith``,
    restricted to the features TensorWasm compiles and made to terminate (fuel), for
    whole-function runs of every exported function and for decoder/translator robustness.

A Hypothesis draw costs tens of microseconds, and drawing a numeric function takes about
half as long as compiling it: strategies here are built once and reused where their
arguments allow, and the edge values of a whole argument vector are one draw
(:func:`draw_values`).

NaN payloads: Wasm leaves the payload of a NaN produced by arithmetic open, so a generated
program must not let such bits reach anything compared bit for bit. Generators
canonicalise a possibly-arithmetic NaN (``select(nan, x, x != x)``) before a reinterpret,
the sign operand of copysign, a store, a global, a local, an argument or a result; a value
built only from inputs by the bit operations (abs, neg, copysign, reinterpret, select,
loads) keeps its exact bits and is compared exactly.
"""

from __future__ import annotations

import functools
import struct
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from hypothesis import assume
from hypothesis import strategies as st

from tensorwasm.compiler.frontend.opcodes import OPCODES, Opcode
from tensorwasm.dialect.types import EXTERNREF, F32, F64, FUNCREF, I32, I64, Type
from tensorwasm.oracle.case import Call, Case, wasm_tools

T = TypeVar("T")

NUMBER_TYPES = ("i32", "i64", "f32", "f64")
TYPES: dict[str, Type] = {"i32": I32, "i64": I64, "f32": F32, "f64": F64}
PAGE = 65536


def _f32(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _f64(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


# Edge values by type, simplest first (Hypothesis shrinks towards the front).
EDGES: dict[str, list[int]] = {
    "i32": [0, 1, 2, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 0x80000001, 0xFFFFFFFE, 7, 8, 15, 16, 31, 32,
            33, 63, 64, 0xFF, 0x80, 0xFFFF, 0x8000, 0x12345678, 0x00010000, 0xFFFF8000, 0xFFFFFF80],
    "i64": [0, 1, 2, (1 << 64) - 1, 1 << 63, (1 << 63) - 1, (1 << 63) + 1, (1 << 64) - 2, 31, 32, 33,
            63, 64, 65, 0x123456789ABCDEF0, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 1 << 32,
            0xFFFFFFFF80000000, 0xFF, 0x80],
    "f32": [_f32(0.0), _f32(-0.0), _f32(1.0), _f32(-1.0), _f32(0.5), _f32(-0.5), _f32(1.5), _f32(2.5),
            _f32(-2.5), _f32(-0.9), 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7FA00000,
            0xFFA00001, 0x7F800001, 0x7FC00001, 0x7FFFFFFF, 0x00000001, 0x80000001, 0x007FFFFF,
            0x00800000, 0x80800000, 0x7F7FFFFF, 0xFF7FFFFF, _f32(2.0**31), _f32(-(2.0**31)), 0x4EFFFFFF,
            0xCF000001, _f32(2.0**32), 0x4F7FFFFF, _f32(2.0**63), _f32(-(2.0**63)), 0x5EFFFFFF,
            _f32(2.0**64), 0x5F7FFFFF, _f32(4294967040.0), _f32(16777217.0), _f32(0.49999997)],
    "f64": [_f64(0.0), _f64(-0.0), _f64(1.0), _f64(-1.0), _f64(0.5), _f64(-0.5), _f64(1.5), _f64(2.5),
            _f64(-2.5), _f64(-0.9), 0x7FF0000000000000, 0xFFF0000000000000, 0x7FF8000000000000,
            0xFFF8000000000000, 0x7FF4000000000000, 0xFFF0000000000001, 0x7FF8000000000001,
            0x7FFFFFFFFFFFFFFF, 1, 0x8000000000000001, 0x000FFFFFFFFFFFFF, 0x0010000000000000,
            0x7FEFFFFFFFFFFFFF, 0xFFEFFFFFFFFFFFFF, _f64(2.0**31), _f64(-(2.0**31)), _f64(2147483647.9),
            _f64(-2147483648.9), _f64(-2147483649.0), _f64(2.0**32), _f64(4294967295.5),
            _f64(2.0**63), _f64(-(2.0**63)), 0x43DFFFFFFFFFFFFF, _f64(2.0**64), 0x43EFFFFFFFFFFFFF,
            _f64(-1.5e300), _f64(3.4028235677973366e38), _f64(1.401298464324817e-45),
            _f64(0.49999999999999994), _f64(4503599627370497.0)],
}  # fmt: skip


ANY_SHARE = 4  # of len(EDGES[ty]) + ANY_SHARE picks, this many draw any bit pattern
_EDGE_INDEX = {ty: st.integers(0, len(EDGES[ty]) + ANY_SHARE - 1) for ty in EDGES}
_ANY = {ty: st.integers(0, (1 << TYPES[ty].bits) - 1) for ty in EDGES}


def draw_value(draw: st.DrawFn, ty: str) -> int:
    """A bit pattern of ``ty``: mostly an edge value, sometimes any pattern. (Two plain draws
    instead of ``one_of``: argument vectors are most of the drawing, and this halves it.)"""
    k = draw(_EDGE_INDEX[ty])
    return EDGES[ty][k] if k < len(EDGES[ty]) else draw(_ANY[ty])


@st.composite
def values(draw: st.DrawFn, ty: str) -> int:
    """Bit patterns of ``ty``, as :func:`draw_value` draws them."""
    return draw_value(draw, ty)


def draw_values(draw: st.DrawFn, types: tuple[str, ...]) -> list[int]:
    """Bit patterns for ``types``, distributed as :func:`draw_value` draws them, with the
    picks of all of them in one draw of a byte each (an argument vector is most of the
    drawing of a call, and each Hypothesis draw costs tens of microseconds). A byte that
    shrinks to 0 picks the simplest edge value."""
    picks = draw(_picks(len(types)))
    out = []
    for ty, byte in zip(types, picks, strict=True):
        edges = EDGES[ty]
        k = byte * (len(edges) + ANY_SHARE) >> 8
        out.append(edges[k] if k < len(edges) else draw(_ANY[ty]))
    return out


@functools.cache
def _picks(n: int) -> st.SearchStrategy[bytes]:
    return st.binary(min_size=n, max_size=n)


# -- expressions ---------------------------------------------------------------------------

Expr = tuple  # ("leaf", ty, text) | ("op", name, ty, children) | ("select", ty, children)

FLOAT_BIT_OPS = ("abs", "neg", "copysign")


def numeric_ops() -> list[Opcode]:
    """Every supported row with a plain numeric signature and no immediate."""
    return [
        op
        for op in OPCODES
        if op.supported
        and op.imm.value == "none"
        and op.operand_types
        and op.result_types
        and set(op.operand_types) <= set(NUMBER_TYPES)
        and set(op.result_types) <= set(NUMBER_TYPES)
        and op.name != "select"
    ]


NUMERIC_OPS = numeric_ops()
OPS_BY_RESULT: dict[str, list[Opcode]] = {
    ty: [op for op in NUMERIC_OPS if op.result_types == (ty,)] for ty in NUMBER_TYPES
}


def const_text(ty: str, bits: int) -> str:
    """A ``t.const`` instruction with exactly these bits (NaN payloads included)."""
    if ty in ("i32", "i64"):
        return f"{ty}.const {bits}"
    width, mantissa = (32, 23) if ty == "f32" else (64, 52)
    sign = "-" if bits >> (width - 1) else ""
    exponent = (bits >> mantissa) & ((1 << (width - 1 - mantissa)) - 1)
    fraction = bits & ((1 << mantissa) - 1)
    if exponent == (1 << (width - 1 - mantissa)) - 1:
        return f"{ty}.const {sign}inf" if fraction == 0 else f"{ty}.const {sign}nan:0x{fraction:x}"
    value = struct.unpack("<f", struct.pack("<I", bits))[0] if ty == "f32" else _f64_value(bits)
    return f"{ty}.const {value.hex()}"


def _f64_value(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def is_exact(e: Expr) -> bool:
    """Whether ``e``'s bits are fixed by Wasm: no NaN produced by arithmetic can reach them."""
    if e[0] == "leaf":
        return True
    if e[0] == "select":
        return is_exact(e[2][0]) and is_exact(e[2][1])
    _, name, ty, children = e
    if ty in ("i32", "i64"):
        return True  # integer results never depend on a NaN's payload, reinterpret aside
    op = name.split(".", 1)[1]
    if op in ("abs", "neg", "copysign"):
        return is_exact(children[0])
    return op.startswith("reinterpret")


def _needs_canonical(name: str, operand: int) -> bool:
    return (name.startswith(("i32.reinterpret", "i64.reinterpret")) and operand == 0) or (
        name.endswith("copysign") and operand == 1
    )


def canonicalize(ty: str, out: list[str]) -> None:
    """Replace the float on top of the stack by the canonical NaN if it is a NaN."""
    scratch = f"$c{ty}"
    out += [f"local.set {scratch}", f"{ty}.const nan", f"local.get {scratch}", f"local.get {scratch}",
            f"local.get {scratch}", f"{ty}.ne", "select"]  # fmt: skip


def emit_expr(e: Expr, out: list[str]) -> None:
    """Append ``e`` as flat instructions (operands first), canonicalising where bits leak."""
    if e[0] == "leaf":
        out.append(e[2])
    elif e[0] == "select":
        for child in e[2]:
            emit_expr(child, out)
        out.append("select")
    else:
        _, name, _, children = e
        for k, child in enumerate(children):
            emit_expr(child, out)
            if _needs_canonical(name, k) and not is_exact(child):
                canonicalize(expr_type(child), out)
        out.append(name)


def emit_value(e: Expr, out: list[str]) -> None:
    """``e``, canonicalised if its bits may be an open NaN: for anything compared later."""
    emit_expr(e, out)
    if expr_type(e) in ("f32", "f64") and not is_exact(e):
        canonicalize(expr_type(e), out)


def expr_type(e: Expr) -> str:
    return e[1] if e[0] in ("leaf", "select") else e[2]


class Leaves(dict[str, tuple[str, ...]]):
    """Instructions that push a value, by type. Hashed by identity: the strategies that draw
    expressions over one set of leaves are built once and reused, so build each set once."""

    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other


_QUARTER = st.integers(0, 3)
_BOOL = st.booleans()
_OP_PICK = {ty: st.integers(0, len(OPS_BY_RESULT[ty])) for ty in NUMBER_TYPES}


@functools.cache
def _leaf(leaves: Leaves, ty: str) -> st.SearchStrategy[str]:
    return st.sampled_from(leaves[ty])


@functools.cache
def expressions(ty: str, depth: int, leaves: Leaves) -> st.SearchStrategy[Expr]:
    """Random expression trees of type ``ty``, at most ``depth`` deep. (One strategy object
    per argument triple: Hypothesis validates a new strategy on its first draw, and
    expression trees are most of the drawing.)"""
    return _expressions(ty, depth, leaves)


@st.composite
def _expressions(draw: st.DrawFn, ty: str, depth: int, leaves: Leaves) -> Expr:
    if depth <= 0 or draw(_QUARTER) == 0:
        if leaves.get(ty) and draw(_BOOL):
            return ("leaf", ty, draw(_leaf(leaves, ty)))
        return ("leaf", ty, const_text(ty, draw_value(draw, ty)))
    choices = OPS_BY_RESULT[ty]
    pick = draw(_OP_PICK[ty])
    if pick == len(choices):
        a = draw(expressions(ty, depth - 1, leaves))
        b = draw(expressions(ty, depth - 1, leaves))
        c = draw(expressions("i32", depth - 1, leaves))
        return ("select", ty, (a, b, c))
    op = choices[pick]
    children = tuple(draw(expressions(t, depth - 1, leaves)) for t in op.operand_types)
    return ("op", op.name, ty, children)


# -- batches ---------------------------------------------------------------------------------

BATCH = 16
"""The most programs one module holds."""


@dataclass(frozen=True)
class BatchShape:
    """How many programs a module holds: a flag before each one ends the module (0),
    leaves its slot empty (1) or fills it (2 up to ``top``); the first slot never ends it.
    Large ``top``: long modules, ``top - 1`` programs on average, fewer where ``limit``
    cuts them."""

    top: int
    limit: int = BATCH

    @functools.cached_property
    def flags(self) -> tuple[st.SearchStrategy[int], st.SearchStrategy[int]]:
        return st.integers(1, self.top), st.integers(0, self.top)


# About 5 functions or 3 loop kernels a module: longer modules make hardly more cases a
# second (a loop kernel costs more to compile than the module around it), and each step
# of shrinking compiles the module again.
NUMERIC_BATCH = CONTROL_BATCH = BatchShape(7)
LOOP_BATCH = BatchShape(5, limit=8)
_END, _EMPTY = object(), object()


def batch(draw: st.DrawFn, program: Callable[[int], st.SearchStrategy[T]], shape: BatchShape) -> list[T]:
    """Programs ``program(0)``, ``program(1)``, ... for one module, each drawn in a slot of
    its own after a flag (see :class:`BatchShape`). Lowering a filled slot's flag by one
    empties it, and the shrinker then tries deleting the span that follows: so any program
    of a module can go, and a failure shrinks to a module of the one program that fails."""
    programs: list[T] = []
    for slot in range(shape.limit):
        got = draw(_program_slot(program, len(programs), shape.flags[slot > 0]))
        if got is _END:
            break
        if got is not _EMPTY:
            programs.append(got)
    assume(programs)
    return programs


@st.composite
def _program_slot(
    draw: st.DrawFn, program: Callable[[int], st.SearchStrategy[T]], index: int, flags: st.SearchStrategy[int]
) -> object:
    flag = draw(flags)
    if flag == 0:
        return _END
    return _EMPTY if flag == 1 else draw(program(index))


# -- numeric -------------------------------------------------------------------------------

NUMERIC_PARAMS = ("i32", "i32", "i64", "i64", "f32", "f32", "f64", "f64")
SCRATCH_LOCALS = "(local $cf32 f32) (local $cf64 f64)"


NUMERIC_LEAVES = Leaves(
    {ty: tuple(f"local.get {i}" for i, t in enumerate(NUMERIC_PARAMS) if t == ty) for ty in NUMBER_TYPES}
)
_NUMBER_TYPE = st.sampled_from(NUMBER_TYPES)
_NUMERIC_DEPTH = {depth: st.integers(1, depth) for depth in range(1, 9)}
_CALLS = st.integers(1, 4)


@st.composite
def numeric_cases(draw: st.DrawFn, shape: BatchShape = NUMERIC_BATCH, max_depth: int = 4) -> Case:
    """A module of expression-tree functions over every numeric op, with edge-biased calls;
    each function is a program of its own."""
    return _numeric_module(batch(draw, lambda f: numeric_function(f, max_depth), shape))


def _numeric_module(funcs: list[tuple[str, list[Call]]]) -> Case:
    wat = "(module\n" + "\n".join(text for text, _ in funcs) + ")\n"
    calls = [replace(call, program=k) for k, (_, calls) in enumerate(funcs) for call in calls]
    return Case("numeric", wat, calls, programs=len(funcs),
                subset=lambda keep: _numeric_module([funcs[k] for k in keep]))  # fmt: skip


@st.composite
def numeric_function(draw: st.DrawFn, index: int, max_depth: int = 4) -> tuple[str, list[Call]]:
    """Function ``f<index>``: one expression tree over the parameters, and 1 to 4 calls."""
    ty = draw(_NUMBER_TYPE)
    tree = draw(expressions(ty, draw(_NUMERIC_DEPTH[max_depth]), NUMERIC_LEAVES))
    body: list[str] = []
    emit_expr(tree, body)
    params = " ".join(NUMERIC_PARAMS)
    text = (
        f'  (func (export "f{index}") (param {params}) (result {ty}) {SCRATCH_LOCALS}\n    '
        + "\n    ".join(body)
        + ")"
    )
    exact = is_exact(tree)
    calls = []
    for _ in range(draw(_CALLS)):
        args = tuple((TYPES[t], bits) for t, bits in zip(NUMERIC_PARAMS, draw_values(draw, NUMERIC_PARAMS)))
        calls.append(Call(f"f{index}", args, exact, index))
    return text, calls


# -- control and memory ---------------------------------------------------------------------

SIGNATURES = {  # type name -> (params, result)
    "$t0": (("i32", "i32"), "i32"),
    "$t1": (("i64",), "i64"),
    "$t2": (("f64", "i32"), "f64"),
    "$t3": (("f32", "i64"), "f32"),
}
LOCALS = {"i32": ("$a0", "$a1"), "i64": ("$b0", "$b1"), "f32": ("$c0", "$c1"), "f64": ("$d0", "$d1")}
GLOBALS = {"i32": "$g0", "i64": "$g1", "f32": "$g2", "f64": "$g3"}
LOADS = [
    ("i32.load", "i32", 4), ("i64.load", "i64", 8), ("f32.load", "f32", 4), ("f64.load", "f64", 8),
    ("i32.load8_s", "i32", 1), ("i32.load8_u", "i32", 1), ("i32.load16_s", "i32", 2),
    ("i32.load16_u", "i32", 2), ("i64.load8_s", "i64", 1), ("i64.load8_u", "i64", 1),
    ("i64.load16_s", "i64", 2), ("i64.load16_u", "i64", 2), ("i64.load32_s", "i64", 4),
    ("i64.load32_u", "i64", 4),
]  # fmt: skip
STORES = [
    ("i32.store", "i32", 4), ("i64.store", "i64", 8), ("f32.store", "f32", 4), ("f64.store", "f64", 8),
    ("i32.store8", "i32", 1), ("i32.store16", "i32", 2), ("i64.store8", "i64", 1),
    ("i64.store16", "i64", 2), ("i64.store32", "i64", 4),
]  # fmt: skip
ADDRESSES = [0, 8, 1, 3, 100, PAGE - 4, PAGE - 8, PAGE - 1, PAGE - 2, PAGE, PAGE + 1, PAGE - 16,
             2 * PAGE - 4, 2 * PAGE - 8, 2 * PAGE, 3 * PAGE - 1, 0xFFFFFFFF, 0xFFFFFFF8, 0x80000000]  # fmt: skip
OFFSETS = [0, 0, 1, 4, 16, PAGE - 8, PAGE, 0xFFFFFFFF]
LENGTHS = [0, 1, 4, 8, 17, 100, PAGE, 0xFFFFFFFF]


CONTROL_LEAVES = {  # signature -> what its functions' expressions read: locals, globals, params
    sig: Leaves(
        {
            ty: (
                *(f"local.get {n}" for n in LOCALS[ty]),
                f"global.get {GLOBALS[ty]}",
                *(f"local.get $p{i}" for i, t in enumerate(params) if t == ty),
            )
            for ty in NUMBER_TYPES
        }
    )
    for sig, (params, _) in SIGNATURES.items()
}
STATEMENTS = ("set", "store", "load", "global", "if", "loop", "br_if", "br_table", "call",
              "call_indirect", "size", "grow", "fill", "copy", "return")  # fmt: skip
_SIGNATURE = st.sampled_from(sorted(SIGNATURES))
_STATEMENT = st.sampled_from(STATEMENTS)
_STORE = st.sampled_from(STORES)
_LOAD = st.sampled_from(LOADS)
_OFFSET = st.sampled_from(OFFSETS)
_LENGTH = st.sampled_from(LENGTHS)
_MASK = st.sampled_from([0xFFFF, 0xFFF8, 0x1FFFF, 0xFFFFFFFF])
_ADDRESS = st.one_of(st.sampled_from(ADDRESSES), st.integers(0, 3 * PAGE))
_LOCAL = {ty: st.sampled_from(LOCALS[ty]) for ty in NUMBER_TYPES}
_STATEMENT_COUNT = st.integers(0, 4)
_LOOP_BOUND = st.integers(0, 6)
_GROW = st.sampled_from([0, 1, 2, 0xFFFFFFFF, 70000])
_SLOT = st.sampled_from([0xFFFFFFFF, 0x80000000])
_CONTROL_CALLS = st.integers(1, 3)


@dataclass
class _Scope:
    """What a statement may use: its function, the labels around it, the loop depth, and the
    signatures of the functions before it (which it may call directly)."""

    func: int
    result: str
    leaves: Leaves
    sigs: list[str]
    callees: set[int]  # of the function, filled in as its direct calls are drawn
    labels: tuple[str, ...] = ()
    loops: int = 0
    names: list[int] = field(default_factory=lambda: [0])

    def label(self) -> str:
        self.names[0] += 1
        return f"$L{self.names[0]}"

    def inner(self, labels: tuple[str, ...], loops: int | None = None) -> _Scope:
        """The scope of a nested block: more labels, maybe one more loop."""
        loops = self.loops if loops is None else loops
        return _Scope(self.func, self.result, self.leaves, self.sigs, self.callees, labels, loops, self.names)


@functools.cache
def _below(n: int) -> st.SearchStrategy[int]:
    """0 to ``n - 1``: one strategy per bound (each new strategy is validated on its first draw)."""
    return st.integers(0, n - 1)


@functools.cache
def _one_of(items: tuple[str, ...]) -> st.SearchStrategy[str]:
    return st.sampled_from(items)


@st.composite
def _address(draw: st.DrawFn, scope: _Scope) -> Expr:
    if draw(_QUARTER) == 0:
        mask = draw(_MASK)
        inner = draw(expressions("i32", 1, scope.leaves))
        return ("op", "i32.and", "i32", (inner, ("leaf", "i32", f"i32.const {mask}")))
    return ("leaf", "i32", f"i32.const {draw(_ADDRESS)}")


def _small_expr(ty: str, scope: _Scope) -> st.SearchStrategy[Expr]:
    return expressions(ty, 2, scope.leaves)


@st.composite
def _statement(draw: st.DrawFn, scope: _Scope, table_size: int, depth: int) -> list[str]:
    kind = draw(_STATEMENT)
    out: list[str] = []
    if kind == "set":
        ty = draw(_NUMBER_TYPE)
        emit_value(draw(_small_expr(ty, scope)), out)
        out.append(f"local.set {draw(_LOCAL[ty])}")
    elif kind == "store":
        name, ty, _ = draw(_STORE)
        emit_expr(draw(_address(scope)), out)
        emit_value(draw(_small_expr(ty, scope)), out)
        out.append(f"{name} offset={draw(_OFFSET)}")
    elif kind == "load":
        name, ty, _ = draw(_LOAD)
        emit_expr(draw(_address(scope)), out)
        out += [f"{name} offset={draw(_OFFSET)}", f"local.set {LOCALS[ty][0]}"]
    elif kind == "global":
        ty = draw(_NUMBER_TYPE)
        emit_value(draw(_small_expr(ty, scope)), out)
        out.append(f"global.set {GLOBALS[ty]}")
    elif kind == "if" and depth > 0:
        emit_expr(draw(_small_expr("i32", scope)), out)
        label = scope.label()
        inner = scope.inner((*scope.labels, label))
        out.append(f"if {label}")
        out += draw(_statements(inner, table_size, depth - 1))
        out.append("else")
        out += draw(_statements(inner, table_size, depth - 1))
        out.append("end")
    elif kind == "loop" and depth > 0 and scope.loops < 2:
        counter = f"$k{scope.loops}"
        bound = draw(_LOOP_BOUND)
        exit_label, loop_label = scope.label(), scope.label()
        inner = scope.inner((*scope.labels, exit_label), scope.loops + 1)
        out += ["i32.const 0", f"local.set {counter}", f"block {exit_label}", f"loop {loop_label}",
                f"local.get {counter}", f"i32.const {bound}", "i32.ge_u", f"br_if {exit_label}"]  # fmt: skip
        out += draw(_statements(inner, table_size, depth - 1))
        out += [f"local.get {counter}", "i32.const 1", "i32.add", f"local.set {counter}", f"br {loop_label}",
                "end", "end"]  # fmt: skip
    elif kind == "br_if" and scope.labels:
        emit_expr(draw(_small_expr("i32", scope)), out)
        out.append(f"br_if {draw(_one_of(scope.labels))}")
    elif kind == "br_table" and depth > 0:
        labels = [scope.label() for _ in range(3)]
        targets = draw(st.lists(_one_of((*labels, *scope.labels)), min_size=1, max_size=5))
        out += [f"block {labels[0]}", f"block {labels[1]}", f"block {labels[2]}"]
        emit_expr(draw(_small_expr("i32", scope)), out)
        out += ["br_table " + " ".join(targets), "end"]
        for k in (1, 0):
            inner = scope.inner((*scope.labels, *labels[: k + 1]))
            out += draw(_statements(inner, table_size, depth - 1))
            out.append("end")
    elif kind == "call" and scope.func > 0:
        callee = draw(_below(scope.func))
        scope.callees.add(callee)
        out += draw(_call_args(scope, scope.sigs[callee], callee=callee))
    elif kind == "call_indirect":
        sig = draw(_SIGNATURE)
        out += draw(_call_args(scope, sig, callee=None, table_size=table_size))
    elif kind == "size":
        out += ["memory.size", "local.set $a1"]
    elif kind == "grow":
        out += [f"i32.const {draw(_GROW)}", "memory.grow", "local.set $a0"]
    elif kind in ("fill", "copy"):
        emit_expr(draw(_address(scope)), out)
        if kind == "fill":
            emit_expr(draw(_small_expr("i32", scope)), out)
        else:
            emit_expr(draw(_address(scope)), out)
        out += [f"i32.const {draw(_LENGTH)}", f"memory.{kind}"]
    elif kind == "return":
        emit_value(draw(_small_expr(scope.result, scope)), out)
        out.append("return")
    else:
        out.append("nop")
    return out


@functools.cache
def _slot(table_size: int) -> st.SearchStrategy[int]:
    """A call_indirect's table slot: in the table, just past it, or far beyond."""
    return st.one_of(st.integers(0, table_size + 1), _SLOT)


@st.composite
def _call_args(
    draw: st.DrawFn, scope: _Scope, sig: str, callee: int | None, table_size: int = 0
) -> list[str]:
    """A direct call of ``callee`` (of type ``sig``, its own), or a call_indirect of type ``sig``."""
    params, result = SIGNATURES[sig]
    out: list[str] = []
    for ty in params:
        emit_value(draw(_small_expr(ty, scope)), out)
    if callee is not None:
        out.append(f"call $f{callee}")
    else:
        slot = draw(_slot(table_size))
        out += [f"i32.const {slot}", f"call_indirect (type {sig})"]
    out.append(f"local.set {LOCALS[result][1]}" if draw(_BOOL) else "drop")
    return out


@st.composite
def _statements(draw: st.DrawFn, scope: _Scope, table_size: int, depth: int) -> list[str]:
    out: list[str] = []
    for _ in range(draw(_STATEMENT_COUNT)):
        out += draw(_statement(scope, table_size, depth))
    return out


@st.composite
def control_cases(draw: st.DrawFn, shape: BatchShape = CONTROL_BATCH) -> Case:
    """A module of statement-level functions over one memory, globals and a table; each
    function is a program of its own, called 1 to 3 times in turn (state carries over)."""
    lines = ["(module"]
    for name, (params, result) in sorted(SIGNATURES.items()):
        lines.append(f"  (type {name} (func (param {' '.join(params)}) (result {result})))")
    max_pages = draw(st.sampled_from([1, 2, 4]))
    lines.append(f'  (memory (export "memory") 1 {max_pages})')
    for k, (ty, bits) in enumerate(zip(NUMBER_TYPES, draw_values(draw, NUMBER_TYPES))):
        lines.append(f'  (global {GLOBALS[ty]} (export "g{k}") (mut {ty}) ({const_text(ty, bits)}))')
    table_size = draw(st.integers(1, 8))
    data = draw(st.binary(max_size=64))
    lines.append(f'  (data (i32.const {draw(st.sampled_from([0, 16, PAGE - 64]))}) "{_wat_bytes(data)}")')
    sigs: list[str] = []
    names = [0]
    funcs = batch(draw, lambda f: control_function(f, sigs, table_size, names), shape)
    slots = draw(st.lists(st.one_of(st.none(), st.integers(0, len(funcs) - 1)), min_size=table_size,
                          max_size=table_size))  # fmt: skip
    return _control_module(lines, slots, list(enumerate(funcs)))


ControlFunction = tuple[str, list[Call], set[int]]  # text, calls, the functions it calls directly


def _control_module(
    head: list[str], slots: list[int | None], funcs: list[tuple[int, ControlFunction]]
) -> Case:
    """The module of ``funcs`` (by their index when drawn); table slots of other functions
    are null. None where a function calls one that is left out."""
    present = {index for index, _ in funcs}
    items = " ".join("(ref.null func)" if s not in present else f"(ref.func $f{s})" for s in slots)
    lines = [*head, f'  (table $tab (export "table") {len(slots)} funcref)',
             f"  (elem (table $tab) (i32.const 0) funcref {items})"]  # fmt: skip
    lines += [text for _, (text, _, _) in funcs]
    calls = [replace(call, program=k) for k, (_, (_, calls, _)) in enumerate(funcs) for call in calls]

    def subset(keep: list[int]) -> Case | None:
        kept = [funcs[k] for k in keep]
        if any(not callees <= {index for index, _ in kept} for _, (_, _, callees) in kept):
            return None
        return _control_module(head, slots, kept)

    return Case("control", "\n".join(lines) + "\n)\n", calls, programs=len(funcs), subset=subset)


@st.composite
def control_function(
    draw: st.DrawFn, index: int, sigs: list[str], table_size: int, names: list[int]
) -> ControlFunction:
    """Function ``f<index>`` of a control module and its calls; ``sigs`` holds the types of
    the functions before it (and gets its own), ``names`` numbers the labels of the module."""
    sig = draw(_SIGNATURE)
    params, result = SIGNATURES[sig]
    scope = _Scope(index, result, CONTROL_LEAVES[sig], sigs, set(), names=names)
    body = draw(_statements(scope, table_size, depth=2))
    emit_value(draw(_small_expr(result, scope)), body)
    sigs.append(sig)
    decl = " ".join(f"(param $p{i} {ty})" for i, ty in enumerate(params))
    local_decls = " ".join(f"(local {n} {ty})" for ty in NUMBER_TYPES for n in LOCALS[ty])
    text = (
        f'  (func $f{index} (export "f{index}") (type {sig}) {decl} (result {result})\n'
        f"    {local_decls} (local $k0 i32) (local $k1 i32) {SCRATCH_LOCALS}\n    "
        + "\n    ".join(body)
        + ")"
    )
    calls = []
    for _ in range(draw(_CONTROL_CALLS)):
        args = tuple((TYPES[t], bits) for t, bits in zip(params, draw_values(draw, params)))
        calls.append(Call(f"f{index}", args, program=index))
    return text, calls, scope.callees


def _wat_bytes(data: bytes) -> str:
    return "".join(f"\\{b:02x}" for b in data)


# -- loop kernels ---------------------------------------------------------------------------

ELEMENTS = {  # element kind -> (value type, load, store, size)
    "i32": ("i32", "i32.load", "i32.store", 4), "i64": ("i64", "i64.load", "i64.store", 8),
    "f32": ("f32", "f32.load", "f32.store", 4), "f64": ("f64", "f64.load", "f64.store", 8),
    "u8": ("i32", "i32.load8_u", "i32.store8", 1), "s16": ("i32", "i32.load16_s", "i32.store16", 2),
}  # fmt: skip
# (from, to) -> the conversion instruction; same type needs none.
CONVERSIONS = {
    ("i32", "i64"): "i64.extend_i32_s", ("i64", "i32"): "i32.wrap_i64",
    ("i32", "f32"): "f32.convert_i32_s", ("i32", "f64"): "f64.convert_i32_u",
    ("i64", "f32"): "f32.convert_i64_u", ("i64", "f64"): "f64.convert_i64_s",
    ("f32", "i32"): "i32.trunc_sat_f32_s", ("f64", "i32"): "i32.trunc_sat_f64_u",
    ("f32", "i64"): "i64.trunc_sat_f32_u", ("f64", "i64"): "i64.trunc_sat_f64_s",
    ("f32", "f64"): "f64.promote_f32", ("f64", "f32"): "f32.demote_f64",
}  # fmt: skip
BINARY = {"i32": ["add", "sub", "mul", "xor", "and", "shl", "rotr", "shr_s"],
          "i64": ["add", "sub", "mul", "or", "shr_u", "rotl"],
          "f32": ["add", "sub", "mul", "div", "min", "max"],
          "f64": ["add", "mul", "sub", "div", "min", "max", "copysign"]}  # fmt: skip
# Constant divisors of the loop kernels' divisions: mostly ones that make them total.
DIVISORS = [2100, 7, 3, -3, 1, 2100, 7, -1, 0]
REDUCTIONS = {
    "i32": ["add", "xor", "mul", "max_s"],
    "i64": ["add", "or", "min_u"],
    "f32": ["add"],
    "f64": ["add"],
}


@dataclass
class Access:
    """``buffer[stride_i * i + stride_j * j + stride_k * k + offset]``: one affine access of
    a loop body (``j`` and ``k`` the counters of a nest's inner loops, when it has them)."""

    buffer: int
    stride_i: int
    stride_j: int
    offset: int
    stride_k: int = 0


@st.composite
def _access(draw: st.DrawFn, buffer: int, depth: int) -> Access:
    stride_i = draw(st.sampled_from([1, 2, 0, 3, -1, 4]))
    stride_j = draw(st.sampled_from([1, 0, 2, 8])) if depth > 1 else 0
    stride_k = draw(st.sampled_from([1, 0, 3, 6])) if depth > 2 else 0
    return Access(buffer, stride_i, stride_j, draw(st.sampled_from([0, 1, 3, -1, 7])), stride_k)


def _index_range(a: Access, n: int, m: int) -> tuple[int, int]:
    """The smallest and largest element index ``a`` touches for i < n and j, k < m (n, m >= 1)."""
    corners = [
        a.stride_i * i + a.stride_j * j + a.stride_k * k + a.offset
        for i in (0, n - 1) for j in (0, m - 1) for k in (0, m - 1)
    ]  # fmt: skip
    return min(corners), max(corners)


def _fits(accesses: list[Access], lengths: list[int], n: int, m: int) -> bool:
    if n == 0 or m == 0:
        return True
    for a in accesses:
        low, high = _index_range(a, n, m)
        if low < 0 or high >= lengths[a.buffer]:
            return False
    return True


LAYOUTS = ("packed", "at_end", "overlap", "unaligned")


@st.composite
def _layout(draw: st.DrawFn, kinds: list[str], lengths: list[int]) -> tuple[str, list[int]]:
    """Where the buffers of ``kinds`` (the last one written) lie: one after another with a
    gap (``packed``), at odd addresses (``unaligned``), the written one over the first
    (``overlap``: only the guards see it), or against the end of memory (``at_end``: an
    overrun traps)."""
    layout = draw(st.sampled_from(LAYOUTS))
    bases, cursor = [], 64
    for kind, length in zip(kinds, lengths, strict=True):
        if layout == "unaligned":
            cursor += draw(st.integers(0, 7))
        bases.append(cursor)
        cursor += length * ELEMENTS[kind][3] + (0 if layout == "overlap" else 8)
    if layout == "overlap":
        bases[-1] = bases[0] + draw(st.integers(0, 8))
    if layout == "at_end":
        shift = PAGE - cursor
        bases = [b + shift for b in bases]
        bases[-1] = PAGE - lengths[-1] * ELEMENTS[kinds[-1]][3]
    return layout, bases


def _segments(draw: st.DrawFn, kinds: list[str], lengths: list[int], bases: list[int]) -> list[str]:
    """Data segments for the first (up to six) elements of each buffer, edge-biased."""
    data = []
    for kind, length, base in zip(kinds, lengths, bases, strict=True):
        vt, _, _, size = ELEMENTS[kind]
        raw = b"".join(
            (bits & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
            for bits in draw_values(draw, (vt,) * min(length, 6))
        )
        data.append(f'  (data (i32.const {base}) "{_wat_bytes(raw)}")')
    return data


def _stored(value: str, ty: str) -> str:
    """``value`` made ready to store: a float stored to memory is compared bit for bit, so a
    NaN that arithmetic made becomes the canonical one (uses the scratch local of ``ty``)."""
    if ty not in ("f32", "f64"):
        return value
    scratch = f"(local.get $c{ty})"
    return f"(local.set $c{ty} {value}) (select ({ty}.const nan) {scratch} ({ty}.ne {scratch} {scratch}))"


@st.composite
def loop_cases(draw: st.DrawFn, shape: BatchShape = LOOP_BATCH) -> Case:
    """A module of loop kernels ``kernel0``..., each a counted loop (or a nest of two or three) over
    affine accesses, and each a program of its own; see the module docstring. The kernels
    share the one page of memory. ``meta["kernels"]`` describes each one."""
    return _loop_module(batch(draw, lambda k: _any_kernel(f"kernel{k}", k), shape))


Kernel = tuple[str, list[str], list[Call], dict[str, Any]]  # function, data segments, calls, meta


def _loop_module(kernels: list[Kernel], data: list[str] | None = None) -> Case:
    """The module of ``kernels``, with the data segments ``data`` (default: theirs). A
    subset keeps every data segment of the whole module: the kernels share the one page, so
    a kernel may read another's data, and the program left must see the memory it saw."""
    funcs = [func for func, _, _, _ in kernels]
    if data is None:
        data = [segment for _, segments, _, _ in kernels for segment in segments]
    calls = [replace(call, program=k) for k, (_, _, calls, _) in enumerate(kernels) for call in calls]
    wat = (
        '(module\n  (memory (export "memory") 1 1)\n'
        '  (global $phase (export "phase") (mut i32) (i32.const 0))\n' + "\n".join(data + funcs) + "\n)\n"
    )
    meta = {"kernels": [meta for *_, meta in kernels]}
    return Case("loops", wat, calls, meta=meta, programs=len(kernels),
                subset=lambda keep: _loop_module([kernels[k] for k in keep], data))  # fmt: skip


@st.composite
def _any_kernel(draw: st.DrawFn, name: str, index: int) -> Kernel:
    """A kernel over buffers (:func:`_kernel`) three in eight; one in eight a long
    reduction; half one of PolyBench's eight shapes (:func:`shaped_kernel`)."""
    pick = draw(st.integers(0, 7))
    if pick == 0:
        return draw(_long_reduction(name, index))
    if pick >= 4:
        return draw(shaped_kernel(name, index))
    return draw(_kernel(name, index))


LONG_TRIPS = st.sampled_from([4_096, 65_537, 262_144, 300_001]) | st.integers(0, 300_001)


@st.composite
def _long_reduction(draw: st.DrawFn, name: str, index: int) -> Kernel:
    """An integer reduction over up to 300,001 iterations of a few elements read at fixed
    places, plus the counter: on the GPU, more blocks than the device holds at once, so
    blocks start after others have folded their partials (a kernel that read its starting
    value from the output would count those twice)."""
    kind = draw(st.sampled_from(sorted(ELEMENTS)))
    vt, op, _, size = ELEMENTS[kind]
    length = draw(st.integers(1, 6))
    reduce_type = draw(st.sampled_from(["i32", "i64"]))
    reduce_op = draw(st.sampled_from(REDUCTIONS[reduce_type]))
    reads = [Access(0, 0, 0, draw(st.integers(0, length - 1))) for _ in range(draw(st.integers(1, 2)))]
    term = convert("(local.get $i)", "i32", reduce_type)
    for a in reads:
        loaded = convert(f"({op} (i32.const {64 + a.offset * size}))", vt, reduce_type)
        term = f"({reduce_type}.add {term} {loaded})"
    init_bits = draw_values(draw, (reduce_type,))[0]
    update = f"(local.set $acc {_reduce(reduce_type, reduce_op, '(local.get $acc)', term)})"
    func = (
        f'  (func (export "{name}") (param $n i32) (param $m i32) (result {reduce_type})\n'
        f"    (local $i i32) (local $acc {reduce_type})\n"
        f"    (local.set $acc ({const_text(reduce_type, init_bits)}))\n"
        f"    {_counted('$i', '$n', update, '      ')}\n    (local.get $acc))"
    )
    raw = b"".join(
        (bits & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
        for bits in draw_values(draw, (vt,) * length)
    )
    data = [f'  (data (i32.const 64) "{_wat_bytes(raw)}")']
    trips = [draw(LONG_TRIPS) for _ in range(draw(st.integers(1, 2)))]
    calls = [Call(name, ((I32, n), (I32, 1)), True, index) for n in trips]
    meta: dict[str, Any] = {
        "function": name,
        "buffers": [{"base": 64, "element": kind, "length": length, "bytes": length * size}],
        "accesses": [vars(a) for a in reads],
        "written": None,
        "layout": "long",
        "nest_depth": 1,
        "trip_counts": [(n, 1) for n in trips],
        "reduction": [reduce_type, reduce_op],
        "conditional": False,
        "time_steps": 0,
    }
    return func, data, calls, meta


@st.composite
def _kernel(draw: st.DrawFn, name: str, index: int) -> Kernel:
    depth = draw(st.sampled_from([1, 1, 1, 2, 2, 3]))  # a nest of 2 or 3 loops, both bounded by m
    nested = depth > 1
    n_inputs = draw(st.integers(1, 3))
    kinds = [draw(st.sampled_from(sorted(ELEMENTS))) for _ in range(n_inputs + 1)]  # the last one is written
    lengths = [draw(st.integers(1, 40)) for _ in kinds]
    layout, bases = draw(_layout(kinds, lengths))
    reads = [draw(_access(b, depth)) for b in range(n_inputs)]
    write = draw(_access(n_inputs, depth))
    # One kernel in four takes its buffers' addresses as parameters: whether the written one
    # meets another (a call may pass it overlapping one) is then known only at run time.
    parametric = draw(st.integers(0, 3)) == 0
    # Two kernels in five (without a reduction or time steps) have their last call made
    # again, with the same arguments, and bump a byte its first iteration reads on every
    # call: the runtime replays a launch like the last one without the whole path, and must
    # still see what changed in memory. Made again twice, the last call is a replay in
    # Python; four times, one in native code (the oracle's instances go native at once).
    repeats = draw(st.sampled_from([0, 0, 0, 2, 4]))

    def base(b: int) -> str:
        return f"(local.get $p{b})" if parametric else f"(i32.const {bases[b]})"

    out_type = ELEMENTS[kinds[-1]][0]
    reduce_type = None if repeats else draw(st.sampled_from([None, "i32", "i64", "f32", "f64"]))
    reduce_op = draw(st.sampled_from(REDUCTIONS[reduce_type])) if reduce_type else None
    conditional = draw(st.booleans())

    def address(a: Access) -> str:
        size = ELEMENTS[kinds[a.buffer]][3]
        index = f"(i32.mul (local.get $i) (i32.const {a.stride_i}))"
        if nested:
            index = f"(i32.add {index} (i32.mul (local.get $j) (i32.const {a.stride_j})))"
        if depth > 2:
            index = f"(i32.add {index} (i32.mul (local.get $k) (i32.const {a.stride_k})))"
        return f"(i32.add {base(a.buffer)} (i32.mul (i32.add {index} (i32.const {a.offset})) (i32.const {size})))"

    def load(a: Access, ty: str) -> str:
        vt, op, _, _ = ELEMENTS[kinds[a.buffer]]
        return convert(f"({op} {address(a)})", vt, ty)

    value = load(reads[0], out_type)
    for a in reads[1:]:
        op = draw(st.sampled_from(BINARY[out_type]))
        value = f"({out_type}.{op} {value} {load(a, out_type)})"
    if out_type in ("i32", "i64") and draw(st.integers(0, 3)) == 0:
        # A division by a constant (PolyBench's ``(i + j) % n``, ``n`` inlined): it cannot
        # trap unless the constant is 0 (or -1 under div_s), and only then may the kernel.
        op = draw(st.sampled_from(["div_u", "div_s", "rem_u", "rem_s"]))
        value = f"({out_type}.{op} {value} ({out_type}.const {draw(st.sampled_from(DIVISORS))}))"
    # Sometimes the outer loop of a nest loads a value before its inner loop (no perfect
    # nest): the outer loop launches with its inner loops in the thread, or where it
    # declines (overlapping buffers), each inner loop launches between wasmtime's loads.
    hoisted = None
    if nested and draw(st.integers(0, 2)) == 0:
        a = draw(st.sampled_from(reads))
        vt, load_op, _, size = ELEMENTS[kinds[a.buffer]]
        at = f"(i32.add (i32.mul (local.get $i) (i32.const {a.stride_i})) (i32.const {a.offset}))"
        hoisted = convert(
            f"({load_op} (i32.add {base(a.buffer)} (i32.mul {at} (i32.const {size}))))",
            vt,
            out_type,
        )
        value = f"({out_type}.{draw(st.sampled_from(BINARY[out_type]))} {value} (local.get $h))"
    value = _stored(value, out_type)
    _, _, store_op, _ = ELEMENTS[kinds[-1]]
    store = f"({store_op} {address(write)} {value})"
    if conditional:
        cond = f"(i32.and (local.get $i) (i32.const {draw(st.sampled_from([1, 3, 4]))}))"
        if draw(st.booleans()):
            cond = load(reads[0], "i32")
        store = f"(if {cond} (then {store}))"
    body = [store]
    if reduce_type:
        term = load(draw(st.sampled_from(reads)), reduce_type)
        body.append(f"(local.set $acc {_reduce(reduce_type, reduce_op, '(local.get $acc)', term)})")
    inner = "\n        ".join(body)
    if depth > 2:
        inner = _counted("$k", "$m", inner, "            ")
    if nested:
        inner = _counted("$j", "$m", inner, "          ")
        if hoisted is not None:
            inner = f"(local.set $h {hoisted})\n          {inner}"
    func_body = _counted("$i", "$n", inner, "      ")
    # Repeated over time steps, the loop makes a device-resident region: its data stays on
    # the device from one step to the next.
    steps = 0 if repeats else draw(st.sampled_from([0, 0, 1, 2, 3]))
    if steps:
        func_body = (
            f"(local.set $s (i32.const 0))\n    (loop $time\n      {func_body}\n"
            # A scalar carried from step to step, not a reduction: the steps are sequential.
            f"      (global.set $phase (i32.add (i32.mul (global.get $phase) (i32.const 5)) (i32.const 1)))\n"
            f"      (local.set $s (i32.add (local.get $s) (i32.const 1)))\n"
            f"      (br_if $time (i32.lt_u (local.get $s) (i32.const {steps}))))"
        )
    if repeats:
        first = bases[0] + reads[0].offset * ELEMENTS[kinds[0]][3]
        func_body = (
            f"(i32.store8 (i32.const {first}) (i32.add (i32.load8_u (i32.const {first})) (i32.const 1)))\n"
            f"    {func_body}"
        )
    acc_type = reduce_type or "i32"
    pointer_params = "".join(f" (param $p{b} i32)" for b in range(len(kinds))) if parametric else ""
    func = (
        f'  (func (export "{name}") (param $n i32) (param $m i32){pointer_params} (result {acc_type})\n'
        f"    (local $i i32) (local $j i32) (local $k i32) (local $s i32) (local $acc {acc_type}) (local $h {out_type})"
        f" {SCRATCH_LOCALS}\n"
        f"    {func_body}\n    (local.get $acc))"
    )
    data = _segments(draw, kinds, lengths, bases)
    accesses = [*reads, write]
    trips = []
    fit_m = max(m for m in range(16) if _fits(accesses, lengths, 1, m)) if nested else 1
    fit = max(n for n in range(64) if _fits(accesses, lengths, n, max(fit_m, 1)))
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.sampled_from([fit, fit + 1, 0, 1, max(fit - 1, 0)]) | st.integers(0, 48))
        m = draw(st.sampled_from([fit_m, fit_m + 1, 1, 0]) | st.integers(0, 8)) if nested else 1
        trips.append((n, m))
    exact = reduce_type not in ("f32", "f64")
    pointers = []
    for _ in trips:
        at = list(bases)
        if parametric and draw(st.booleans()):  # the written buffer over an input, a few elements off
            at[-1] = (
                bases[draw(st.integers(0, n_inputs - 1))] + draw(st.integers(-2, 2)) * ELEMENTS[kinds[-1]][3]
            )
        pointers.append(tuple(at) if parametric else ())
    trips += [trips[-1]] * repeats
    pointers += [pointers[-1]] * repeats
    calls = [
        Call(name, ((I32, n), (I32, m), *((I32, b & 0xFFFFFFFF) for b in at)), exact, index)
        for (n, m), at in zip(trips, pointers, strict=True)
    ]
    meta: dict[str, Any] = {
        "function": name,
        "buffers": [
            {"base": base, "element": kind, "length": length, "bytes": length * ELEMENTS[kind][3]}
            for base, kind, length in zip(bases, kinds, lengths, strict=True)
        ],
        "accesses": [vars(a) for a in accesses],
        "written": n_inputs,
        "layout": layout,
        "nest_depth": depth,
        "trip_counts": trips,
        "reduction": [reduce_type, reduce_op] if reduce_type else None,
        "conditional": conditional,
        "time_steps": steps,
        "hoisted_load": hoisted is not None,
        "pointers": [list(at) for at in pointers] if parametric else None,
    }
    return func, data, calls, meta


def convert(value: str, src: str, dst: str) -> str:
    return value if src == dst else f"({CONVERSIONS[src, dst]} {value})"


def _reduce(ty: str, op: str, acc: str, term: str) -> str:
    if op in ("max_s", "min_u"):
        cmp = "gt_s" if op == "max_s" else "lt_u"
        return f"(select {acc} {term} ({ty}.{cmp} {acc} {term}))"
    return f"({ty}.{op} {acc} {term})"


def _counted(var: str, bound: str, body: str, indent: str) -> str:
    return (
        f"(local.set {var} (i32.const 0))\n{indent}(block $exit{var} (loop $loop{var}\n"
        f"{indent}  (br_if $exit{var} (i32.ge_s (local.get {var}) (local.get {bound})))\n"
        f"{indent}  {body}\n"
        f"{indent}  (local.set {var} (i32.add (local.get {var}) (i32.const 1)))\n"
        f"{indent}  (br $loop{var})))"
    )


def _range(var: str, start: str, bound: str, body: str, indent: str, test: str = "ge_s") -> str:
    """``for var in [start, bound)``, tested at its top (``test`` the exit comparison)."""
    return (
        f"(local.set {var} {start})\n{indent}(block $exit{var} (loop $loop{var}\n"
        f"{indent}  (br_if $exit{var} (i32.{test} (local.get {var}) {bound}))\n"
        f"{indent}  {body}\n"
        f"{indent}  (local.set {var} (i32.add (local.get {var}) (i32.const 1)))\n"
        f"{indent}  (br $loop{var})))"
    )


# -- PolyBench's shapes ------------------------------------------------------------------------
#
# Loop nests shaped the way PolyBench's kernels are once clang -O2 has built them: bounds
# affine in the enclosing counters, a statement loop beside a nested loop under one outer
# loop, time loops over stencils, and loops unrolled by four with their remainder. Each
# kernel takes ``(n, m, s)``: the outer trip count, the inner one, and (stencils) the time
# steps. Accesses are :class:`Access` over the counters ``i``, ``j``, ``k``.

SHAPES = (
    "triangular", "imperfect", "stencil", "unrolled", "privatised", "midexit", "columns", "split", "rows",
)  # fmt: skip
# Inner bounds of a triangular or trapezoidal nest, as (start, end) in i, n, m and c.
TRIANGLES = (("0", "i"), ("i", "n"), ("i+1", "n"), ("0", "i+c"), ("i", "i+c"), ("i", "m"))
_ROW = st.sampled_from([4, 8, 16, 5])  # the row stride of a 2-D array, in elements


def _bound_text(bound: str, c: int) -> str:
    """The Wasm of a bound of :data:`TRIANGLES` (or ``n``, ``m``)."""
    return {
        "0": "(i32.const 0)", "i": "(local.get $i)", "n": "(local.get $n)", "m": "(local.get $m)",
        "i+1": "(i32.add (local.get $i) (i32.const 1))", "i+c": f"(i32.add (local.get $i) (i32.const {c}))",
    }[bound]  # fmt: skip


def _bound_value(bound: str, c: int, i: int, n: int, m: int) -> int:
    return {"0": 0, "i": i, "n": n, "m": m, "i+1": i + 1, "i+c": i + c}[bound]


@dataclass
class _Shape:
    """One drawn kernel of :data:`SHAPES`: its buffers (the last one written first in
    ``written``) and a function giving, for trip counts ``(n, m)``, the counter values at
    which an affine access takes its extremes (every ``i``, and each inner loop's ends)."""

    name: str
    kinds: list[str]
    lengths: list[int]
    bases: list[int]
    layout: str
    accesses: list[Access]
    points: Callable[[int, int], list[tuple[int, int, int]]]
    body: str = ""
    params: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    # Buffers addressed through a parameter (index -> the Wasm of its base), and the values
    # a call may pass to the parameters after ``params``' own (one tuple drawn per call).
    pointers: dict[int, str] = field(default_factory=dict)
    arguments: list[tuple[int, ...]] = field(default_factory=list)

    def base(self, b: int) -> str:
        return self.pointers.get(b, f"(i32.const {self.bases[b]})")

    def address(self, a: Access, at: dict[str, str]) -> str:
        """The address of ``a`` with the counters' values ``at`` (Wasm expressions)."""
        index = f"(i32.const {a.offset})"
        for var, stride in (("i", a.stride_i), ("j", a.stride_j), ("k", a.stride_k)):
            if stride:
                index = f"(i32.add {index} (i32.mul {at[var]} (i32.const {stride})))"
        size = ELEMENTS[self.kinds[a.buffer]][3]
        return f"(i32.add {self.base(a.buffer)} (i32.mul {index} (i32.const {size})))"

    def load(self, a: Access, ty: str, at: dict[str, str]) -> str:
        vt, op, _, _ = ELEMENTS[self.kinds[a.buffer]]
        return convert(f"({op} {self.address(a, at)})", vt, ty)

    def store(self, a: Access, value: str, ty: str, at: dict[str, str]) -> str:
        """``a = value``, ``value`` of type ``ty`` converted to the buffer's element."""
        vt, _, op, _ = ELEMENTS[self.kinds[a.buffer]]
        return f"({op} {self.address(a, at)} {_stored(convert(value, ty, vt), vt)})"

    def fits(self, n: int, m: int) -> bool:
        """Every access stays inside its buffer for trip counts ``(n, m)``."""
        for i, j, k in self.points(n, m):
            for a in self.accesses:
                index = a.stride_i * i + a.stride_j * j + a.stride_k * k + a.offset
                if index < 0 or index >= self.lengths[a.buffer]:
                    return False
        return True


COUNTERS = {"i": "(local.get $i)", "j": "(local.get $j)", "k": "(local.get $k)"}


def _ends(start: int, end: int) -> list[int]:
    return [start, end - 1] if end > start else []


def _combine(draw: st.DrawFn, ty: str, values: list[str]) -> str:
    value = values[0]
    for term in values[1:]:
        value = f"({ty}.{draw(st.sampled_from(BINARY[ty]))} {value} {term})"
    return value


@st.composite
def _buffers(draw: st.DrawFn, count: int, same: bool = False) -> tuple[list[str], list[int], str, list[int]]:
    """``count`` buffers (the last one written) of random element kinds (one kind with
    ``same``) and lengths, laid out by :func:`_layout`."""
    kinds = (
        [draw(st.sampled_from(sorted(ELEMENTS)))] * count
        if same
        else [draw(st.sampled_from(sorted(ELEMENTS))) for _ in range(count)]
    )
    lengths = [draw(st.integers(1, 160)) for _ in kinds]
    layout, bases = draw(_layout(kinds, lengths))
    return kinds, lengths, layout, bases


@st.composite
def _triangular(draw: st.DrawFn) -> _Shape:
    """``for i in [0, n): for j in [lo(i), hi(i)): w[...] = f(reads)``, with inner bounds
    affine in ``i`` (:data:`TRIANGLES`): triangular and trapezoidal nests (syrk, trmm, lu)."""
    n_inputs = draw(st.integers(1, 3))
    kinds, lengths, layout, bases = draw(_buffers(n_inputs + 1))
    start, end = draw(st.sampled_from(TRIANGLES))
    c = draw(st.sampled_from([1, 2, 3, -1]))
    row = draw(_ROW)
    # Rows and columns of a 2-D array (the written one mostly so, one row per i: parallel),
    # or any affine access of the rectangular nests.
    rowwise = st.sampled_from([(row, 1), (1, row), (row, 0)])
    accesses = []
    for b in range(n_inputs + 1):
        if draw(st.booleans()):
            si, sj = draw(rowwise)
            accesses.append(Access(b, si, sj, draw(st.sampled_from([0, 1, -1, row]))))
        else:
            accesses.append(draw(_access(b, 2)))
    shape = _Shape("triangular", kinds, lengths, bases, layout, accesses, lambda n, m: [
        (i, j, 0) for i in range(n) for j in _ends(_bound_value(start, c, i, n, m), _bound_value(end, c, i, n, m))
    ])  # fmt: skip
    ty = ELEMENTS[kinds[-1]][0]
    value = _combine(draw, ty, [shape.load(a, ty, COUNTERS) for a in accesses[:-1]])
    inner = _range("$j", _bound_text(start, c), _bound_text(end, c), shape.store(accesses[-1], value, ty, COUNTERS),
                   "          ")  # fmt: skip
    shape.body = _range("$i", "(i32.const 0)", "(local.get $n)", inner, "      ")
    shape.meta = {"bounds": [start, end], "c": c}
    return shape


@st.composite
def _imperfect(draw: st.DrawFn) -> _Shape:
    """gemm's shape: ``for i in [0, n) { for j: c[i][j] *= beta; for k { for j: c[i][j] +=
    a[i][k] * d[k][j] } }``, the nested loop's two counters in either order (``kj``, as
    clang leaves gemm; ``jk``, a reduction per element), ``k`` bounded by ``m`` or ``n``; or
    ``jk`` with ``c[i][j]`` kept in a local across ``k`` and stored after it (``register``:
    a store outside the innermost loop)."""
    kinds, lengths, layout, bases = draw(_buffers(3))  # a, d, then c (read and written)
    row = draw(_ROW)
    order = draw(st.sampled_from(["kj", "jk", "register"]))
    k_bound = draw(st.sampled_from(["m", "n"]))
    first = draw(st.sampled_from(["scale", "set", "add"]))
    off = draw(st.sampled_from([0, 0, 1, -1]))
    a, d = Access(0, row, 0, off, 1), Access(1, 0, 1, 0, row)
    c = Access(2, row, 1, draw(st.sampled_from([0, 0, 2])))
    accesses = [a, d, c]
    shape = _Shape("imperfect", kinds, lengths, bases, layout, accesses, lambda n, m: [
        (i, j, k) for i in range(n) for j in _ends(0, m) for k in _ends(0, m if k_bound == "m" else n)
    ])  # fmt: skip
    ty = ELEMENTS[kinds[2]][0]
    beta = const_text(ty, draw_values(draw, (ty,))[0])
    old = shape.load(c, ty, COUNTERS)
    statement = {
        "scale": f"({ty}.mul {old} ({beta}))", "add": f"({ty}.add {old} ({beta}))", "set": f"({beta})",
    }[first]  # fmt: skip
    product = f"({ty}.mul {shape.load(a, ty, COUNTERS)} {shape.load(d, ty, COUNTERS)})"
    update = shape.store(c, f"({ty}.add {old} {product})", ty, COUNTERS)
    outer, inner = ("$k", "$j") if order == "kj" else ("$j", "$k")
    bounds = {"$j": "(local.get $m)", "$k": f"(local.get ${k_bound})"}
    nest = _range(outer, "(i32.const 0)", bounds[outer],
                  _range(inner, "(i32.const 0)", bounds[inner], update, "            "), "          ")  # fmt: skip
    if order == "register":
        kept = f"(local.get $r{ty})"
        add = f"(local.set $r{ty} ({ty}.add {kept} {product}))"
        keep = (f"(local.set $r{ty} {old})\n            "
                f"{_range('$k', '(i32.const 0)', bounds['$k'], add, '            ')}\n            "
                f"{shape.store(c, kept, ty, COUNTERS)}")  # fmt: skip
        nest = _range("$j", "(i32.const 0)", bounds["$j"], keep, "          ")
    scale = _range(
        "$j", "(i32.const 0)", "(local.get $m)", shape.store(c, statement, ty, COUNTERS), "          "
    )
    shape.body = _range("$i", "(i32.const 0)", "(local.get $n)", f"{scale}\n        {nest}", "      ")
    shape.meta = {"order": order, "k_bound": k_bound, "first": first}
    return shape


@st.composite
def _split(draw: st.DrawFn, variant: str | None = None) -> _Shape:
    """atax's and bicg's shape: a loop that every iteration adds into a whole vector,
    sequential, whose body splits into phases that each run in parallel over all of it
    (compiler.analysis.fission). ``atax``: ``for i in [0, n) { t[i] = c; for j in [0, m):
    t[i] = t[i] + a[i][j] * x[j]; for j in [0, m): y[j] = y[j] + a[i][j] * t[i] }``;
    ``bicg``: both updates in one ``j`` loop, ``y[j]`` taking ``x[i]`` for ``t[i]``; ``carried``: the statement reads ``y[i]``,
    which earlier rows' ``j`` loops wrote (not split: a stepped loop, each ``i`` running its
    statement and first ``j`` loop on one thread, then the second over ``j``); ``norm``:
    gramschmidt's, the row's sum made in a local by the first ``j`` loop and stored after it
    (a stepped loop whose one-thread phase runs that loop, the others skipping it); ``lu``:
    PolyBench's lu over ``a`` alone, its size a number as PolyBench's are (``for i in [0, s) {
    for j in [0, i) { for k in [0, j): a[i][j] -= a[i][k] * a[k][j]; a[i][j] *= c }; for j in
    [i, s): for k in [0, i): ... }``: a wavefront, each ``a[i][j]`` a task in step ``i + j``);
    ``fw``: PolyBench's floyd-warshall over ``a``, its size a number (``for k in [0, s) for i
    in [0, s) for j in [0, s): a[i][j] = a[i][j] < a[i][k] + a[k][j] ? a[i][j] : a[i][k] +
    a[k][j]``: stepped, the ``i`` loop split at row ``k``); ``seidel``: PolyBench's seidel-2d
    over ``a``, its size a number (``for t in [0, s) for r in [1, size - 1) for c in [1, size -
    1): a[r][c] = f(a[r-1][c], a[r][c-1], a[r][c], a[r][c+1], a[r+1][c], u)``, where ``u``, as
    clang leaves it, is carried from row to row: row ``r - 1``'s first element loaded, or the
    value row ``r - 1`` stored there last; a wavefront in steps ``2t + r`` whose tasks reload
    ``u``); ``gs``: PolyBench's gramschmidt over ``a``, ``q`` and ``r``, its size a number
    (``for k in [0, s) { r[k][k] = a[k][k] * c; for i: q[i][k] = a[i][k] * r[k][k]; for j in
    [k + 1, s) { r[k][j] = c0; for i: r[k][j] += q[i][k] * a[i][j]; for i: a[i][j] -= q[i][k]
    * r[k][j] } }``, ``r[k][j]`` read back from memory as clang leaves it: stepped, its ``j``
    loop split into the sums over ``j`` and the updates over ``(j, i)`` cells). The arrays
    are pointers."""
    kinds, lengths, layout, bases = draw(_buffers(4, same=draw(st.booleans())))  # a, x, t, then y
    row = draw(_ROW)
    # (``gs`` only where asked for: its isl checks would slow every drawn split shape's shrinking)
    variant = variant or draw(st.sampled_from(["atax", "bicg", "carried", "norm", "lu", "fw", "seidel"]))
    if variant in ("lu", "fw", "seidel", "gs"):
        return _lu(draw, kinds, lengths, bases, layout, row, variant)
    a, x, x_i = Access(0, row, 1, 0), Access(1, 0, 1, 0), Access(1, 1, 0, 0)
    t, y, y_i = Access(2, 1, 0, 0), Access(3, 0, 1, 0), Access(3, 1, 0, 0)
    accesses = [a, x, t, y, *{"carried": [y_i], "bicg": [x_i]}.get(variant, [])]
    shape = _Shape("split", kinds, lengths, bases, layout, accesses, lambda n, m: [
        (i, j, 0) for i in range(n) for j in _ends(0, m)
    ])  # fmt: skip
    _by_pointers(shape, bases)
    tt, yt = ELEMENTS[kinds[2]][0], ELEMENTS[kinds[3]][0]
    first = const_text(tt, draw_values(draw, (tt,))[0])
    if variant == "carried":
        first = f"({tt}.add {shape.load(y_i, tt, COUNTERS)} {first})"
    start = shape.store(t, first, tt, COUNTERS)
    own = shape.store(t, f"({tt}.add {shape.load(t, tt, COUNTERS)} ({tt}.mul {shape.load(a, tt, COUNTERS)} "
                         f"{shape.load(x, tt, COUNTERS)}))", tt, COUNTERS)  # fmt: skip
    factor = x_i if variant == "bicg" else t  # bicg's s[j] += r[i] * A[i][j]: an input, not what the row sums
    spread = shape.store(y, f"({yt}.add {shape.load(y, yt, COUNTERS)} ({yt}.mul {shape.load(a, yt, COUNTERS)} "
                            f"{shape.load(factor, yt, COUNTERS)}))", yt, COUNTERS)  # fmt: skip
    columns = "(local.get $m)"
    if variant == "norm":  # t[i] = (c + sum of a[i][j] * x[j], in a local): the sum is the loop's value
        total = f"(local.set $r{tt} ({tt}.add (local.get $r{tt}) ({tt}.mul {shape.load(a, tt, COUNTERS)} " \
                f"{shape.load(x, tt, COUNTERS)})))"  # fmt: skip
        start = f"(local.set $r{tt} {const_text(tt, draw_values(draw, (tt,))[0])})"
        inner = (f"{_range('$j', '(i32.const 0)', columns, total, '          ')}\n        "
                 f"{shape.store(t, f'(local.get $r{tt})', tt, COUNTERS)}\n        "
                 f"{_range('$j', '(i32.const 0)', columns, spread, '          ')}")  # fmt: skip
    elif variant == "bicg":
        inner = _range("$j", "(i32.const 0)", columns, f"{spread}\n            {own}", "          ")
    else:
        inner = (f"{_range('$j', '(i32.const 0)', columns, own, '          ')}\n        "
                 f"{_range('$j', '(i32.const 0)', columns, spread, '          ')}")  # fmt: skip
    shape.body = _range("$i", "(i32.const 0)", "(local.get $n)", f"{start}\n        {inner}", "      ")
    shape.meta = {"variant": variant}
    return shape


def _by_pointers(shape: _Shape, bases: list[int]) -> None:
    """The split shape's four arrays come in as pointers (PolyBench's are): apart by the
    guards, not by the analysis."""
    names = ("$pa", "$px", "$pt", "$py")
    shape.pointers = {b: f"(local.get {name})" for b, name in enumerate(names)}
    shape.params = "".join(f" (param {name} i32)" for name in names)
    shape.arguments = [tuple(bases)]


def _lu(draw: st.DrawFn, kinds, lengths, bases, layout, row: int, variant: str) -> _Shape:
    """The split shape's ``lu``, ``fw`` or ``seidel`` variant (see :func:`_split`), on buffer 0,
    rows ``row`` apart."""
    if variant == "seidel":
        return _seidel(draw, kinds, lengths, bases, layout, row)
    if variant == "gs":
        return _gs(draw, kinds, lengths, bases, layout, row)
    size = draw(st.integers(2, row))  # no column past its row: rows never meet
    aij, aik, akj = Access(0, row, 1, 0), Access(0, row, 0, 0, 1), Access(0, 0, 1, 0, row)
    shape = _Shape("split", kinds, lengths, bases, layout, [aij, aik, akj], lambda n, m: [
        (i, j, k) for i in _ends(0, size) for j in _ends(0, size) for k in [0, *_ends(0, size - 1)]
    ])  # fmt: skip
    _by_pointers(shape, bases)
    ty = ELEMENTS[kinds[0]][0]
    bound = f"(i32.const {size})"
    if variant == "fw":  # the shorter of a[r][c] and the way through p: counters p = $i, r = $k, c = $j
        arp = Access(0, 1, 0, 0, row)  # (the kernel returns the outer counter, $i)
        through = f"({ty}.add {shape.load(arp, ty, COUNTERS)} {shape.load(aij, ty, COUNTERS)})"
        less = f"{ty}.lt" if ty.startswith("f") else f"{ty}.lt_s"
        mine = shape.load(akj, ty, COUNTERS)
        update = shape.store(akj, f"(select {mine} {through} ({less} {mine} {through}))", ty, COUNTERS)
        rows = _range("$k", "(i32.const 0)", bound, _range("$j", "(i32.const 0)", bound, update, "            "),
                      "          ")  # fmt: skip
        shape.body = _range("$i", "(i32.const 0)", bound, rows, "      ")
        shape.meta = {"variant": "fw", "size": size}
        return shape
    scale = const_text(ty, draw_values(draw, (ty,))[0])
    product = f"({ty}.mul {shape.load(aik, ty, COUNTERS)} {shape.load(akj, ty, COUNTERS)})"
    update = shape.store(aij, f"({ty}.sub {shape.load(aij, ty, COUNTERS)} {product})", ty, COUNTERS)
    left = (f"{_range('$k', '(i32.const 0)', '(local.get $j)', update, '            ')}\n            "
            f"{shape.store(aij, f'({ty}.mul {shape.load(aij, ty, COUNTERS)} ({scale}))', ty, COUNTERS)}")  # fmt: skip
    rows = (f"{_range('$j', '(i32.const 0)', '(local.get $i)', left, '          ')}\n        "
            f"{_range('$j', '(local.get $i)', bound, _range('$k', '(i32.const 0)', '(local.get $i)', update, '            '), '          ')}")  # fmt: skip
    shape.body = _range("$i", "(i32.const 0)", bound, rows, "      ")
    shape.meta = {"variant": "lu", "size": size}
    return shape


def _gs(draw: st.DrawFn, kinds, lengths, bases, layout, row: int) -> _Shape:
    """The split shape's ``gs`` variant (see :func:`_split`): counters ``i`` the step (``k``
    there), ``k`` the column (``j``), ``j`` the row (``i``); ``a``, ``q`` and ``r`` buffers 0,
    1 and 2, rows ``row`` apart."""
    size = draw(st.integers(2, row))  # no column past its row: rows never meet
    a_kk, r_kk = Access(0, row + 1, 0, 0), Access(2, row + 1, 0, 0)
    a_ik, q_ik = Access(0, 1, row, 0), Access(1, 1, row, 0)
    r_kj, a_ij = Access(2, row, 0, 0, 1), Access(0, 0, row, 0, 1)
    shape = _Shape("split", kinds, lengths, bases, layout, [a_ij, a_kk, r_kk, a_ik, q_ik, r_kj], lambda n, m: [
        (i, j, k) for i in _ends(0, size) for j in _ends(0, size) for k in _ends(0, size)
    ])  # fmt: skip
    _by_pointers(shape, bases)
    ta, tq, tr = (ELEMENTS[kinds[b]][0] for b in range(3))
    scale, start = (const_text(tr, v) for v in draw_values(draw, (tr, tr)))
    c = COUNTERS
    bound = f"(i32.const {size})"
    diagonal = shape.store(r_kk, f"({tr}.mul {shape.load(a_kk, tr, c)} ({scale}))", tr, c)
    column = shape.store(q_ik, f"({tq}.mul {shape.load(a_ik, tq, c)} {shape.load(r_kk, tq, c)})", tq, c)
    total = shape.store(r_kj, f"({tr}.add {shape.load(r_kj, tr, c)} ({tr}.mul {shape.load(q_ik, tr, c)} "
                              f"{shape.load(a_ij, tr, c)}))", tr, c)  # fmt: skip
    update = shape.store(a_ij, f"({ta}.sub {shape.load(a_ij, ta, c)} ({ta}.mul {shape.load(q_ik, ta, c)} "
                               f"{shape.load(r_kj, ta, c)}))", ta, c)  # fmt: skip
    rows = "            "
    cell = (f"{shape.store(r_kj, f'({start})', tr, c)}\n{rows}"
            f"{_range('$j', '(i32.const 0)', bound, total, rows + '  ')}\n{rows}"
            f"{_range('$j', '(i32.const 0)', bound, update, rows + '  ')}")  # fmt: skip
    step = (f"{diagonal}\n        {_range('$j', '(i32.const 0)', bound, column, '          ')}\n        "
            f"{_range('$k', '(i32.add (local.get $i) (i32.const 1))', bound, cell, '          ')}")  # fmt: skip
    shape.body = _range("$i", "(i32.const 0)", bound, step, "      ")
    shape.meta = {"variant": "gs", "size": size}
    return shape


def _seidel(draw: st.DrawFn, kinds, lengths, bases, layout, row: int) -> _Shape:
    """The split shape's ``seidel`` variant (see :func:`_split`): counters ``i`` the step,
    ``k`` the row, ``j`` the column; ``u`` carried from row to row, ``loaded`` (row ``k``'s
    first element, loaded in its task) or ``stored`` (a value of the row stored there)."""
    size = draw(st.integers(3, row))
    carried = draw(st.sampled_from(["loaded", "stored"]))
    steps = draw(st.integers(1, 3))
    at, first = Access(0, 0, 1, 0, row), Access(0, 0, 0, 0, row)  # a[k][j], a[k][0]
    around = [Access(0, 0, 1, o, row) for o in (-row, -1, 1, row)]
    shape = _Shape("split", kinds, lengths, bases, layout, [at, first, *around], lambda n, m: [
        (0, j, k) for j in (1, size - 2) for k in (1, size - 2)
    ])  # fmt: skip
    _by_pointers(shape, bases)
    ty = ELEMENTS[kinds[0]][0]
    terms = [shape.load(a, ty, COUNTERS) for a in (at, *around)] + [f"(local.get $u{ty})"]
    value = _combine(draw, ty, [terms[o] for o in draw(st.permutations(range(len(terms))))])
    inner = f"(i32.const {size - 1})"
    cells = _range("$j", "(i32.const 1)", inner, shape.store(at, value, ty, COUNTERS), "            ")
    if carried == "loaded":  # u: a[k][0] as the row's task loaded it, for row k + 1
        task = (f"(local.set $v{ty} {shape.load(first, ty, COUNTERS)})\n          {cells}\n"
                f"          (local.set $u{ty} (local.get $v{ty}))")  # fmt: skip
    else:  # u: what the row's task stored at a[k][0] last, for row k + 1
        made = _combine(draw, ty, [f"(local.get $u{ty})", shape.load(Access(0, 0, 0, 1, row), ty, COUNTERS)])
        vt, _, op, _ = ELEMENTS[kinds[0]]
        store = shape.store(first, f"(local.get $u{ty})", ty, COUNTERS)
        if vt == ty and ty in ("f32", "f64"):  # u's NaN made canonical itself: memory holds u's bits
            made = f"(select ({ty}.const nan) (local.tee $u{ty} {made}) ({ty}.ne (local.get $u{ty}) (local.get $u{ty})))"
            store = f"({op} {shape.address(first, COUNTERS)} (local.get $u{ty}))"
        task = f"{cells}\n          (local.set $u{ty} {made})\n          {store}"
    entry = f"(local.set $u{ty} {shape.load(first, ty, {'k': '(i32.const 0)'})})"
    rows = _range("$k", "(i32.const 1)", inner, task, "          ")
    shape.body = _range("$i", "(i32.const 0)", f"(i32.const {steps})", f"{entry}\n        {rows}", "      ")
    shape.meta = {"variant": "seidel", "size": size, "carried": carried, "steps": steps}
    return shape


@st.composite
def _stencil(draw: st.DrawFn) -> _Shape:
    """jacobi's shape: ``for t in [0, s) { for i in [1, n-1): b[i] = f(a[i-1], a[i], a[i+1]);
    for i in [1, n-1): a[i] = b[i] }``, or the same over ``j in [1, m-1)`` within each row
    (2-D, five points): a time loop the runtime makes a device-resident region. One in three
    is seidel's instead, ``a[i] = f(a[i-1], a[i], a[i+1])`` in place: every sweep sequential
    by proof, so nothing may launch a sweep with its iterations side by side."""
    kinds, lengths, layout, bases = draw(_buffers(2, same=draw(st.booleans())))  # a, then b
    two_d = draw(st.booleans())
    row = draw(_ROW) if two_d else 0
    offsets = [-1, 0, 1, -row, row] if two_d else [-1, 0, 1]
    reads = [Access(0, row or 1, 1 if two_d else 0, o) for o in offsets]
    here_a, here_b = Access(0, row or 1, 1 if two_d else 0, 0), Access(1, row or 1, 1 if two_d else 0, 0)
    accesses = [*reads, here_b]
    shape = _Shape("stencil", kinds, lengths, bases, layout, accesses, lambda n, m: [
        (i, j, 0) for i in range(1, n - 1) for j in (_ends(1, m - 1) if two_d else [0])
    ])  # fmt: skip
    ty = ELEMENTS[kinds[0]][0]
    terms = {a.offset: shape.load(a, ty, COUNTERS) for a in reads}
    # In one 1-D sweep in two, a[i] is kept for the next i's a[i-1] (a carried load, which
    # the kernel must reload), entered with a[0].
    rotated = not two_d and draw(st.booleans())
    if rotated:
        terms.update({-1: f"(local.get $u{ty})", 0: f"(local.get $v{ty})"})
    value = _combine(draw, ty, [terms[o] for o in draw(st.permutations(sorted(terms)))])
    sweep = shape.store(here_b, value, ty, COUNTERS)
    if rotated:
        sweep = (f"(local.set $v{ty} {shape.load(here_a, ty, COUNTERS)})\n            {sweep}\n"
                 f"            (local.set $u{ty} (local.get $v{ty}))")  # fmt: skip
    copy = shape.store(here_a, shape.load(here_b, ty, COUNTERS), ty, COUNTERS)

    def over(body: str) -> str:
        if two_d:
            body = _range(
                "$j", "(i32.const 1)", "(i32.sub (local.get $m) (i32.const 1))", body, "            "
            )
        return _range("$i", "(i32.const 1)", "(i32.sub (local.get $n) (i32.const 1))", body, "          ")

    steps = f"{over(sweep)}\n        {over(copy)}"
    if rotated:
        steps = f"(local.set $u{ty} {shape.load(here_a, ty, {'i': '(i32.const 0)'})})\n        {steps}"
    in_place = draw(st.integers(0, 2)) == 0
    if in_place:
        steps = over(shape.store(here_a, value, ty, COUNTERS))
    shape.body = _range("$t", "(i32.const 0)", "(local.get $s)", steps, "      ")
    shape.params = " (param $s i32)"
    shape.meta = {"dimensions": 2 if two_d else 1, "in_place": in_place, "rotated": rotated and not in_place}
    return shape


@st.composite
def _unrolled(draw: st.DrawFn) -> _Shape:
    """A loop unrolled by four the way clang does, in an outer loop: ``for i in [0, n) {
    for j in [0, x & -4) step 4: four bodies; for q in [0, x & 3): body(e + q) }``, where
    ``x`` is ``i + c``, ``i``, ``n`` or ``m`` and ``e`` is ``x & -4`` or the unrolled loop's
    counter at its exit (the merge clang leaves); or, as clang writes it, that counter
    carried on by a remainder loop behind the test ``x & 3 != 0`` that counts ``q`` down
    to zero. The unrolled loop's exit test is ``j >= x & -4`` or clang's ``j != x & -4``
    (the calls' ``x`` is never negative)."""
    n_inputs = draw(st.integers(1, 2))
    kinds, lengths, layout, bases = draw(_buffers(n_inputs + 1))
    count = draw(st.sampled_from(["i+c", "i", "n", "m"]))
    c = draw(st.integers(1, 4))
    rest = draw(st.sampled_from(["mask", "exit", "down"]))
    test = draw(st.sampled_from(["ge_s", "eq"]))
    row = draw(_ROW)
    strides = [(row, 1), (0, 1), (1, 0), (row, 2)]  # the written buffer mostly one row per i
    accesses = [
        Access(b, *draw(st.sampled_from(strides if b < n_inputs else [(row, 1), *strides])),
               draw(st.sampled_from([0, 1, -1, 3])))
        for b in range(n_inputs + 1)
    ]  # fmt: skip
    shape = _Shape("unrolled", kinds, lengths, bases, layout, accesses, lambda n, m: [
        (i, j, 0) for i in range(n) for j in _ends(0, _bound_value(count, c, i, n, m))
    ])  # fmt: skip
    ty = ELEMENTS[kinds[-1]][0]
    ops = [draw(st.sampled_from(BINARY[ty])) for _ in accesses[1:-1]]

    def body(j: str) -> str:
        at = {"i": "(local.get $i)", "j": j}
        value = shape.load(accesses[0], ty, at)
        for op, a in zip(ops, accesses[1:-1], strict=True):
            value = f"({ty}.{op} {value} {shape.load(a, ty, at)})"
        return shape.store(accesses[-1], value, ty, at)

    x = _bound_text(count, c)
    unrolled = "\n            ".join(
        body(f"(i32.add (local.get $j) (i32.const {u}))" if u else "(local.get $j)") for u in range(4)
    )
    main = (
        f"(local.set $j (i32.const 0))\n          (block $exit$j (loop $loop$j\n"
        f"            (br_if $exit$j (i32.{test} (local.get $j) (i32.and {x} (i32.const -4))))\n"
        f"            {unrolled}\n"
        f"            (local.set $j (i32.add (local.get $j) (i32.const 4)))\n"
        f"            (br $loop$j)))"
    )
    start = f"(i32.and {x} (i32.const -4))" if rest == "mask" else "(local.get $j)"
    remainder = _range("$k", "(i32.const 0)", f"(i32.and {x} (i32.const 3))",
                       body(f"(i32.add {start} (local.get $k))"), "          ")  # fmt: skip
    if rest == "down":
        remainder = (
            f"(local.set $k (i32.and {x} (i32.const 3)))\n"
            f"          (if (local.get $k) (then (loop $rest\n"
            f"            {body('(local.get $j)')}\n"
            f"            (local.set $j (i32.add (local.get $j) (i32.const 1)))\n"
            f"            (local.set $k (i32.sub (local.get $k) (i32.const 1)))\n"
            f"            (br_if $rest (local.get $k)))))"
        )
    shape.body = _range("$i", "(i32.const 0)", "(local.get $n)", f"{main}\n          {remainder}", "      ")
    shape.meta = {"count": count, "c": c, "remainder": rest, "exit_test": test}
    return shape


def _rotated(var: str, count: int, body: str, indent: str) -> str:
    """``for var in [0, count)`` as clang leaves a loop of a number ``count >= 1`` of
    iterations: tested at its bottom (``var != count``), so its body runs whenever the
    loop is reached (its blocks dominate the latches of the loops around it)."""
    return (
        f"(local.set {var} (i32.const 0))\n{indent}(loop $loop{var}\n"
        f"{indent}  {body}\n"
        f"{indent}  (local.set {var} (i32.add (local.get {var}) (i32.const 1)))\n"
        f"{indent}  (br_if $loop{var} (i32.ne (local.get {var}) (i32.const {count}))))"
    )


# A temporary is read and written whole, one element type at its full width (privatise.py).
PRIVATE_KINDS = ("i32", "i64", "f32", "f64")


@st.composite
def _privatised(draw: st.DrawFn) -> _Shape:
    """doitgen's shape: ``for i in [0, R) { for j in [0, P) { t[j] = 0; for k in [0, S):
    t[j] += a[i][k] * c[k][j] } for j in [0, P): a[i][j] = t[j] }``, ``P`` and ``S``
    numbers (the loops tested at their bottom, as clang leaves them), ``R`` a number of
    rows or (one in four) ``n``, the arrays passed as pointers: every iteration writes the
    temporary ``t`` before it reads it, so each thread may work on a copy of its own
    (``analysis/privatise``; with ``n`` rows the loop's last iteration, whose copy memory
    keeps, is not known, which is refused by name). One in three is a variant that
    must stay sequential: the first loop stops one short of the copy's (``exposed``: the
    copy reads ``t[P - 1]``, which the iteration did not write), or runs only where the
    row's first byte is odd (``guarded``: the writes do not run in every iteration)."""
    p_count, s_count = draw(st.integers(2, 8)), draw(st.integers(1, 6))
    offset = draw(st.sampled_from([0, 0, 1]))
    row = max(p_count, s_count + offset) + draw(st.integers(0, 2))
    kinds = [
        draw(st.sampled_from(sorted(ELEMENTS))),
        draw(st.sampled_from(PRIVATE_KINDS)),
        draw(st.sampled_from(sorted(ELEMENTS))),
    ]  # c, t, then a (read and written)
    lengths = [max(1, s_count * p_count + draw(st.integers(-1, 3))), p_count + draw(st.integers(0, 2)),
               draw(st.integers(1, 160))]  # fmt: skip
    layout, bases = draw(_layout(kinds, lengths))
    variant = draw(st.sampled_from(["doitgen", "doitgen", "doitgen", "doitgen", "exposed", "guarded"]))
    read_a, c, t = Access(2, row, 0, offset, 1), Access(0, 0, 1, 0, p_count), Access(1, 0, 1, 0)
    write_a, first = Access(2, row, 1, 0), Access(2, row, 0, 0)
    accesses = [c, t, read_a, first, write_a]
    rows: list[int] = []  # the outer loop's count, where it is a number

    def points(n: int, m: int) -> list[tuple[int, int, int]]:
        return [(i, j, k) for i in range(rows[0] if rows else n) for j in _ends(0, p_count)
                for k in _ends(0, s_count)]  # fmt: skip

    shape = _Shape("privatised", kinds, lengths, bases, layout, accesses, points)
    if draw(st.integers(0, 3)) < 3:
        # Three in four count a number of rows, as doitgen does (where the count is ``n``,
        # the last iteration, whose copy memory keeps, is not known): the most that fit,
        # one more, one, or any.
        fit = max([r for r in range(1, 41) if shape.fits(r, 0)] or [1])
        rows.append(draw(st.sampled_from([fit, fit, fit + 1, 1]) | st.integers(1, 12)))
    # As PolyBench's kernels take them, the arrays come in as pointers (constant addresses
    # would make them one array apart by constants, which no temporary is).
    shape.pointers = {0: "(local.get $pc)", 1: "(local.get $pt)", 2: "(local.get $pa)"}
    shape.params = " (param $pc i32) (param $pt i32) (param $pa i32)"
    shape.arguments = [tuple(bases)]
    ty = ELEMENTS[kinds[1]][0]
    product = f"({ty}.{draw(st.sampled_from(BINARY[ty]))} {shape.load(read_a, ty, COUNTERS)} {shape.load(c, ty, COUNTERS)})"
    add = draw(st.sampled_from(["add", "add", "sub"]))
    update = shape.store(t, f"({ty}.{add} {shape.load(t, ty, COUNTERS)} {product})", ty, COUNTERS)
    computed = p_count - 1 if variant == "exposed" else p_count
    sums = _rotated("$j", computed,
                    f"{shape.store(t, f'({const_text(ty, 0)})', ty, COUNTERS)}\n            "
                    f"{_rotated('$k', s_count, update, '            ')}",
                    "          ")  # fmt: skip
    if variant == "guarded":
        sums = f"(if (i32.and (i32.load8_u {shape.address(first, COUNTERS)}) (i32.const 1)) (then\n          {sums}))"
    copy = _rotated(
        "$j", p_count, shape.store(write_a, shape.load(t, ty, COUNTERS), ty, COUNTERS), "          "
    )
    body = f"{sums}\n        {copy}"
    shape.body = (
        _rotated("$i", rows[0], body, "      ")
        if rows
        else _range("$i", "(i32.const 0)", "(local.get $n)", body, "      ")
    )
    shape.meta = {"variant": variant, "counts": [rows[0] if rows else "n", p_count, s_count], "row": row}
    return shape


def _last_first_half(x: int) -> int:
    """The counter of the last first half a mid-exit loop over ``x`` runs (``x >= 1``): the
    test ``j + 1 >= x`` leaves after ``j = x - 1`` for an odd ``x``, after ``j = x`` for an
    even one (whose last first half runs one past the count, as in wasmtime)."""
    return x if x % 2 == 0 else x - 1


@st.composite
def _midexit(draw: st.DrawFn) -> _Shape:
    """A loop whose exit test is in the middle of its body, as clang unrolls a loop by two
    (fdtd-2d's ``ex`` sweep; ``analysis/trips`` ``exits_mid_body``): ``loop { body(j); if
    (j + 1 >= x) break; body(j + 1); j += 2 }`` behind clang's guard ``x > 0``, with ``x``
    ``m``, ``n`` or ``i + c`` (both parities, 0 and 1 too), or clang's own for an odd
    number ``x``: ``if (j == x - 1) break``, unguarded. Mostly the inner loop over the
    columns ``j`` of rows ``i in [0, n)``; one in three the outer loop itself, over ``n``."""
    n_inputs = draw(st.integers(1, 2))
    kinds, lengths, layout, bases = draw(_buffers(n_inputs + 1))
    outer = draw(st.integers(0, 2)) == 0
    count = "n" if outer else draw(st.sampled_from(["m", "m", "n", "i+c", "odd"]))
    c = draw(st.integers(1, 3))
    odd = draw(st.sampled_from([1, 3, 5, 7, 9, 15]))
    row = draw(_ROW)
    if outer:
        written, read = [(1, 0), (2, 0)], [(1, 0), (0, 0), (2, 0), (row, 0)]
    else:
        written, read = [(row, 1), (row, 2)], [(row, 1), (0, 1), (row, 0), (row, 2)]
    accesses = [
        Access(b, *draw(st.sampled_from(read if b < n_inputs else written)), draw(st.sampled_from([0, 0, 1, 3, -1])))
        for b in range(n_inputs + 1)
    ]  # fmt: skip

    def counts(i: int, n: int, m: int) -> int:
        return odd if count == "odd" else _bound_value(count, c, i, n, m)

    def points(n: int, m: int) -> list[tuple[int, int, int]]:
        if outer:
            return [(i, 0, 0) for i in ([0, _last_first_half(n)] if n > 0 else [])]
        return [
            (i, j, 0) for i in range(n) if counts(i, n, m) > 0 for j in (0, _last_first_half(counts(i, n, m)))
        ]

    shape = _Shape("midexit", kinds, lengths, bases, layout, accesses, points)
    ty = ELEMENTS[kinds[-1]][0]
    ops = [draw(st.sampled_from(BINARY[ty])) for _ in accesses[1:-1]]

    def body(at: dict[str, str]) -> str:
        value = shape.load(accesses[0], ty, at)
        for op, a in zip(ops, accesses[1:-1], strict=True):
            value = f"({ty}.{op} {value} {shape.load(a, ty, at)})"
        return shape.store(accesses[-1], value, ty, at)

    var = "$i" if outer else "$j"
    here, next_one = f"(local.get {var})", f"(i32.add (local.get {var}) (i32.const 1))"
    x = f"(i32.const {odd})" if count == "odd" else _bound_text(count, c)
    test = f"(i32.eq {here} (i32.const {odd - 1}))" if count == "odd" else f"(i32.ge_s {next_one} {x})"
    halves = [{"i": here, "j": "(i32.const 0)"}, {"i": next_one, "j": "(i32.const 0)"}] if outer else [
        {"i": "(local.get $i)", "j": here}, {"i": "(local.get $i)", "j": next_one}]  # fmt: skip
    loop = (
        f"(local.set {var} (i32.const 0))\n          (block $exit{var} (loop $loop{var}\n"
        f"            {body(halves[0])}\n"
        f"            (br_if $exit{var} {test})\n"
        f"            {body(halves[1])}\n"
        f"            (local.set {var} (i32.add (local.get {var}) (i32.const 2)))\n"
        f"            (br $loop{var})))"
    )
    if count != "odd":
        loop = f"(if (i32.gt_s {x} (i32.const 0)) (then\n          {loop}))"
    shape.body = loop if outer else _range("$i", "(i32.const 0)", "(local.get $n)", loop, "      ")
    shape.meta = {"outer": outer, "count": count, "c": c, "odd": odd}
    return shape


@st.composite
def _columns(draw: st.DrawFn) -> _Shape:
    """gramschmidt's ``j`` loop: ``for i in [lo, n)`` over the columns of a row-major
    matrix ``a``, each iteration updating its column from column ``col`` of ``b``: ``for j
    in [0, m): a[j][i] = f(a[j][i], b[j][col])``, or gramschmidt's two loops, ``r = sum_j
    b[j][col] * a[j][i]; for j: a[j][i] -= b[j][col] * r``; ``lo`` is 0 or ``col + 1``.
    Both matrices come in as pointers, so the run-time guard compares the columns'
    footprints element by element (``runtime/guards``); where ``b`` is of ``a``'s element
    type, a call may pass ``a`` one to three elements on as ``b``: its column ``col`` is
    then a column of ``a`` that another iteration writes."""
    kinds, lengths, layout, bases = draw(_buffers(2, same=draw(st.booleans())))  # b, then a
    row = draw(st.sampled_from([8, 16, 12, 5]))
    col = draw(st.integers(0, 3))
    lo = draw(st.sampled_from([0, col + 1]))
    dot = draw(st.booleans())
    delta = draw(st.integers(1, 3))
    meets = kinds[0] == kinds[1]
    column, source = Access(1, 1, row, 0), Access(0, 0, row, col)
    accesses = [source, *([Access(1, 0, row, col + delta)] if meets else []), column]
    shape = _Shape("columns", kinds, lengths, bases, layout, accesses, lambda n, m: [
        (i, j, 0) for i in range(lo, n) for j in _ends(0, m)
    ])  # fmt: skip
    shape.pointers = {0: "(local.get $pb)", 1: "(local.get $pa)"}
    shape.params = " (param $pa i32) (param $pb i32)"
    size = ELEMENTS[kinds[1]][3]
    shape.arguments = [(bases[1], bases[0]), *([(bases[1], bases[1] + delta * size)] if meets else [])]
    ty = ELEMENTS[kinds[1]][0]
    here, other = shape.load(column, ty, COUNTERS), shape.load(source, ty, COUNTERS)
    rows = "(local.get $m)"
    if dot:
        kept = f"(local.get $r{ty})"
        total = _range("$j", "(i32.const 0)", rows,
                       f"(local.set $r{ty} {_stored(f'({ty}.add {kept} ({ty}.mul {other} {here}))', ty)})",
                       "          ")  # fmt: skip
        update = _range("$j", "(i32.const 0)", rows,
                        shape.store(column, f"({ty}.sub {here} ({ty}.mul {other} {kept}))", ty, COUNTERS),
                        "          ")  # fmt: skip
        inner = f"(local.set $r{ty} ({const_text(ty, 0)}))\n        {total}\n        {update}"
    else:
        value = f"({ty}.{draw(st.sampled_from(BINARY[ty]))} {here} {other})"
        inner = _range("$j", "(i32.const 0)", rows, shape.store(column, value, ty, COUNTERS), "          ")
    shape.body = _range("$i", f"(i32.const {lo})", "(local.get $n)", inner, "      ")
    shape.meta = {"row": row, "column": col, "start": lo, "dot": dot, "meets": delta if meets else 0}
    return shape


@st.composite
def _rows(draw: st.DrawFn) -> _Shape:
    """gemv's and gemm's shapes as the tiler takes them (``compiler/tile.py``): ``for i in
    [0, n) { r = c0; for k in [0, K): r = f(r, a[i][k], x[k]); w[i] = r }`` (``rows``: a
    row per thread), or ``for i in [0, n): for j in [0, m) { r = c0; for k: r = f(r, a[i][k],
    d[k][j]); w[i][j] = r }`` (``cells``), the ``k`` loop tested at its bottom as clang leaves
    it, ``K`` a constant from 1 to 40 (several stages of a tile where the rows are short),
    ``f`` two drawn operations (float ones without Wasm's NaN rules in the tile's engine
    where each propagates a NaN)."""
    kinds, lengths, layout, bases = draw(_buffers(3))  # a, x or d, then w
    variant = draw(st.sampled_from(["rows", "cells"]))
    row = draw(st.sampled_from([8, 16, 40, 5]))
    count = draw(st.integers(1, min(row, 40)))
    off = draw(st.sampled_from([0, 0, 1]))
    a = Access(0, row, 0, off, 1)
    other = Access(1, 0, 0, 0, 1) if variant == "rows" else Access(1, 0, 1, 0, row)
    out = Access(2, 1, 0, 0) if variant == "rows" else Access(2, row, 1, 0)
    shape = _Shape("rows", kinds, lengths, bases, layout, [a, other, out], lambda n, m: [
        (i, j, k) for i in range(n) for j in (_ends(0, m) if variant == "cells" else [0])
        for k in (0, count - 1)
    ])  # fmt: skip
    ty = ELEMENTS[kinds[2]][0]
    kept = f"(local.get $r{ty})"
    term = f"({ty}.{draw(st.sampled_from(BINARY[ty]))} {shape.load(a, ty, COUNTERS)} {shape.load(other, ty, COUNTERS)})"
    step = f"(local.set $r{ty} ({ty}.{draw(st.sampled_from(BINARY[ty]))} {kept} {term}))"
    start = const_text(ty, draw_values(draw, (ty,))[0])
    cell = (f"(local.set $r{ty} ({start}))\n          {_rotated('$k', count, step, '          ')}\n"
            f"          {shape.store(out, kept, ty, COUNTERS)}")  # fmt: skip
    if variant == "cells":
        cell = _range("$j", "(i32.const 0)", "(local.get $m)", cell, "          ")
    shape.body = _range("$i", "(i32.const 0)", "(local.get $n)", cell, "      ")
    shape.meta = {"variant": variant, "row": row, "count": count}
    return shape


# Locals of every type for values kept across iterations (``$r``, ``$u``, ``$v`` + type).
SHAPE_LOCALS = "\n".join(
    f"    (local $r{ty} {ty}) (local $u{ty} {ty}) (local $v{ty} {ty})" for ty in NUMBER_TYPES
)
SHAPE_STRATEGIES = {
    "triangular": _triangular,
    "imperfect": _imperfect,
    "stencil": _stencil,
    "unrolled": _unrolled,
    "privatised": _privatised,
    "midexit": _midexit,
    "columns": _columns,
    "split": _split,
    "rows": _rows,
}


@st.composite
def shaped_kernel(
    draw: st.DrawFn, name: str, index: int, shape_name: str | None = None, **shape_args: Any
) -> Kernel:
    """A kernel of one of PolyBench's :data:`SHAPES` (``shape_name``, or drawn; ``shape_args``
    for its strategy, such as the split shape's ``variant``), with its
    data and 1 to 3 calls whose trip counts fit its buffers exactly, overrun them by one,
    are 0 or 1, or are random. It returns the outer counter at the loop's exit."""
    shape = draw(SHAPE_STRATEGIES[shape_name or draw(st.sampled_from(SHAPES))](**shape_args))
    fit_m = max(m for m in range(2, 17) if shape.fits(3, m)) if shape.fits(3, 2) else 2
    fit = max([n for n in range(2, 64) if shape.fits(n, fit_m)] or [1])
    calls_n = draw(st.integers(1, 3))
    trips: list[tuple[int, int, int]] = []
    arguments: list[tuple[int, ...]] = []  # what each call passes after (n, m[, s])
    for _ in range(calls_n):
        n = draw(st.sampled_from([fit, fit + 1, 0, 1, max(fit - 1, 0)]) | st.integers(0, 40))
        m = draw(st.sampled_from([fit_m, fit_m + 1, 1, 0]) | st.integers(0, 12))
        steps = draw(st.sampled_from([1, 2, 0, 3, 5])) if shape.name == "stencil" else 0
        trips.append((n, m, steps))
        arguments.append(draw(st.sampled_from(shape.arguments)) if shape.arguments else ())
    # As in :func:`_kernel`, two kernels in five (no time loop) have their last call made
    # again, two or four times, each after bumping a byte that an iteration of it reads: the
    # runtime's replays of the last launch (in Python, then native) see memory changed.
    repeats = 0 if shape.name == "stencil" else draw(st.sampled_from([0, 0, 0, 2, 4]))
    bump = ""
    if repeats:
        n, m, _ = trips[-1]
        read = shape.accesses[0]
        touched = [read.stride_i * i + read.stride_j * j + read.stride_k * k + read.offset
                   for i, j, k in shape.points(n, m)]  # fmt: skip
        at = shape.bases[0] + min(touched or [0]) * ELEMENTS[shape.kinds[0]][3]
        if 0 <= at < PAGE:
            bump = (
                f"(i32.store8 (i32.const {at}) (i32.add (i32.load8_u (i32.const {at})) (i32.const 1)))\n    "
            )
    trips += [trips[-1]] * repeats
    arguments += [arguments[-1]] * repeats
    func = (
        f'  (func (export "{name}") (param $n i32) (param $m i32){shape.params} (result i32)\n'
        f"    (local $i i32) (local $j i32) (local $k i32) (local $t i32) {SCRATCH_LOCALS}\n"
        f"{SHAPE_LOCALS}\n"
        f"    {bump}{shape.body}\n    (local.get $i))"
    )
    data = _segments(draw, shape.kinds, shape.lengths, shape.bases)
    calls = [
        Call(name, ((I32, n), (I32, m), *(((I32, s),) if shape.name == "stencil" else ()),
                    *((I32, v) for v in extra)), True, index)
        for (n, m, s), extra in zip(trips, arguments, strict=True)
    ]  # fmt: skip
    meta: dict[str, Any] = {
        "function": name,
        "shape": shape.name,
        "buffers": [
            {"base": base, "element": kind, "length": length, "bytes": length * ELEMENTS[kind][3]}
            for base, kind, length in zip(shape.bases, shape.kinds, shape.lengths, strict=True)
        ],
        "accesses": [vars(a) for a in shape.accesses],
        "written": len(shape.kinds) - 1,
        "layout": shape.layout,
        "trip_counts": trips,
        "repeats": repeats,
        "arguments": arguments,
        **shape.meta,
    }
    return func, data, calls, meta


# -- SIMD ----------------------------------------------------------------------------------

LANES = {"i8x16": 16, "i16x8": 8, "i32x4": 4, "i64x2": 2, "f32x4": 4, "f64x2": 2}
_SIMD_TYPES = {*NUMBER_TYPES, "v128"}
# Float lane ops whose NaN results have an open payload (Wasm's rule for scalars, per lane).
# abs, neg, pmin and pmax move bits; compares and int-to-float conversions make no NaN.
OPEN_NAN_LANE_OPS = {"add", "sub", "mul", "div", "min", "max", "sqrt", "ceil", "floor", "trunc", "nearest",
                     "demote_f64x2_zero", "promote_low_f32x4"}  # fmt: skip


def simd_ops() -> list[Opcode]:
    """Every supported SIMD row that computes on values (memory rows and ``v128.const``,
    which the generators place themselves, aside): lane arithmetic, saturating ops, shifts,
    compares, bitselect, shuffle and swizzle, splats, lane extract/replace, conversions."""
    return [
        op
        for op in OPCODES
        if op.supported
        and op.imm.value in ("none", "laneidx", "16 x laneidx")
        and "v128" in (*op.operand_types, *op.result_types)
        and set(op.operand_types) | set(op.result_types) <= _SIMD_TYPES
    ]


SIMD_OPS = simd_ops()
SIMD_BY_RESULT: dict[str, list[Opcode]] = {
    ty: [op for op in SIMD_OPS if op.result_types == (ty,)] for ty in (*NUMBER_TYPES, "v128")
}
LANE_MEMORY_OPS = [
    op for op in OPCODES if op.supported and op.imm.value == "memarg laneidx" and op.result_types
]
VECTOR_LOADS = [
    op.name for op in OPCODES if op.supported and op.imm.value == "memarg" and op.result_types == ("v128",)
]
SIMD_ADDRESSES = [0, 16, 1, 7, 100, 200, PAGE - 16, PAGE - 15, PAGE - 8, PAGE - 1]
SIMD_OFFSETS = [0, 0, 3, 16]
SIMD_SCRATCH = "(local $cv v128)"
_V128_PICK = st.integers(0, len(SIMD_BY_RESULT["v128"]) - 1)
_SHAPE = st.sampled_from(sorted(LANES))
_SMALL_EDGES = {8: [0, 1, 0x7F, 0x80, 0xFF, 0xFE, 0x40], 16: [0, 1, 0x7FFF, 0x8000, 0xFFFF, 0xFFFE, 0x7F]}
_SIMD_LEAF_PICK = st.integers(0, 7)


def is_open_nan(name: str) -> bool:
    """Whether SIMD op ``name`` may make a float lane that is a NaN with an open payload."""
    shape, _, op = name.partition(".")
    return shape in ("f32x4", "f64x2") and op in OPEN_NAN_LANE_OPS


def canonicalize_lanes(shape: str, out: list[str]) -> None:
    """Replace each NaN lane of the vector on top of the stack by the canonical NaN
    (``bitselect(nan, v, v != v)``): a vector's bits are all compared."""
    nans = " ".join(["nan"] * LANES[shape])
    out += ["local.set $cv", f"v128.const {shape} {nans}", "local.get $cv", "local.get $cv", "local.get $cv",
            f"{shape}.ne", "v128.bitselect"]  # fmt: skip


def draw_vector(draw: st.DrawFn, shape: str) -> bytes:
    """16 bytes of ``shape``'s lanes, each an edge value of its lane type (NaN payloads,
    signalling ones too, for float lanes) or any pattern."""
    lanes = LANES[shape]
    width = 128 // lanes
    if width in _SMALL_EDGES:
        edges = _SMALL_EDGES[width]
        picks = draw(_picks(lanes))
        bits = [edges[b % len(edges)] if b < 200 else b for b in picks]
    else:
        ty = ("f" if shape[0] == "f" else "i") + str(width)
        bits = draw_values(draw, (ty,) * lanes)
    return b"".join(int(x).to_bytes(width // 8, "little") for x in bits)


def v128_const(data: bytes) -> str:
    """``v128.const`` of exactly these 16 bytes."""
    return "v128.const i32x4 " + " ".join(
        f"0x{int.from_bytes(data[k : k + 4], 'little'):08x}" for k in range(0, 16, 4)
    )


def _lane_immediate(draw: st.DrawFn, op: Opcode) -> str:
    if op.imm.value == "16 x laneidx":
        return " " + " ".join(str(draw(st.integers(0, 31))) for _ in range(16))
    if op.imm.value == "laneidx":
        return f" {draw(_below(LANES[op.name.split('.')[0]]))}"
    return ""


def _lane_memory_immediate(draw: st.DrawFn, op: Opcode) -> str:
    bits = int(op.name.split("_")[0].removeprefix("v128.load").removeprefix("v128.store"))
    return f" offset={draw(st.sampled_from(SIMD_OFFSETS))} {draw(_below(128 // bits))}"


def emit_vector(draw: st.DrawFn, depth: int, leaves: Leaves, out: list[str]) -> None:
    """Append instructions that push a random v128 at most ``depth`` ops deep over ``leaves``
    (``leaves["v128"]``: instructions that push one), exact in every bit: float lanes that
    may be an open NaN are canonicalised where they are made."""
    if depth <= 0 or draw(_QUARTER) == 0:
        pick = draw(_SIMD_LEAF_PICK)
        if leaves.get("v128") and pick < 4:
            out.append(draw(_leaf(leaves, "v128")))
        elif pick == 7 and leaves.get("address"):
            out += [
                draw(_leaf(leaves, "address")),
                f"{draw(st.sampled_from(VECTOR_LOADS))} offset={draw(st.sampled_from(SIMD_OFFSETS))}",
            ]
        else:
            out.append(v128_const(draw_vector(draw, draw(_SHAPE))))
        return
    if leaves.get("address") and draw(st.integers(0, 15)) == 0:
        op = draw(st.sampled_from(LANE_MEMORY_OPS))
        out.append(draw(_leaf(leaves, "address")))
        emit_vector(draw, depth - 1, leaves, out)
        out.append(op.name + _lane_memory_immediate(draw, op))
        return
    op = SIMD_BY_RESULT["v128"][draw(_V128_PICK)]
    for ty in op.operand_types:
        if ty == "v128":
            emit_vector(draw, depth - 1, leaves, out)
        else:
            emit_lane_scalar(draw, ty, depth - 1, leaves, out)
    out.append(op.name + _lane_immediate(draw, op))
    if is_open_nan(op.name):
        canonicalize_lanes(op.name.split(".")[0], out)


def emit_lane_scalar(draw: st.DrawFn, ty: str, depth: int, leaves: Leaves, out: list[str]) -> None:
    """A scalar operand of a SIMD op (a splat's value, a lane, a shift count): a lane or a
    test of a vector, or a scalar expression, canonicalised where its bits may be open."""
    choices = SIMD_BY_RESULT[ty]
    if depth > 0 and choices and draw(_QUARTER) == 0:
        op = draw(st.sampled_from(choices))
        emit_vector(draw, depth - 1, leaves, out)
        out.append(op.name + _lane_immediate(draw, op))
    else:
        emit_value(draw(expressions(ty, 1, leaves)), out)


SIMD_RESULTS = 1024  # where whole-function SIMD programs store their vectors, 16 bytes each
SIMD_LEAVES = Leaves(
    {
        **NUMERIC_LEAVES,
        "address": tuple(f"i32.const {a}" for a in SIMD_ADDRESSES),
    }
)
_SIMD_DEPTH = st.integers(1, 4)


def _mix_lanes(vector: str) -> list[str]:
    """Instructions that turn the v128 in local ``vector`` into an i64 of both its halves
    (the reference returns scalars only; the whole vector is also stored to memory)."""
    return [f"local.get {vector}", "i64x2.extract_lane 0", f"local.get {vector}", "i64x2.extract_lane 1",
            "i64.const 1", "i64.rotl", "i64.xor"]  # fmt: skip


@st.composite
def simd_function(draw: st.DrawFn, index: int) -> tuple[str, list[Call]]:
    """Function ``f<index>``: a SIMD expression over the parameters, constants and loads of
    the data at address 0; it stores the vector at ``SIMD_RESULTS + 16 * index`` and
    returns both halves folded into an i64."""
    body: list[str] = []
    emit_vector(draw, draw(_SIMD_DEPTH), SIMD_LEAVES, body)
    body += ["local.set $r", f"i32.const {SIMD_RESULTS + 16 * index}", "local.get $r", "v128.store"]
    if draw(st.integers(0, 3)) == 0:  # and a lane of it somewhere near the end of memory
        op = draw(
            st.sampled_from(
                [op for op in OPCODES if op.imm.value == "memarg laneidx" and not op.result_types]
            )
        )
        body += [f"i32.const {draw(st.sampled_from(SIMD_ADDRESSES[6:]))}", "local.get $r",
                 op.name + _lane_memory_immediate(draw, op)]  # fmt: skip
    body += _mix_lanes("$r")
    params = " ".join(NUMERIC_PARAMS)
    text = (
        f'  (func (export "f{index}") (param {params}) (result i64) (local $r v128) {SIMD_SCRATCH} '
        f"{SCRATCH_LOCALS}\n    " + "\n    ".join(body) + ")"
    )
    calls = []
    for _ in range(draw(_CALLS)):
        args = tuple((TYPES[t], bits) for t, bits in zip(NUMERIC_PARAMS, draw_values(draw, NUMERIC_PARAMS)))
        calls.append(Call(f"f{index}", args, True, index))
    return text, calls


@st.composite
def simd_cases(draw: st.DrawFn, shape: BatchShape = NUMERIC_BATCH) -> Case:
    """A module of SIMD expression functions (a program each) over one page of memory whose
    first 256 bytes hold vectors of edge lanes; each stores its result vector."""
    data = b"".join(draw_vector(draw, draw(_SHAPE)) for _ in range(16))
    return _simd_module(batch(draw, simd_function, shape), data)


def _simd_module(funcs: list[tuple[str, list[Call]]], data: bytes) -> Case:
    wat = (
        f'(module\n  (memory (export "memory") 1 1)\n  (data (i32.const 0) "{_wat_bytes(data)}")\n'
        + "\n".join(text for text, _ in funcs)
        + "\n)\n"
    )
    calls = [replace(call, program=k) for k, (_, calls) in enumerate(funcs) for call in calls]
    return Case("simd", wat, calls, programs=len(funcs),
                subset=lambda keep: _simd_module([funcs[k] for k in keep], data))  # fmt: skip


# Lane-wise integer operations the loop detector takes for a vector reduction (and one,
# add_sat_u, it does not: that loop must run on the host and agree all the same).
VECTOR_REDUCTIONS = ["i32x4.add", "i64x2.add", "i16x8.add", "i8x16.add", "v128.xor", "v128.and", "i32x4.max_s",
                     "i16x8.min_u", "i32x4.mul", "i8x16.add_sat_u"]  # fmt: skip
# Buffers of a SIMD kernel lie this many vectors apart at least: a store and a load closer
# in iterations than the detector's guarded distance (16) would make it reject the loop.
SIMD_BUFFER_GAP = 16


@st.composite
def simd_loop_cases(draw: st.DrawFn, shape: BatchShape = LOOP_BATCH) -> Case:
    """A module of SIMD loop kernels (a program each): ``for i in [0, n)`` over v128 loads
    and stores with a stride of 16 bytes, a SIMD expression per element, and an optional
    vector reduction; the kernels share the one page of memory."""
    return _simd_loop_module(batch(draw, lambda k: _simd_kernel(f"kernel{k}", k), shape))


def _simd_loop_module(kernels: list[Kernel], data: list[str] | None = None) -> Case:
    case = _loop_module(kernels, data)
    case.generator = "simd-loops"
    all_data = data if data is not None else [s for _, segments, _, _ in kernels for s in segments]
    case.subset = lambda keep: _simd_loop_module([kernels[k] for k in keep], all_data)
    return case


@st.composite
def _simd_kernel(draw: st.DrawFn, name: str, index: int) -> Kernel:
    n_inputs = draw(st.integers(1, 3))
    length = draw(st.integers(1, 8))  # vectors per buffer
    offsets = [draw(st.sampled_from([0, 0, 1])) for _ in range(n_inputs)]
    at_end = draw(st.booleans())
    stride = 16 * (SIMD_BUFFER_GAP + length)
    start = PAGE - stride * (n_inputs + 1) if at_end else 64 + 2048 * index
    misaligned = draw(st.integers(0, 3)) == 0  # an input off the output's 16-byte grid: a guard declines
    bases = [start + stride * b + (4 if misaligned and b == 0 else 0) for b in range(n_inputs + 1)]
    if at_end:
        bases[-1] = PAGE - 16 * length
    loads = tuple(
        f"local.get $i i32.const 4 i32.shl i32.const {bases[b] + 16 * offsets[b]} i32.add v128.load"
        for b in range(n_inputs)
    )
    leaves = Leaves({"v128": loads, "i32": ("local.get $i", "local.get $n"), "i64": (), "f32": (), "f64": ()})
    value: list[str] = []
    emit_vector(draw, draw(st.integers(1, 3)), leaves, value)
    body = [f"local.get $i i32.const 4 i32.shl i32.const {bases[-1]} i32.add", *value, "v128.store"]
    reduce = draw(st.sampled_from([None, *VECTOR_REDUCTIONS]))
    if reduce:
        body += ["local.get $acc", draw(st.sampled_from(loads)), reduce, "local.set $acc"]
    init = draw_vector(draw, draw(_SHAPE))
    func = (
        f'  (func (export "{name}") (param $n i32) (param $m i32) (result i64)\n'
        f"    (local $i i32) (local $acc v128) (local $r v128) {SIMD_SCRATCH} {SCRATCH_LOCALS}\n"
        f"    {v128_const(init)} local.set $acc i32.const 0 local.set $i\n"
        f"    block $exit loop $loop\n      local.get $i local.get $n i32.ge_s br_if $exit\n      "
        + "\n      ".join(body)
        + "\n      local.get $i i32.const 1 i32.add local.set $i br $loop end end\n    "
        + " ".join(_mix_lanes("$acc"))
        + ")"
    )
    data = [
        f'  (data (i32.const {bases[b]}) "{_wat_bytes(b"".join(draw_vector(draw, draw(_SHAPE)) for _ in range(length)))}")'
        for b in range(n_inputs)
    ]
    fit = length - max(offsets)
    trips = [draw(st.sampled_from([fit, fit + 1, 0, 1, max(fit - 1, 0)]) | st.integers(0, 12))
             for _ in range(draw(st.integers(1, 3)))]  # fmt: skip
    calls = [Call(name, ((I32, n), (I32, 1)), True, index) for n in trips]
    meta: dict[str, Any] = {
        "function": name,
        "buffers": [
            {"base": base, "element": "v128", "length": length, "bytes": 16 * length} for base in bases
        ],
        "written": n_inputs,
        "layout": "at_end" if at_end else "packed",
        "nest_depth": 1,
        "trip_counts": [(n, 1) for n in trips],
        "reduction": ["v128", reduce] if reduce else None,
    }
    return func, data, calls, meta


# -- wasm-smith -----------------------------------------------------------------------------

SMITH_FUEL = 100  # loop iterations and calls: keeps recursion under the GPU's call depth
SMITH_FLAGS = [
    "--ensure-termination", f"--fuel={SMITH_FUEL}",
    "--simd-enabled=false", "--relaxed-simd-enabled=false", "--threads-enabled=false",
    "--shared-everything-threads-enabled=false", "--exceptions-enabled=false", "--gc-enabled=false",
    "--tail-call-enabled=false", "--memory64-enabled=false", "--custom-page-sizes-enabled=false",
    "--wide-arithmetic-enabled=false", "--custom-descriptors-enabled=false",
    "--compact-imports-enabled=false", "--max-memories=1", "--max-tables=2", "--max-imports=0",
    "--canonicalize-nans=true", "--export-everything=true", "--min-funcs=1", "--max-funcs=10",
    "--max-instructions=80", "--max-memory32-bytes=1048576", "--max-table-elements=1000",
    "--max-data-segments=8", "--max-element-segments=8", "--memory-max-size-required=true",
    "--table-max-size-required=true",
]  # fmt: skip


SMITH_SIMD_FLAGS = [flag.replace("--simd-enabled=false", "--simd-enabled=true") for flag in SMITH_FLAGS]


def smith(seed: bytes, simd: bool = False) -> bytes | None:
    """The module ``wasm-tools smith`` makes from ``seed`` (with SIMD128 where ``simd``);
    None when it makes none."""
    flags = SMITH_SIMD_FLAGS if simd else SMITH_FLAGS
    done = subprocess.run([wasm_tools(), "smith", *flags], input=seed, capture_output=True)
    return done.stdout if done.returncode == 0 and done.stdout[:4] == b"\0asm" else None


def _signatures(wasm: bytes) -> list[tuple[str, tuple[Type, ...]]]:
    """Exported functions and their parameter types, by our decoder; empty if it refuses."""
    from tensorwasm.compiler.frontend import decode

    try:
        module = decode(wasm)
        return [(e.name, module.func_sig(e.index).params) for e in module.exports if e.kind == "func"]
    except Exception:  # the comparator reports any decoder crash on this module
        return []


def _argument(ty: Type) -> st.SearchStrategy[tuple[Type, int]]:
    if ty in (FUNCREF, EXTERNREF):
        return st.just((ty, 0))
    return values(ty.name).map(lambda bits: (ty, bits))


@st.composite
def smith_cases(draw: st.DrawFn, max_calls: int = 12, simd: bool = False) -> Case:
    """A ``wasm-tools smith`` module and calls of its exported functions (whose parameters
    are never v128: the calls pass scalars and references only)."""
    wasm = smith(draw(st.binary(min_size=512, max_size=4096)), simd)
    assume(wasm is not None)
    assert wasm is not None
    funcs = [
        (name, params)
        for name, params in _signatures(wasm)
        if all(p.name in TYPES or p.is_ref for p in params)
    ]
    calls = []
    if funcs:
        for _ in range(draw(st.integers(0, max_calls))):
            name, params = draw(st.sampled_from(funcs))
            calls.append(Call(name, tuple(draw(_argument(p)) for p in params)))
    return Case("smith", None, calls, wasm_bytes=wasm)


# -- the registry ---------------------------------------------------------------------------

GENERATORS: dict[str, Callable[[], st.SearchStrategy[Case]]] = {
    "numeric": numeric_cases,
    "control": control_cases,
    "loops": loop_cases,
    "smith": smith_cases,
}
"""Generator name -> a function returning its strategy (``tensorwasm fuzz --generator NAME``)."""


SIMD_GENERATORS: dict[str, Callable[[], st.SearchStrategy[Case]]] = {
    "numeric": simd_cases,
    "loops": simd_loop_cases,
    "smith": functools.partial(smith_cases, simd=True),
}
"""Generator name -> its SIMD128 variant (``tensorwasm fuzz --simd``): SIMD expression
functions, SIMD loop kernels, wasm-smith modules with SIMD on. ``control`` has none."""


def generator_strategy(name: str, simd: bool = False) -> st.SearchStrategy[Case]:
    """The strategy of generator ``name``, or of its SIMD variant."""
    table = SIMD_GENERATORS if simd else GENERATORS
    if name not in table:
        raise ValueError(
            f"generator {name!r} has no SIMD variant (those that do: {', '.join(SIMD_GENERATORS)})"
        )
    return table[name]()
