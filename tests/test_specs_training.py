"""TrainingSpec: ZeRO byte accounting defaults, loading, and precision against a cluster."""

import pytest

from tangram_opt.errors import SpecError
from tangram_opt.specs import TrainingSpec, check_precision, load_cluster, load_training


def test_mixed_precision_defaults_follow_zero():
    # ZeRO (Rajbhandari et al., SC'20) Sec. 3.1: 2 + 2 + K bytes per parameter with K = 12 for mixed-precision Adam.
    t = TrainingSpec(global_batch_size=512, seq_len=4096)
    assert (t.weight_bytes, t.grad_bytes, t.optimizer_bytes) == (2, 2, 12)
    assert t.weight_bytes + t.grad_bytes + t.optimizer_bytes == 16
    assert t.tokens_per_step == 512 * 4096 and t.activation_bytes == 2


def test_fp32_defaults_and_overrides():
    t = TrainingSpec(global_batch_size=8, seq_len=2048, precision="FP32")
    assert t.precision == "fp32" and (t.weight_bytes, t.grad_bytes, t.optimizer_bytes) == (4, 4, 8)
    t2 = TrainingSpec(global_batch_size=8, seq_len=2048, optimizer_bytes_per_param=0)
    assert t2.optimizer_bytes == 0


def test_load_training_from_every_form(tmp_path):
    t = TrainingSpec(global_batch_size=64, seq_len=2048, precision="fp16")
    assert load_training(t) is t
    assert load_training(t.to_dict()) == t
    (tmp_path / "t.yaml").write_text("global_batch_size: 64\nseq_len: 2048\nprecision: fp16\n")
    assert load_training(tmp_path / "t.yaml") == t
    nested = '{"training": {"global_batch_size": 64, "seq_len": 2048, "precision": "fp16"}}'
    (tmp_path / "nested.json").write_text(nested)
    assert load_training(str(tmp_path / "nested.json")) == t


def test_precision_check_against_cluster():
    bf16 = TrainingSpec(global_batch_size=64, seq_len=2048)
    check_precision(bf16, load_cluster("h100-a100-l4"))  # every GPU has BF16
    check_precision(TrainingSpec(global_batch_size=64, seq_len=2048, precision="fp16"), load_cluster("a100-v100"))
    with pytest.raises(SpecError, match="V100-16") as e:
        check_precision(bf16, load_cluster("tiny-mixed"))
    assert e.value.field == "training.precision"
