"""Solver processes: MIP solves that run beside the caller, one per spare core (the planner's search
starts one more and waits for them rather than solving leaves itself: tuning.EXTRA_LEAF_WORKERS).

HiGHS's branch and bound is essentially serial (the 512-GPU Mixtral-8x22B proof to 1% took 144 s
with one thread and 138 s with two), so on a machine with two cores the planner's search keeps
the second one busy by solving leaf models in a *worker*: a separate Python process
(``python -m tangram_opt.solvers.workers``) that reads pickled ``(model, backend, options)``
requests on its standard input and writes pickled :class:`SolveResult` objects back. Models of the
search pickle in a few milliseconds (0.1-0.2 MB).

A worker also runs other work of the caller's (:meth:`SolverWorker.call`: a module-level function
and its arguments, e.g. building and bounding one window of the search). Data that many such calls
read (a sub-problem's candidates and stage types, about 1 MB) travels once per worker as a
:class:`Shared` value: the worker keeps the last ``SHARED_KEEP`` of them by key, and the caller
keeps a mirror of which keys each worker holds, so later calls send only the key.

A plain subprocess rather than :mod:`multiprocessing`: the ``spawn`` and ``forkserver`` start
methods import the caller's ``__main__`` module again in the child (a user script that calls
``solve`` at top level would call it again there), and ``fork`` is unsafe once HiGHS has started
its thread pool in the parent. A worker that dies or answers garbage fails its future; the caller
then solves the model itself (:meth:`SolverPool.solve_here`).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

from tangram_opt.solvers.backends import solve_model
from tangram_opt.solvers.model import LinearModel
from tangram_opt.solvers.protocol import SolveOptions, SolveResult, SolveStatus

_HEADER = 8  # bytes of the little-endian length before each pickle
#: shared values a worker keeps (least recently used dropped first); the caller mirrors the same rule
SHARED_KEEP = 32


class WorkerError(RuntimeError):
    """A worker process died, or its answer could not be read."""


def _send(stream, obj: object) -> None:  # type: ignore[no-untyped-def]
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(len(data).to_bytes(_HEADER, "little") + data)
    stream.flush()


def _receive(stream) -> object:  # type: ignore[no-untyped-def]
    head = stream.read(_HEADER)
    if len(head) < _HEADER:
        raise EOFError("stream closed")
    size = int.from_bytes(head, "little")
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("stream closed mid-message")
    return pickle.loads(data)


@dataclass(slots=True)
class Shared:
    """A value many :meth:`SolverWorker.call` requests read, sent to each worker once under ``key``;
    ``make`` gives it when a worker does not hold it yet (pickled once, then reused for every worker)."""

    key: Hashable
    make: Callable[[], Any]
    _blob: bytes | None = field(default=None, repr=False)

    def blob(self) -> bytes:
        if self._blob is None:
            self._blob = pickle.dumps(self.make(), protocol=pickle.HIGHEST_PROTOCOL)
        return self._blob


@dataclass(frozen=True, slots=True)
class _Call:
    """A request to run ``fn(shared value, *args)`` (or ``fn(*args)`` without ``key``) in a worker;
    ``blob`` carries the shared value when the worker does not hold it yet."""

    fn: Callable[..., Any]
    args: tuple
    key: Hashable | None = None
    blob: bytes | None = None


@dataclass(frozen=True, slots=True)
class _Answer:
    value: Any


def _remember(held: OrderedDict, key: Hashable, value: Any) -> None:
    """The shared-value rule both sides apply: most recently used last, at most SHARED_KEEP kept."""
    held[key] = value
    held.move_to_end(key)
    while len(held) > SHARED_KEEP:
        held.popitem(last=False)


class SolverWorker:
    """One solver process; at most one request (a solve or a call) at a time."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tangram_opt.solvers.workers"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.future: Future | None = None
        #: keys of the shared values the process holds (the mirror of its own table)
        self.held: OrderedDict = OrderedDict()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def idle(self) -> bool:
        return self.alive and (self.future is None or self.future.done())

    def submit(self, model: LinearModel, backend: str, options: SolveOptions) -> Future:
        """Start solving ``model``; the future holds its :class:`SolveResult` (or a
        :class:`WorkerError`). Callbacks in ``options`` stay behind (they cannot cross processes)."""
        return self._start((model, backend, replace(options, on_progress=None)))

    def call(self, fn: Callable[..., Any], args: tuple, shared: Shared | None = None) -> Future:
        """Start ``fn(shared value, *args)`` (``fn(*args)`` without ``shared``) in the worker; the
        future holds what it returns (or a :class:`WorkerError`, also when it raised). ``fn`` must
        be a module-level function, and ``args`` and its result picklable."""
        if not self.idle:
            raise RuntimeError("worker is busy")
        if shared is None:
            return self._start(_Call(fn, args))
        blob = None if shared.key in self.held else shared.blob()
        _remember(self.held, shared.key, None)
        return self._start(_Call(fn, args, shared.key, blob))

    def _start(self, request: object) -> Future:
        if not self.idle:
            raise RuntimeError("worker is busy")
        fut: Future = Future()
        fut.set_running_or_notify_cancel()
        self.future = fut
        threading.Thread(target=self._round_trip, args=(request, fut), daemon=True).start()
        return fut

    def _round_trip(self, request: object, fut: Future) -> None:
        try:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            _send(self.proc.stdin, request)
            answer = _receive(self.proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError, ValueError) as exc:
            fut.set_exception(WorkerError(f"solver worker failed: {exc!r}"))
            return
        if isinstance(answer, SolveResult):
            fut.set_result(answer)
        elif isinstance(answer, _Answer):
            fut.set_result(answer.value)
        else:
            fut.set_exception(WorkerError(f"solver worker failed: {answer}"))

    def close(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:  # still solving: its answer is no longer wanted
            self.proc.kill()
            self.proc.wait()


class SolverPool:
    """Up to ``size`` solver workers, started when first asked for (a search that never reaches a
    leaf starts none; each takes a fraction of a second to import, beside the caller).

    A pool made current (:meth:`as_current`) serves every search run inside that block: ``solve``
    makes one for its whole run, so the searches of the multi-pipeline level's sub-clusters (a few
    seconds each) use workers already started and do not start their own."""

    def __init__(self, size: int):
        self.size = max(0, size)
        self.workers: list[SolverWorker] = []

    @staticmethod
    def current() -> SolverPool | None:
        """The pool made current by an enclosing :meth:`as_current`, if any."""
        return _CURRENT.get()

    @contextmanager
    def as_current(self) -> Iterator[SolverPool]:
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)

    def idle_worker(self) -> SolverWorker | None:
        self.workers = [w for w in self.workers if w.alive]  # dead or stopped ones are replaced
        if len(self.workers) < self.size:
            self.workers += [SolverWorker() for _ in range(self.size - len(self.workers))]
        return next((w for w in self.workers if w.idle), None)

    def stop_busy(self) -> None:
        """Stop the workers still working on a request nobody will read (a search that ran out of
        time leaves its last leaves unfinished): they would take cores from whatever runs next.
        Stopped workers are replaced when next asked for."""
        for w in self.workers:
            if not w.idle and w.alive:
                w.proc.kill()
                w.proc.wait()
        self.workers = [w for w in self.workers if w.alive]

    @staticmethod
    def solve_here(model: LinearModel, backend: str, options: SolveOptions) -> SolveResult:
        """The fallback when a worker failed: the same solve in this process."""
        return solve_model(model, backend, options)

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.workers, self.size = [], 0

    def __enter__(self) -> SolverPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_CURRENT: ContextVar[SolverPool | None] = ContextVar("tangram_opt_solver_pool", default=None)


