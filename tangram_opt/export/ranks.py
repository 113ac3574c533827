"""Where each stage's GPUs are: global ranks, and (given the cluster) node and local GPU indices.

Ranks are numbered pipeline by pipeline, stage by stage: stage ``k`` of pipeline ``p`` owns the
``gpus`` consecutive ranks after every earlier stage's. Identical pipelines (:func:`identical_pipelines`)
are one job with a larger data-parallel group, so their ranks are numbered stage by stage: stage ``k``
of every pipeline, pipeline 0 first, then stage ``k + 1``. Inside a stage the order is tp fastest,
then cp, then dp, which is Megatron-LM's default rank order (``tp-cp-ep-dp-pp``, pp slowest), so a
single-part plan's rank ``r`` is the rank Megatron-LM expects at that position.

GPUs are handed out per island by first fit, in stage order: a stage smaller than a node takes
``gpus`` free GPUs of one node (the planner only makes stages that divide the node size or are
whole nodes), a larger stage takes whole free nodes. Island nodes are numbered in the order of the
node groups that form the island (``find_islands``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tangram_opt.errors import SpecError
from tangram_opt.planner.plan import Plan
from tangram_opt.specs.cluster import Cluster


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeSlice:
    """``gpus`` GPUs (``local_gpus``) of one node: node ``node`` of island ``island``, which is node
    ``group_node`` of node group ``group``."""

    island: str
    node: int
    group: str
    group_node: int
    local_gpus: tuple[int, ...]
    first_rank: int

    @property
    def host(self) -> str:
        """A readable node name: ``<node group>[<index in the group>]``."""
        return f"{self.group}[{self.group_node}]"


@dataclass(frozen=True, slots=True, kw_only=True)
class StageRanks:
    """The global ranks of one stage and, when a cluster is known, the node slices holding them."""

    pipeline: int
    stage: int
    island: str
    gpu: str
    first_rank: int
    num_ranks: int
    slices: tuple[NodeSlice, ...] = ()

    @property
    def ranks(self) -> range:
        return range(self.first_rank, self.first_rank + self.num_ranks)

    @property
    def rank_text(self) -> str:
        last = self.first_rank + self.num_ranks - 1
        return str(self.first_rank) if last == self.first_rank else f"{self.first_rank}-{last}"

    @property
    def hosts_text(self) -> str:
        """E.g. ``a100[0] GPUs 0-3`` or ``v100[0..1]`` (whole nodes)."""
        if not self.slices:
            return ""
        parts = []
        for s in self.slices:
            g = s.local_gpus
            parts.append(f"{s.host} GPUs {g[0]}-{g[-1]}" if len(g) > 1 else f"{s.host} GPU {g[0]}")
        return ", ".join(parts)


def assign_ranks(plan: Plan, cluster: Cluster | None = None) -> tuple[StageRanks, ...]:
    """Global ranks of every stage; with ``cluster``, also the node and GPUs each rank runs on.

    Raises :class:`SpecError` when a stage names an island the cluster does not have or the island
    has too few free GPUs left (the plan was made for another cluster).
    """
    islands = _island_nodes(cluster) if cluster is not None else {}
    free: dict[str, list[list[int]]] = {name: [list(range(n)) for _, _, n in nodes]
                                        for name, nodes in islands.items()}
    out: list[StageRanks] = []
    rank = 0
    if identical_pipelines(plan):
        # one job with dp x pipelines: stage k of every pipeline forms one contiguous rank block
        # (pipeline p at offset p x gpus), so the data-parallel index is p x dp + d and pp stays slowest
        order = [(pi, k) for k in range(plan.pipelines[0].num_stages) for pi in range(len(plan.pipelines))]
    else:
        order = [(pi, k) for pi, pipe in enumerate(plan.pipelines) for k in range(pipe.num_stages)]
    for pi, k in order:
        st = plan.pipelines[pi].stages[k]
        slices: tuple[NodeSlice, ...] = ()
        if cluster is not None:
            slices = _place(islands, free, st.island, st.gpus, rank, where=f"pipelines[{pi}].stages[{k}]")
        out.append(StageRanks(pipeline=pi, stage=k, island=st.island, gpu=st.gpu, first_rank=rank,
                              num_ranks=st.gpus, slices=slices))
        rank += st.gpus
    return tuple(sorted(out, key=lambda r: (r.pipeline, r.stage)))


def _shape(plan: Plan, pi: int) -> tuple:
    """What a stock framework sees of pipeline ``pi``: per-stage layout and layers, and the schedule."""
    pipe = plan.pipelines[pi]
    return (pipe.pipeline_micro_batch, pipe.num_micro_batches, pipe.schedule,
            tuple((s.tp, s.cp, s.dp, s.ep, s.zero, s.recompute, s.micro_batch_size, s.first_layer,
                   s.num_dense_layers, s.num_moe_layers, s.has_embedding, s.has_head) for s in pipe.stages))


def identical_pipelines(plan: Plan) -> bool:
    """Whether the plan has several pipelines that a framework cannot tell apart: same stages (parallel
    layout, ZeRO, recomputation, micro-batch, layers) and same micro-batch count. GPU types may differ.
    Such pipelines are one job whose data-parallel size is dp x pipelines."""
    return len(plan.pipelines) > 1 and all(_shape(plan, pi) == _shape(plan, 0) for pi in range(len(plan.pipelines)))


def _island_nodes(cluster: Cluster) -> dict[str, list[tuple[str, int, int]]]:
    """Island name -> its nodes as (node group, index in the group, GPUs per node)."""
    from tangram_opt.planner.islands import find_islands

    groups = {g.name: g for g in cluster.node_groups}
    out: dict[str, list[tuple[str, int, int]]] = {}
    for isl in find_islands(cluster):
        nodes = []
        for gname in isl.node_groups:
            g = groups[gname]
            nodes += [(gname, i, g.node.gpus_per_node) for i in range(g.num_nodes)]
        out[isl.name] = nodes
    return out


def _place(islands: dict[str, list[tuple[str, int, int]]], free: dict[str, list[list[int]]], island: str,
           gpus: int, first_rank: int, *, where: str) -> tuple[NodeSlice, ...]:
    if island not in islands:
        raise SpecError(f"{where}.island", island, "is not an island of this cluster",
                        f"use the cluster the plan was made for (islands: {', '.join(islands)})")
    nodes, avail = islands[island], free[island]
    per_node = nodes[0][2]
    if gpus <= per_node:
        for j, left in enumerate(avail):
            if len(left) >= gpus:
                take, avail[j] = left[:gpus], left[gpus:]
                g, gi, _ = nodes[j]
                return (NodeSlice(island=island, node=j, group=g, group_node=gi, local_gpus=tuple(take),
                                  first_rank=first_rank),)
    else:
        whole = [j for j, left in enumerate(avail) if len(left) == nodes[j][2]]
        need = -(-gpus // per_node)
        if len(whole) >= need:
            out = []
            for n, j in enumerate(whole[:need]):
                g, gi, _ = nodes[j]
                out.append(NodeSlice(island=island, node=j, group=g, group_node=gi, local_gpus=tuple(avail[j]),
                                     first_rank=first_rank + n * per_node))
                avail[j] = []
            return tuple(out)
    left = sum(len(a) for a in avail)
    raise SpecError(f"{where}.gpus", gpus, f"island {island!r} has only {left} unassigned GPUs left for this stage",
                    "use the cluster the plan was made for")


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeLaunch:
    """One launcher invocation: ``nproc`` processes on ``host`` (GPUs ``local_gpus``) taking global
    ranks ``first_rank`` .. ``first_rank + nproc - 1``; ``node_rank`` is the host's position."""

    node_rank: int
    host: str
    first_rank: int
    nproc: int
    local_gpus: tuple[int, ...]


