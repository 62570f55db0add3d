"""The call graph of a dialect module: what a function may call (directly or through a
table), what a set of roots reaches, and which functions are recursive."""

from __future__ import annotations

from collections.abc import Iterable

from tensorwasm.compiler.errors import NotCompilable
from tensorwasm.dialect.ir import FuncSig, Function, Module


def callees(module: Module, func: Function) -> Iterable[int]:
    """Every function ``func`` may call, directly or through a table."""
    for op in func.ops():
        if op.name == "func.call":
            yield op.attrs["callee"]
        elif op.name == "func.call_indirect":
            yield from indirect_candidates(module, op.attrs["sig"])


def indirect_candidates(module: Module, sig: FuncSig) -> list[int]:
    """Functions of type ``sig`` that a table can hold (Wasm compares types structurally)."""
    return sorted(
        i
        for i in module.table_funcs
        if module.functions[i].params == sig.params and module.functions[i].results == sig.results
    )


def reachable(module: Module, roots: Iterable[int]) -> list[int]:
    """The functions reachable from ``roots``; NotCompilable if that includes an import."""
    seen: dict[int, int | None] = {}
    stack = [(root, None) for root in roots]
    order = []
    while stack:
        index, caller = stack.pop()
        if index in seen:
            continue
        seen[index] = caller
        func = module.functions[index]
        if func.is_import:
            chain = []
            at: int | None = index
            while at is not None:
                chain.append(module.functions[at].name)
                at = seen[at]
            mod, name = func.import_name
            path = " -> ".join(reversed(chain))
            raise NotCompilable(f"calls host import {mod}.{name} ({path})", func.import_name)
        order.append(index)
        stack.extend((callee, index) for callee in callees(module, func))
    return order


def recursive_functions(module: Module, functions: list[int]) -> set[int]:
    """Functions on a call-graph cycle (Tarjan's strongly connected components, iteratively)."""
    graph = {f: sorted(set(callees(module, module.functions[f]))) for f in functions}
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    result: set[int] = set()
    counter = 0
    for root in functions:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            succs = graph.get(node, [])
            if i < len(succs):
                work.append((node, i + 1))
                nxt = succs[i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, []):
                    result.update(component)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return result