class DeadlineSolver:
    """Solves one model at a time in a worker process and stops it at a hard deadline.

    For the solves whose time limit a backend may overrun by minutes (HiGHS can stay inside a long
    presolve or LP solve of a large big-M model: a 17 s limit ran 312 s on a priced MIP): the
    caller waits ``hard_s`` at most, then kills the worker and gets None. The worker is reused
    between solves and restarted after a kill."""

    def __init__(self) -> None:
        self.worker: SolverWorker | None = None

    def solve(self, model: LinearModel, backend: str, options: SolveOptions, hard_s: float) -> SolveResult | None:
        if self.worker is None or not self.worker.alive:
            self.worker = SolverWorker()
        res = _answer_within(self.worker, model, backend, options, hard_s)
        if res is None:
            self.worker = None
        return res

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None


def _answer_within(worker: SolverWorker, model: LinearModel, backend: str, options: SolveOptions,
                   hard_s: float) -> SolveResult | None:
    """``worker``'s answer to ``model`` within ``hard_s`` seconds; None when it failed or did not
    answer in time (then it is killed)."""
    try:
        return worker.submit(model, backend, options).result(timeout=hard_s)
    except FutureTimeout:
        worker.proc.kill()
        worker.proc.wait()
        return None
    except WorkerError:
        return None


