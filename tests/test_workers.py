"""Solver processes (tangram_opt.solvers.workers) and the search's use of them."""

from __future__ import annotations

import math
import operator
from concurrent.futures import Future

import pytest

from tangram_opt.planner.search import SearchOptions, solve, tuning
from tangram_opt.planner.search import branch_and_bound as search_module
from tangram_opt.planner.space import SearchSpace
from tangram_opt.solvers import SolveOptions, SolveResult, SolveStatus, solve_model
from tangram_opt.solvers.model import LinearModel, lsum
from tangram_opt.solvers.workers import Shared, SolverPool, SolverWorker, WorkerError
from tangram_opt.specs import TrainingSpec, load_model, make_cluster


def knapsack_model() -> LinearModel:
    md = LinearModel(name="cover")
    xs = [md.add_var(f"x{i}", 0, 10, integer=True) for i in range(12)]
    md.add(lsum((i % 5 + 1) * x for i, x in enumerate(xs)) >= 37, "cover")
    md.add(lsum(xs[:6]) <= 4, "few")
    md.minimize(lsum((i % 7 + 2) * x for i, x in enumerate(xs)) + 1.5)
    return md


def test_a_worker_solves_the_model_it_is_sent_as_this_process_would():
    md = knapsack_model()
    here = solve_model(md, "highs", SolveOptions(time_limit_s=10))
    with SolverPool(1) as pool:
        worker = pool.idle_worker()
        assert worker is not None
        fut = worker.submit(md, "highs", SolveOptions(time_limit_s=10, on_progress=lambda p: None))
        assert pool.idle_worker() is None or fut.done()  # busy until it answers
        res = fut.result(timeout=30)
        assert pool.idle_worker() is worker
        # a second request on the same process, with a cutoff below the optimum
        low = worker.submit(md, "highs", SolveOptions(time_limit_s=10, cutoff=here.objective - 1)).result(timeout=30)
    assert res.status == SolveStatus.OPTIMAL == here.status
    assert res.objective == pytest.approx(here.objective) and res.bound == pytest.approx(here.bound)
    assert md.check(res.values) == []
    assert low.status == SolveStatus.INFEASIBLE


def test_a_dead_worker_fails_its_future_is_never_idle_again_and_is_replaced():
    with SolverPool(1) as pool:
        assert pool.workers == []  # none until asked for
        worker = pool.idle_worker()
        worker.proc.kill()
        worker.proc.wait()
        assert not worker.idle
        with pytest.raises(RuntimeError):
            worker.submit(knapsack_model(), "highs", SolveOptions())
        fresh = pool.idle_worker()  # the pool starts another in its place
        assert fresh is not worker and pool.workers == [fresh]
        assert fresh.submit(knapsack_model(), "highs", SolveOptions()).result(timeout=30).status == SolveStatus.OPTIMAL
    fresh = SolverWorker()
    try:
        fresh.proc.stdin.close()  # the worker reads EOF and exits: the request cannot be sent
        fresh.proc.wait(timeout=30)
        fut = Future()
        fresh._round_trip((knapsack_model(), "highs", SolveOptions()), fut)
        with pytest.raises(WorkerError):
            fut.result()
    finally:
        fresh.close()


def test_a_call_reads_its_shared_value_which_each_worker_receives_once(monkeypatch):
    made, blobs = [], []
    start = SolverWorker._start

    def recording(self, request):
        blobs.append(getattr(request, "blob", None) is not None)
        return start(self, request)

    monkeypatch.setattr(SolverWorker, "_start", recording)
    table = Shared(key="table", make=lambda: made.append(1) or {"a": 1, "b": 2})
    other = Shared(key="other", make=lambda: {"a": 10})
    with SolverPool(2) as pool:
        pool.idle_worker()
        first, second = pool.workers
        assert first.call(operator.getitem, ("a",), shared=table).result(timeout=30) == 1
        assert first.call(operator.getitem, ("b",), shared=table).result(timeout=30) == 2
        assert second.call(operator.getitem, ("b",), shared=table).result(timeout=30) == 2
        assert first.call(operator.getitem, ("a",), shared=other).result(timeout=30) == 10
        assert first.call(operator.getitem, ("a",), shared=table).result(timeout=30) == 1  # both kept
        assert first.call(operator.add, (2, 3)).result(timeout=30) == 5  # no shared value
        with pytest.raises(WorkerError, match="KeyError"):  # what the function raised
            first.call(operator.getitem, ("c",), shared=table).result(timeout=30)
        assert first.call(operator.getitem, ("b",), shared=table).result(timeout=30) == 2  # still serving
    # the value was pickled once, and sent once to each worker (and "other" once)
    assert made == [1]
    assert blobs == [True, False, True, True, False, False, False, False]


