"""``tangram-opt experts``: expert placement for one MoE layer or several, from a loads file or a
synthetic profile (layer: command line)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tangram_opt.cli.common import EXIT_OK, ComponentUnavailable, _note, _print
from tangram_opt.errors import FormatError, SpecError


#: Python argument of synthetic_expert_loads / place_experts -> the flag that sets it
_FLAGS = {"kind": "--profile", "experts": "--experts", "skew": "--skew", "tokens": "--tokens", "layers": "--layers",
          "seed": "--profile-seed", "ranks": "--ranks", "nodes": "--nodes", "slots": "--slots",
          "time_limit_s": "--time-limit", "backend": "--backend", "method": "--method"}


def _read_loads(path: str) -> Any:
    p = Path(path)
    if not p.is_file():
        raise FormatError("loads", path, "file not found", "pass a JSON file with tokens per expert")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise FormatError("loads", path, f"is not valid JSON (line {e.lineno}: {e.msg})",
                          "write a JSON list of numbers, or a list of lists (one per layer)") from None
    if isinstance(data, dict):
        if "loads" not in data:
            raise SpecError("loads", sorted(data), "a JSON object must have a 'loads' key",
                            "write {\"loads\": [...]} or a bare list")
        data = data["loads"]
    return data


def cmd_experts(args: argparse.Namespace) -> int:
    from rich import box
    from rich.table import Table

    try:
        from tangram_opt.experts import DEFAULT_PLACEMENT_BACKEND, place_experts, synthetic_expert_loads
    except ImportError as e:
        raise ComponentUnavailable(f"expert placement is not available in this installation "
                                   f"(tangram_opt.experts: {e})") from None
    try:
        if args.loads:
            loads = _read_loads(args.loads)
            src = args.loads
        else:
            loads = synthetic_expert_loads(args.profile, experts=args.experts, skew=args.skew, tokens=args.tokens,
                                           seed=args.profile_seed, layers=args.layers)
            src = f"{args.profile} profile (skew {args.skew}, seed {args.profile_seed})"
        res = place_experts(loads, args.ranks, args.nodes, args.slots, method=args.method,
                            backend=args.backend or DEFAULT_PLACEMENT_BACKEND, time_limit_s=args.time_limit)
    except SpecError as e:  # name the command-line flag, not the Python argument
        if e.field in _FLAGS:
            raise type(e)(_FLAGS[e.field], e.value, e.problem, e.fix, source=e.source) from None
        raise
    placements = res if isinstance(res, list) else [res]
    head = (f"expert placement ({args.method}): {src}; {args.ranks} ranks on {args.nodes} node(s), "
            f"{args.slots} slots per rank")
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("layer", "experts", "replicas", "max load", "mean load", "imbalance", "bound", "gap", "status"):
        t.add_column(name, justify="right", no_wrap=True)
    for i, pl in enumerate(placements):
        c = pl.certificate
        t.add_row(str(i), str(pl.experts), str(sum(pl.replicas)), f"{pl.max_load:,.0f}", f"{pl.mean_load:,.0f}",
                  f"{pl.imbalance:.3f}", f"{c.max_load_bound:,.0f}", f"{100 * c.gap:.2f}%", c.status)
    from rich.console import Group

    _print(Group(head, t))
    if args.output:
        out = [pl.to_dict() for pl in placements]
        Path(args.output).write_text(json.dumps(out if isinstance(res, list) else out[0], indent=2) + "\n",
                                     encoding="utf-8")
        _note(f"placement written: {args.output}")
    return EXIT_OK
