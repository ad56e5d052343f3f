"""The pipeline input pairs: what a pipeline stage keeps after the optimizer step (issue 22).

Each model chunk fed by the previous pipeline stage keeps the last micro-batch's received activation
(``TransformerBlock.set_input_tensor``) and, after the backward, that leaf's gradient: two [s/CP/(TP with SP), b, h]
tensors in the pipeline dtype, until the chunk's next forward.  Hand-worked on a GPT-3 shell (h 512, s 1024, b 4,
bf16): 2 x 1024 x 4 x 512 x 2 B = 8 MiB a chunk.  The measured post-step allocations of Megatron-LM's functional
tests show it: a TP4 PP2 test logs exactly 8 MiB + 3 KiB more than memlib's account without the pair.

And the micro-batches of the step that RerunDataIterator saves for a rerun: from Megatron-LM 5e4fc931ba
(2026-05-21) get_batch moves the saved dict itself to the GPU, until bf32f4415e (2026-07-06) saves a copy; the
goldens written on 2026-05-30 keep 4.11 MiB (one micro-batch of a PP1 run) and 16.19 MiB (four of a last stage)
more than those written before.
"""
from __future__ import annotations

import pytest

from memlib.device import megatron_buffers as mb
from memlib.device.estimate import estimate
from memlib.device.overhead import Overheads
from memlib.megatron.flags import parse_megatron_config
from memlib.model.partition import Partition

MiB = 2**20
GPT = {"--num-layers": 12, "--hidden-size": 512, "--num-attention-heads": 8, "--seq-length": 1024,
       "--max-position-embeddings": 1024, "--micro-batch-size": 4, "--global-batch-size": 32, "--bf16": True,
       "--pipeline-model-parallel-size": 4, "--transformer-impl": "transformer_engine"}


def run(world: int = 8, overrides=None, **flags):
    return parse_megatron_config({**GPT, **flags}, {}, name="gpt", world_size=world, overrides=overrides or {})


def pairs(r) -> list[int]:
    part = Partition(r.model, r.train)
    return [mb.framework_memory(part, i).evaluate()["pipeline_input_tensors"] for i in range(r.train.pp)]


def test_pairs_by_hand():
    # 1F1B: every stage but the first receives; one chunk each
    assert pairs(run()) == [0, 8 * MiB, 8 * MiB, 8 * MiB]
    # interleaved, 3 chunks a rank: the first rank's first chunk holds the embedding and receives nothing
    r = run(**{"--num-layers-per-virtual-pipeline-stage": 1})
    assert r.train.vpp == 3 and pairs(r) == [16 * MiB, 24 * MiB, 24 * MiB, 24 * MiB]
    # sequence parallelism and context parallelism shorten the received sequence: 1024 / 2 / 2 rows
    r = run(32, **{"--tensor-model-parallel-size": 2, "--sequence-parallel": True, "--context-parallel-size": 2})
    assert pairs(r) == [0, 2 * MiB, 2 * MiB, 2 * MiB]
    # no pipeline, no pair
    assert pairs(run(**{"--pipeline-model-parallel-size": 1})) == [0]


def _peak(r):
    est = estimate(r.model, r.train, Overheads(0, 0, 0), framework=r.framework)
    return est.peak_of(r.train.pp - 1)


def test_the_pair_at_the_peak():
    # 1F1B with 4 micro-batches: the backwarded micro-batch's pair lives through the next forward (the loop's
    # output_tensor keeps its graph): at the peak as after the step
    p = _peak(run())
    assert p.persistent["pipeline_input_tensors"] == 8 * MiB and "pipeline_inputs_replaced" not in p.activations
    # one micro-batch: the step's only forward replaced the previous step's pair
    p = _peak(run(**{"--global-batch-size": 8}))
    assert p.activations["pipeline_inputs_replaced"] == -8 * MiB
    # interleaved: at the peak every chunk holds a micro-batch in flight, whose input is among its activations
    p = _peak(run(**{"--num-layers-per-virtual-pipeline-stage": 1}))
    assert all(p.moment.counts) and p.activations["pipeline_inputs_replaced"] == -24 * MiB


