"""Solving a sweep's variants: in this process, in local worker processes, or on a Ray cluster.

A *job* is one call of :func:`tangram_opt.solve`, given in file form (``cluster``, ``model``,
``training`` dicts and the ``solve`` settings), so it crosses process and machine boundaries as
plain JSON; its *outcome* is the plan's ``to_dict()`` or the status and message of why there is
none. :func:`solve_job` turns one into the other, wherever it runs.

Local workers are plain subprocesses (``python -m tangram_opt.sweeps.worker``) that read jobs as
JSON lines on stdin and answer on stdout, one job at a time, as the planner's own solver workers
(tangram_opt/solvers/workers.py) and for the same reason: :mod:`multiprocessing`'s ``spawn`` and
``forkserver`` import the caller's ``__main__`` again in the child (a script calling
``tangram_opt.sweep`` at top level would start its sweep there), and ``fork`` is unsafe once HiGHS
has started its threads in the parent. A worker that dies fails its job (status ``error``) and is
replaced.

Ray (``ray_address``) is imported only when asked for; it is the optional extra ``[ray]``.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tangram_opt.errors import InfeasibleError, NoSolutionError, TangramError

Job = Mapping[str, Any]
Outcome = dict[str, Any]
#: statuses of a variant without a plan (a plan's own status is its certificate's: optimal, feasible, heuristic)
NO_PLAN_STATUSES = ("infeasible", "no plan", "error", "skipped")


class RayUnavailableError(TangramError):
    """``ray_address`` was given but Ray is not installed (the optional extra ``[ray]``)."""


def solve_job(job: Job) -> Outcome:
    """Solve one job (any process, any machine with tangram_opt installed); never raises for a
    variant's own failure: infeasible, no plan in time, bad input and internal errors become the
    outcome's ``status`` and ``message``."""
    t0 = time.perf_counter()
    try:
        from tangram_opt.planner.search import SearchOptions, solve
        from tangram_opt.specs import cluster_from_dict, model_from_dict, training_from_dict

        kw = dict(job["solve"])
        multi = kw.pop("multi_pipeline", None)
        if multi is not None:
            kw["options"] = SearchOptions(multi_pipeline=multi)
        plan = solve(cluster_from_dict(job["cluster"]), model_from_dict(job["model"]),
                     training_from_dict(job["training"]), **kw)
        status = str(plan.certificate.status) if plan.certificate else "heuristic"
        return {"status": status, "message": "", "plan": plan.to_dict(), "wall_s": time.perf_counter() - t0}
    except InfeasibleError as e:
        status, message = "infeasible", str(e)
    except NoSolutionError as e:
        status, message = "no plan", str(e)
    except TangramError as e:
        status, message = "error", str(e)
    except Exception as e:  # noqa: BLE001 - one variant's bug must not lose the others' results
        status, message = "error", (f"internal error, a bug in tangram_opt (please report): "
                                    f"{type(e).__name__}: {e}")
    return {"status": status, "message": message.splitlines()[0] if message else "", "detail": message,
            "plan": None, "wall_s": time.perf_counter() - t0}


def run_jobs(jobs: Sequence[Job], *, workers: int, ray_address: str | None = None,
             on_done: Callable[[int, Outcome], None] | None = None) -> list[Outcome]:
    """Every job's outcome, in the jobs' order; ``on_done(i, outcome)`` as each one finishes."""
    results: list[Outcome | None] = [None] * len(jobs)
    lock = threading.Lock()

    def done(i: int, out: Outcome) -> None:
        with lock:
            results[i] = out
            if on_done is not None:
                on_done(i, out)

    if ray_address is not None:
        _run_ray(jobs, ray_address, done)
    elif workers <= 1 or len(jobs) <= 1:
        for i, job in enumerate(jobs):
            done(i, solve_job(job))
    else:
        _run_local(jobs, min(workers, len(jobs)), done)
    assert all(r is not None for r in results)
    return results  # type: ignore[return-value]


# --- local worker processes -----------------------------------------------------------------------------
class _WorkerProcess:
    """One ``python -m tangram_opt.sweeps.worker``; one job at a time."""

    def __init__(self) -> None:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the directory holding tangram_opt/
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen([sys.executable, "-m", "tangram_opt.sweeps.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, encoding="utf-8",
                                     env=env)

    def run(self, job: Job) -> Outcome:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(job) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            raise EOFError("the worker process ended")
        return json.loads(line)

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def _run_local(jobs: Sequence[Job], workers: int, done: Callable[[int, Outcome], None]) -> None:
    todo: queue.Queue[int] = queue.Queue()
    for i in range(len(jobs)):
        todo.put(i)
    procs: list[_WorkerProcess] = []
    procs_lock = threading.Lock()

    def serve() -> None:
        worker: _WorkerProcess | None = None
        try:
            while True:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                if worker is None:
                    worker = _WorkerProcess()
                    with procs_lock:
                        procs.append(worker)
                try:
                    out = worker.run(jobs[i])
                except (EOFError, ValueError) as e:
                    out = {"status": "error", "message": f"the worker process solving this variant died ({e})",
                           "plan": None, "wall_s": 0.0}
                    worker.close()
                    worker = None
                done(i, out)
        finally:
            if worker is not None:
                worker.close()

    threads = [threading.Thread(target=serve, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(timeout=0.2)
    finally:  # interrupted: stop every worker this sweep started
        with procs_lock:
            for p in procs:
                if p.proc.poll() is None:
                    p.proc.kill()


# --- Ray ----------------------------------------------------------------------------------------------
def require_ray() -> Any:
    """The ``ray`` module, or :class:`RayUnavailableError` naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise RayUnavailableError("ray_address was given but Ray is not installed: pip install 'tangram_opt[ray]' "
                                  "(or leave ray_address out to sweep with local worker processes)") from None
    return ray


def _run_ray(jobs: Sequence[Job], address: str, done: Callable[[int, Outcome], None]) -> None:
    """One Ray task per job. ``address`` is what ``ray.init`` takes: ``"local"`` starts a runtime on
    this machine, ``"auto"`` joins the one running here, ``"ray://host:10001"`` a remote cluster
    (whose nodes need tangram_opt installed). A runtime this function started is shut down after."""
    ray = require_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(solve_job)
        refs = {task.options(num_cpus=int(job["solve"].get("threads", 1))).remote(dict(job)): i
                for i, job in enumerate(jobs)}
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                try:
                    out = ray.get(ref)
                except Exception as e:  # noqa: BLE001 - a lost Ray task fails its variant only
                    out = {"status": "error", "message": f"the Ray task solving this variant failed: "
                           f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                           "plan": None, "wall_s": 0.0}
                done(refs[ref], out)
    finally:
        if started:
            ray.shutdown()


__all__ = ["NO_PLAN_STATUSES", "RayUnavailableError", "require_ray", "run_jobs", "solve_job"]
