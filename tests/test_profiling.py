"""tangram_opt.profiling and ``tangram-opt profile``: measured layer profiles on the local device.

The measuring tests run on the CPU with a small model in fp32 (a few seconds) and need PyTorch
(the ``profile`` extra); they are skipped without it. Input checks and the "torch is missing" path
run everywhere.
"""

from __future__ import annotations

import csv
import inspect
import json
import sys
from pathlib import Path

import pytest

from tangram_opt import TrainingSpec, make_cluster
from tangram_opt.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_UNAVAILABLE, main
from tangram_opt.cost import CostModel, StageConfig, load_profile, load_profiles, model_shape
from tangram_opt.cost.flops import layer_params
from tangram_opt.errors import SpecError
from tangram_opt.profiling import ProfileRequest, check_output_dir, check_request, run_profile
from tangram_opt.specs import list_presets, load_model
from tangram_opt.specs.model import MLASpec, ModelSpec, MoESpec

TORCH_REASON = "measuring layers needs PyTorch: pip install 'tangram_opt[profile]' (CI machine: pip install torch==2.13.0)"

#: big enough that every timed pass takes milliseconds on a CPU (so ordering survives a busy machine),
#: small enough that the whole measurement takes a few seconds
SMALL = {"name": "small-gqa", "num_layers": 2, "hidden_size": 256, "ffn_hidden_size": 768, "num_attention_heads": 4,
         "num_kv_heads": 2, "vocab_size": 1024}
SEQ = 64
MBS = (1, 4)


@pytest.fixture(scope="module")
def torch():  # type: ignore[no-untyped-def]
    return pytest.importorskip("torch", reason=TORCH_REASON)


@pytest.fixture(scope="module")
def measured(torch, tmp_path_factory):  # type: ignore[no-untyped-def]
    """One CPU run of the command line: (profile directory, model, captured stdout/stderr, exit code)."""
    root = tmp_path_factory.mktemp("profile")
    model_file = root / "small.json"
    model_file.write_text(json.dumps(SMALL), encoding="utf-8")
    out = root / "profiles"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: no spinning on a shared CI machine's cores
    try:
        import contextlib
        import io

        so, se = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
            code = main(["profile", "--model", str(model_file), "--gpu-name", "A100-40", "--device", "cpu",
                         "--precision", "fp32", "--seq", str(SEQ), "--micro-batch-sizes", ",".join(map(str, MBS)),
                         "--tp", "1,2", "--warmup", "1", "--repeats", "7", "--output", str(out), "--plain"])
    finally:
        torch.set_num_threads(threads)
    return out, load_model(str(model_file)), so.getvalue(), se.getvalue(), code


