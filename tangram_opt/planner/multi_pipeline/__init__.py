"""Several data-parallel pipelines in one plan: pipeline templates plus a level-2 MIP (issue 10).

A plan may run ``R`` pipelines side by side on disjoint GPUs. Each pipeline is a chain of
homogeneous stages (as in a single-pipeline plan) with its own pipeline micro-batch ``b_p``,
stage layout and island types, and takes a whole number ``m_p`` of micro-batches, so its share of
the global batch is ``b_p m_p`` and the shares sum to ``B``. The step (docs/multi_pipeline.md,
formulations/multi_pipeline.md) is

    step = max_p PIPE_p(m_p) + X(R, stages) + max_p max_{k in p} OPT_k

- ``PIPE_p(m)``: pipeline p's 1F1B (or GPipe) step with every stage's tail reduced to its exposed
  intra-stage gradient sync. The model is the closed form ``CF'(m) = makespan(m) + tail excess``
  of pipeline_model.py (an upper bound of the exact schedule, which plans report);
- ``X``: the gradient all-reduce of every layer across the R pipelines (:func:`cross_sync`), not
  overlapped with compute; it starts when the slowest pipeline is ready;
- ``OPT_k``: stage k's optimizer update, which needs the all-reduced gradients.

With R = 1 there is no cross-pipeline sync and the optimizer stays in the stage tails: that is the
single-pipeline plan space of :func:`~tangram_opt.planner.search.solve`.

Two levels. (1) Templates: a template is a pipeline (stages with candidates and layer counts, and
its micro-batch ``b``) whose micro-batch count is left free. They come from every candidate that
holds the whole model on one stage (pure data parallelism with uneven shares), from the
single-pipeline optimizer run on scaled-down sub-clusters (every island's node count divided by
k) and on each island alone, and from the single-pipeline optimum itself. (2) A MIP chooses how
many replicas of each (template, micro-batch count) pair to run: an all-integer model (times in
integer ticks, rounded so that its optimum is a valid lower bound) that every backend solves.
The union of the single-pipeline space and the declared template space is the plan space the
certificate states; its bound is the smaller of the two levels' bounds.

The modules:

- :mod:`.options`: the knobs of this level (:class:`MultiPipelineOptions`);
- :mod:`.sync_model`: the gradient all-reduce across pipelines (:func:`cross_sync`);
- :mod:`.templates`: pipelines with a free micro-batch count and their pricing (:class:`TemplatePricer`);
- :mod:`.generation`: level 1, which templates (sub-cluster searches through a passed-in solver);
- :mod:`.level2`: level 2, the MIP choosing replicas and micro-batch counts;
- :mod:`.combine`: the whole level, the plan it returns and the merged certificate.

Layer: baselines and the multi-pipeline level: sees only candidate tables (never the cost model) and
gets the single-pipeline search as a ``solver`` callable instead of importing it.
"""

from tangram_opt.planner.multi_pipeline.combine import (MultiPipelineRun, assemble, combine_levels,
                                                        describe_template_space, run_multi_pipeline,
                                                        with_multi_pipeline)
from tangram_opt.planner.multi_pipeline.generation import SinglePipelineSolver, generate_templates, sub_cluster
from tangram_opt.planner.multi_pipeline.level2 import Level2Result, fluid_throughput, solve_level2
from tangram_opt.planner.multi_pipeline.options import MultiPipelineOptions
from tangram_opt.planner.multi_pipeline.sync_model import (SyncBreakdown, SyncStage, cross_sync, latency_steps,
                                                           ring_factor)
from tangram_opt.planner.multi_pipeline.templates import Template, TemplatePricer, one_stage_templates

__all__ = ["Level2Result", "MultiPipelineOptions", "MultiPipelineRun", "SinglePipelineSolver", "SyncBreakdown",
           "SyncStage", "combine_levels", "Template", "TemplatePricer", "assemble", "cross_sync", "describe_template_space",
           "fluid_throughput", "generate_templates", "latency_steps", "one_stage_templates", "ring_factor",
           "run_multi_pipeline", "solve_level2", "sub_cluster", "with_multi_pipeline"]