def test_a_worker_and_its_caller_forget_the_same_shared_values():
    from tangram_opt.solvers.workers import SHARED_KEEP

    values = [Shared(key=i, make=lambda i=i: [i]) for i in range(SHARED_KEEP + 1)]
    with SolverPool(1) as pool:
        worker = pool.idle_worker()
        for v in values:
            assert worker.call(operator.getitem, (0,), shared=v).result(timeout=30) == v.key
        assert values[0].key not in worker.held and len(worker.held) == SHARED_KEEP
        # the oldest is sent again, and the newest is still held on both sides
        assert worker.call(operator.getitem, (0,), shared=values[0]).result(timeout=30) == 0
        assert worker.call(operator.getitem, (0,), shared=values[-1]).result(timeout=30) == SHARED_KEEP


def test_a_pool_stops_the_workers_busy_on_work_nobody_reads():
    import time

    with SolverPool(2) as pool:
        busy = pool.idle_worker()
        future = busy.call(time.sleep, (60,))
        idle = pool.idle_worker()
        assert idle is not busy
        pool.stop_busy()  # what a search leaves behind when its time is up
        assert not busy.alive and pool.workers == [idle] and idle.alive
        with pytest.raises(WorkerError):
            future.result(timeout=30)


def test_highs_without_its_sub_mip_heuristics_reaches_the_same_optimum():
    import highspy

    from tangram_opt.solvers.highs import HIGHS_SUB_MIP_HEURISTICS

    h = highspy.Highs()
    for name in HIGHS_SUB_MIP_HEURISTICS:  # names the installed HiGHS knows (on by default)
        status, value = h.getOptionValue(name)
        assert status == highspy.HighsStatus.kOk and value is True
    md = knapsack_model()
    with_h = solve_model(md, "highs", SolveOptions(time_limit_s=10))
    without = solve_model(md, "highs", SolveOptions(time_limit_s=10, heuristics=False, presolve=False))
    assert without.status == SolveStatus.OPTIMAL
    assert without.objective == pytest.approx(with_h.objective)


def _instance():
    # two A100 generations: a V100 island (materialized attention) leaves the optimum on one island,
    # found before any leaf MIP runs
    cluster = make_cluster("tiny", [dict(name="a100", gpu="A100-40", nodes=1, gpus_per_node=4, nic_gbps=200),
                                    dict(name="a100b", gpu="A100-80", nodes=1, gpus_per_node=4, nic_gbps=100)])
    space = SearchSpace(max_stages=3, zero=(0, 1), recompute=("none", "full"), cp=(1,), micro_batch_sizes=(1, 2))
    return cluster, load_model("llama-3-8b").with_layers(4), TrainingSpec(global_batch_size=8, seq_len=1024,
                                                                           precision="fp16"), space


@pytest.mark.parametrize("leaves", [False, True])
def test_the_search_with_solver_processes_proves_the_same_optimum(leaves, monkeypatch):
    cluster, model, training, space = _instance()
    alone = solve(cluster, model, training, space=space, time_limit_s=60, rel_gap=1e-9, threads=1,
                  options=SearchOptions(sequence_leaves=leaves, multi_pipeline=False))
    sent = []
    submit = SolverWorker.submit

    def counting(self, *args):
        sent.append(args[0].name)
        return submit(self, *args)

    monkeypatch.setattr(SolverWorker, "submit", counting)
    both = solve(cluster, model, training, space=space, time_limit_s=60, rel_gap=1e-9, threads=2,
                 options=SearchOptions(sequence_leaves=leaves, multi_pipeline=False))
    assert sent, "no leaf went to a worker"
    assert both.certificate.status == alone.certificate.status == "optimal"
    assert both.step_time_s == pytest.approx(alone.step_time_s, rel=1e-9)
    assert both.certificate.bound_s <= both.certificate.objective_s * (1 + 1e-9)  # the closed form it bounds


