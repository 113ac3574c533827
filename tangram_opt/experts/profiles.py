"""Reproducible synthetic expert-load profiles (tokens per expert per MoE layer).

Measured router statistics of large MoE models are skewed: a few hot experts take several times the
mean load and the tail is long. Two standard shapes are used for tests and benchmarks:

* ``zipf``: the expert of popularity rank ``i`` (1-based) gets a share proportional to ``i ** -skew``
  (skew 0 is uniform; about 0.5-1.2 spans mildly to strongly skewed routing), with popularity ranks
  shuffled over expert ids per layer;
* ``lognormal``: shares proportional to ``exp(skew * z)``, ``z ~ N(0, 1)`` (``skew`` is the sigma of
  the log-load);
* ``uniform``: every expert gets the same share (the planner's default: imbalance 1).

``skew`` must lie in ``[0, MAX_SKEW]`` (3.0): beyond it both shapes put (nearly) every token on one expert
(zipf 3 already gives the hottest of 64 experts 83% of the tokens; at 50 it gets all of them), which is no
routing profile but a degenerate one, and ``exp(skew * z)`` overflows float64 for ``skew`` in the hundreds.

Shares are turned into whole tokens by largest remainders, so each layer sums to exactly ``tokens``
(at most ``MAX_TOKENS`` = 2**53, the integers float64 holds exactly).
The generator is ``numpy.random.default_rng(seed)``: the same arguments give the same profile.
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

import numpy as np

from tangram_opt.errors import SpecError

PROFILE_KINDS = ("zipf", "lognormal", "uniform")
#: the largest ``skew`` accepted for zipf and lognormal profiles (module docstring)
MAX_SKEW = 3.0
#: the largest ``tokens`` per layer (float64 holds every integer up to it exactly)
MAX_TOKENS = 2**53


def _whole_tokens(share: np.ndarray, tokens: int) -> np.ndarray:
    """Largest-remainder rounding of ``tokens * share`` to integers summing to ``tokens`` (computed in
    float64; shares that overflow, or sum to zero, are refused naming ``skew``)."""
    total = float(share.sum())
    if not np.isfinite(total) or total <= 0:
        raise SpecError("skew", None, f"gives expert shares that float64 cannot hold (sum {total})",
                        f"use a skew in [0, {MAX_SKEW:g}]")
    raw = share / total * tokens
    out = np.floor(raw).astype(np.int64)
    short = int(tokens - out.sum())
    if short > 0:
        order = np.argsort(-(raw - out), kind="stable")
        out[order[:short]] += 1
    return out


def synthetic_expert_loads(kind: str = "zipf", experts: int = 64, skew: float = 1.0, tokens: int = 1_000_000,
                           seed: int = 0, layers: int = 1) -> np.ndarray:
    """Tokens per expert: shape ``(experts,)`` for one layer, ``(layers, experts)`` for several.

    ``tokens`` is the number of routed token-expert assignments per layer (tokens x top_k, at most
    ``MAX_TOKENS``); ``skew`` is in ``[0, MAX_SKEW]`` for zipf and lognormal (module docstring), any
    number >= 0 for uniform (ignored); ``seed`` an integer >= 0.
    """
    kinds = {k.lower(): k for k in PROFILE_KINDS}
    if not isinstance(kind, str) or kind.lower() not in kinds:
        raise SpecError("kind", kind, "is not a known load profile", f"use one of {', '.join(PROFILE_KINDS)}")
    kind = kinds[kind.lower()]
    for name, v, lo in (("experts", experts, 1), ("tokens", tokens, 1), ("layers", layers, 1), ("seed", seed, 0)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise SpecError(name, v, f"must be an integer >= {lo}",
                            "use 0 or another non-negative integer" if name == "seed" else "write e.g. 8")
    if tokens > MAX_TOKENS:
        raise SpecError("tokens", tokens, f"is above 2**53 = {MAX_TOKENS}, where float64 loses whole tokens",
                        "give tokens per layer (tokens x top_k), e.g. 1000000")
    if isinstance(skew, bool) or not isinstance(skew, numbers.Real) or not math.isfinite(skew) or skew < 0:
        raise SpecError("skew", skew, "must be a finite number >= 0", "use 0 for uniform, about 1 for skewed")
    if kind != "uniform" and skew > MAX_SKEW:
        raise SpecError("skew", skew, f"is above {MAX_SKEW:g}: nearly every token would go to one expert",
                        f"use a skew in [0, {MAX_SKEW:g}] (about 0.5-1.5 matches measured routing)")
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(layers):
        if kind == "uniform":
            share = np.ones(experts)
        elif kind == "zipf":
            share = np.arange(1, experts + 1, dtype=float) ** -float(skew)
            share = share[rng.permutation(experts)]
        else:
            share = np.exp(float(skew) * rng.standard_normal(experts))
        rows.append(_whole_tokens(share, int(tokens)))
    out = np.asarray(rows, dtype=np.int64)
    return out[0] if layers == 1 else out


#: old name -> new one, still importable from here with a DeprecationWarning
_RENAMED = {"load_profile": "synthetic_expert_loads"}


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        warnings.warn(f"tangram_opt.experts.profiles.{name} is now tangram_opt.experts.profiles.{_RENAMED[name]}; "
                      "the old name will be removed", DeprecationWarning, stacklevel=2)
        return globals()[_RENAMED[name]]
    raise AttributeError(f"module 'tangram_opt.experts.profiles' has no attribute {name!r}")
