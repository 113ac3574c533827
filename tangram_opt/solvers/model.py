"""A small, backend-neutral linear model (variables, linear constraints, one objective).

Formulations build a :class:`LinearModel`; backends (:mod:`tangram_opt.solvers.backends`) translate
it for a concrete solver. Keeping one representation means every backend solves exactly the same
problem, the model can be written to MPS for any other solver, and a solution can be checked
independently of the solver that produced it (:meth:`LinearModel.check`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Union

import numpy as np

Number = Union[int, float]


@dataclass(frozen=True, slots=True)
class Var:
    """A decision variable; arithmetic on it builds :class:`LinExpr` objects."""

    index: int
    name: str
    lb: float
    ub: float
    integer: bool

    def __add__(self, other: object) -> LinExpr:
        return LinExpr.of(self) + other

    __radd__ = __add__

    def __sub__(self, other: object) -> LinExpr:
        return LinExpr.of(self) - other

    def __rsub__(self, other: object) -> LinExpr:
        return (-1) * LinExpr.of(self) + other

    def __mul__(self, k: Number) -> LinExpr:
        if not isinstance(k, (int, float)):
            raise TypeError("linear expressions can only be scaled by numbers")
        return LinExpr({self.index: float(k)})  # one expression, not one scaled into another

    __rmul__ = __mul__

    def __neg__(self) -> LinExpr:
        return LinExpr.of(self) * -1

    def __le__(self, other: object) -> Constraint:  # type: ignore[override]
        return LinExpr.of(self) <= other

    def __ge__(self, other: object) -> Constraint:  # type: ignore[override]
        return LinExpr.of(self) >= other

    def __eq__(self, other: object) -> Constraint:  # type: ignore[override]
        return LinExpr.of(self) == other

    def __hash__(self) -> int:
        return hash(self.index)


class LinExpr:
    """``sum(coef[i] * x_i) + const`` with coefficients keyed by variable index."""

    __slots__ = ("coefs", "const")

    def __init__(self, coefs: Mapping[int, float] | None = None, const: float = 0.0):
        self.coefs: dict[int, float] = dict(coefs or {})
        self.const = float(const)

    @staticmethod
    def of(x: object) -> LinExpr:
        if isinstance(x, LinExpr):
            return x
        if isinstance(x, Var):
            return LinExpr({x.index: 1.0})
        if isinstance(x, (int, float)):
            return LinExpr(const=float(x))
        raise TypeError(f"cannot use {type(x).__name__} in a linear expression")

    def copy(self) -> LinExpr:
        return LinExpr(self.coefs, self.const)

    def add_term(self, var: Var, coef: float) -> LinExpr:
        """In-place ``self += coef * var`` (fast path for large sums)."""
        if coef:
            self.coefs[var.index] = self.coefs.get(var.index, 0.0) + coef
        return self

    @staticmethod
    def terms(pairs: Iterable[tuple[Var, Number]]) -> LinExpr:
        """``sum(coef * var)`` over distinct variables, in one pass: the rows over every stage type
        of a model sum thousands of terms, and ``coef * var`` would make an expression of each."""
        return LinExpr({var.index: float(coef) for var, coef in pairs})

    def _plus(self, other: object, sign: float) -> LinExpr:
        """``self + sign * other`` as a new expression (``sign`` is 1 or -1: the negation is exact,
        so a difference is the same numbers as ``self + other * -1``, without scaling a copy first).
        The rows of a model add expressions over thousands of columns that mostly share none: the
        shared ones are updated in place, the others appended in one comprehension."""
        o = LinExpr.of(other)
        out = self.copy()
        coefs, theirs = out.coefs, o.coefs
        for i in coefs.keys() & theirs.keys():
            coefs[i] += sign * theirs[i]
        coefs.update({i: 0.0 + sign * c for i, c in theirs.items() if i not in coefs})
        out.const += sign * o.const
        return out

    def __add__(self, other: object) -> LinExpr:
        return self._plus(other, 1.0)

    __radd__ = __add__

    def __sub__(self, other: object) -> LinExpr:
        return self._plus(other, -1.0)

    def __rsub__(self, other: object) -> LinExpr:
        return self * -1 + other

    def __mul__(self, k: Number) -> LinExpr:
        if not isinstance(k, (int, float)):
            raise TypeError("linear expressions can only be scaled by numbers")
        return LinExpr({i: c * k for i, c in self.coefs.items()}, self.const * k)

    __rmul__ = __mul__

    def __neg__(self) -> LinExpr:
        return self * -1

    def __le__(self, other: object) -> Constraint:  # type: ignore[override]
        d = self - other
        return Constraint(d.coefs, -math.inf, -d.const)

    def __ge__(self, other: object) -> Constraint:  # type: ignore[override]
        d = self - other
        return Constraint(d.coefs, -d.const, math.inf)

    def __eq__(self, other: object) -> Constraint:  # type: ignore[override]
        d = self - other
        return Constraint(d.coefs, -d.const, -d.const)

    def value(self, x: Sequence[float]) -> float:
        return self.const + sum(c * x[i] for i, c in self.coefs.items())


def lsum(terms: Iterable[object]) -> LinExpr:
    """Sum of variables/expressions/numbers without quadratic copying."""
    out = LinExpr()
    for t in terms:
        if isinstance(t, Var):
            out.coefs[t.index] = out.coefs.get(t.index, 0.0) + 1.0
        else:
            e = LinExpr.of(t)
            for i, c in e.coefs.items():
                out.coefs[i] = out.coefs.get(i, 0.0) + c
            out.const += e.const
    return out


@dataclass(slots=True)
class Constraint:
    """``lb <= sum(coefs[i] * x_i) <= ub``."""

    coefs: dict[int, float]
    lb: float
    ub: float
    name: str = ""


class ArrayConstraint:
    """``lb <= sum(value[k] * x[index[k]]) <= ub`` held as two arrays (distinct column indices, the
    builder's to keep): the dense rows of a window's model, over every stage type, built from
    arrays and handed to an LP backend as they are (solvers/highs.py), where a coefficient dict per
    row cost more in Python than the simplex on them. ``coefs`` is the same row as a dict, built when first read, for
    every other consumer (MPS, the other backends, :meth:`LinearModel.check`)."""

    __slots__ = ("index", "value", "lb", "ub", "name", "_coefs")

    def __init__(self, index: Any, value: Any, lb: float, ub: float, name: str = ""):
        self.index = np.asarray(index, dtype=np.int32)
        self.value = np.asarray(value, dtype=float)
        if self.index.shape != self.value.shape or self.index.ndim != 1:
            raise ValueError("an array row needs one index per value")
        self.lb, self.ub, self.name = float(lb), float(ub), name
        self._coefs: dict[int, float] | None = None

    @property
    def coefs(self) -> dict[int, float]:
        if self._coefs is None:
            self._coefs = dict(zip(self.index.tolist(), self.value.tolist()))
        return self._coefs


def row_length(row: Constraint | ArrayConstraint) -> int:
    """The nonzeros of a row, without building an array row's dict."""
    return len(row.index) if type(row) is ArrayConstraint else len(row.coefs)


@dataclass(frozen=True, slots=True)
class ModelStats:
    rows: int
    columns: int
    integer_columns: int
    binary_columns: int
    nonzeros: int


@dataclass
class LinearModel:
    """A minimization MILP. Build with :meth:`add_var`, :meth:`add`, :meth:`minimize`."""

    name: str = "model"
    vars: list[Var] = field(default_factory=list)
    constraints: list[Constraint | ArrayConstraint] = field(default_factory=list)
    objective: LinExpr = field(default_factory=LinExpr)
    hint: dict[int, float] = field(default_factory=dict)
    _names: set[str] = field(default_factory=set, repr=False)
    #: what an LP backend kept of its last relaxation of this model, for the next one of it or of a
    #: fork (the HiGHS backend: the rows in its array form and the optimal basis); never part of the model
    lp_cache: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    #: per position, a partition of some columns into groups of which every integer solution uses
    #: columns of at most one (a position picks one item; a group is, e.g., the island of a
    #: pipeline position's stage types): what ``SolveOptions(group_branching=True)`` branches on
    #: (solvers/group_branching.py). Empty: none declared
    choice_groups: list[list[list[int]]] = field(default_factory=list, repr=False)

    def fork(self) -> LinearModel:
        """A copy that shares the constraints built so far (they are never changed after
        :meth:`add`), so rows and bound changes on the copy leave this model as it is. The copy
        starts from this model's LP cache (its rows are a prefix of the copy's)."""
        return LinearModel(name=self.name, vars=list(self.vars), constraints=list(self.constraints),
                           objective=self.objective, hint=dict(self.hint), _names=set(self._names),
                           lp_cache=dict(self.lp_cache), choice_groups=self.choice_groups)

    def add_var(self, name: str, lb: float = 0.0, ub: float = math.inf, *, integer: bool = False) -> Var:
        if lb > ub:
            raise ValueError(f"variable {name}: lb {lb} > ub {ub}")
        v = Var(len(self.vars), name, float(lb), float(ub), integer)
        self.vars.append(v)
        return v

    def add_binary(self, name: str) -> Var:
        return self.add_var(name, 0, 1, integer=True)

    def add(self, con: Constraint | ArrayConstraint, name: str = "") -> Constraint | ArrayConstraint:
        rows = self.constraints
        if isinstance(con, ArrayConstraint):
            zero = con.value == 0.0
            if zero.any():
                con.index, con.value, con._coefs = con.index[~zero], con.value[~zero], None
        elif isinstance(con, Constraint):
            # the row owns a copy of its coefficients; zeros dropped (a scan and a copy in C; the
            # Python rebuild only when a zero is there)
            coefs = con.coefs
            con.coefs = {i: c for i, c in coefs.items() if c != 0.0} if 0.0 in coefs.values() else dict(coefs)
        else:
            raise TypeError("add() takes a constraint built with <=, >= or == (or an ArrayConstraint)")
        name = name or f"c{len(rows)}"
        if name in self._names:  # solvers (CBC through OR-Tools) abort on duplicate row names
            name = f"{name}#{len(rows)}"
        con.name = name
        self._names.add(name)
        rows.append(con)
        return con

    def set_upper_bound(self, index: int, ub: float) -> None:
        """Tighten a variable's upper bound (e.g. reduced-cost fixing); the Var keeps its index.
        (Built directly: ``dataclasses.replace`` took 2-3% of a window's bound, a thousand columns
        fixed per LP.)"""
        v = self.vars[index]
        self.vars[index] = Var(v.index, v.name, v.lb, min(v.ub, float(ub)), v.integer)

    @contextmanager
    def zeroed(self, indices: Iterable[int]) -> Iterator[None]:
        """Inside the ``with`` block the variables ``indices`` are fixed to 0 (their upper bounds);
        after it their bounds are as before (``set_upper_bound`` only tightens)."""
        saved = [(j, self.vars[j]) for j in indices]
        for j, _ in saved:
            self.set_upper_bound(j, 0.0)
        try:
            yield
        finally:
            for j, var in saved:
                self.vars[j] = var

    def minimize(self, expr: object) -> None:
        self.objective = LinExpr.of(expr)

    def set_hint(self, values: Mapping[Var, float]) -> None:
        """A (partial or complete) starting solution for backends that accept one."""
        self.hint = {v.index: float(val) for v, val in values.items()}

    @property
    def is_integral(self) -> bool:
        """Every variable integer and every coefficient an integer: CP-SAT can take it as is."""
        def whole(x: float) -> bool:
            return math.isinf(x) or float(x).is_integer()

        return (all(v.integer and whole(v.lb) and whole(v.ub) for v in self.vars)
                and all(whole(c) for c in self.objective.coefs.values())
                and all(whole(c) and whole(k.lb) and whole(k.ub) for k in self.constraints for c in k.coefs.values()))

    def size(self) -> tuple[int, int, int]:
        """Rows, columns and integer columns: :meth:`stats` without a pass over the nonzeros."""
        return len(self.constraints), len(self.vars), sum(v.integer for v in self.vars)

    def stats(self) -> ModelStats:
        ints = sum(v.integer for v in self.vars)
        bins = sum(v.integer and v.lb == 0 and v.ub == 1 for v in self.vars)
        return ModelStats(rows=len(self.constraints), columns=len(self.vars), integer_columns=ints,
                          binary_columns=bins, nonzeros=sum(row_length(c) for c in self.constraints))

    def check(self, x: Sequence[float], *, tol: float = 1e-6) -> list[str]:
        """Violations of bounds, integrality and constraints by ``x`` (empty when feasible)."""
        out = []
        for v in self.vars:
            val = x[v.index]
            if val < v.lb - tol or val > v.ub + tol:
                out.append(f"{v.name} = {val} outside [{v.lb}, {v.ub}]")
            if v.integer and abs(val - round(val)) > tol:
                out.append(f"{v.name} = {val} is not integral")
        for k in self.constraints:
            act = sum(c * x[i] for i, c in k.coefs.items())
            # relative to the row's magnitude, as solvers' feasibility tolerances are
            scale = max(1.0, abs(k.lb) if math.isfinite(k.lb) else 0.0, abs(k.ub) if math.isfinite(k.ub) else 0.0,
                        sum(abs(c * x[i]) for i, c in k.coefs.items()))
            if act < k.lb - tol * scale or act > k.ub + tol * scale:
                out.append(f"{k.name}: {act} not in [{k.lb}, {k.ub}]")
        return out

    def write_mps(self, path: str) -> None:
        """Write the model in free MPS format (readable by SCIP, HiGHS, CBC, Gurobi, ...)."""
        from tangram_opt.solvers.mps import write_mps

        write_mps(self, path)