def test_the_search_waits_for_its_workers_instead_of_solving_leaves_itself(monkeypatch):
    # threads = 2: two workers (one per spare core and one more); with both busy and no window
    # left to split, the search waits for one, so no leaf MIP runs in the search's own process
    cluster, model, training, space = _instance()
    alone = solve(cluster, model, training, space=space, time_limit_s=60, rel_gap=1e-9, threads=1,
                  options=SearchOptions(sequence_leaves=True, multi_pipeline=False))
    workers, here = set(), []
    submit = SolverWorker.submit

    def counting(self, *args):
        workers.add(id(self))
        return submit(self, *args)

    def in_process(md, *args, **kw):
        here.append(md.name)
        return solve_model(md, *args, **kw)

    monkeypatch.setattr(SolverWorker, "submit", counting)
    monkeypatch.setattr(search_module, "solve_model", in_process)
    assert tuning.EXTRA_LEAF_WORKERS == 1
    plan = solve(cluster, model, training, space=space, time_limit_s=60, rel_gap=1e-9, threads=2,
                 options=SearchOptions(sequence_leaves=True, multi_pipeline=False))
    assert workers and len(workers) <= 2 and here == []
    assert plan.certificate.status == "optimal"
    assert plan.step_time_s == pytest.approx(alone.step_time_s, rel=1e-9)


def test_windows_bounded_in_workers_give_the_bounds_and_optimum_of_the_search_alone(monkeypatch):
    # roots and split children go to idle workers, which send back bounds and fixings only; the
    # search proves the same optimum, and a worker's bound equals the one built here
    from tangram_opt.planner.search.window_bounds import bound_in_worker, bound_model, build_aggregated

    cluster, model, training, space = _instance()
    alone = solve(cluster, model, training, space=space, time_limit_s=60, rel_gap=1e-9, threads=1,
                  options=SearchOptions(sequence_leaves=True, multi_pipeline=False))
    compared = []
    call = SolverWorker.call

    def checking(self, fn, args, shared=None):
        future = call(self, fn, args, shared)
        if fn is bound_in_worker:
            options, window, arguments = args
            here = bound_model(build_aggregated(*shared.make(), options, window), window, **arguments)
            got = future.result(timeout=60)
            assert got.mip is None and (got.bound_s, got.fixed, got.max_tail_s, got.model_size) == \
                (here.bound_s, here.fixed, here.max_tail_s, here.model_size)
            assert got.model_size is None or (got.build_s > 0 and got.lp_s > 0)  # its time comes back too
            compared.append(math.isfinite(got.bound_s))
        return future

    monkeypatch.setattr(SolverWorker, "call", checking)
    both = solve(cluster, model, training, space=space, time_limit_s=60, rel_gap=1e-9, threads=2,
                 options=SearchOptions(sequence_leaves=True, multi_pipeline=False))
    assert True in compared, "no window was bounded in a worker"
    assert both.certificate.status == alone.certificate.status == "optimal"
    # each sub-problem's row says how long its windows took to build and to bound by their LPs
    rows = [r for r in both.certificate.subproblems if r.get("lp_solves")]
    assert rows and all(r["window_build_s"] > 0 and r["window_lp_s"] > 0 for r in rows)
    assert both.step_time_s == pytest.approx(alone.step_time_s, rel=1e-9)


def test_a_failing_worker_leaves_its_model_to_the_search(monkeypatch):
    cluster, model, training, space = _instance()
    alone = solve(cluster, model, training, space=space, time_limit_s=60, rel_gap=1e-9, threads=1,
                  options=SearchOptions(sequence_leaves=True, multi_pipeline=False))
    failed = []

    def broken(self, model, backend, options):
        fut: Future = Future()
        fut.set_exception(WorkerError("solver worker failed: test"))
        failed.append(model.name)
        self.future = fut
        return fut

    monkeypatch.setattr(SolverWorker, "submit", broken)
    here = []
    fallback = SolverPool.solve_here

    def counting(*args):
        here.append(args[0].name)
        return fallback(*args)

    monkeypatch.setattr(search_module.SolverPool, "solve_here", staticmethod(counting))
    plan = solve(cluster, model, training, space=space, time_limit_s=60, rel_gap=1e-9, threads=2,
                 options=SearchOptions(sequence_leaves=True, multi_pipeline=False))
    assert failed and sorted(here) == sorted(failed)
    assert plan.certificate.status == "optimal"
    assert plan.step_time_s == pytest.approx(alone.step_time_s, rel=1e-9)


