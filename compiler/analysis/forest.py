"""The loop forest of one function, and its def-use facts.

The translator marks each Wasm ``loop``'s header block and lists the loops (their nesting
depth, parent, exits and the locals they assign). From the dominator tree this finds each
loop's natural body: the header, and every block that reaches a latch (a predecessor of
the header that the header dominates) without passing through the header. Alongside it
keeps, for every SSA value, the block that defines it and the ops (terminators' branch
arguments included) that use it. Every part of the loop analysis reads these facts; they
are computed once per function and shared by its loops, and each question they answer costs
what its answer holds, not the size of the function: dominance by the dominator tree's
DFS numbering, a loop's blocks in function order by their positions, its inner loops from
the loop tree (a function of thousands of loops was quadratic in their number), a loop's
body as a slice of one list of the function's loop blocks (sets per loop held d^2 / 2
blocks for a nest of depth d), and how deep the nest is that each loop heads.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Set

from tensorwasm.dialect.ir import Block, Function, LoopInfo, Module, Op, Value
from tensorwasm.dialect.verifier import DominatorTree, reverse_postorder

# The deepest loop nest the loop analysis works on loop by loop with the loops inside it.
# Such work costs each loop the size of the nest below it (its plan names every inner
# loop: trip counts, accesses, one polyhedral dimension each), quadratic in the depth of
# one nested deeper: the analysis rejects a loop heading a deeper nest without looking
# inside (its inner loops within the limit stay candidates). Real programs nest loops a
# few deep (PolyBench and the examples at most 4); a 64-deep counted nest whose innermost
# loop stores took 16.6 s to analyse, a 16-deep one 0.18 s.
MAX_LOOP_DEPTH = 16


class Reject(Exception):
    """Why a loop cannot be offloaded (message: the reason shown in the report)."""


def at(op: Op) -> str:
    """Where ``op`` is in the Wasm code, as the reports print it."""
    return f"+0x{op.offset:x}" if op.offset is not None else "?"


def only_traps(block: Block) -> bool:
    """The block ends in a trap: leaving a loop for it is no way out of the loop."""
    term = block.terminator
    return term is not None and term.name == "cf.trap"


class LoopBody(Set):
    """The blocks of one loop: a slice of a list shared by the function's loops, where the
    blocks of every loop are one slice (see :meth:`FunctionLoops._views`). Reads as a
    set: membership by a block's slot, iteration, and set operations giving sets."""

    __slots__ = ("_end", "_order", "_slot", "_start")

    def __init__(self, order: list[Block], slot: dict[Block, int], start: int, end: int):
        self._order, self._slot, self._start, self._end = order, slot, start, end

    def __contains__(self, block: object) -> bool:
        i = self._slot.get(block)
        return i is not None and self._start <= i < self._end

    def __iter__(self) -> Iterator[Block]:
        order = self._order
        return (order[i] for i in range(self._start, self._end))

    def __len__(self) -> int:
        return self._end - self._start

    @classmethod
    def _from_iterable(cls, blocks: Iterable[Block]) -> set[Block]:
        return set(blocks)