@pytest.mark.parametrize("test,file,gap", [
    ("gpt3_mcore_te_tp4_pp2_resume_torch_dist_reshard_8x1xNone", "golden_values_dev_dgx_h100.json", 3072),
    ("gpt3_mcore_te_tp4_pp2_resume_torch_dist_reshard_8x1xNone", "golden_values_dev_dgx_gb200.json", 3072),
    ("gpt3_7b_tp1_pp4_memory_speed", "golden_values_dev_dgx_a100.json", -8704),       # 8 chunks x 128 MiB
    # --offload-modules attn_norm frees the received input of the three chunks with layers: 4 gradients and the
    # input of the layerless last chunk, 20 MiB of [2048, 1, 1024] bf16 (32 MiB would leave -12 MiB)
    ("gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_no_mtp_no_a2a_ovlp_fine_grained_offloading",
     "golden_values_dev_dgx_h100.json", 9728),
])
def test_post_step_allocation_explained(test, file, gap):
    """The logged post-step allocation of the last rank minus memlib's persistent account: 8 MiB and 1 GiB
    before the pair was counted."""
    from memlib.scenarios.functional import cases

    (c,) = [c for c in cases() if c.golden.test == test and c.golden.file == file]
    assert c.post_step_gap == gap


# ------------------------------------------------------------------------------------------------
# the micro-batches RerunDataIterator keeps (Megatron-LM from 5e4fc931ba until bf32f4415e)
# ------------------------------------------------------------------------------------------------
BUGGY = "6e091e1b68@2026-05-30"


def saved(r, **framework) -> list[int]:
    part = Partition(r.model, r.train)
    opts = {"attention_mask_in_batch": r.framework.attention_mask_in_batch, "rerun_mode": r.framework.rerun_mode,
            **framework}
    return [mb.framework_memory(part, i, **opts).evaluate()["rerun_saved_batches"] for i in range(r.train.pp)]


def test_saved_micro_batches_by_hand():
    """4 micro-batches a step (GBS 32 = 4 x b 4 x DP 2); [4, 1024] int64 tokens, labels, position_ids (32 KiB),
    fp32 loss_mask (16 KiB), bool [4, 1, 1024, 1024] attention mask (4 MiB); the last stage drops tokens and
    position_ids, the first labels and loss_mask, the middle stages read nothing."""
    KiB = 1024
    r = run(overrides={"megatron_version": BUGGY})
    assert saved(r) == [4 * (4 * MiB + 64 * KiB), 0, 0, 4 * (4 * MiB + 48 * KiB)]
    # one stage, one micro-batch a step (DP 8): all five
    r = run(overrides={"megatron_version": BUGGY}, **{"--pipeline-model-parallel-size": 1})
    assert saved(r) == [4 * MiB + 112 * KiB]
    # without the mask in the batch, with the rerun machine off, on a TP rank that does not read the loader
    r = run(overrides={"megatron_version": BUGGY})
    assert saved(r, attention_mask_in_batch=False)[-1] == 4 * 48 * KiB
    assert saved(r, rerun_mode="disabled") == saved(r, data_loading_rank=False) == [0, 0, 0, 0]
    # the versions: core_r0.18.0 keeps them; the pinned commit and core_r0.19.0 save a copy of the host batch
    assert saved(run(overrides={"megatron_version": "core_r0.18.0"}))[-1] == 4 * (4 * MiB + 48 * KiB)
    assert saved(run()) == saved(run(overrides={"megatron_version": "core_r0.19.0"})) == [0, 0, 0, 0]


def test_the_saved_mask_is_not_counted_twice():
    r = run(overrides={"megatron_version": BUGGY})
    p = _peak(r)
    assert p.persistent["rerun_saved_batches"] == 4 * (4 * MiB + 48 * 1024)
    assert p.transient["batch_attention_mask"] == 0
    assert _peak(run()).transient["batch_attention_mask"] == 4 * MiB