def test_every_search_of_a_solve_shares_its_workers(monkeypatch):
    # the single-pipeline search and the multi-pipeline level's sub-cluster searches use one pool:
    # no sub-cluster search starts processes of its own, and the pool is gone after solve
    cluster, model, training, space = _instance()
    started, pools = [], []
    init, run = SolverWorker.__init__, search_module.BranchAndBound._run

    def starting(self):
        started.append(self)
        init(self)

    def running(self):
        pools.append(self.pool)
        return run(self)

    monkeypatch.setattr(SolverWorker, "__init__", starting)
    monkeypatch.setattr(search_module.BranchAndBound, "_run", running)
    plan = solve(cluster, model, training, space=space, time_limit_s=20, rel_gap=1e-9, threads=2)
    assert len(pools) >= 2 and pools[0] is not None and all(p is pools[0] for p in pools)
    assert len(started) <= 2 and all(not w.alive for w in started)
    assert SolverPool.current() is None
    assert plan.certificate.status == "optimal"


def test_windows_whose_worker_fails_are_bounded_by_the_search(monkeypatch):
    cluster, model, training, space = _instance()
    alone = solve(cluster, model, training, space=space, time_limit_s=60, rel_gap=1e-9, threads=1,
                  options=SearchOptions(sequence_leaves=True, multi_pipeline=False))
    failed, here = [], []

    def broken(self, fn, args, shared=None):
        fut: Future = Future()
        fut.set_exception(WorkerError("solver worker failed: test"))
        failed.append(args[1])
        self.future = fut
        return fut

    bound_here = search_module.BranchAndBound.bound_here

    def counting(self, sub, window, parent=None):
        here.append(window)
        return bound_here(self, sub, window, parent)

    monkeypatch.setattr(SolverWorker, "call", broken)
    monkeypatch.setattr(search_module.BranchAndBound, "bound_here", counting)
    plan = solve(cluster, model, training, space=space, time_limit_s=60, rel_gap=1e-9, threads=2,
                 options=SearchOptions(sequence_leaves=True, multi_pipeline=False))
    assert failed and set(failed) <= set(here)  # every window a worker failed was bounded here
    assert plan.certificate.status == "optimal"
    assert plan.step_time_s == pytest.approx(alone.step_time_s, rel=1e-9)


@pytest.mark.parametrize("slack, misses, expected", [(-1.0, 10**6, {True}), (1.0, 10**6, {False}),
                                                     (-1.0, 0, {True, False})])
def test_sequence_leaves_take_heuristics_by_their_distance_to_the_target(slack, misses, expected, monkeypatch):
    # slack -1: every open leaf lies "far" below the target (bound < 2 x target), slack 1: none
    # does (bound < 0); with no misses allowed, far leaves take turns (heuristics_turn), the first
    # without (the turns themselves: the test below; since the on_gpus rows this instance may need
    # a single leaf). The proof is the same either way, only the route to it differs
    cluster, model, training, space = _instance()
    reference = solve(cluster, model, training, space=space, time_limit_s=60, rel_gap=1e-9, threads=1,
                      options=SearchOptions(sequence_leaves=True, multi_pipeline=False))
    seen = []
    inner = search_module.solve_model

    def recording(model, backend, options):
        if model.name.startswith("sequence"):
            seen.append(options.heuristics)
        return inner(model, backend, options)

    monkeypatch.setattr(tuning, "SEQUENCE_HEURISTICS_SLACK", slack)
    monkeypatch.setattr(tuning, "SEQUENCE_HEURISTICS_MISSES", misses)
    monkeypatch.setattr(search_module, "solve_model", recording)
    plan = solve(cluster, model, training, space=space, time_limit_s=60, rel_gap=1e-9, threads=1,
                 options=SearchOptions(sequence_leaves=True, multi_pipeline=False))
    if misses:
        assert seen and set(seen) == expected
    else:
        assert seen and seen[0] is False and set(seen) == (expected if len(seen) > 1 else {False})
    assert plan.certificate.status == "optimal"
    assert plan.step_time_s == pytest.approx(reference.step_time_s, rel=1e-9)