class FunctionLoops:
    """Loop structure and def-use facts of one function, shared by its loops' analyses."""

    def __init__(self, module: Module, func: Function):
        self.module = module
        self.func = func
        self.dominator_tree = DominatorTree(reverse_postorder(func))
        self.idom = self.dominator_tree.idom
        self.position = {b: i for i, b in enumerate(func.blocks)}
        self.loop_position = {info: i for i, info in enumerate(func.loops)}
        self.children: dict[LoopInfo | None, list[LoopInfo]] = {}
        for info in func.loops:
            self.children.setdefault(info.parent, []).append(info)
        self.preds: dict[Block, list[Block]] = {b: [] for b in func.blocks}
        for b in func.blocks:
            for s in b.successors:
                self.preds[s].append(b)
        self.def_block: dict[Value, Block] = {}
        self.users: dict[Value, list[tuple[Op, Block]]] = {}
        for block in func.blocks:
            for arg in block.args:
                self.def_block[arg] = block
            for op in block.ops:
                for r in op.results:
                    self.def_block[r] = block
                for v in op.operands:
                    self.users.setdefault(v, []).append((op, block))
                for succ in op.successors:
                    for v in succ.args:
                        self.users.setdefault(v, []).append((op, block))
        # Each block's innermost loop, and each loop's innermost enclosing one (None: outermost).
        self.innermost: dict[Block, LoopInfo] = {}
        self.enclosing: dict[LoopInfo, LoopInfo | None] = {}
        self._taken_by: dict[LoopInfo, LoopInfo] = {}  # see _outermost_made
        for info in sorted(func.loops, key=lambda m: -m.depth):  # inner loops first
            self._find_body(info)
        self.bodies: dict[LoopInfo, LoopBody] = self._views()
        self._exits: dict[LoopInfo, list[tuple[Block, Op]]] | None = None
        self.effects: dict[LoopInfo, tuple[int, str] | None] = {}  # see loops.first_effect
        self.exit_tests: dict[LoopInfo, tuple | Exception] = {}  # see trips.exit_test
        self._entry_args: dict[LoopInfo, list[Value]] = {}
        self._back_args: dict[LoopInfo, list[list[Value]]] = {}
        self._nest_depths: dict[LoopInfo, int] | None = None
        self.latches: dict[LoopInfo, list[Block]] = {
            info: [p for p in self.preds[info.header] if p in self.bodies[info]] for info in func.loops
        }

    def dominates(self, a: Block, b: Block) -> bool:
        """Every path from the entry to ``b`` passes through ``a``."""
        return self.dominator_tree.dominates(a, b)

    def in_order(self, blocks: set[Block]) -> list[Block]:
        """``blocks`` in function order (what set iteration is not: it differs between processes)."""
        position = self.position
        return sorted(blocks, key=position.__getitem__)

    def nested(self, info: LoopInfo) -> list[LoopInfo]:
        """The loops inside ``info``, itself included, in the function's loop order: natural
        loops of a reducible graph (Wasm's are) nest or are disjoint, so a loop is inside
        where its header is."""
        body = self.bodies[info]
        found, work = [info], list(self.children.get(info, ()))
        while work:
            m = work.pop()
            if m.header in body:
                found.append(m)
            work.extend(self.children.get(m, ()))
        return sorted(found, key=self.loop_position.__getitem__)

    def nest_depth(self, info: LoopInfo) -> int:
        """How deep the nest is that ``info`` heads: 1 for a loop with none inside it, else
        one more than its deepest inner loop's (made for every loop at once, inner loops
        first, each from the loops right inside it)."""
        if self._nest_depths is None:
            depths = self._nest_depths = dict.fromkeys(self.func.loops, 1)
            for m in sorted(self.func.loops, key=lambda m: -m.depth):  # inner loops first
                parent = self.enclosing[m]
                if parent is not None:
                    depths[parent] = max(depths[parent], depths[m] + 1)
        return self._nest_depths[info]

    def _find_body(self, info: LoopInfo) -> None:
        """The natural loop: the header and every block reaching a latch without it, each
        block's innermost loop and each loop's enclosing one recorded. The loops inside it
        are made first: the walk goes from such a loop's header where it meets one of its
        blocks, so every block is walked once per function (a nest of depth d walked
        d^2 / 2 blocks)."""
        header = info.header
        seen = {header}
        self.innermost.setdefault(header, info)
        work = [p for p in self.preds[header] if self.dominates(header, p)]
        while work:
            b = work.pop()
            if b in seen:
                continue
            inner = self.innermost.get(b)
            if inner is None:
                self.innermost[b] = info
                seen.add(b)
                work.extend(self.preds[b])
                continue
            inner = self._outermost_made(inner)
            if inner is info:
                continue  # a block of a loop this one has taken already
            self.enclosing[inner] = self._taken_by[inner] = info
            work.extend(self.preds[inner.header])
        self.enclosing.setdefault(info, None)

    def _views(self) -> dict[LoopInfo, LoopBody]:
        """Each loop's body as a view of one list of the function's loop blocks, ordered
        so that every loop's blocks and its inner loops' are one slice of it (the loop
        tree in preorder, each loop's own blocks first): sets of each loop's blocks held
        d^2 / 2 blocks for a nest of depth d."""
        inside: dict[LoopInfo | None, list[LoopInfo]] = {}
        for info in self.func.loops:
            inside.setdefault(self.enclosing[info], []).append(info)
        own = self.own_blocks()
        order: list[Block] = []
        start: dict[LoopInfo, int] = {}
        end: dict[LoopInfo, int] = {}
        work = [(info, False) for info in reversed(inside.get(None, ()))]
        while work:
            info, done = work.pop()
            if done:
                end[info] = len(order)
                continue
            start[info] = len(order)
            order.extend(own[info])
            work.append((info, True))
            work.extend((m, False) for m in reversed(inside.get(info, ())))
        slot = {b: i for i, b in enumerate(order)}
        return {info: LoopBody(order, slot, start[info], end[info]) for info in self.func.loops}

    def _outermost_made(self, info: LoopInfo) -> LoopInfo:
        """The outermost loop made so far that holds ``info`` (a union-find with path
        compression over the loops that took others whole)."""
        top = info
        while top in self._taken_by:
            top = self._taken_by[top]
        while info is not top:
            above = self._taken_by[info]
            self._taken_by[info] = top
            info = above
        return top

    def own_blocks(self) -> dict[LoopInfo, list[Block]]:
        """Each loop's blocks that no loop inside it holds, in function order."""
        own: dict[LoopInfo, list[Block]] = {info: [] for info in self.func.loops}
        for block in self.func.blocks:
            info = self.innermost.get(block)
            if info is not None:
                own[info].append(block)
        return own

    def exits(self, info: LoopInfo) -> list[tuple[Block, Op]]:
        """The edges out of ``info``'s body (to anything but a trap), as (block, its
        terminator) once per such successor. Made for every loop at once, each edge walked
        up from its block's innermost loop to the first loop holding its successor."""
        if self._exits is None:
            self._exits = {m: [] for m in self.func.loops}
            for block, m in self.innermost.items():
                term = block.terminator
                if term is None:
                    continue
                for succ in term.successors:
                    loop = m
                    while loop is not None and succ.block not in self.bodies[loop]:
                        if not only_traps(succ.block):
                            self._exits[loop].append((block, term))
                        loop = self.enclosing.get(loop)
        return self._exits[info]

    def entry_edge_args(self, info: LoopInfo) -> list[Value]:
        """The values the edge into the loop (from outside its body) gives its header (made
        once per loop: every candidate around it asks)."""
        found = self._entry_args.get(info)
        if found is None:
            found = self._entry_args[info] = self._entry_edge_args(info)
        return found

    def _entry_edge_args(self, info: LoopInfo) -> list[Value]:
        for pred in self.preds[info.header]:
            if pred not in self.bodies[info]:
                for succ in pred.terminator.successors:
                    if succ.block is info.header:
                        return succ.args
        raise Reject("loop header has no entry edge")

    def back_edge_args(self, info: LoopInfo) -> list[list[Value]]:
        """The values each back edge (from a latch) gives the header, latch by latch (made
        once per loop)."""
        found = self._back_args.get(info)
        if found is None:
            found = self._back_args[info] = [
                succ.args
                for latch in self.latches[info]
                for succ in latch.terminator.successors
                if succ.block is info.header
            ]
        return found
