"""Candidate tables priced ahead, in the search's worker processes as well as its own.

Before its roots the search needs the candidate table of every pipeline micro-batch size. Pricing
is pure Python (the cost model of every configuration of every island) and, on large search
spaces, a sizeable part of a short time limit: on the communication-bound "384 V100+A10G, MoE" case
20,297 candidates (of about 60,000 enumerated) took 12.9 s in one process on a slow 2-core machine
(formulations/pipeline_mip.md §5, tenth round). The solver workers are idle then (the pool has
one per core), so the tables of (island, size) pairs are handed out to them.

Only the default provider (:class:`AnalyticalCandidates`) is priced ahead: its tables are a pure
function of the specs, so a worker's table is the one this process would have priced, and the
pruning counts of the certificate's notes are merged as if priced here. Any other provider, a
table that does not pickle or a worker that fails leaves the pricing to this process (lazily, as
before).
"""

from __future__ import annotations

import itertools
import pickle
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait

from tangram_opt.planner.candidates import AnalyticalCandidates
from tangram_opt.planner.candidates.analytical import price_table
from tangram_opt.planner.context import PlanningContext
from tangram_opt.planner.islands import Island
from tangram_opt.planner.search import tuning
from tangram_opt.solvers.workers import Shared, SolverPool, WorkerError

#: keys of the providers sent to workers: one per call, never reused (an ``id`` may be, once its
#: object is gone, and a worker would then price with another planning call's provider)
_PROVIDER_KEYS = itertools.count()


def price_ahead(ctx: PlanningContext, sizes: Sequence[int], pool: SolverPool | None) -> int:
    """Price the candidate tables of ``sizes`` on every island of ``ctx`` now, with ``pool``'s
    workers beside this process when the tables of the first size, times the number of sizes
    left, come to at least ``tuning.PRICE_AHEAD_MIN_S`` (the first size is the smallest and
    cheapest; cheaper searches are not worth starting workers for). Returns how many tables the
    workers priced (0: everything was left to this process)."""
    provider = ctx.provider
    if pool is None or pool.size < 1 or type(provider) is not AnalyticalCandidates or len(sizes) < 2:
        return 0
    t0 = time.perf_counter()
    for isl in ctx.islands:
        provider.candidates(isl, sizes[0])
    todo = [(isl, b) for b in sizes[1:] for isl in ctx.islands if not provider.has(isl, b)]
    if not todo or (time.perf_counter() - t0) * (len(sizes) - 1) < tuning.PRICE_AHEAD_MIN_S:
        return 0
    shared = Shared(key=("candidate provider", next(_PROVIDER_KEYS)), make=provider.fresh)
    try:
        shared.blob()
    except (pickle.PicklingError, TypeError, AttributeError):
        return 0  # a cost model holding something that cannot cross processes: price here
    running: dict[Future, tuple[Island, int]] = {}
    remote, failed = 0, False
    while todo or running:
        while todo and not failed:
            worker = pool.idle_worker()
            if worker is None:
                break
            job = todo.pop(0)
            running[worker.call(price_table, job, shared)] = job
        if not running:  # no worker to be had: price one here
            provider.candidates(*todo.pop(0))
            continue
        # this process only hands out tables (the pool has a worker per core): a table priced
        # here would keep it from handing the next one to a worker that is done
        for fut in wait(running, return_when=FIRST_COMPLETED).done:
            isl, b = running.pop(fut)
            try:
                kept, stats = fut.result()
            except WorkerError:  # e.g. a cost model whose class the worker cannot import: the rest here
                failed = True
                provider.candidates(isl, b)
                continue
            if not provider.has(isl, b):
                provider.adopt((isl.index, b), kept, stats)
                remote += 1
    return remote


__all__ = ["price_ahead"]