def test_heuristic_turns_back_off_while_they_miss_and_return_on_a_better_plan(monkeypatch):
    from tangram_opt.planner.search.leaves import LeafSolves

    monkeypatch.setattr(tuning, "SEQUENCE_HEURISTICS_MISSES", 2)
    monkeypatch.setattr(tuning, "SEQUENCE_HEURISTICS_MAX_EVERY", 8)

    class Search:
        heuristic_misses = heuristic_skips = 0

    search = Search()

    def turns(n: int) -> list[bool]:
        return [LeafSolves.heuristics_turn(search) for _ in range(n)]

    assert turns(5) == [True] * 5  # fewer misses than allowed: every far leaf
    search.heuristic_misses = 2
    assert turns(6) == [False, True] * 3  # one in 2
    search.heuristic_misses = 3
    assert turns(8) == [False, False, False, True] * 2  # one in 4
    search.heuristic_misses = 9
    assert turns(16) == ([False] * 7 + [True]) * 2  # never rarer than one in MAX_EVERY
    search.heuristic_misses = 0  # a leaf's plan became the incumbent
    assert turns(3) == [True] * 3


def test_a_deadline_solver_stops_an_overrunning_solve_and_starts_afresh():
    # a deadline shorter than the worker needs to start and answer: None, the worker killed; the
    # next solve starts a new worker and answers as this process would
    from tangram_opt.solvers.workers import DeadlineSolver

    md = knapsack_model()
    here = solve_model(md, "highs", SolveOptions(time_limit_s=10))
    ds = DeadlineSolver()
    try:
        assert ds.solve(md, "highs", SolveOptions(time_limit_s=10), hard_s=1e-3) is None
        assert ds.worker is None
        res = ds.solve(md, "highs", SolveOptions(time_limit_s=10), hard_s=60)
        assert res is not None and res.objective == pytest.approx(here.objective)
        first = ds.worker
        assert ds.solve(md, "highs", SolveOptions(time_limit_s=10), hard_s=60) is not None
        assert ds.worker is first  # reused between solves
    finally:
        ds.close()
    assert ds.worker is None


def _tables(ctx):
    st = ctx.provider.stats
    return ({b: ctx.candidates(b) for b in ctx.pipeline_micro_batches()},
            (st.enumerated, st.invalid, st.no_fit, st.dominated, st.heuristic, st.kept, sorted(st.by_key.items())))


def test_candidate_tables_priced_in_workers_are_the_tables_priced_here(monkeypatch):
    # the search hands the tables of (island, size) pairs to its workers (planner/search/tables.py):
    # the same rows, in the same order, and the same pruning counts as pricing them here
    from tangram_opt.planner.context import PlanningContext
    from tangram_opt.planner.search.tables import price_ahead

    cluster, model, training, space = _instance()
    here = _tables(PlanningContext(cluster, model, training, space=space))
    ctx = PlanningContext(cluster, model, training, space=space)
    monkeypatch.setattr(tuning, "PRICE_AHEAD_MIN_S", 0.0)
    with SolverPool(2) as pool:
        remote = price_ahead(ctx, ctx.pipeline_micro_batches(), pool)
    sizes, islands = len(ctx.pipeline_micro_batches()), len(ctx.islands)
    assert remote == (sizes - 1) * islands  # all but the first size's, which is priced here to time it
    assert _tables(ctx) == here
    # below the threshold, without a pool, or with another provider, nothing is handed out
    monkeypatch.setattr(tuning, "PRICE_AHEAD_MIN_S", 1e9)
    with SolverPool(2) as pool:
        fresh = PlanningContext(cluster, model, training, space=space)
        assert price_ahead(fresh, fresh.pipeline_micro_batches(), pool) == 0 and pool.workers == []
    monkeypatch.setattr(tuning, "PRICE_AHEAD_MIN_S", 0.0)
    fresh = PlanningContext(cluster, model, training, space=space)
    assert price_ahead(fresh, fresh.pipeline_micro_batches(), None) == 0
    from tangram_opt.planner.candidates import HeuristicallyPruned

    pruned = PlanningContext(cluster, model, training, space=space,
                             provider=HeuristicallyPruned(fresh.provider, fresh.kinds, 2))
    with SolverPool(2) as pool:
        assert price_ahead(pruned, pruned.pipeline_micro_batches(), pool) == 0 and pool.workers == []