def _run_cli(capsys, *argv: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    code = main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


# --- the blocks are the model's blocks ------------------------------------------------------------
def test_block_parameters_match_the_cost_models_layout(torch) -> None:  # type: ignore[no-untyped-def]
    """Every preset's block, per TP rank (and per EP rank for MoE), holds exactly the parameters the
    cost model counts for one GPU (Megatron-LM's sharded/replicated split): the same matrices, so the
    same FLOPs. Built on the meta device: nothing is allocated."""
    from tangram_opt.profiling.blocks import build_layer, parameter_count

    for name in list_presets():
        m = load_model(name)
        for kind in ("dense", "moe"):
            if not m.layers_of_kind(kind):  # type: ignore[arg-type]
                continue
            for tp in (1, 2, 4):
                if m.num_attention_heads % tp or (m.mla is None and m.kv_heads % tp):
                    continue
                for ep in ((1, 2) if kind == "moe" else (1,)):
                    block = build_layer(m, kind, tp=tp, seq_len=128, micro_batch_size=1, ep=ep, device="meta")
                    dense, expert = layer_params(m, kind).per_gpu(tp, ep)
                    assert parameter_count(block) == dense + expert, (name, kind, tp, ep)


def test_embedding_and_head_are_vocab_parallel(torch) -> None:  # type: ignore[no-untyped-def]
    from tangram_opt.profiling.blocks import build_layer, parameter_count

    for name in ("llama-3-8b", "opt-350m", "qwen2-7b"):
        m = load_model(name)
        for tp in (1, 2):
            emb = build_layer(m, "embedding", tp=tp, seq_len=128, micro_batch_size=1, device="meta")
            head = build_layer(m, "head", tp=tp, seq_len=128, micro_batch_size=1, device="meta")
            pos = m.max_position_embeddings * m.hidden_size if m.position_embedding == "learned" else 0
            proj = m.embed_dim * m.hidden_size if m.embed_dim != m.hidden_size else 0
            vocab = m.vocab_size * m.embed_dim // tp
            assert parameter_count(emb) == vocab + pos + proj, (name, tp)
            assert parameter_count(head) == vocab + proj + (m.norm_params if m.final_norm else 0), (name, tp)


def test_moe_routing_is_forced_uniform_and_trains_the_router(torch) -> None:  # type: ignore[no-untyped-def]
    from tangram_opt.profiling.blocks import MoE

    m = ModelSpec(name="moe", num_layers=2, hidden_size=32, ffn_hidden_size=64, num_attention_heads=4, vocab_size=64,
                  moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=16, num_shared_experts=1,
                              shared_expert_gate=True))
    for ep, tokens in ((1, 24), (2, 24), (4, 10)):  # 10 x 2 copies over 2 local experts; 24 x 2 over 4 and 8
        moe = MoE(m, 1, ep, tokens)
        counts = torch.bincount(moe.expert.reshape(-1), minlength=moe.local)
        assert counts.max() - counts.min() <= 1 and int(counts.sum()) == tokens * 2
        x = torch.randn(1, tokens, 32, requires_grad=True)
        moe(x).sum().backward()
        assert moe.router.weight.grad is not None and moe.router.weight.grad.abs().sum() > 0
        assert all(moe.w1.grad[e].abs().sum() > 0 for e in range(moe.local))  # every local expert computed
        assert x.grad is not None and x.grad.abs().sum() > 0


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_every_architecture_runs_forward_and_backward(torch, attention: str) -> None:  # type: ignore[no-untyped-def]
    """MoE with MLA, shared experts and dense-first layers; OPT-style learned positions, LayerNorm,
    biases, ReLU, dropout, a projected embedding and no final norm; Qwen3 Q/K norms."""
    models = [
        ModelSpec(name="mla-moe", num_layers=3, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                  vocab_size=256, moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=32, num_shared_experts=1,
                                              first_dense_layers=1, router_bias=True),
                  mla=MLASpec(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, q_lora_rank=48)),
        ModelSpec(name="opt-like", num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
                  vocab_size=256, mlp_type="relu", norm_type="layernorm", attention_bias="all", mlp_bias=True,
                  position_embedding="learned", max_position_embeddings=64, embedding_dim=32, final_norm=False,
                  attention_dropout=0.1, hidden_dropout=0.1),
        ModelSpec(name="qwen3-like", num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                  num_kv_heads=2, head_dim=32, qk_norm=True, vocab_size=256, attention_bias="qkv"),
    ]
    for m in models:
        res = run_profile(ProfileRequest(model=m, seq_len=16, micro_batch_sizes=(1, 2), tp=(1, 2), gpu="H100",
                                         precision="fp32", device="cpu", attention=attention, warmup=0, repeats=1))
        kinds = {e.kind for e in res.profile.entries}
        assert kinds == {k for k in ("dense", "moe") if m.layers_of_kind(k)} | {"embedding", "head"}  # type: ignore
        assert len(res.profile.entries) == len(kinds) * 4
        assert all(e.fwd_time_s > 0 and e.bwd_time_s > 0 for e in res.profile.entries)
        assert res.profile.gpu == "H100-SXM" and not res.profile.includes_tp_comm
        assert attention in res.profile.source
        if m.moe is not None:
            assert "routing forced uniform" in res.profile.source


