"""The verifier: types, terminators, reachability and dominance of a dialect function.

It re-derives every op's result types from its definition, checks branch arguments and
returns against their targets, and checks that each use is dominated by its definition
(dominators by the Cooper-Harvey-Kennedy iteration over reverse postorder).
"""

from __future__ import annotations

from tensorwasm.dialect import cf
from tensorwasm.dialect.builder import check_successor
from tensorwasm.dialect.ir import Block, Function, Module, Op, Value
from tensorwasm.support.errors import IRTypeError, VerifyError


def verify_module(module: Module) -> None:
    for func in module.functions:
        if not func.is_import:
            verify_function(func)


def verify_function(func: Function) -> None:
    """Raise VerifyError naming the function, block and op of the first broken rule: each
    block's structure and types first (in order), then reachability, then dominance."""
    if not func.blocks:
        raise VerifyError(f"function {func.name}: has no blocks")
    entry = func.entry
    if [a.type for a in entry.args] != list(func.params):
        raise VerifyError(f"function {func.name}: entry block arguments do not match the parameters")
    block_ids = {block: i for i, block in enumerate(func.blocks)}
    positions: dict[Op, int] = {}
    # Uses a block's own pass cannot settle (a value of another block, or of this one not
    # yet seen): (value, block, its index, the use's position), checked once the
    # dominators are known. A use of an earlier op of its own block, or of its own block's
    # argument, is dominated: most uses are, and they cost one test each.
    later: list[tuple[Value, Block, int, int]] = []
    for bi, block in enumerate(func.blocks):
        _verify_block(func, block, bi, block_ids, positions, later)
    order = reverse_postorder(func)
    if len(order) != len(func.blocks):
        seen = set(order)
        dead = next(i for i, b in enumerate(func.blocks) if b not in seen)
        raise VerifyError(f"function {func.name}: ^bb{dead} is unreachable from the entry block")
    tree = DominatorTree(order)
    for value, block, bi, pos in later:
        _check_dominance(func, value, block, pos, tree, positions, block_ids, bi)


def _at(func: Function, bi: int) -> str:
    """Where a broken rule is (built only to raise: a function has thousands of blocks)."""
    return f"function {func.name}, ^bb{bi}"


def _verify_block(func, block, bi, block_ids, positions, later) -> None:
    ops = block.ops
    if not ops or not ops[-1].opdef.terminator:
        raise VerifyError(f"{_at(func, bi)}: does not end in a terminator")
    last = len(ops) - 1
    for pos, op in enumerate(ops):
        opdef = op.opdef
        if opdef.terminator and pos != last:
            raise VerifyError(f"{_at(func, bi)}: terminator {op.name} is not the last op")
        if op.block is not block:
            raise VerifyError(f"{_at(func, bi)}: {op.name} does not know its block")
        operands = op.operands
        try:
            expected = opdef.infer([v.type for v in operands], op.attrs)
            for succ in op.successors:
                if succ.block not in block_ids:
                    raise VerifyError(f"{_at(func, bi)}: {op.name} branches to a block of another function")
                check_successor(opdef, succ)
        except IRTypeError as exc:
            raise VerifyError(f"{_at(func, bi)}: {exc}") from None
        results = op.results
        if len(results) != len(expected) or any(r.type != t for r, t in zip(results, expected)):
            raise VerifyError(f"{_at(func, bi)}: {op.name} has results of the wrong types")
        if opdef is cf.return_ and tuple(v.type for v in operands) != func.results:
            got = ", ".join(str(v.type) for v in operands)
            want = ", ".join(map(str, func.results))
            raise VerifyError(f"{_at(func, bi)}: returns ({got}) from a function of results ({want})")
        uses = (
            operands if not op.successors else [*operands, *(v for succ in op.successors for v in succ.args)]
        )
        for value in uses:
            owner = value.owner
            if owner is block or (owner in positions and owner.block is block):
                continue
            later.append((value, block, bi, pos))
        positions[op] = pos


def _check_dominance(func, value, block, pos, tree, positions, block_ids, bi) -> None:
    owner = value.owner
    if isinstance(owner, Block):
        def_block, def_pos = owner, -1
    else:
        def_block = owner.block
        def_pos = positions.get(owner)
        if def_pos is None:
            def_block = None
    if def_block is None or def_block not in block_ids:
        raise VerifyError(f"{_at(func, bi)}: uses a value defined outside the function")
    if def_block is block:
        if def_pos < pos:
            return
    elif tree.dominates(def_block, block):
        return
    raise VerifyError(
        f"{_at(func, bi)}: a use is not dominated by its definition in ^bb{block_ids[def_block]}"
    )


def reverse_postorder(func: Function) -> list[Block]:
    """The blocks reachable from the entry, in reverse postorder (iteratively)."""
    seen = {func.entry}
    post: list[Block] = []
    stack = [(func.entry, iter(func.entry.successors))]
    while stack:
        block, succs = stack[-1]
        for succ in succs:
            if succ not in seen:
                seen.add(succ)
                stack.append((succ, iter(succ.successors)))
                break
        else:
            post.append(block)
            stack.pop()
    post.reverse()
    return post


def dominators(order: list[Block]) -> dict[Block, Block]:
    """Immediate dominators of the blocks in ``order`` (reverse postorder, entry first)."""
    index = {b: i for i, b in enumerate(order)}
    preds: dict[Block, list[Block]] = {b: [] for b in order}
    for b in order:
        for s in b.successors:
            preds[s].append(b)
    entry = order[0]
    idom: dict[Block, Block] = {entry: entry}
    changed = True
    while changed:
        changed = False
        for b in order[1:]:
            new = None
            for p in preds[b]:
                if p not in idom:
                    continue
                if new is None:
                    new = p
                    continue
                a, c = p, new
                while a is not c:
                    while index[a] > index[c]:
                        a = idom[a]
                    while index[c] > index[a]:
                        c = idom[c]
                new = a
            if idom.get(b) is not new:
                idom[b] = new
                changed = True
    return idom


class DominatorTree:
    """The immediate dominators of the blocks in ``order`` (reverse postorder, entry first),
    and each block's interval in a depth-first walk of their tree: ``a`` dominates ``b``
    where ``b``'s interval lies in ``a``'s, a test that costs the same in a function of
    thousands of blocks (walking up the tree cost the tree's depth, each time)."""

    def __init__(self, order: list[Block]) -> None:
        self.idom = dominators(order) if order else {}
        kids: dict[Block, list[Block]] = {}
        for b, parent in self.idom.items():
            if parent is not b:
                kids.setdefault(parent, []).append(b)
        self.enter: dict[Block, int] = {}
        self.leave: dict[Block, int] = {}
        clock = 0
        stack = [(order[0], False)] if order else []
        while stack:
            b, done = stack.pop()
            clock += 1
            if done:
                self.leave[b] = clock
                continue
            self.enter[b] = clock
            stack.append((b, True))
            stack.extend((k, False) for k in kids.get(b, ()))

    def dominates(self, a: Block, b: Block) -> bool:
        """Every path from the entry to ``b`` passes through ``a`` (False where either is
        unreachable and they differ)."""
        if a is b:
            return True
        enter_a, enter_b = self.enter.get(a), self.enter.get(b)
        if enter_a is None or enter_b is None:
            return False
        return enter_a < enter_b and self.leave[b] < self.leave[a]
