"""The search's tuning constants, each with the measurement or reason behind it.

Changing one changes how fast the search closes its gap, never what it proves: every node is
closed by a valid bound whatever these say. The modules of the search read them as
``tuning.NAME`` at the point of use, so a test or an experiment can set one for a run.
"""

from __future__ import annotations

#: a node whose window is at most this wide (hi / lo) goes to the MIP backend instead of being split
LEAF_WINDOW_RATIO = 1.01
#: above this many candidates (summed over pipeline micro-batch sizes) a restricted search on the
#: fastest RESTRICTED_PRIMAL_KEEP candidates per island and size first finds a good incumbent,
#: using RESTRICTED_PRIMAL_SHARE of the time. Off (share 0) since the neighbourhood search: with
#: the share at 0.3 and 0 (60 s, 2 threads), 4,096-GPU DeepSeek-V3 (300 s) proved 0.01% after 207 s
#: and 70 s, the 512-GPU Mixtral-8x22B case after 12.8 s and 13.4 s, and "384 V100+A10G, MoE"
#: ended at 19-20% and 10.5% (formulations/pipeline_mip.md §5)
RESTRICTED_PRIMAL_CANDIDATES = 3000
RESTRICTED_PRIMAL_KEEP = 2
RESTRICTED_PRIMAL_SHARE = 0.0
#: ... and it takes the incumbent as its cutoff (it looks only for better plans)
RESTRICTED_PRIMAL_CUTOFF = True
#: the restricted search looks for plans, not bounds: wider leaves reach leaf MIPs (plans) sooner
RESTRICTED_PRIMAL_LEAF_RATIO = 1.03
#: ... and stops once its best plan is proved within this gap on the restricted space (it looks
#: for plans; the main search's own first pass proves the same gap)
RESTRICTED_PRIMAL_GAP = 0.01
#: a node is also split on the largest step tail of its stages (``BranchAndBound.split``) until
#: that window is at most this fraction of the incumbent wide
TAIL_LEAF_FRACTION = 0.0025
#: split a node on its largest step tail before its period window is narrow, whenever the tail
#: window spans more than WIDE_TAIL_FACTOR times the seconds of step the period window spans
#: (``WindowSplits.wide_tail_split_point``)
WIDE_TAIL_SPLITS = True
WIDE_TAIL_FACTOR = 1.0
#: a window's model is rebuilt before its MIP solve when the incumbent improved by more than this
REBUILD_CUTOFF_GAIN = 1e-3
#: re-solves with no-good cuts when a window's MIP answer scores worse exactly than in the model
NOGOOD_ROUNDS = 3
#: rounds of support-class cuts per window (``BranchAndBound.refine``; the window then closes at
#: its bound), and the most orders one class may have for its exact best to be enumerated
REFINE_ROUNDS = 8
REFINE_MAX_ORDERS = 5000
#: each re-solve of a cut window gets at most this many times the first solve's time (>= 1 s)
REFINE_SOLVE_FACTOR = 3.0
#: the knapsack primal heuristic (``BranchAndBound.knapsack_plans``): caps in [bound, SPAN x bound],
#: at most CAPS of them, each with these minimum memory tolerances, for at most
#: max(MIN_S, SHARE x time_limit_s) seconds per pipeline micro-batch size
KNAPSACK_PLAN_SPAN = 1.1
KNAPSACK_PLAN_CAPS = 12
KNAPSACK_PLAN_TOLERANCES = (0, 4, 8, 16)
KNAPSACK_PLAN_MIN_S = 0.2
KNAPSACK_PLAN_SHARE = 0.02
#: ... and island caps: caps in [bound, ISLAND_SPAN x bound], each island's a fraction ISLAND_CAPS of
#: it (one at the full cap), minimum tolerance 0
KNAPSACK_PLAN_ISLAND_SPAN = 1.3
KNAPSACK_PLAN_ISLAND_CAPS = (0.5, 0.75, 1.0)
#: a knapsack plan that improves its sub-problem's best to within NEAR of the incumbent gets one
#: neighbourhood descent of at most max(NEIGHBOURHOOD_TURN_MIN_S, DESCENT_SHARE x time_limit_s)
KNAPSACK_DESCENT_NEAR = 0.02
KNAPSACK_DESCENT_SHARE = 0.025
#: the neighbourhood search (formulations/neighbourhood.py, primal.py): at most NEIGHBOURHOOD_SHARE
#: of the time so far, in three parts: before the roots, a descent from every sub-problem's best
#: plan and kicks on the NEIGHBOURHOOD_KICK_SUBS best (NEIGHBOURHOOD_START_S at most: on the
#: fast-network cases a whole 6% of a 300 s limit there made a 4 s proof take 22 s, and 2 s made
#: a 2.9 s one take 5.4 s);
#: between nodes, slices of NEIGHBOURHOOD_SLICE_S of kicks, the best open sub-problems in turn;
#: on every new incumbent NEIGHBOURHOOD_TURN_SHARE of the limit (at least NEIGHBOURHOOD_TURN_MIN_S)
NEIGHBOURHOOD_SHARE = 0.06
NEIGHBOURHOOD_START_S = 1.0
#: ... and at most this many seconds per candidate (summed over the pipeline micro-batch sizes)
#: before the roots: the test instances (40 to 72 candidates), which their branch and bound closes
#: in about a second, spent 0.4 s there; the communication-bound family has 976 to 20,297
#: candidates, so all but its smallest case keep the whole second
NEIGHBOURHOOD_START_PER_CANDIDATE_S = 5e-4
NEIGHBOURHOOD_KICK_SUBS = 5
NEIGHBOURHOOD_SLICE_S = 0.3
NEIGHBOURHOOD_TURN_SHARE = 0.005
NEIGHBOURHOOD_TURN_MIN_S = 0.2
#: the island-order search (search/patterns.py): the sequence model with the island of every
#: position fixed, for the orders one edit away from the incumbent's; from ORDER_START_SHARE of the
#: time limit on (the fast-network cases of the planner scaling page close before it) and while
#: the gap is at least ORDER_MIN_GAP, at most ORDER_SHARE of the time so far, in slices of
#: ORDER_SLICE_S between nodes, each order for at most ORDER_SOLVE_S; after ORDER_PATIENCE orders in
#: a row found no plan ORDER_MIN_GAIN better than the incumbent it waits for one from elsewhere (on
#: "384 V100+A10G, MoE" a stream of 0.02-0.05% better plans kept it busy, and the time it took cost
#: 0.2-0.4 s of bound; on "512 L4+A10G+V100, MoE" the 1.5% better plan came from the third order)
ORDER_SEARCH = True
ORDER_START_SHARE = 0.2
ORDER_MIN_GAP = 0.02
ORDER_SHARE = 0.15
ORDER_SLICE_S = 2.5
ORDER_SOLVE_S = 2.5
#: ... with periods at most this fraction above the incumbent's
ORDER_PERIOD_SLACK = 0.02
ORDER_PATIENCE = 8
ORDER_MIN_GAIN = 0.002
#: dives (search/patterns.py ``Dive``): once the orders around the incumbent are used up, the
#: island-order search's slices go to depth-first searches over the island of each position, for
#: the DIVE_SUBS pipeline micro-batch sizes with the lowest bounds at a few stage counts each,
#: DIVE_ACTIVE of them in turns, each leaf (every island fixed) solved for at most DIVE_LEAF_S;
#: after DIVE_PATIENCE_S of dives (their models' builds included) without an ORDER_MIN_GAIN better
#: plan they wait for one from elsewhere. On "384 V100+A10G, MoE", where they find nothing, their
#: time costs the bound (single-pipeline, 60 s: 6.65% without dives, 7.71% without a patience,
#: 7.65% at 4 s, 7.04% at 2.5 s); "512 A100+L4+V100, dense" still reaches 1.00% at 2.5 s
DIVE_SUBS = 4
DIVE_ACTIVE = 3
DIVE_LEAF_S = 1.0
DIVE_PATIENCE_S = 2.5
#: node selection: primal turns (``BranchAndBound.next_node``) back off after this many find nothing
PRIMAL_IDLE_TURNS = 8
PRIMAL_MAX_EVERY = 8
#: knapsack plans whose layer split is polished (the best orders by exact step time)
KNAPSACK_PLAN_POLISH = 8
#: with sequence leaves (the default), period windows at most this wide (hi / lo) are split on
#: the stage count and solved per stage count by the sequence model (formulations/stage_sequence.py)
SEQUENCE_WINDOW_RATIO = 1.02
#: ... and at most this wide for a pipeline micro-batch size once SEQUENCE_NARROW_AFTER of its
#: sequence leaves came back unfinished: an unfinished leaf is then split on the period rather
#: than solved again with twice the time (``WindowSplits.leaf_ratio_of``). Narrower leaves
#: everywhere (1.015) helped "512 L4+A10G+V100, MoE" (single-pipeline, 60 s: 3.90% twice against
#: 4.33-4.38%) and cost "1024 A100+L4+V100" 1.00% -> 2.44% and "512 A100+L4+V100, dense" 0.01%
#: -> 0.46%, whose leaves all close at once (formulations/pipeline_mip.md §5, twenty-fourth round)
SEQUENCE_NARROW_RATIO = 1.01
SEQUENCE_NARROW_AFTER = 1
#: a sequence leaf that came back unfinished with a dual bound below its window's aggregated bound
#: is solved again with the aggregated model's rows joined to it (``SequenceMIP.relaxation``)
SEQUENCE_JOIN_AGGREGATED = True
#: ... and once this many leaves of a pipeline micro-batch size did, every leaf of it from its first try
SEQUENCE_JOIN_AFTER = 2
#: ... if its bound lies more than this fraction below the target (nearer, the plain model's
#: quick proofs of infeasibility pay more than the joined model's bound)
SEQUENCE_JOIN_SLACK = 0.03
#: a sequence model with more stage-type columns than this goes to the aggregated leaf instead
SEQUENCE_MAX_COLUMNS = 40000
#: the search first proves this relative gap (when ``rel_gap`` is smaller), then starts again
#: from the roots with the requested one, keeping the first proof as a floor under the bound
FIRST_PASS_GAP = 0.01
#: the second pass (``BranchAndBound.next_pass``) roots no more sub-problems once this little
#: time is left; those keep the first pass's bound (their floor)
SECOND_PASS_ROOT_MIN_S = 0.5
#: the least time a sequence leaf gets (doubled each time it comes back unfinished)
SEQUENCE_FIRST_BUDGET_S = 5.0
#: sequence leaves are solved by branching on the island of each position, with an LP at every
#: node (solvers/group_branching.py), instead of HiGHS's branch and bound on single stage types; the
#: end-island LPs below are then its first levels and are not run
SEQUENCE_GROUP_BRANCHING = True
#: ... where the islands' boundaries differ by at least this share of the period
#: (``leaves.island_link_spread``); elsewhere HiGHS's own branch and bound, whose cuts close the
#: leaves of fast networks that lie within a percent of the target. On the 4,096-GPU
#: Llama-3-405B case island branching left those leaves unfinished (0.72% after 90 s, where HiGHS
#: proved 0.01% in 42 s). The spread at the best plan's period: 0.001-0.002 on the fast-network
#: cases of the planner scaling page, 0.025-0.24 on the communication-bound MoE and dense cases
SEQUENCE_BRANCHING_MIN_SPREAD = 0.01
#: from this try of a sequence leaf on (0: the first; 1: once it came back unfinished), it is split
#: on the island of its first and last stage by LP relaxations (``LeafSolves.end_islands``), which
#: share at most END_ISLANDS_S; the leaves proved infeasible in a fraction of a second by the MIP
#: would pay about 0.1 s per island and end for nothing, and with 2 s per LP the 24-stage leaves of
#: "384 V100+A10G, MoE" cost its bound 0.15 s
SEQUENCE_END_ISLANDS_TRY = 1
END_ISLANDS_S = 1.0
#: a sequence leaf whose bound lies more than this fraction below the target is solved with
#: HiGHS's sub-MIP heuristics (it may hold much better plans: find them); nearer the target, where
#: nearly every leaf ends as a quick infeasibility proof, without (formulations/pipeline_mip.md §3b)
SEQUENCE_HEURISTICS_SLACK = 0.05
#: ... until this many such leaves in a row found no better plan; then one such leaf in 2, 4, ...,
#: at most one in SEQUENCE_HEURISTICS_MAX_EVERY, gets them (``LeafSolves.heuristics_turn``)
SEQUENCE_HEURISTICS_MISSES = 3
SEQUENCE_HEURISTICS_MAX_EVERY = 16
#: ``sequence_leaves=None`` (the default) turns them on when ``solve``'s time limit is at least
#: this long: below it the aggregated leaves reach a smaller gap, above it the sequence leaves do
#: (formulations/pipeline_mip.md §5, "Sequence leaves"). With the multi-pipeline level too, whose
#: single-pipeline share closes sooner with them on the communication-bound cases
SEQUENCE_MIN_TIME_S = 50.0
#: leaf solves run in ``threads - 1 + EXTRA_LEAF_WORKERS`` solver processes beside the search
#: (HiGHS's MIP is serial); a worker's solve stops at its time limit, and the search waits this
#: much longer for it
WORKER_GRACE_S = 2.0
#: one worker more than spare cores: when every worker is busy and no window is left to split, the
#: search waits for a worker instead of solving a leaf itself, so no core idles behind a long leaf
#: solve in the search's process (formulations/pipeline_mip.md §5, seventh round); 0: the search
#: solves such leaves itself
EXTRA_LEAF_WORKERS = 1
#: the search prices the candidate tables of its pipeline micro-batch sizes in its worker processes
#: as well as its own when the tables of the first (smallest) size, times the number of sizes,
#: take at least this long (tables.py); starting a worker costs a fraction of a second, which
#: cheaper tables do not repay
PRICE_AHEAD_MIN_S = 2.0
#: share of ``time_limit_s`` the single-pipeline search may use when the multi-pipeline level follows
MULTI_PIPELINE_SINGLE_SHARE = 0.7
#: when the multi-pipeline level ends with at least RESUME_MIN_S left before this share of
#: ``time_limit_s`` and the single-pipeline bound limits the certificate, that search goes on
#: (``BranchAndBound.resume``) until then: the whole limit, where the single-pipeline search alone
#: stops too (its loop ends 0.05 s before; the two levels' plans are then merged in about 0.2 s).
#: At 0.97 the default certificate's search had 1.8 s less than the single-pipeline one at 60 s
#: (formulations/pipeline_mip.md §5, fifteenth round)
RESUME_DEADLINE_SHARE = 1.0
RESUME_MIN_S = 2.0
