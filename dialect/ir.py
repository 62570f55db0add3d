"""The dialect's IR objects: values, operations, blocks, functions, modules.

A function is a list of basic blocks; the first is the entry block, whose arguments are
the function's parameters. Blocks take arguments instead of phi nodes: a branch names
its successor blocks together with the values it passes to their arguments. Every block
ends in exactly one terminator (``cf.*``). Values are defined once, by an op result or a
block argument, and used by ops that the definition dominates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tensorwasm.dialect.types import Type

if TYPE_CHECKING:
    from tensorwasm.dialect.opdef import OpDef


class Value:
    """An SSA value: the result of an op or an argument of a block."""

    __slots__ = ("index", "owner", "type")

    def __init__(self, type: Type, owner: Op | Block, index: int):
        self.type = type
        self.owner = owner
        self.index = index

    def __repr__(self) -> str:
        return f"<Value {self.type} of {self.owner!r}#{self.index}>"


class Successor:
    """A branch target: the block and the values passed to its arguments."""

    __slots__ = ("args", "block")

    def __init__(self, block: Block, args: list[Value]):
        self.block = block
        self.args = args


class Op:
    """One operation: an op definition applied to operands, with attributes.

    ``offset`` is the byte offset of the Wasm instruction the op came from, kept for
    error messages and reports.
    """

    __slots__ = ("attrs", "block", "offset", "opdef", "operands", "results", "successors")

    def __init__(
        self,
        opdef: OpDef,
        operands: list[Value],
        result_types: tuple[Type, ...],
        attrs: dict[str, Any],
        successors: list[Successor] | None = None,
        offset: int | None = None,
    ):
        self.opdef = opdef
        self.operands = operands
        if len(result_types) == 1:
            self.results = [Value(result_types[0], self, 0)]
        else:
            self.results = [Value(t, self, i) for i, t in enumerate(result_types)]
        self.attrs = attrs
        self.successors = successors or []
        self.block: Block | None = None
        self.offset = offset

    @property
    def name(self) -> str:
        return self.opdef.name

    @property
    def result(self) -> Value:
        """The single result of a one-result op."""
        (value,) = self.results
        return value

    def __repr__(self) -> str:
        return f"<Op {self.opdef.name}>"


class Block:
    """A basic block with typed arguments and a list of ops ending in a terminator.

    ``attrs`` carries structural facts for later stages; ``loop`` marks a loop header
    (its value is the :class:`LoopInfo`).
    """

    __slots__ = ("args", "attrs", "func", "ops")

    def __init__(self, arg_types: tuple[Type, ...] | list[Type] = ()):
        self.args = [Value(t, self, i) for i, t in enumerate(arg_types)]
        self.ops: list[Op] = []
        self.attrs: dict[str, Any] = {}
        self.func: Function | None = None

    def add_arg(self, type: Type) -> Value:
        value = Value(type, self, len(self.args))
        self.args.append(value)
        return value

    @property
    def terminator(self) -> Op | None:
        if self.ops and self.ops[-1].opdef.terminator:
            return self.ops[-1]
        return None

    @property
    def successors(self) -> list[Block]:
        term = self.terminator
        return [s.block for s in term.successors] if term else []

    def __repr__(self) -> str:
        return f"<Block {id(self):#x}>"


@dataclass(eq=False)
class LoopInfo:
    """A loop of the source program: its header block and where it came from.

    ``offset`` is the byte offset of the Wasm ``loop`` instruction, ``depth`` its nesting
    depth among loops (1 for an outermost loop) and ``parent`` the enclosing loop.
    """

    header: Block
    offset: int
    depth: int
    parent: LoopInfo | None = None
    # What the frontend knew at the Wasm level, for rewriting the module around the loop:
    # the index of the ``loop`` instruction in its function body and of its ``end``; the
    # value of every local on entry; the locals the header takes as arguments (in order);
    # and, for each way out of the loop, the successor (None for falling off its end) with
    # the value of every local there.
    start: int = -1
    end: int = -1
    entry_env: list = field(default_factory=list)
    assigned: list[int] = field(default_factory=list)
    exits: list = field(default_factory=list)
    returns: bool = False  # a return inside the loop leaves it too


@dataclass(eq=False)
class Function:
    """A function: a signature and, unless imported, a body of blocks.

    ``index`` is the Wasm function index; ``import_name`` is ``(module, name)`` for an
    imported function, which has no blocks; ``exports`` lists its export names.
    """

    name: str
    index: int
    params: tuple[Type, ...]
    results: tuple[Type, ...]
    blocks: list[Block] = field(default_factory=list)
    loops: list[LoopInfo] = field(default_factory=list)
    import_name: tuple[str, str] | None = None
    exports: list[str] = field(default_factory=list)
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def entry(self) -> Block:
        return self.blocks[0]

    @property
    def is_import(self) -> bool:
        return self.import_name is not None

    @property
    def loop_depth(self) -> int:
        """How deep the function's loops nest: 0 without loops, 1 for loops none encloses."""
        return max((info.depth for info in self.loops), default=0)

    def add_block(self, arg_types: tuple[Type, ...] | list[Type] = ()) -> Block:
        block = Block(arg_types)
        block.func = self
        self.blocks.append(block)
        return block

    def ops(self):
        """Every op of the function, block by block."""
        for block in self.blocks:
            yield from block.ops


@dataclass(frozen=True)
class FuncSig:
    """A function type: parameter and result types."""

    params: tuple[Type, ...]
    results: tuple[Type, ...]

    def __str__(self) -> str:
        params = ", ".join(map(str, self.params))
        results = ", ".join(map(str, self.results))
        return f"({params}) -> ({results})"


@dataclass(frozen=True)
class GlobalDecl:
    """A global variable: type, mutability, initial value (constant expression) or import."""

    type: Type
    mutable: bool
    init: Any = None
    import_name: tuple[str, str] | None = None


@dataclass(frozen=True)
class MemoryDecl:
    """A linear memory, in 64 KiB pages."""

    min_pages: int
    max_pages: int | None
    import_name: tuple[str, str] | None = None


@dataclass(frozen=True)
class TableDecl:
    """A table of references."""

    type: Type
    min_size: int
    max_size: int | None
    import_name: tuple[str, str] | None = None


@dataclass(eq=False)
class Module:
    """A translated module: functions (imports first, as in Wasm) and the state they use."""

    functions: list[Function] = field(default_factory=list)
    types: list[FuncSig] = field(default_factory=list)
    globals: list[GlobalDecl] = field(default_factory=list)
    memories: list[MemoryDecl] = field(default_factory=list)
    tables: list[TableDecl] = field(default_factory=list)
    # Functions a table can hold: named by element segments or by ref.func anywhere.
    table_funcs: set[int] = field(default_factory=set)

    def function(self, key: str | int) -> Function:
        """Find a function by index, export name or debug name."""
        if isinstance(key, int):
            return self.functions[key]
        for func in self.functions:
            if key in func.exports:
                return func
        for func in self.functions:
            if func.name == key:
                return func
        raise KeyError(key)