# --- the command writes what the planner reads -------------------------------------------------------
def test_profile_command_writes_a_loadable_profile(measured) -> None:  # type: ignore[no-untyped-def]
    out, model, stdout, stderr, code = measured
    assert code == EXIT_OK, stderr
    files = sorted(out.glob("*.json"))
    assert [f.name for f in files] == ["small-gqa_a100-40_fp32_seq64.json"]
    prof = load_profile(files[0])
    assert (prof.model, prof.gpu, prof.seq_len, prof.precision) == ("small-gqa", "A100-40", SEQ, "fp32")
    assert prof.includes_tp_comm is False and prof.sequence_parallel is False
    assert dict(prof.model_shape or {}) == model_shape(model)
    assert "sdpa" in prof.source and "without TP communication" in prof.source
    assert {(e.kind, e.tp, e.micro_batch_size) for e in prof.entries} == {
        (k, tp, mb) for k in ("dense", "embedding", "head") for tp in (1, 2) for mb in MBS}
    assert all(e.fwd_time_s > 0 and e.bwd_time_s > 0 for e in prof.entries)
    assert len(load_profiles(out)) == 1  # the directory is a profile set as written
    rows = (out / "small-gqa_a100-40_fp32_seq64.measurements.csv").read_text().splitlines()
    assert rows[0].startswith("kind,tp,micro_batch_size,fwd_s,bwd_s") and len(rows) == 1 + len(prof.entries)
    assert "dense" in stdout and "fwd ms" in stdout  # the results table
    assert "profile written" in stderr and "--profiles" in stderr


def _fastest(out: Path) -> dict[tuple[str, int, int], tuple[float, float]]:
    """(fastest forward, fastest backward) pass per entry, from the raw measurements beside the profile:
    on a busy CI machine the other processes only ever add time, so the minimum is the steadiest figure."""
    rows = list(csv.DictReader(next(out.glob("*.measurements.csv")).open(encoding="utf-8")))
    return {(r["kind"], int(r["tp"]), int(r["micro_batch_size"])): (float(r["fwd_min_s"]), float(r["bwd_min_s"]))
            for r in rows}


def test_backward_takes_longer_than_forward_for_the_block(measured) -> None:  # type: ignore[no-untyped-def]
    prof = load_profile(next(measured[0].glob("*.json")))
    dense = [e for e in prof.entries if e.kind == "dense"]
    assert sum(e.bwd_time_s for e in dense) > sum(e.fwd_time_s for e in dense)  # the medians in the file
    # the fastest passes, summed over the entries: one tiny entry's pair can swap on a busy machine
    # (the backward does about twice the forward's work, so the sums cannot)
    fastest = [(f, b) for (kind, _, _), (f, b) in _fastest(measured[0]).items() if kind == "dense"]
    assert sum(b for _, b in fastest) > sum(f for f, _ in fastest), fastest


def test_times_grow_with_the_micro_batch_size(measured) -> None:  # type: ignore[no-untyped-def]
    prof = load_profile(next(measured[0].glob("*.json")))
    fastest = _fastest(measured[0])
    for kind in ("dense", "head"):
        small = sum(sum(prof.lookup(kind, tp, MBS[0]) or (0.0,)) for tp in (1, 2))  # the medians in the file
        big = sum(sum(prof.lookup(kind, tp, MBS[-1]) or (0.0,)) for tp in (1, 2))
        assert big > small, (kind, small, big)
        for tp in (1, 2):
            assert sum(fastest[kind, tp, MBS[-1]]) > sum(fastest[kind, tp, MBS[0]]), (kind, tp)


