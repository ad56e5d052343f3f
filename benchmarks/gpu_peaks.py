"""On a CUDA GPU: the caching allocator's own peak for Megatron-Core training steps.

Each case is one model and one training configuration, run in a fresh process on one GPU (world size 1,
NCCL initialised in-process) as ``pretrain_gpt.py`` runs it: Megatron-Core's ``GPTModel`` from the local
spec (``--transformer-impl local``: no Transformer Engine or Apex on the machine), bf16 (``Float16Module``),
Megatron's ``DistributedDataParallel`` with the distributed optimizer (fp32 gradient buffer), Adam, and
two iterations of Megatron-LM's ``train_step`` (zero the buffers, M micro-batches through
``get_forward_backward_func()``, ``finalize_model_grads``, the optimizer step).  The model is built by
:func:`memlib.measure.megatron_model._build`, the same builder the CPU measurement uses.

Per case it records ``max_memory_allocated`` and ``max_memory_reserved`` of each iteration, the allocation
after each optimizer step, and a memory history of the second (steady) iteration reduced to the live blocks
at the peak, grouped by the Python line that allocated them; and ``memlib_args``, the ``memlib estimate``
arguments that describe the run.  A separate case measures the loss region alone (the native fused
cross-entropy, the unfused one) in units of one bf16 logits tensor.

Stand-ins for what the machine lacks, and why they do not move the peak: torch's fused AdamW for
Transformer Engine's ``FusedAdam`` (both update in place; megatron-core falls back to torch's AdamW);
gradient-accumulation fusion off (it needs Apex's ``fused_weight_gradient_mlp_cuda``): each Linear's
weight gradient is a bf16 tensor that DDP's hook adds into ``main_grad``; RoPE fusion, the permutation
fusion and grouped GEMM off (they need Transformer Engine).  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``
(memlib's default); the garbage collector runs between iterations only (``--manual-gc``), so that
frees happen when the last reference goes.

    python benchmarks/gpu_peaks.py [--out DIR] [--only NAME,...] [--budget SECONDS]
    python benchmarks/gpu_peaks.py --cpu-check      # the same steps on the CPU at tiny sizes (nothing measured)
    python benchmarks/gpu_peaks.py --rewrite FILE   # a measured FILE's config and memlib_args from CASES again
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: the models, as Hugging Face config.json fields (written beside the results; memlib_args name them)
MODELS = {
    # DeepSeek-V3-style: MLA with q and kv LoRA, one dense layer then MoE layers with a shared expert,
    # sigmoid routing with the expert bias, one MTP module
    "ds-moe": {"model_type": "deepseek_v3", "hidden_size": 2048, "intermediate_size": 8192,
               "moe_intermediate_size": 1024, "num_attention_heads": 16, "qk_nope_head_dim": 128,
               "qk_rope_head_dim": 64, "v_head_dim": 128, "q_lora_rank": 768, "kv_lora_rank": 256,
               "n_routed_experts": 32, "n_shared_experts": 1, "num_experts_per_tok": 4, "num_hidden_layers": 6,
               "first_k_dense_replace": 1, "vocab_size": 129280, "n_group": 1, "topk_group": 1,
               "num_nextn_predict_layers": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
               "norm_topk_prob": True, "tie_word_embeddings": False},
    # Llama-3-style: grouped-query attention, SwiGLU, RMSNorm, RoPE, a 128k vocabulary
    "llama-gqa": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
                  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 8,
                  "vocab_size": 128256, "tie_word_embeddings": False, "max_position_embeddings": 8192},
    # Mixtral-style: GQA and 8 experts, top-2, no shared expert
    "mixtral-moe": {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 7168,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 4,
                    "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
                    "tie_word_embeddings": False, "max_position_embeddings": 32768},
}

#: name, model, training options (memlib TrainingConfig fields beside the common ones), micro-batches
CASES = [
    ("ds-none-native", "ds-moe", dict(micro_batch=2, recompute="none", cross_entropy_loss_fusion=True), 2),
    ("llama-none-native", "llama-gqa", dict(micro_batch=1, recompute="none", cross_entropy_loss_fusion=True), 2),
    ("mixtral-none-unfused", "mixtral-moe", dict(micro_batch=1, recompute="none", moe_aux_loss="aux_loss"), 2),
    ("ds-selective-unfused", "ds-moe", dict(micro_batch=2, recompute="selective"), 2),
    ("llama-selective-unfused", "llama-gqa", dict(micro_batch=2, recompute="selective"), 2),
    ("ds-full-native", "ds-moe", dict(micro_batch=4, recompute="full", cross_entropy_loss_fusion=True), 2),
    ("llama-full-native", "llama-gqa", dict(micro_batch=4, recompute="full", cross_entropy_loss_fusion=True), 2),
    ("mixtral-full-native", "mixtral-moe", dict(micro_batch=2, recompute="full", moe_aux_loss="aux_loss",
                                                cross_entropy_loss_fusion=True), 2),
]
SEQ_LEN = 4096
#: the training options every case shares (memlib TrainingConfig fields)
COMMON = dict(dp=1, tp=1, pp=1, ep=1, etp=1, cp=1, profile="megatron", precision="megatron", zero=1,
              transformer_impl="local", attention_backend="local", seq_len=SEQ_LEN)
#: the loss-region case: logits [s, b, v] bf16
LOSS_REGION = dict(seq_len=SEQ_LEN, micro_batch=2, vocab_size=129280)
#: the framework the machine allows (memlib.device.peak.Framework fields)
FRAMEWORK = dict(gradient_accumulation_fusion=False, rope_fusion=False, moe_grouped_gemm=False,
                 token_dispatcher="alltoall", permute_fusion=False, expandable_segments=True)


def case_config(name: str) -> dict:
    """What case ``name`` ran, as memlib's inputs: the model file (memlib/data/gpu_peaks/), the
    TrainingConfig fields, the Framework fields, the overhead preset and the GPU."""
    _, model, train, M = _case(name)
    return {"model": model, "train": {**COMMON, **train, "num_microbatches": M}, "framework": dict(FRAMEWORK),
            "overhead": "none", "gpu": "H200"}


def memlib_args(name: str) -> list[str]:
    """The ``memlib estimate`` arguments that describe case ``name`` (:func:`case_config`; the model file
    relative to the repository root)."""
    c = case_config(name)
    t, fw = c["train"], c["framework"]
    args = ["--model", f"memlib/data/gpu_peaks/{c['model']}.json", "--profile", t["profile"], "--precision",
            t["precision"], "--zero", str(t["zero"])]
    for k in ("dp", "tp", "pp", "ep", "etp", "cp"):
        args += [f"--{k}", str(t[k])]
    args += ["--transformer-impl", t["transformer_impl"], "--attention-backend", t["attention_backend"],
             "--micro-batch", str(t["micro_batch"]), "--seq-len", str(t["seq_len"]), "--num-microbatches",
             str(t["num_microbatches"]), "--recompute", t["recompute"]]
    if t.get("cross_entropy_loss_fusion"):
        args += ["--cross-entropy-loss-fusion"]
    if "moe_aux_loss" in t:
        args += ["--moe-router-load-balancing-type", t["moe_aux_loss"]]
    for field, flag in (("gradient_accumulation_fusion", "--no-gradient-accumulation-fusion"),
                        ("rope_fusion", "--no-rope-fusion"), ("moe_grouped_gemm", "--no-moe-grouped-gemm"),
                        ("permute_fusion", "--no-moe-permute-fusion")):
        if not fw[field]:
            args.append(flag)
    args += ["--moe-token-dispatcher-type", fw["token_dispatcher"], "--gpu", c["gpu"], "--overhead", c["overhead"]]
    return args


def _case(name: str):
    for c in CASES:
        if c[0] == name:
            return c
    raise SystemExit(f"--only: no case {name!r}; the cases are {', '.join(c[0] for c in CASES)}")


TINY = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
            q_lora_rank=32, kv_lora_rank=24, vocab_size=512, num_hidden_layers=2)


def _request(name: str, tiny: bool = False) -> dict:
    from memlib.config import TrainingConfig, model_from_dict
    from memlib.measure.step import PeakRequest

    c = case_config(name)
    model, t, M = c["model"], dict(c["train"]), c["train"]["num_microbatches"]
    cfg = dict(MODELS[model])
    if tiny:
        cfg.update({k: v for k, v in TINY.items() if k in cfg})
        t.update(seq_len=64)
    m = model_from_dict(cfg, name=model)
    tr = TrainingConfig(**t)
    req = PeakRequest(m, tr, 0, True, M, True, "fused", 2, False).to_json()
    req["device"] = "cpu" if tiny else "cuda"
    return req


# ------------------------------------------------------------------------------------------------
# the memory history, reduced
# ------------------------------------------------------------------------------------------------
def _short(f) -> str:
    name = f.get("filename", "?")
    for marker in ("megatron/", "torch/", "benchmarks/", "memlib/"):
        i = name.rfind(marker)
        if i >= 0:
            name = name[i:]
            break
    return f"{name}:{f.get('line', '?')} ({f.get('name', '?')})"


def _where(frames, depth: int = 3) -> str:
    """Where a block was allocated: the ``depth`` innermost frames in Megatron-Core, innermost first (else the
    innermost frame outside torch), each as ``path:line (function)``."""
    frames = frames or []
    mcore = [_short(f) for f in frames if "megatron/" in f.get("filename", "")][:depth]
    if mcore:
        return " < ".join(mcore)
    for f in frames:
        fn = f.get("filename", "")
        if "torch/" not in fn and fn.endswith(".py"):
            return _short(f)
    return _short(frames[0]) if frames else "?"


def _groups(blocks, top: int) -> dict:
    groups: dict = {}
    for e in blocks:
        g = groups.setdefault(_where(e.get("frames")), [0, 0])
        g[0] += e["size"]
        g[1] += 1
    rows = sorted(([k, v[0], v[1]] for k, v in groups.items()), key=lambda r: -r[1])
    return {"groups": rows[:top], "other_groups": [len(rows[top:]), sum(r[1] for r in rows[top:])]}


def reduce_trace(events: list[dict], baseline: int, start: int = 0, top: int = 60) -> dict:
    """The peak of a recorded history from event ``start`` on (``alloc`` and ``free_completed`` events over
    ``baseline``, the bytes allocated before the history began), the blocks alive at that moment grouped by
    where they were allocated (blocks older than the history are not in it), the frames of the allocation
    that reached it, and the blocks alive at the end, grouped the same way."""
    cur, peak, at = baseline, None, -1
    for i, e in enumerate(events):
        a = e.get("action")
        if a == "alloc":
            cur += e["size"]
            if i >= start and (peak is None or cur > peak):
                peak, at = cur, i
        elif a == "free_completed":
            cur -= e["size"]
    live: dict = {}
    at_peak = None
    for i, e in enumerate(events):
        a = e.get("action")
        if a == "alloc":
            live[e["addr"]] = e
        elif a == "free_completed":
            live.pop(e["addr"], None)
        if i == at:
            at_peak = list(live.values())
    at_peak = at_peak or []
    return {"peak": peak if peak is not None else baseline, "baseline": baseline, "start": start, "event": at,
            "events": len(events), "live_in_history": sum(e["size"] for e in at_peak), **_groups(at_peak, top),
            "peak_frames": [_short(f) for f in (events[at].get("frames") or [])[:12]] if at >= 0 else [],
            "end": {"live_in_history": sum(e["size"] for e in live.values()), **_groups(live.values(), top)}}


# ------------------------------------------------------------------------------------------------
# one case, in its own process
# ------------------------------------------------------------------------------------------------
def _init(device: str) -> None:
    import torch
    import torch.distributed as dist

    from memlib.measure import cpu_shims

    if device == "cuda":
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
    else:
        cpu_shims._install_shims()
        cpu_shims._init_distributed(1, 0, None)


def _persistent(model, opt) -> dict:
    """Bytes of what outlives a step, by kind (each storage once)."""
    seen, out = set(), {}

    def add(kind, x):
        if x is None:
            return
        s = x.untyped_storage()
        key = (s.data_ptr(), s.nbytes())
        if key in seen or not s.nbytes():
            return
        seen.add(key)
        out[kind] = out.get(kind, 0) + s.nbytes()

    for buf in model.buffers + model.expert_parallel_buffers:
        add("param_buffer", buf.param_data)
        add("grad_buffer", buf.grad_data)
    for o in list(getattr(opt, "chained_optimizers", None) or [opt]):
        inner = getattr(o, "optimizer", None)
        if inner is None:
            continue
        for group in inner.param_groups:
            for p in group["params"]:
                add("main_params", p)
                for k, v in inner.state.get(p, {}).items():
                    if hasattr(v, "untyped_storage"):
                        add(f"adam_{k}", v)
    for p in model.parameters():
        add("parameters_outside_buffers", p)
    return out


def run_case(name: str, device: str) -> dict:
    import contextlib

    from memlib.measure.cpu_shims import _cuda_as_cpu_mode

    with contextlib.nullcontext() if device == "cuda" else _cuda_as_cpu_mode():
        return _run_case(name, device)


def _run_case(name: str, device: str) -> dict:
    import gc

    import torch

    cuda = device == "cuda"
    _init(device)                              # before megatron-core is imported (the CPU stand-ins)
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from memlib.measure import megatron_model as mm
    from memlib.measure.step import _optimizer, _partial

    req = _request(name, tiny=not cuda)
    t, m, M = req["train"], req["model"], req["num_microbatches"]
    b, s, v = t["micro_batch"], t["seq_len"], m["vocab_size"]
    t0 = time.perf_counter()
    if cuda:
        torch.cuda.synchronize()
        recorded_from = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=4_000_000, context="alloc", stacks="python")
    model, cfg = mm._build(req, {"use_distributed_optimizer": True, "check_for_nan_in_grad": True})
    opt = _optimizer(torch, get_megatron_optimizer, OptimizerConfig, cfg, model, req)
    cfg.finalize_model_grads_func = finalize_model_grads
    cfg.grad_scale_func = opt.scale_loss
    cfg.no_sync_func = model.no_sync
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(2 * M):
        tokens = torch.randint(0, v, (b, s + 1), generator=g)
        batches.append({"tokens": tokens[:, :-1].clone(), "labels": tokens[:, 1:].clone(),
                        "loss_mask": torch.ones(b, s, dtype=torch.float),
                        "attention_mask": (torch.tril(torch.ones(s, s)) < 0.5).view(1, 1, s, s).expand(b, 1, s, s)
                        .contiguous(),
                        "position_ids": torch.arange(s).unsqueeze(0).expand(b, s).contiguous()})
        if cuda:
            batches[-1] = {k: x.pin_memory() for k, x in batches[-1].items()}
    data = iter(batches)

    def loss_func(loss_mask, output_tensor):           # pretrain_gpt.py's loss_func
        losses = output_tensor.view(-1).float()
        loss_mask = loss_mask.view(-1).float()
        loss = torch.sum(losses * loss_mask)
        num_tokens = loss_mask.sum().clone().detach().to(torch.int)
        return loss, num_tokens, {"lm loss": torch.cat([loss.clone().detach().view(1), num_tokens.view(1)])}

    phases: list = []

    def phase(name):
        """Close the running phase (its peak and the bytes at its end) and open ``name``."""
        if cuda:
            torch.cuda.synchronize()
            if phases:
                phases[-1].update(peak=torch.cuda.max_memory_allocated(), end=torch.cuda.memory_allocated(),
                                  reserved_peak=torch.cuda.max_memory_reserved())
            torch.cuda.reset_peak_memory_stats()
            if name is not None:
                phases.append({"phase": name, "start": torch.cuda.memory_allocated()})

    def forward_step(data_iterator, model):            # pretrain_gpt.py's forward_step (get_batch: to the device)
        phase(f"{state['it']}.mb{state['mb']}.forward")
        batch = next(data_iterator)
        if cuda:
            batch = {k: x.cuda(non_blocking=True) for k, x in batch.items()}
        output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"], labels=batch["labels"],
                       loss_mask=batch["loss_mask"])
        return output, _partial(loss_func, batch["loss_mask"])

    import megatron.core.pipeline_parallel.schedules as schedules

    state = {"it": 0, "mb": 0}
    original_backward_step = schedules.backward_step

    def backward_step(*args, **kwargs):
        phase(f"{state['it']}.mb{state['mb']}.backward")
        try:
            return original_backward_step(*args, **kwargs)
        finally:
            state["mb"] += 1

    schedules.backward_step = backward_step
    forward_backward = get_forward_backward_func()
    mem = torch.cuda if cuda else None
    gc.disable()
    gc.collect()
    if cuda:
        torch.cuda.synchronize()
    built = mem.memory_allocated() if cuda else 0
    iters, trace, start2 = [], None, 0
    for it in (1, 2):
        state["it"], state["mb"] = it, 0
        if cuda:
            torch.cuda.synchronize()
            if it == 2:
                start2 = len(torch.cuda.memory._snapshot()["device_traces"][0])
            before = mem.memory_allocated()
        phase(f"{it}.zero_grad")
        t1 = time.perf_counter()
        model.zero_grad_buffer()
        opt.zero_grad()
        forward_backward(forward_step_func=forward_step, data_iterator=data, model=[model], num_microbatches=M,
                         seq_length=s, micro_batch_size=b, decoder_seq_length=s, forward_only=False)
        phase(f"{it}.optimizer")
        ok, grad_norm, _ = opt.step()
        phase(None)
        row = {"iteration": it, "update_ok": bool(ok), "grad_norm": float(grad_norm or 0.0)}
        if cuda:
            torch.cuda.synchronize()
            mine = [p for p in phases if p["phase"].startswith(f"{it}.")]
            stats = mem.memory_stats()
            row.update(before=before, max_allocated=max(p["peak"] for p in mine),
                       max_reserved=max(p["reserved_peak"] for p in mine), after_step=mem.memory_allocated(),
                       forward_backward_peak=max(p["peak"] for p in mine if not p["phase"].endswith("optimizer")),
                       phases=mine, alloc_retries=stats.get("num_alloc_retries"), ooms=stats.get("num_ooms"))
        row["seconds"] = round(time.perf_counter() - t1, 2)
        iters.append(row)
        if cuda:
            torch.cuda.synchronize()
            held = mem.memory_allocated()
        gc.collect()
        if cuda:
            torch.cuda.synchronize()
            row["freed_by_gc"] = held - mem.memory_allocated()
    if cuda:
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        trace = reduce_trace(snap["device_traces"][0], recorded_from, start2)
    schedules.backward_step = original_backward_step
    out = {"name": name, "iterations": iters, "built": built, "seconds": round(time.perf_counter() - t0, 1),
           "persistent": _persistent(model, opt), "request": req}
    if cuda:
        out["max_memory_allocated"] = iters[-1]["max_allocated"]
        out["max_memory_reserved"] = iters[-1]["max_reserved"]
        out["after_step"] = iters[-1]["after_step"]
        out["trace"] = trace
    return out


def run_loss_region(device: str) -> dict:
    import contextlib

    from memlib.measure.cpu_shims import _cuda_as_cpu_mode

    with contextlib.nullcontext() if device == "cuda" else _cuda_as_cpu_mode():
        return _run_loss_region(device)


def _run_loss_region(device: str) -> dict:
    """The native fused and the unfused cross-entropy on logits [s, b, v] bf16 alone: what the forward
    holds and what the backward's peak adds, in units of L, the logits' bytes."""
    import torch

    cuda = device == "cuda"
    _init(device)
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel
    from megatron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy

    ps.initialize_model_parallel()
    s, b, v = (LOSS_REGION["seq_len"], LOSS_REGION["micro_batch"], LOSS_REGION["vocab_size"]) if cuda else (64, 2, 512)
    dev = "cuda" if cuda else "cpu"
    L = 2 * s * b * v
    out = {"seq_len": s, "micro_batch": b, "vocab_size": v, "logits_bytes": L}
    impls = {"native": lambda x, y: fused_vocab_parallel_cross_entropy(x, y, ps.get_tensor_model_parallel_group()),
             "unfused": lambda x, y: tensor_parallel.vocab_parallel_cross_entropy(x.float(), y)}
    for impl, fn in impls.items():
        rows = []
        for _ in range(3):                  # the first call compiles (jit_fuser); the last is reported
            logits = torch.randn(s, b, v, dtype=torch.bfloat16, device=dev, requires_grad=True)
            target = torch.randint(0, v, (s, b), device=dev)
            if cuda:
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            loss = fn(logits, target)
            if cuda:
                torch.cuda.synchronize()
                held, fwd_peak = torch.cuda.memory_allocated() - base, torch.cuda.max_memory_allocated() - base
                torch.cuda.reset_peak_memory_stats()
                mid = torch.cuda.memory_allocated()
            loss.backward(torch.ones_like(loss))
            if cuda:
                torch.cuda.synchronize()
                bwd_peak = torch.cuda.max_memory_allocated() - mid
                after = torch.cuda.memory_allocated() - base
                rows.append({"held_after_forward": held, "forward_peak_above_logits": fwd_peak,
                             "backward_peak_above_held": bwd_peak, "after_backward": after,
                             "held_after_forward_L": held / L, "forward_peak_L": fwd_peak / L,
                             "backward_peak_above_held_L": bwd_peak / L, "after_backward_L": after / L})
            del loss, logits, target
        out[impl] = rows[-1] if rows else {}
        out[impl + "_first_call"] = rows[0] if rows else {}
    return out


# ------------------------------------------------------------------------------------------------
# the driver: each case in a fresh process
# ------------------------------------------------------------------------------------------------
def _environment() -> dict:
    import torch

    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")}
    try:
        from importlib.metadata import version

        env["megatron_core"] = version("megatron-core")
        env["triton"] = version("triton")
    except Exception as exc:                                    # noqa: BLE001
        env["versions_error"] = repr(exc)
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["total_memory"] = torch.cuda.get_device_properties(0).total_memory
        try:
            env["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                           capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception as exc:                                # noqa: BLE001
            env["driver"] = repr(exc)
    return env


def _worker(what: str, device: str, out: Path) -> None:
    result = run_loss_region(device) if what == "loss-region" else run_case(what, device)
    out.write_text(json.dumps(result, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".", help="folder for gpu_peaks.json and the model configs")
    ap.add_argument("--only", default=None, help="comma list of case names (and/or loss-region)")
    ap.add_argument("--budget", type=float, default=420, help="seconds after which no new case starts")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per case")
    ap.add_argument("--cpu-check", action="store_true", help="run every case on the CPU at tiny sizes")
    ap.add_argument("--rewrite", default=None, metavar="FILE",
                    help="write each case's config and memlib_args into a measured FILE again (nothing runs)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rewrite:
        data = json.loads(Path(args.rewrite).read_text())
        for case in data["cases"]:
            case["config"], case["memlib_args"] = case_config(case["name"]), memlib_args(case["name"])
        Path(args.rewrite).write_text(json.dumps(data, indent=1))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.worker:
        _worker(args.worker, args.device, out / f"{args.worker}.part.json")
        return
    device = "cpu" if args.cpu_check else "cuda"
    names = ["loss-region"] + [c[0] for c in CASES]
    if args.only:
        names = [n for n in args.only.split(",") if n == "loss-region" or _case(n)]
    result = {"environment": _environment(), "framework": FRAMEWORK, "models": MODELS, "cases": [],
              "loss_region": None, "errors": {}}
    start = time.perf_counter()
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for name in names:
        if time.perf_counter() - start > args.budget:
            result["errors"][name] = "not started: over the time budget"
            continue
        part = out / f"{name}.part.json"
        t0 = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, __file__, "--worker", name, "--device", device, "--out", str(out)],
                               env=env, timeout=args.timeout, capture_output=True, text=True)
            ok = p.returncode == 0 and part.exists()
            if not ok:
                result["errors"][name] = (p.stdout[-2000:] + "\n" + p.stderr[-6000:]).strip()
        except subprocess.TimeoutExpired:
            ok = False
            result["errors"][name] = f"timed out after {args.timeout} s"
        if ok:
            r = json.loads(part.read_text())
            part.unlink()
            if name == "loss-region":
                result["loss_region"] = r
            else:
                r["config"], r["memlib_args"] = case_config(name), memlib_args(name)
                result["cases"].append(r)
            print(f"{name}: {time.perf_counter() - t0:.0f} s " + (
                f"max_allocated {r['max_memory_allocated'] / 2**30:.3f} GiB" if "max_memory_allocated" in r else
                "ok"), flush=True)
        else:
            print(f"{name}: FAILED ({time.perf_counter() - t0:.0f} s)\n{result['errors'][name][-3000:]}", flush=True)
        (out / "gpu_peaks.json").write_text(json.dumps(result, indent=1))
        if len(result["errors"]) >= 2 and not result["cases"]:
            print("the first two runs failed: stopping", flush=True)
            break
    print(f"total {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