def test_tables_whose_worker_fails_are_priced_here(monkeypatch):
    from tangram_opt.planner.context import PlanningContext
    from tangram_opt.planner.search.tables import price_ahead

    cluster, model, training, space = _instance()
    here = _tables(PlanningContext(cluster, model, training, space=space))
    failed = []

    def broken(self, fn, args, shared=None):
        fut: Future = Future()
        fut.set_exception(WorkerError("solver worker failed: test"))
        failed.append(args)
        self.future = fut
        return fut

    monkeypatch.setattr(SolverWorker, "call", broken)
    monkeypatch.setattr(tuning, "PRICE_AHEAD_MIN_S", 0.0)
    ctx = PlanningContext(cluster, model, training, space=space)
    with SolverPool(2) as pool:
        assert price_ahead(ctx, ctx.pipeline_micro_batches(), pool) == 0
    assert failed and _tables(ctx) == here


def test_a_solve_by_deadline_answers_as_this_process_would_or_is_stopped():
    # in a process of its own, or in an idle worker of the current pool; a deadline shorter than the
    # worker needs stops it (NO_SOLUTION: nothing proven) and the pool starts another in its place
    from tangram_opt.solvers.workers import solve_by_deadline

    md = knapsack_model()
    here = solve_model(md, "highs", SolveOptions(time_limit_s=10))
    alone = solve_by_deadline(md, "highs", SolveOptions(time_limit_s=10), hard_s=60)
    assert alone.status == SolveStatus.OPTIMAL and alone.objective == pytest.approx(here.objective)
    with SolverPool(1) as pool, pool.as_current():
        first = pool.idle_worker()
        assert solve_by_deadline(md, "highs", SolveOptions(time_limit_s=10), hard_s=60).objective == \
            pytest.approx(here.objective)
        assert pool.workers == [first] and first.idle  # the pool's worker did it
        stopped = solve_by_deadline(md, "highs", SolveOptions(time_limit_s=10), hard_s=1e-3)
        assert stopped.status == SolveStatus.NO_SOLUTION and stopped.bound is None and "stopped" in stopped.message
        assert not first.alive and pool.idle_worker() is not first


def test_a_leaf_that_comes_back_unfinished_narrows_its_size_and_the_optimum_stands(monkeypatch):
    # the first sequence leaf answers "no solution, no bound" as a leaf out of time would: it goes
    # back to the queue, its size's leaves narrow (SEQUENCE_NARROW_RATIO) and the search still
    # proves the optimum of the search that had no such answer
    cluster, model, training, space = _instance()
    opts = SearchOptions(sequence_leaves=True, multi_pipeline=False)
    monkeypatch.setattr(tuning, "SEQUENCE_WINDOW_RATIO", 1.05)  # wide leaves, which the answer narrows
    alone = solve(cluster, model, training, space=space, time_limit_s=60, rel_gap=1e-9, threads=1, options=opts)
    leaves = []  # (b, hi / lo, unfinished answers so far) of every sequence leaf solved
    solve_sequence = search_module.BranchAndBound.solve_sequence

    def recording(self, node):
        leaves.append((node.b, min(node.hi_s, self.inc_s / self.subs[node.b].problem.num_micro_batches) / node.lo_s,
                       len(unfinished)))
        return solve_sequence(self, node)

    unfinished = []

    def first_unfinished(md, *args, **kw):
        if md.name.startswith("sequence_") and not unfinished:
            unfinished.append(md.name)
            return SolveResult(status=SolveStatus.NO_SOLUTION, backend="highs", solve_time_s=0.0)
        return solve_model(md, *args, **kw)

    monkeypatch.setattr(search_module.BranchAndBound, "solve_sequence", recording)
    monkeypatch.setattr(search_module, "solve_model", first_unfinished)
    plan = solve(cluster, model, training, space=space, time_limit_s=60, rel_gap=1e-9, threads=1, options=opts)
    assert unfinished, "no sequence leaf was solved"
    b = int(unfinished[0].split("_b")[1].split("_")[0])
    before = [r for b_, r, n in leaves if b_ == b and n == 0]
    after = [r for b_, r, n in leaves if b_ == b and n == 1]
    assert max(before) > tuning.SEQUENCE_NARROW_RATIO and after  # the leaf came back, and was split
    assert max(after) <= tuning.SEQUENCE_NARROW_RATIO * (1 + 1e-12)
    assert plan.certificate.status == "optimal"
    assert plan.step_time_s == pytest.approx(alone.step_time_s, rel=1e-9)
