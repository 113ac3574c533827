"""The benchmark's scenario suite (benchmarks/scenarios/*.yaml) and what a run of one scenario records.

:class:`Scenario` is one case (cluster, model, training, time limits); :func:`load_scenarios` reads the
suite with every field checked; :class:`MethodResult` and :class:`ScenarioResult` hold the plans of the
MIP and the three baselines and their simulated replays (benchmarks/run.py fills them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tangram_opt.errors import SpecError
from tangram_opt.planner.plan import Plan
from tangram_opt.specs import Cluster, TrainingSpec, load_cluster, training_from_dict

ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "benchmarks"
SCENARIO_DIR = BENCH_DIR / "scenarios"
DEFAULT_OUT = BENCH_DIR / "results"
DOCS_PAGE = ROOT / "docs" / "results" / "benchmark.md"
INSTANCES_DIR = ROOT / "formulations" / "instances"

METHODS = ("mip", "greedy", "homogeneous", "unaware")
BASELINES = METHODS[1:]
#: relative tolerance of the "MIP >= baseline" check (float noise of two evaluations of one plan)
RTOL = 1e-9
TARGET_RATIO = 1.3

_SCENARIO_FIELDS = ("name", "description", "cluster", "model", "training", "time_limit_s", "island_time_limit_s",
                    "quick", "notes")


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """One benchmark case: a cluster, a model preset, a training run and the solver time limits.

    ``cluster`` is a built-in example name (tangram_opt/data/clusters) or a path relative to
    benchmarks/ (``clusters/<name>.yaml``). ``time_limit_s`` bounds the MIP (``solve``);
    ``island_time_limit_s`` bounds each island's ``solve`` in the best-homogeneous baseline.
    """

    name: str
    description: str
    cluster_ref: str
    model: str
    training: dict[str, Any]
    time_limit_full_s: float
    time_limit_quick_s: float
    island_time_limit_full_s: float
    island_time_limit_quick_s: float
    quick: bool
    path: Path
    notes: str = ""

    def load_cluster(self) -> Cluster:
        ref = self.cluster_ref
        if ref.endswith((".yaml", ".yml", ".json")):
            p = Path(ref)
            return load_cluster(p if p.is_absolute() else BENCH_DIR / p)
        return load_cluster(ref)

    def training_spec(self) -> TrainingSpec:
        return training_from_dict(self.training, source=str(self.path))

    def time_limit_s(self, quick: bool) -> float:
        return self.time_limit_quick_s if quick else self.time_limit_full_s

    def island_time_limit_s(self, quick: bool) -> float:
        return self.island_time_limit_quick_s if quick else self.island_time_limit_full_s


def _limits(data: dict[str, Any], key: str, source: str) -> tuple[float, float]:
    v = data.get(key)
    if not isinstance(v, dict) or set(v) != {"full", "quick"}:
        raise SpecError(key, v, "must map full: and quick: to seconds", f"write {key}: {{full: 60, quick: 10}}",
                        source=source)
    out = []
    for mode in ("full", "quick"):
        x = v[mode]
        if isinstance(x, bool) or not isinstance(x, (int, float)) or x <= 0:
            raise SpecError(f"{key}.{mode}", x, "must be a positive number of seconds", "e.g. 30", source=source)
        out.append(float(x))
    return out[0], out[1]


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate one scenario file (every key is checked; see benchmarks/scenarios/README.md)."""
    path = Path(path)
    src = str(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise SpecError("scenario", path.name, f"is not valid YAML ({str(e).splitlines()[0]})",
                        "quote values that contain ': '", source=src) from None
    if not isinstance(data, dict):
        raise SpecError("scenario", type(data).__name__, "must be a mapping", "see benchmarks/scenarios/", source=src)
    unknown = sorted(set(data) - set(_SCENARIO_FIELDS))
    if unknown:
        raise SpecError(unknown[0], data[unknown[0]], "is not a scenario field", f"use {', '.join(_SCENARIO_FIELDS)}",
                        source=src)
    for key in ("cluster", "model", "training", "time_limit_s", "island_time_limit_s", "quick"):
        if key not in data:
            raise SpecError(key, None, "is required", f"add '{key}:' to the scenario", source=src)
    if not isinstance(data["quick"], bool):
        raise SpecError("quick", data["quick"], "must be true or false", "write quick: true", source=src)
    if not isinstance(data["training"], dict):
        raise SpecError("training", data["training"], "must be a mapping",
                        "write training: {global_batch_size: ..., seq_len: ..., precision: ...}", source=src)
    full, quick = _limits(data, "time_limit_s", src)
    ifull, iquick = _limits(data, "island_time_limit_s", src)
    name = str(data.get("name") or path.stem)
    if name != path.stem:
        raise SpecError("name", name, f"differs from the file name {path.stem!r}", "name the file <name>.yaml",
                        source=src)
    return Scenario(name=name, description=str(data.get("description", "")), cluster_ref=str(data["cluster"]),
                    model=str(data["model"]), training=dict(data["training"]), time_limit_full_s=full,
                    time_limit_quick_s=quick, island_time_limit_full_s=ifull, island_time_limit_quick_s=iquick,
                    quick=data["quick"], path=path, notes=str(data.get("notes", "")).strip())


def load_scenarios(names: Sequence[str] | None = None, *, quick: bool = False,
                   directory: Path = SCENARIO_DIR) -> list[Scenario]:
    """Every scenario of ``directory`` (sorted by name); with ``quick`` only those marked ``quick: true``;
    with ``names`` exactly those (in that order)."""
    all_sc = {p.stem: load_scenario(p) for p in sorted(directory.glob("*.yaml"))}
    if names:
        missing = [n for n in names if n not in all_sc]
        if missing:
            raise SpecError("--scenarios", missing, "are not scenarios", f"use some of {', '.join(all_sc)}")
        return [all_sc[n] for n in names]
    return [s for s in all_sc.values() if s.quick or not quick]


@dataclass(slots=True)
class MethodResult:
    method: str
    plan: Plan | None = None
    error: str = ""
    wall_s: float = 0.0
    simulated_step_s: float | None = None
    simulated: bool = False
    sim_note: str = ""

    @property
    def ok(self) -> bool:
        return self.plan is not None

    @property
    def step_s(self) -> float:
        """The step time every comparison uses: simulated when available, else predicted."""
        assert self.plan is not None
        return self.simulated_step_s if self.simulated_step_s is not None else self.plan.step_time_s

    @property
    def tokens_per_s(self) -> float:
        assert self.plan is not None
        return self.plan.global_batch_size * self.plan.seq_len / self.step_s


@dataclass(slots=True)
class ScenarioResult:
    scenario: Scenario
    cluster: Cluster
    num_islands: int
    methods: dict[str, MethodResult] = field(default_factory=dict)
    island_alone_tokens_per_s: dict[str, float] = field(default_factory=dict)
    candidates_s: float = 0.0
    wall_s: float = 0.0
    violations: list[tuple[str, str]] = field(default_factory=list)  # (baseline, description)
    mps: dict[str, Any] = field(default_factory=dict)

    @property
    def heterogeneous(self) -> bool:
        return self.num_islands > 1

    def ratio(self, baseline: str) -> float | None:
        a, b = self.methods.get("mip"), self.methods.get(baseline)
        if a is None or b is None or not a.ok or not b.ok:
            return None
        return a.tokens_per_s / b.tokens_per_s

    def het_efficiency(self, method: str) -> float | None:
        r = self.methods.get(method)
        total = sum(self.island_alone_tokens_per_s.values())
        if r is None or not r.ok or total <= 0:
            return None
        return r.tokens_per_s / total


__all__ = ["BASELINES", "BENCH_DIR", "DEFAULT_OUT", "DOCS_PAGE", "INSTANCES_DIR", "METHODS", "MethodResult", "ROOT",
           "RTOL", "SCENARIO_DIR", "Scenario", "ScenarioResult", "TARGET_RATIO", "load_scenario", "load_scenarios"]
