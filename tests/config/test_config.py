"""memlib.config: TrainingConfig's derived sizes, its coercions and its one-line errors; the strategies' rules;
model loading's errors.  Hand-worked values only."""
from fractions import Fraction

import pytest

from memlib.config import PAPER_TRAINING, ConfigError, TrainingConfig, load_model
from memlib.config.strategies import AttnBackend, Runtime, Schedule, TransformerImpl, ZeroStage


def test_the_papers_configuration():
    t = PAPER_TRAINING
    assert t.label() == "PP16@TP2@EP8@ETP1"
    assert t.world_size == 1024                      # 32 x 2 x 1 x 16
    assert t.edp == 8                                # 32 x 2 x 1 / (8 x 1)
    assert TrainingConfig(dp=4, tp=2, cp=2, ep=4, etp=2).edp == 2
    assert TrainingConfig(dp=4, tp=2, cp=2).dp_cp == 8 and t.dp_cp == 32
    assert TrainingConfig(pp=2, cp=4).label() == "PP2@TP1@EP1@ETP1@CP4"


def test_spellings_become_types():
    t = TrainingConfig(zero=2, schedule="dualpipe", pp=2, transformer_impl="local", attention_backend="local",
                       runtime="cpu", sp=False, tp=2, layout=[1, 2], routing_imbalance=Fraction(5, 4))
    assert t.zero is ZeroStage.OS_G and t.schedule is Schedule.DUALPIPE
    assert t.transformer_impl is TransformerImpl.LOCAL and t.attention_backend is AttnBackend.LOCAL
    assert t.runtime is Runtime.CPU and t.layout == (1, 2)
    v = t.values()
    assert (v["zero"], v["schedule"], v["transformer_impl"], v["layout"]) == (2, "dualpipe", "local", [1, 2])
    assert v["routing_imbalance"] == "5/4" and v["edp"] == 2 and v["world_size"] == 4


def test_with_validates_again():
    with pytest.raises(ConfigError, match="dp=0 must be a positive integer"):
        PAPER_TRAINING.with_(dp=0)


@pytest.mark.parametrize("kw, needle", [
    (dict(dp=0), "dp=0 must be a positive integer"),
    (dict(tp=True), "tp=True must be a positive integer"),
    (dict(ep=2.0), "ep=2.0 must be a positive integer"),
    (dict(cp=2**30 + 1), r"cp=1073741825 exceeds 2\^30"),
    (dict(pp=2**8, vpp=2**9, schedule="interleaved"), r"pp\*vpp=131072 exceeds 2\^16"),
    (dict(zero=4), "zero=4 must be one of 0, 1, 2, 3"),
    (dict(zero=True), "zero=True must be one of"),
    (dict(schedule="zigzag"), "schedule='zigzag' must be one of gpipe, 1f1b, interleaved, dualpipe"),
    (dict(sp=1), "sp=1 must be true or false"),
    (dict(layout=(4, -1)), "layout=4,-1 must be non-negative integers"),
    (dict(num_microbatches=0), "num_microbatches=0 must be a positive integer or null"),
    (dict(fp8="e5m2"), "fp8='e5m2' must be one of e4m3, hybrid or None"),
    (dict(fp8_recipe="fast"), "fp8_recipe='fast' must be one of"),
    (dict(offload_modules="core_attn"), "must be a tuple of module names"),
    (dict(offload_modules=("attn_proj",)), "attn_proj needs core_attn"),
    (dict(offload_modules=("core_attn", "core_attn")), "a module is named twice"),
    (dict(overlap_param_gather=True), "needs overlap_grad_reduce=True"),
    (dict(overlap_param_gather=True, overlap_grad_reduce=True), "needs zero >= 1"),
    (dict(routing_imbalance=Fraction(1, 2)), "routing_imbalance=1/2 must be >= 1"),
    (dict(routing_imbalance=1.25), "must be an exact number"),
    (dict(transformer_impl="local", attention_backend="flash"), "attention_backend=flash needs transformer_impl"),
    (dict(transformer_impl="local", tp=2), "does not support sequence parallelism; pass --no-sp"),
    (dict(transformer_impl="local", cp=2, sp=False), "supports no context parallelism"),
    (dict(transformer_impl="thunder"), "transformer_impl='thunder' must be one of"),
])
def test_bad_training_is_one_line_naming_the_field(kw, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        TrainingConfig(**kw)
    assert "\n" not in str(e.value)


def test_zero_stages_shard_more_as_they_rise():
    table = {z: tuple(z.shards(s) for s in ("optimizer_states", "gradients", "parameters")) for z in ZeroStage}
    assert table == {ZeroStage.NONE: (False, False, False), ZeroStage.OS: (True, False, False),
                     ZeroStage.OS_G: (True, True, False), ZeroStage.OS_G_PARAMS: (True, True, True)}
    assert [z.label for z in ZeroStage] == ["none", "os", "os+g", "os+g+params"]


def test_which_chunks_a_rank_holds():
    assert Schedule.ONE_F_ONE_B.rank_chunks(2, 4, 1) == (2,)
    assert Schedule.INTERLEAVED.rank_chunks(1, 4, 3) == (1, 5, 9)     # virtual stages r, PP + r, 2 PP + r
    assert Schedule.DUALPIPE.rank_chunks(0, 8, 1) == (0, 7)            # a stage and its mirror
    assert Schedule.DUALPIPE.rank_chunks(5, 8, 1) == (2, 5)
    assert Schedule.INTERLEAVED.chunks(4, 3) == 12 and Schedule.GPIPE.chunks(4, 3) == 4
    assert [s.parameter_copies for s in Schedule] == [1, 1, 1, 2]


@pytest.mark.parametrize("kw, needle", [
    (dict(schedule="interleaved", pp=4), r"needs vpp >= 2"),
    (dict(schedule="interleaved", pp=4, vpp=2, num_microbatches=6), "must be a multiple of pp=4"),
    (dict(vpp=2, pp=4), "vpp=2 needs schedule=interleaved"),
    (dict(schedule="dualpipe", pp=3), "pp=3 must be even"),
    (dict(schedule="dualpipe", pp=4, num_microbatches=7), "must be even and at least 2\\*pp=8"),
    (dict(schedule="gpipe", pp=4), "give num_microbatches"),
])
def test_the_schedules_rules(kw, needle):
    t = TrainingConfig(**kw)
    with pytest.raises(ConfigError, match=needle):
        t.schedule.check(t)


def test_schedules_that_pass_their_rules():
    for kw in (dict(schedule="interleaved", pp=4, vpp=2, num_microbatches=8), dict(schedule="dualpipe", pp=4),
               dict(schedule="dualpipe", pp=4, num_microbatches=8), dict(schedule="gpipe", pp=2, num_microbatches=1)):
        t = TrainingConfig(**kw)
        t.schedule.check(t)


def test_loading_a_model_names_what_is_wrong(tmp_path):
    assert load_model("DeepSeek-V3").name == "deepseek-v3"           # presets by any case
    with pytest.raises(ConfigError, match="model='no-such-model' is neither a known preset"):
        load_model("no-such-model")
    bad = tmp_path / "config.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="the file must hold a JSON object"):
        load_model(bad)
    bad.write_text("{")
    with pytest.raises(ConfigError, match="cannot read it as JSON"):
        load_model(bad)
    bad.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_model(bad)