@pytest.mark.parametrize("test,file", [
    ("gpt3_mcore_te_tp1_pp1_dist_optimizer_fim_dataset", "golden_values_dev_dgx_gb200.json"),   # 1 micro-batch
    ("gpt3_mcore_te_tp1_pp4_vp1", "golden_values_dev_dgx_gb200.json"),                         # 4, 3 chunks
])
def test_the_step_of_2026_05_30_explained(test, file):
    """Goldens written at 6e091e1b68 (2026-05-30): 4.11 MiB and 16.19 MiB more after the step than before it."""
    from memlib.scenarios.functional import cases

    (c,) = [c for c in cases() if c.golden.test == test and c.golden.file == file]
    assert c.golden.values_date == "2026-05-30" and c.post_step_gap == 3072


# ------------------------------------------------------------------------------------------------
# ground truth: Megatron-Core's own 1F1B schedule over two pipeline ranks on the CPU
# ------------------------------------------------------------------------------------------------
from test_measure_megatron import mcore  # noqa: E402,F401  (skips without megatron-core; fails under CI)


def _pipeline_run(tmp_path, req) -> list[dict]:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path / "requests.json"
    path.write_text(json.dumps([req]))
    worker = Path(__file__).resolve().parents[1] / "megatron_pipeline_worker.py"
    outs = [tmp_path / f"out{r}.json" for r in range(2)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(worker), str(path), str(outs[r]), "2", str(r),
                               str(tmp_path / "store")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for r in range(2)]
    errs = [p.communicate(timeout=600)[1] for p in procs]
    assert not any(p.returncode for p in procs), [e[-2000:] for e in errs]
    return [json.loads(o.read_text()) for o in outs]


def test_megatron_core_keeps_the_pair(mcore, tmp_path):
    """Two steps of forward_backward_pipelining_without_interleaving (gloo p2p, 4 micro-batches of [8, 2, 64]
    bf16): the last stage keeps its last received input and that input's gradient after the step, the first stage
    nothing; and at each forward after the first the input received before the current one is still alive (the
    loop's output_tensor keeps its graph), the earlier ones are not."""
    from test_megatron_buffers import SMALL, _request, _train

    from memlib.config import model_from_dict

    first, last = _pipeline_run(tmp_path, _request(2, 2, 1))
    assert first["chunks"] == [{"input": None, "grad": None}]
    pair = {"shape": [8, 2, 64], "dtype": "bfloat16", "nbytes": 8 * 2 * 64 * 2}
    assert last["chunks"] == [{"input": pair, "grad": pair}]
    assert last["alive"] == [[], [True], [False, True], [False, False, True]]
    # memlib's term for the same rank: the pair of its one chunk
    part = Partition(model_from_dict(SMALL, "small"), _train(2, 2, 1))
    assert mb.framework_memory(part, 1).evaluate()["pipeline_input_tensors"] == 2 * pair["nbytes"]
    assert mb.framework_memory(part, 0).evaluate()["pipeline_input_tensors"] == 0


def test_megatron_core_keeps_a_pair_per_chunk_interleaved(mcore, tmp_path):
    """The interleaved schedule, two chunks a rank (4 layers, no MTP): after the step every chunk but the model's
    first keeps its pair, as memlib counts them."""
    from test_megatron_buffers import SMALL, _request

    from memlib.config import TrainingConfig, model_from_dict

    req = _request(2, 2, 1)
    req["model"]["num_nextn_predict_layers"] = 0
    req["train"].update(vpp=2, schedule="interleaved")
    first, last = _pipeline_run(tmp_path, req)
    pair = {"shape": [8, 2, 64], "dtype": "bfloat16", "nbytes": 8 * 2 * 64 * 2}
    assert first["chunks"] == [{"input": None, "grad": None}, {"input": pair, "grad": pair}]
    assert last["chunks"] == [{"input": pair, "grad": pair}] * 2
    part = Partition(model_from_dict({**SMALL, "num_nextn_predict_layers": 0}, "small"), TrainingConfig(
        dp=1, pp=2, vpp=2, schedule="interleaved", ep=1, profile="megatron", transformer_impl="local",
        precision="megatron", micro_batch=2, seq_len=8, zero=1))
    assert [mb.framework_memory(part, r).evaluate()["pipeline_input_tensors"] for r in (0, 1)] == [
        2 * pair["nbytes"], 4 * pair["nbytes"]]
