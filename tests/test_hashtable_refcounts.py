"""The tables' per-id loops hold no reference counting. numba counts references to the arrays given
to an inlined helper that loops, or branches around a loop (``NRT_incref``/``NRT_decref``, atomic
operations); in a loop over ids that cost a gather 43-49 ns an id on a 16-core Xeon against 4.5
without (docs/benchmarks.md, "Hash tables"). Each kernel is compiled afresh (the on-disk cache
keeps no IR) and its optimized LLVM IR searched for those calls inside a loop: a block that a
back edge (a branch to a block dominating its source) reaches."""

from __future__ import annotations

import re

import numba
import numpy as np
import pytest

from des.hashtable import BlockSpec, EmbeddingTable, Initializer, optimizer_from_spec
from des.hashtable import _index as K
from des.hashtable import fused, pooling
from des.hashtable.bfloat16 import load


def _body(ir: str, name: str) -> str:
    """The kernel's own function in a module's IR (not its Python wrapper or the NRT helpers)."""
    for text in re.split(r"\ndefine ", ir)[1:]:
        symbol = re.search(r"@([^\s(]+)\(", text.split("\n")[0])
        if symbol and name in symbol.group(1) and not symbol.group(1).startswith(("_ZN7cpython", "cfunc")):
            return text
    raise AssertionError(f"no function {name} in the IR")


def _blocks(body: str) -> tuple[list[str], dict[str, list[str]], dict[str, list[str]]]:
    order, lines, current = [], {}, None
    for line in body.splitlines()[1:]:
        label = re.match(r"^([\w.$\"-]+):", line)
        if label:
            current = label.group(1).strip('"')
            order.append(current)
            lines[current] = []
        elif current is not None:
            lines[current].append(line)
    successors = {b: [t.strip('"') for line in lines[b] if re.match(r"\s+(br|switch)\b|\s+i\d+ -?\d+, label", line)
                      for t in re.findall(r'label %("?[\w.$-]+"?)', line)] for b in order}
    return order, lines, successors


def refcounts_in_loops(ir: str, name: str) -> int:
    """``NRT_incref``/``NRT_decref`` calls in the blocks of function ``name``'s loops."""
    order, lines, successors = _blocks(_body(ir, name))
    predecessors: dict[str, list[str]] = {b: [] for b in order}
    for b in order:
        for s in successors[b]:
            predecessors[s].append(b)
    dominators = {b: set(order) for b in order}
    dominators[order[0]] = {order[0]}
    changed = True
    while changed:
        changed = False
        for b in order[1:]:
            known = [dominators[p] for p in predecessors[b]]
            new = {b} | (set.intersection(*known) if known else set())
            if new != dominators[b]:
                dominators[b], changed = new, True
    in_loops: set[str] = set()
    for source in order:
        for header in successors[source]:
            if header in dominators[source]:  # a back edge: the loop is what reaches source without header
                loop, stack = {header, source}, [source] if source != header else []
                while stack:
                    for p in predecessors[stack.pop()]:
                        if p not in loop:
                            loop.add(p)
                            stack.append(p)
                in_loops |= loop
    return sum(bool(re.search(r"call void @NRT_(incref|decref)\(", line)) for b in in_loops for line in lines[b])


def _fresh(kernel, *args) -> str:
    compiled = numba.njit(nogil=True)(kernel.py_func)
    compiled(*args)
    return next(iter(compiled.inspect_llvm().values()))


@numba.njit(nogil=True, inline="always")
def _copy_row_under_branch(data, r, out, i):  # the pattern the check exists for
    if r >= 0:
        for c in range(out.shape[1]):
            out[i, c] = load(data, r, c)
    else:
        for c in range(out.shape[1]):
            out[i, c] = 0


def _gather_with_helper(data, rows, out):
    for i in range(rows.shape[0]):
        _copy_row_under_branch(data, rows[i], out, i)


def test_the_check_finds_reference_counts_in_a_loop():
    data, rows, out = np.ones((50, 8), np.float32), np.arange(-1, 20), np.empty((21, 8), np.float32)
    compiled = numba.njit(nogil=True)(_gather_with_helper)
    compiled(data, rows, out)
    assert refcounts_in_loops(next(iter(compiled.inspect_llvm().values())), "_gather_with_helper") > 0


@pytest.mark.parametrize("counters", [True, False])
def test_the_lookups_and_gathers_loop_over_ids_without_reference_counts(counters):
    table = EmbeddingTable(field=3, seed=1, capacity=1024, counters=counters, blocks=[
        BlockSpec("embedding", 8, optimizer_from_spec("adam:lr=0.001"), Initializer("normal", 0.01))])
    keys = np.arange(1, 3000, dtype=np.int64)
    rows = table.lookup(keys, insert=True)
    b = table.block_index("embedding")
    data, n = table._data[b], len(table)
    out = np.empty((keys.shape[0], 8), table.dtype)
    idx, row_keys, meta = table._idx, table._keys, table._meta
    found = np.empty(keys.shape[0], np.int64)
    more = np.arange(5000, 6000, dtype=np.int64)
    derive = np.array([1.0, 0.05, 0.01, 0.0, 1.0], table.dtype)  # a computed FTRL row's terms
    admitted = np.ones(keys.shape[0], np.bool_)
    kernels = {
        "gather_rows": (K.gather_rows, (data, 8, derive, rows, keys, n, meta, 1, False, np.uint64(1), 2, 0.1, out)),
        "find_keys": (K.find_keys, (idx, row_keys, keys, found)),
        "insert_keys": (K.insert_keys, (idx.copy(), more, np.empty_like(more), 0, n, n, row_keys.shape[0], idx.shape[0],
                                        row_keys.copy(), meta.copy(), 1, 1, counters, K.ONE_EACH)),
        "_read_ids": (fused._read_ids, (data, derive, keys, rows, admitted, n, False, np.uint64(1), 2, 0.1, out)),
        "_read_distinct": (fused._read_distinct, (data, 8, derive, rows, admitted, rows, n, out)),
        "_read_others": (fused._read_others, (data, 8, derive, keys, rows, admitted, 10, n, False, np.uint64(1), 2,
                                              0.1, np.arange(keys.shape[0]), out)),
        "dedup_rows": (K.dedup_rows, (rows, out, admitted, False, n, np.empty_like(rows), np.empty_like(out))),
    }
    for name, (kernel, args) in kernels.items():
        assert refcounts_in_loops(_fresh(kernel, *args), name) == 0, name
    grads = np.ones((keys.shape[0], 1, 8), table.dtype)
    sums = np.zeros((keys.shape[0], 8), table.dtype)
    offsets = np.arange(keys.shape[0] + 1, dtype=np.int64)
    inverse = np.arange(keys.shape[0], dtype=np.int32)
    ir = _fresh(pooling.pool_or_unpool, sums, inverse, offsets, np.ones(keys.shape[0]), True, grads, 0, True)
    assert refcounts_in_loops(ir, "pool_or_unpool") == 0