def test_cost_model_uses_the_measured_times(measured) -> None:  # type: ignore[no-untyped-def]
    out, model, *_ = measured
    profiles = load_profiles(out)
    training = TrainingSpec(global_batch_size=8, seq_len=SEQ, precision="fp32")
    node = make_cluster("one", [{"gpu": "A100-40", "nodes": 1, "gpus_per_node": 2, "nic_gbps": 100}]).node_groups[0].node
    cost = CostModel(model, training, profiles=profiles)
    prof = next(iter(profiles))
    for tp in (1, 2):
        for mb in MBS:
            layer = cost.layer(node, StageConfig(tp=tp, micro_batch_size=mb, sequence_parallel=False), "dense")
            assert layer.breakdown["profiled"] == 1.0
            assert (layer.breakdown["compute_fwd"], layer.breakdown["compute_bwd"]) == prof.lookup("dense", tp, mb)
            # the profile holds one rank's compute only: TP all-reduces come from the link model
            assert (layer.breakdown["tp_comm"] > 0) == (tp > 1)
    analytical = CostModel(model, training).layer(node, StageConfig(tp=1, micro_batch_size=1), "dense")
    assert analytical.breakdown["profiled"] == 0.0
    # another sequence length does not match the profile: computed again, not silently mis-used
    other = CostModel(model, TrainingSpec(global_batch_size=8, seq_len=2 * SEQ, precision="fp32"), profiles=profiles)
    assert other.layer(node, StageConfig(tp=1, micro_batch_size=1), "dense").breakdown["profiled"] == 0.0


def test_solve_plans_with_the_profiles(measured) -> None:  # type: ignore[no-untyped-def]
    from tangram_opt.planner import search
    from tangram_opt.planner.space import SearchSpace

    out, model, *_ = measured
    cluster = make_cluster("two-a100", [{"gpu": "A100-40", "nodes": 1, "gpus_per_node": 2, "nic_gbps": 100}])
    training = TrainingSpec(global_batch_size=8, seq_len=SEQ, precision="fp32")
    space = SearchSpace(tp=(1, 2), cp=(1,), micro_batch_sizes=MBS)
    if "profiles" in inspect.signature(search.solve).parameters:
        plan = search.solve(cluster, model, training, time_limit_s=20, space=space, profiles=out)
    else:  # a cost model with the profiles behind the candidate tables (the public provider= argument)
        from tangram_opt.planner.candidates import AnalyticalCandidates

        cost = CostModel(model, training, profiles=load_profiles(out))
        plan = search.solve(cluster, model, training, time_limit_s=20, space=space,
                            provider=AnalyticalCandidates(model, cost, space))
    computed = search.solve(cluster, model, training, time_limit_s=20, space=space)
    prof = next(iter(load_profiles(out)))
    for stage in (s for p in plan.pipelines for s in p.stages):
        fwd, _ = prof.lookup("dense", stage.tp, stage.micro_batch_size)  # type: ignore[misc]
        assert stage.fwd_time_s >= stage.num_dense_layers * fwd
    # CPU times under an A100 label are far slower than the A100's computed times
    assert plan.step_time_s > computed.step_time_s


# --- bad inputs --------------------------------------------------------------------------------------
def _tiny() -> ModelSpec:
    return ModelSpec(name="tiny", num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
                     num_kv_heads=2, vocab_size=128)


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"tp": (1, 3)}, "tp", "does not divide the 4 attention heads"),
    ({"tp": (4,)}, "tp", "does not divide the 2 key/value heads"),
    ({"micro_batch_sizes": ()}, "micro_batch_sizes", "is empty"),
    ({"micro_batch_sizes": (0, 1)}, "micro_batch_sizes", ">= 1"),
    ({"tp": ()}, "tp", "is empty"),
    ({"seq_len": 0}, "seq_len", ">= 1"),
    ({"ep": 2}, "ep", "dense model"),
    ({"kinds": ("moe",)}, "kinds", "has no moe layers"),
    ({"kinds": ("attention",)}, "kinds", "is not a layer kind"),
    ({"precision": "int8"}, "precision", "is not a precision"),
    ({"attention": "flash3"}, "attention", "is not an attention implementation"),
    ({"gpu": "A100-41"}, "gpu", "is not a known GPU type"),
    ({"gpu": "V100-16", "precision": "bf16"}, "gpu_precision", "has no bf16"),
    ({"device": "tpu"}, "device", "is not a device"),
    ({"repeats": 0}, "repeats", ">= 1"),
])
def test_bad_requests_are_refused_naming_the_field(change: dict, field: str, words: str) -> None:
    req = ProfileRequest(**{"model": _tiny(), "seq_len": 32, **change})
    with pytest.raises(SpecError) as e:
        check_request(req)
    assert e.value.field == ("precision" if field == "gpu_precision" else field)
    assert words in str(e.value) and e.value.fix