def node_launches(ranks: tuple[StageRanks, ...]) -> tuple[NodeLaunch, ...] | None:
    """Per-node launcher invocations when every used node holds one contiguous range of ranks
    (ordered by first rank); ``None`` when a node holds two separate ranges (then each process needs
    its RANK / LOCAL_RANK / WORLD_SIZE set explicitly) or no cluster was given."""
    slices = sorted((s for r in ranks for s in r.slices), key=lambda s: s.first_rank)
    if not slices:
        return None
    per_host: dict[tuple[str, int], list[NodeSlice]] = {}
    for s in slices:
        per_host.setdefault((s.island, s.node), []).append(s)
    out: list[NodeLaunch] = []
    for n, sl in enumerate(sorted(per_host.values(), key=lambda v: v[0].first_rank)):
        ranks_here = [r for s in sl for r in range(s.first_rank, s.first_rank + len(s.local_gpus))]
        first = ranks_here[0]
        if ranks_here != list(range(first, first + len(ranks_here))):
            return None
        out.append(NodeLaunch(node_rank=n, host=sl[0].host, first_rank=first, nproc=len(ranks_here),
                              local_gpus=tuple(g for s in sl for g in s.local_gpus)))
    return tuple(out)


__all__ = ["NodeSlice", "StageRanks", "assign_ranks", "identical_pipelines", "NodeLaunch", "node_launches"]
