"""Ground truth for the ``megatron`` profile: Megatron-Core's own modules on the CPU.

Needs ``megatron-core`` 0.19.2 (``make venv`` installs it; by hand:
``pip install --no-deps --ignore-requires-python megatron-core==0.19.2``) beside the pinned CPU
``torch``.  Nothing is downloaded and no GPU is used: every model is built from a config with random
weights, on the CPU, in one or several processes joined by ``gloo``.  :func:`measure` builds
Megatron-Core's ``GPTModel`` for a model of any family, runs one training forward pass under
saved-tensor hooks and counts every storage saved for backward per region, site and tensor (with
the CPU workarounds of :mod:`~memlib.measure.cpu_shims`; the model is built by
:mod:`~memlib.measure.megatron_model`); :func:`memlib.measure.megatron_compare.compare` puts a measurement
beside the ``megatron`` profile's ledger (:mod:`memlib.ledgers.megatron`).

The derivation, with its sources (file:line), is in ``docs/derivations/measure_megatron.md``.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

from ..config import ConfigError, ModelConfig, TrainingConfig, load_model
from ..config.versions import MCORE_VERSION
from .cpu_shims import _init_distributed, _install_shims
from .megatron_model import _build, m_kind

__all__ = ["MISSING_MCORE", "require", "available", "Request", "measure", "measure_many",
           "site_block"]

MISSING_MCORE = (f"framework=megatron-core needs megatron-core {MCORE_VERSION} beside the measure extra: "
                 f"pip install --no-deps --ignore-requires-python megatron-core=={MCORE_VERSION}")


def available() -> bool:
    """Whether torch and the pinned megatron-core can be imported (without importing them)."""
    import importlib.util
    from importlib.metadata import PackageNotFoundError, version

    if importlib.util.find_spec("torch") is None:
        return False
    try:
        return version("megatron-core") == MCORE_VERSION
    except PackageNotFoundError:
        return False


def require() -> None:
    """:class:`ConfigError` naming the install command unless the pinned megatron-core is present."""
    import importlib.util
    from importlib.metadata import PackageNotFoundError, version

    if importlib.util.find_spec("torch") is None:
        from .hf import MISSING_EXTRA
        raise ConfigError(MISSING_EXTRA)
    try:
        got = version("megatron-core")
    except PackageNotFoundError:
        raise ConfigError(MISSING_MCORE) from None
    if got != MCORE_VERSION:
        raise ConfigError(f"megatron-core={got} is installed; the megatron profile is exact for {MCORE_VERSION}: "
                          f"pip install --no-deps --ignore-requires-python megatron-core=={MCORE_VERSION}")


# ------------------------------------------------------------------------------------------------
# a request: one model, one training configuration
# ------------------------------------------------------------------------------------------------
_MODEL_FIELDS = ("hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads",
                 "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "q_lora_rank", "kv_lora_rank",
                 "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "num_hidden_layers",
                 "first_k_dense_replace", "vocab_size", "moe_layer_freq", "num_nextn_predict_layers",
                 "tie_word_embeddings", "n_group", "topk_group", "scoring_func")
#: the block kinds and fields of the other families (:data:`memlib.config.FAMILIES`)
_FAMILY_FIELDS = ("family", "attention", "mlp", "moe", "norm", "positions", "num_key_value_heads", "head_dim",
                  "qk_norm", "qkv_bias", "o_bias", "mlp_bias", "shared_expert_intermediate_size",
                  "max_position_embeddings")


def _model_dict(m: ModelConfig) -> dict:
    d = {f: getattr(m, f) for f in _MODEL_FIELDS}
    d["topk_method"] = "noaux_tc" if m.router_bias else "greedy"
    if m.family != "deepseek":
        d.update({f: getattr(m, f) for f in _FAMILY_FIELDS})
    return d


#: the training fields a measurement depends on
_TRAIN_FIELDS = ("tp", "ep", "etp", "cp", "sp", "micro_batch", "seq_len", "recompute", "precision",
                 "transformer_impl", "attention_backend", "attention_softmax_in_fp32", "bias_swiglu_fusion",
                 "cross_entropy_loss_fusion", "cross_entropy_fusion_impl", "moe_aux_loss")


@dataclass
class Request:
    """What one measurement runs: a model and the training options that change what is saved."""

    model: ModelConfig
    train: TrainingConfig
    seed: int = 0
    step: bool = True             #: run backward and count the main_grad buffers

    def to_json(self) -> dict:
        t = {}
        for f in _TRAIN_FIELDS:
            x = getattr(self.train, f)
            t[f] = x.value if hasattr(x, "value") else x
        return {"model": _model_dict(self.model), "train": t, "seed": self.seed, "step": self.step}

    def label(self) -> str:
        t = self.train
        return (f"b={t.micro_batch} s={t.seq_len} recompute={t.recompute} precision={t.precision} "
                f"impl={t.transformer_impl} softmax_fp32={t.attention_softmax_in_fp32} "
                f"swiglu_fusion={t.bias_swiglu_fusion} ce_fusion={t.cross_entropy_loss_fusion} "
                f"aux={t.moe_aux_loss} tp={t.tp} ep={t.ep} cp={t.cp} sp={t.sp} " + json.dumps(_model_dict(self.model)))


# ------------------------------------------------------------------------------------------------
# the measuring process: the forward pass under saved-tensor hooks (the model: memlib.measure.megatron_model)
# ------------------------------------------------------------------------------------------------
class _Packed:
    """What the pack hook hands autograd: the tensor and where it was saved."""

    __slots__ = ("tensor", "region", "site", "order", "__weakref__")

    def __init__(self, tensor, region, site, order):
        self.tensor, self.region, self.site, self.order = tensor, region, site, order


def _storage_key(t):
    s = t.untyped_storage()
    return (s.data_ptr(), s.nbytes())


def _place(stack: list[str], phase: dict) -> tuple[str, str]:
    """(region, site) of a tensor saved while the modules ``stack`` (outermost first) run.

    A checkpoint saves its inputs after running its function, from the module that called it: the
    layer (an RMSNorm's checkpoint under layernorm recomputation) or the decoder (full recomputation).
    Such a save is placed by the module that ran last (``phase["last"]``)."""
    inner = stack[-1] if stack else ""
    last = phase["last"]
    if inner == "decoder" and last.startswith("decoder.layers."):
        return f"layer.{last.split('.')[2]}", "layer_checkpoint"
    for name in stack:
        parts = name.split(".")
        if len(parts) >= 3 and parts[0] == "decoder" and parts[1] == "layers":
            return f"layer.{parts[2]}", _site(inner, ".".join(parts[:3]), last)
        if len(parts) >= 3 and parts[0] == "mtp" and parts[1] == "layers":
            return f"mtp.{parts[2]}", _site(inner, ".".join(parts[:3]), last)
    if phase["mtp_loss"]:
        return f"mtp.{max(phase['mtp_heads'] - 1, 0)}", "head." + (inner or "loss")
    if inner == "embedding" or inner.startswith("embedding."):
        return "embedding", "embedding"
    if inner.startswith("decoder.final_layernorm"):
        return "head", "final_layernorm"
    return "head", inner or ("loss_func" if phase["loss_func"] else "loss")


def _site(inner: str, prefix: str, last: str) -> str:
    rest = inner[len(prefix):].lstrip(".") if inner.startswith(prefix) else inner
    layer = prefix if not prefix.startswith("mtp.") else prefix + ".mtp_model_layer"
    if inner == layer:                      # an RMSNorm's checkpoint, called by the layer: where it ran
        if last.startswith(layer + "."):
            return last[len(layer) + 1:].split(".")[0] + "_checkpoint"
        return "layer_checkpoint"
    if not rest:                            # the MTP module's own checkpoint (full recomputation)
        return "checkpoint"
    return re.sub(r"local_experts\.\d+", "experts", rest.removeprefix("mtp_model_layer."))


def site_block(region: str, site: str, kind: str) -> str:
    """The ledger block (the first part of an entry key) a measured site belongs to."""
    if region in ("embedding", "head"):
        return region
    top = site.split(".")[0].removesuffix("_checkpoint")
    if top in ("input_layernorm", "self_attention", "layer"):
        return "attention"
    if top in ("pre_mlp_layernorm", "pre_cross_attn_layernorm", "mlp"):
        return "moe" if kind == "moe" else "dense_ffn"
    if region.startswith("mtp.") and top in ("final_layernorm", "head", "output_layer"):
        return "head"
    return "mtp"


def _measure(req: dict) -> dict:
    """One forward pass (and backward) of the request's model: see the module docstring."""
    import weakref

    import torch
    import megatron.core.models.gpt.gpt_model as gpt_model
    from megatron.core import parallel_state as ps

    model, cfg = _build(req)
    t = req["train"]
    core = model.module.module if cfg.bf16 else model.module
    names = {mod: name for name, mod in core.named_modules()}
    stack: list[str] = []
    phase = {"mtp_loss": False, "mtp_heads": 0, "loss_func": False, "last": ""}

    def pre(mod, *_):
        stack.append(names[mod])
        phase["last"] = names[mod]
        if phase["mtp_loss"] and names[mod] == "output_layer":
            phase["mtp_heads"] += 1

    def post(mod, *_):
        stack.pop()

    hooks = []
    for mod in names:
        if mod is not core:
            hooks.append(mod.register_forward_pre_hook(pre))
            hooks.append(mod.register_forward_hook(post))
    original_mtp_loss = gpt_model.process_mtp_loss

    def mtp_loss(*a, **k):
        phase["mtp_loss"], phase["mtp_heads"] = True, 0
        try:
            return original_mtp_loss(*a, **k)
        finally:
            phase["mtp_loss"] = False

    gpt_model.process_mtp_loss = mtp_loss
    params = ({_storage_key(p) for p in model.parameters()}
              | {_storage_key(x) for x in torch.nn.Module.buffers(model)})
    packed: list = []

    def pack(x):
        region, site = _place(stack, phase)
        p = _Packed(x, region, site, len(packed))
        packed.append(weakref.ref(p))
        return p

    def unpack(p):
        return p.tensor

    b, s, v = t["micro_batch"], t["seq_len"], req["model"]["vocab_size"]
    g = torch.Generator().manual_seed(req["seed"])
    # as pretrain_gpt.get_batch hands them over: each its own [b, s] tensor (copied to the device)
    tokens = torch.randint(0, v, (b, s + 1), generator=g)
    ids, labels = tokens[:, :-1].clone(), tokens[:, 1:].clone()
    position_ids = torch.arange(s).unsqueeze(0).expand(b, s).contiguous()
    # the GPT dataset's defaults (create_attention_mask, no EOD masking): a [b, 1, s, s] bool mask, True
    # where attention is masked, and an fp32 loss mask of ones
    attention_mask = (torch.tril(torch.ones(s, s)) < 0.5).unsqueeze(0).unsqueeze(0).expand(b, 1, s, s).contiguous()
    loss_mask = torch.ones(b, s, dtype=torch.float)
    inputs = {_storage_key(attention_mask): ("embedding", "attention_mask"),
              _storage_key(loss_mask): ("head", "loss_func")}
    rope = getattr(core, "rotary_pos_emb", None)
    if rope is not None and m_kind(req) == "gqa":
        # GPTModel's RoPE angles, one tensor for every layer (kept by full recomputation's checkpoints)
        def rope_output(mod, args, out):
            inputs.setdefault(_storage_key(out), ("embedding", "rope_freqs"))

        hooks.append(rope.register_forward_hook(rope_output))
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        output = model(ids, position_ids, attention_mask, labels=labels, loss_mask=loss_mask)
        # pretrain_gpt.py's loss_func
        phase["loss_func"] = True
        losses = output.view(-1).float()
        mask = loss_mask.view(-1).float()
        loss = torch.sum(losses * mask)
    gpt_model.process_mtp_loss = original_mtp_loss
    for h in hooks:
        h.remove()
    alive = sorted((p for p in (r() for r in packed) if p is not None), key=lambda p: p.order)
    storages: dict = {}
    views: dict = {}
    for p in alive:
        x = p.tensor
        key = _storage_key(x)
        if key in params:
            continue
        views.setdefault(key, {}).setdefault(p.region, x.numel() * x.element_size())
        if key in storages:
            continue
        region, site = p.region, p.site
        if key in inputs:
            region, site = inputs[key]
        storages[key] = {"region": region, "site": site, "bytes": key[1],
                         "dtype": str(x.dtype).replace("torch.", ""), "shape": list(x.shape)}
    # the final hidden states of the main model and of every MTP module are one concatenated tensor,
    # chunked for the output layer: each region gets its own chunk
    for key, d in list(storages.items()):
        by_region = views[key]
        if d["site"].endswith("output_layer") and len(by_region) > 1 and sum(by_region.values()) == d["bytes"]:
            for region, n in by_region.items():
                storages[(key, region)] = {**d, "region": region, "site": d["site"].split(".")[-1], "bytes": n}
            del storages[key]
    ctx_held = _ctx_tensors(loss, set(views) | params)
    out = {"storages": list(storages.values()), "ctx_held": ctx_held}
    regions: dict[str, int] = {}
    for d in out["storages"]:
        regions[d["region"]] = regions.get(d["region"], 0) + d["bytes"]
    out["regions"] = regions
    out["parameters"] = _param_blocks(model, core)
    if req["step"]:
        loss.backward()
        out["main_grad"] = sum(buf.grad_data.numel() * buf.grad_data.element_size()
                               for buf in model.buffers + model.expert_parallel_buffers)
        out["main_grad_dtype"] = sorted({str(buf.grad_data.dtype).replace("torch.", "")
                                         for buf in model.buffers + model.expert_parallel_buffers})
    out["rank"] = torch.distributed.get_rank()
    out["ranks"] = {"tp": ps.get_tensor_model_parallel_rank(), "ep": ps.get_expert_model_parallel_rank(),
                    "dp": ps.get_data_parallel_rank()}
    return out


def _ctx_tensors(loss, counted: set) -> list[dict]:
    """Tensors that autograd Functions keep as plain ``ctx`` attributes (invisible to the hooks)."""
    import torch

    seen, found, todo = set(), {}, [loss.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        todo.extend(n for n, _ in node.next_functions)
        attrs = getattr(node, "__dict__", {})
        for name, value in attrs.items():
            for x in (value if isinstance(value, (list, tuple)) else (value,)):
                if isinstance(x, torch.Tensor) and x.untyped_storage().nbytes():
                    key = _storage_key(x)
                    if key not in counted and key not in found:
                        found[key] = {"function": type(node).__name__, "attribute": name, "bytes": key[1],
                                      "dtype": str(x.dtype).replace("torch.", ""),
                                      "rng_state": x.dtype == torch.uint8 and "rng" in name}
    return list(found.values())


def _param_blocks(model, core) -> dict:
    """Parameter bytes and element counts per memlib block, from Megatron's parameter names."""
    out: dict[str, list[int]] = {}
    for name, p in core.named_parameters():
        block = _param_block(name)
        x = out.setdefault(block, [0, 0])
        x[0] += p.numel()
        x[1] += p.numel() * p.element_size()
    return {k: {"count": v[0], "bytes": v[1]} for k, v in out.items()}


def _param_block(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "embedding":
        return "embedding"
    if parts[0] == "output_layer":
        return "head"
    if parts[:2] == ["decoder", "final_layernorm"]:
        return "final_norm"
    mtp = parts[0] == "mtp"
    if mtp:
        if parts[3] in ("enorm", "hnorm", "eh_proj", "final_layernorm"):
            return "mtp"
        rest = parts[4:]
    else:
        rest = parts[3:]
    if rest[0] in ("input_layernorm", "pre_mlp_layernorm"):
        block = "norms"
    elif rest[0] == "self_attention":
        block = "attention"
    elif rest[1] == "router":
        block = "router"
    elif rest[1] == "shared_experts":
        block = "shared_experts"
    elif rest[1] == "experts":
        block = "routed_experts"
    else:
        block = "dense_ffn"
    return ("mtp." + block) if mtp else block


# ------------------------------------------------------------------------------------------------
# the caller's side: worker processes
# ------------------------------------------------------------------------------------------------
def _check_request(m: ModelConfig, t: TrainingConfig) -> None:
    """What megatron-core on the CPU cannot run, named before a process is started."""
    from ..ledgers.base import parse_policy
    from ..model.profiles import profile

    if not profile(t.profile).partition.megatron_kernels:
        raise ConfigError(f"profile={t.profile}: framework=megatron-core measures the megatron profile")
    if t.transformer_impl.uses_te:
        raise ConfigError(f"transformer_impl={t.transformer_impl}: Transformer Engine needs a GPU; "
                          f"framework=megatron-core measures transformer_impl=local on the CPU")
    if t.precision not in ("megatron", "fp32"):
        raise ConfigError(f"precision={t.precision} must be megatron (bf16) or fp32 for framework=megatron-core")
    if t.pp != 1:
        raise ConfigError(f"pp={t.pp}: framework=megatron-core builds the whole model in every process (pp=1)")
    if m.attention == "gqa" and m.o_bias != m.mlp_bias:
        raise ConfigError(f"o_bias={m.o_bias} with mlp_bias={m.mlp_bias}: Megatron-Core's add_bias_linear biases "
                          f"linear_proj and the MLP (or the experts) together")
    if m.mlp_bias and "mlp" in parse_policy(t.recompute).modules:
        raise ConfigError(f"recompute={t.recompute} with mlp_bias=True: megatron-core {MCORE_VERSION}'s mlp checkpoint "
                          f"returns the bias parameter as an output and its backward recurses without end")
    if m.has_moe and m.mlp_bias:
        raise ConfigError(f"mlp_bias=True with MoE layers: megatron-core {MCORE_VERSION}'s SequentialMLP (the CPU's "
                          f"experts) adds each expert's fc2 bias in place on a view of its output, which autograd "
                          f"refuses with TP 1; framework=megatron-core measures MoE models without biases")
    if m.mlp == "gelu" and t.bias_swiglu_fusion and not m.mlp_bias:
        raise ConfigError("bias_swiglu_fusion=True with a GeLU MLP without mlp_bias: Megatron-Core's fused bias-GeLU "
                          "needs the bias (--no-bias-swiglu-fusion)")
    if t.cross_entropy_loss_fusion and not t.cross_entropy_fusion_impl.keeps_fp32_softmax(True):
        raise ConfigError("cross_entropy_fusion_impl=te needs Transformer Engine (a GPU)")
    from ..model.profiles import act_profile
    from ..model.partition import Partition

    act_profile("megatron", t)          # the kernel rules (moe_act needs TE, FP8 needs TE, ...)
    Partition(m, t)                     # the divisibility rules
    parse_policy(t.recompute)


def measure_many(requests: list[Request], *, world: int = 1, timeout: float = 900,
                 worker: str = "memlib.measure.megatron") -> list:
    """Measure every request in one worker process (``world`` processes joined by gloo, each measuring
    every request); per request the result dict (or, with ``world > 1``, the list of every rank's).
    ``worker`` is the module run as the worker (``memlib.measure.step`` measures a training step)."""
    import tempfile

    require()
    for r in requests:
        _check_request(r.model, r.train)
    with tempfile.TemporaryDirectory(prefix="memlib-mcore-") as tmp:
        req_path = os.path.join(tmp, "requests.json")
        with open(req_path, "w") as f:
            json.dump([r.to_json() for r in requests], f)
        outs = [os.path.join(tmp, f"out{rank}.json") for rank in range(world)]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1" if world > 1 else "2")}
        cmds = [[sys.executable, "-m", worker, req_path, outs[rank]]
                + ([str(world), str(rank), os.path.join(tmp, "store")] if world > 1 else []) for rank in range(world)]
        procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for c in cmds]
        errors = []
        for p in procs:
            try:
                _, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise RuntimeError(f"megatron-core worker timed out after {timeout} s") from None
            if p.returncode:
                errors.append(err.strip().splitlines()[-1] if err.strip() else f"exit {p.returncode}")
        if errors:
            raise RuntimeError("megatron-core worker failed: " + "; ".join(errors))
        per_rank = []
        for path in outs:
            with open(path) as f:
                per_rank.append(json.load(f))
    return [res[0] if world == 1 else list(res) for res in zip(*per_rank)]


def measure(model: ModelConfig | str, train: TrainingConfig, *, seed: int = 0, step: bool = True) -> dict:
    """One measurement (one worker process): see the module docstring."""
    return measure_many([Request(load_model(model), train, seed, step)])[0]


def _worker(argv: list[str], run=None) -> int:
    """``python -m memlib.measure.megatron REQUESTS OUT [WORLD RANK STORE]``: measure every request (with
    ``run(request)``, :func:`_measure` by default)."""
    run = run or _measure
    requests_path, out_path = argv[0], argv[1]
    world, rank, store = (int(argv[2]), int(argv[3]), argv[4]) if len(argv) > 2 else (1, 0, None)
    _install_shims()
    _init_distributed(world, rank, store)
    with open(requests_path) as f:
        requests = json.load(f)
    results = []
    for req in requests:
        try:
            results.append({"ok": True, **run(req)})
        except Exception as exc:       # reported to the caller with the request that failed
            import traceback

            results.append({"ok": False, "error": f"{type(exc).__name__}: {exc}",
                            "traceback": traceback.format_exc(limit=12)})
    with open(out_path, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":      # the measuring process
    sys.exit(_worker(sys.argv[1:]))