def test_unwritable_output_is_refused_before_measuring(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for bad in (blocker, blocker / "sub"):
        with pytest.raises(SpecError) as e:
            check_output_dir(bad)
        assert e.value.field == "output_dir"


def _model_file(tmp_path: Path, **over: object) -> str:
    p = tmp_path / "tiny.json"
    p.write_text(json.dumps({**_tiny().to_dict(), **over}), encoding="utf-8")
    return str(p)


@pytest.mark.parametrize(("args", "flag", "words"), [
    (["--tp", "3"], "--tp", "does not divide"),
    (["--micro-batch-sizes", "0"], "--micro-batch-sizes", ">= 1"),
    (["--gpu-name", "A100-41"], "--gpu-name", "is not a known GPU type"),
    (["--gpu-name", "V100-16", "--precision", "bf16"], "--precision", "fp16"),
    (["--seq", "100"], "--seq", "learned positions"),
    (["--warmup", "-1"], "--warmup", ">= 0"),
])
def test_cli_names_the_flag_and_exits_2(capsys, tmp_path: Path, args: list[str], flag: str, words: str) -> None:  # type: ignore[no-untyped-def]
    model = _model_file(tmp_path, position_embedding="learned", max_position_embeddings=64)
    base = ["profile", "--model", model, "--gpu-name", "A100-40", "--device", "cpu", "--seq", "32",
            "--output", str(tmp_path / "out")]
    code, _, err = _run_cli(capsys, *base, *args)
    assert code == EXIT_BAD_INPUT
    # the profiler names the flag and its fix; a list flag's values are refused by the parser first
    assert words in err and ((f"{flag} = " in err and "Fix:" in err) or f"argument {flag}:" in err)


def test_cli_refuses_unknown_model_empty_sizes_and_unwritable_output(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    model = _model_file(tmp_path)
    code, _, err = _run_cli(capsys, "profile", "--model", "llama-9000", "--gpu-name", "A100-40", "--output",
                            str(tmp_path))
    assert code == EXIT_BAD_INPUT and "llama-9000" in err
    code, _, err = _run_cli(capsys, "profile", "--model", model, "--micro-batch-sizes", "", "--output", str(tmp_path))
    assert code == EXIT_BAD_INPUT and "--micro-batch-sizes" in err
    code, _, err = _run_cli(capsys, "profile", "--model", model, "--gpu-name", "A100-40", "--device", "cpu",
                            "--output", str(blocker / "sub"))
    assert code == EXIT_BAD_INPUT and "--output = " in err and "cannot be written" in err


def test_cli_without_torch_says_how_to_install_it(capsys, monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "torch", None)  # "import torch" now raises ImportError
    code, _, err = _run_cli(capsys, "profile", "--model", _model_file(tmp_path), "--gpu-name", "A100-40",
                            "--device", "cpu", "--seq", "32", "--output", str(tmp_path / "out"))
    assert code == EXIT_UNAVAILABLE
    assert "pip install 'tangram_opt[profile]'" in err


def test_cpu_refuses_what_it_cannot_measure(torch, capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = _model_file(tmp_path)
    base = ["profile", "--model", model, "--seq", "32", "--output", str(tmp_path / "out"), "--device", "cpu"]
    code, _, err = _run_cli(capsys, *base)  # no --gpu-name: what would the file stand for?
    assert code == EXIT_BAD_INPUT and "--gpu-name = None" in err
    code, _, err = _run_cli(capsys, *base, "--gpu-name", "A100-40", "--precision", "tf32")
    assert code == EXIT_BAD_INPUT and "--precision = 'tf32'" in err and "fp32" in err
    if not torch.cuda.is_available():
        code, _, err = _run_cli(capsys, *base[:-2], "--device", "cuda", "--gpu-name", "A100-40")
        assert code == EXIT_BAD_INPUT and "--device = 'cuda'" in err


def test_profile_help_has_examples(capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = _run_cli(capsys, "profile", "--help")
    assert code == EXIT_OK and "examples:" in out and "--profiles" in out