def solve_by_deadline(model: LinearModel, backend: str, options: SolveOptions, hard_s: float) -> SolveResult:
    """``model`` solved in a worker process that is stopped ``hard_s`` seconds on, for a solve whose
    time limit the backend may overrun (HiGHS's presolve does not stop at it: the level-2 MIP of
    "384 V100+A10G, MoE" ran 13.0 s under a 3.6 s limit, 4.5 s without presolve). An idle worker of
    the current pool does it when there is one (a stopped one is replaced when next asked for),
    else a process of its own. A stopped solve, or one whose worker failed, answers NO_SOLUTION:
    nothing found, nothing proven (solving it here instead could overrun the limit again)."""
    pool = SolverPool.current()
    worker = pool.idle_worker() if pool is not None else None
    own = worker is None
    if worker is None:
        worker = SolverWorker()
    try:
        res = _answer_within(worker, model, backend, options, hard_s)
    finally:
        if own:
            worker.close()
    return res if res is not None else SolveResult(
        status=SolveStatus.NO_SOLUTION, backend=backend, solve_time_s=hard_s,
        message=f"no answer: stopped after {hard_s:.1f} s (time limit {options.time_limit_s:.1f} s), "
                "or its worker failed")


def _run_call(request: _Call, held: OrderedDict) -> _Answer:
    if request.key is None:
        return _Answer(request.fn(*request.args))
    if request.blob is not None:
        _remember(held, request.key, pickle.loads(request.blob))
    else:
        held.move_to_end(request.key)
    return _Answer(request.fn(held[request.key], *request.args))


def main() -> None:
    """Worker loop: a request per message on stdin, its result (or the error's text) on stdout.
    Solver output would corrupt the protocol, so file descriptor 1 is pointed at stderr."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inp = sys.stdin.buffer
    held: OrderedDict = OrderedDict()  # shared values by key (``Shared``)
    while True:
        try:
            request = _receive(inp)
        except EOFError:
            return
        try:
            if isinstance(request, _Call):
                answer: object = _run_call(request, held)
            else:
                model, backend, options = request  # type: ignore[misc]
                answer = solve_model(model, backend, options)
        except Exception as exc:  # noqa: BLE001 (reported to the caller, which does the work itself)
            answer = f"{type(exc).__name__}: {exc}"
        _send(out, answer)


if __name__ == "__main__":
    # run as the package's module, not as ``__main__``: the classes requests and answers are
    # pickled with must be the ones the caller knows (``tangram_opt.solvers.workers._Call``)
    from tangram_opt.solvers.workers import main as serve

    serve()
