"""Ground truth: memlib's counts against the pinned Hugging Face ``transformers`` implementation.

Needs the optional extra (``pip install memlib[measure]``: a pinned CPU ``torch`` and a pinned
``transformers``).  Nothing is downloaded: every model is built from a config, with random weights.

Parameters
    :func:`param_check` builds a model (a preset at full size) on the ``meta`` device, where no
    memory is allocated, and compares its parameter and buffer counts with memlib's, per Hugging
    Face tensor, per memlib block and in total.

Activations
    :func:`measure_activations` builds a small model in bf16, runs one training forward pass with
    labels (the loss included) under :func:`torch.autograd.graph.saved_tensors_hooks`, and counts
    the bytes of every tensor saved for backward that is still held when the forward pass ends
    (a tensor saved by a node that autograd has already freed, such as the router's group top-k,
    is not held), each storage once (views share storage), parameters and buffers excluded.  Each
    storage is attributed to the region that first saved it: the embedding, decoder layer ``i``,
    the final norm, the head or the loss; the RoPE tables, computed once before the first layer
    and saved by every layer, are attributed to the embedding (GPT-2's position ids are saved there).
    Every family memlib reads is built by its transformers class (:data:`HF_CONFIGS`; memlib's ``gpt``
    as GPT-2), with every dropout probability 0.  It then runs backward and one
    AdamW step and counts the gradient and optimizer-state bytes.

:func:`compare` puts the measurement beside the ``hf-eager`` ledger of :mod:`memlib.ledgers.hf`, per
region and in total.
"""
from __future__ import annotations

import time
import warnings
import weakref
from dataclasses import dataclass, field

from ..config import ConfigError, ModelConfig, load_model

__all__ = ["require", "hf_config", "param_check", "measure_activations", "compare", "predicted",
           "MISSING_EXTRA", "MEASURE_PROFILES", "region_of_key", "SavedTensors", "HF_CONFIGS"]

MISSING_EXTRA = "measure needs the optional extra: pip install memlib[measure]"

#: ledger profile -> Hugging Face attention implementation.  There is no ``hf-sdpa``: what SDPA keeps
#: depends on the kernel it picks (on CPU the math path, in fp32, when the query/key and value head
#: dimensions differ, else a flash kernel; on a GPU flash, memory-efficient or cuDNN), not on the model.
MEASURE_PROFILES = {"hf-eager": "eager"}


def require():
    """``(torch, transformers)``, or :class:`ConfigError` with the one-line install hint."""
    try:
        import torch
        import transformers
    except ImportError:
        raise ConfigError(MISSING_EXTRA) from None
    return torch, transformers


# ------------------------------------------------------------------------------------------------
# memlib config -> Hugging Face config
# ------------------------------------------------------------------------------------------------
def _check_hf_compatible(m: ModelConfig) -> None:
    from ..ledgers.hf import hf_code

    hf_code(m)             # a family (or a gpt config) transformers cannot build: one line
    if m.family == "deepseek" and m.moe_layer_freq != 1:
        raise ConfigError(f"moe_layer_freq={m.moe_layer_freq}: transformers' DeepSeek models make every layer "
                          f"from first_k_dense_replace on MoE; only moe_layer_freq=1 can be compared")


def _gqa_kwargs(m: ModelConfig, max_positions: int) -> dict:
    """The fields every Llama-style config shares (no dropout, as the hf-eager ledger counts)."""
    return dict(vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_hidden_layers,
                num_attention_heads=m.num_attention_heads, num_key_value_heads=m.num_key_value_heads,
                head_dim=m.head_dim, max_position_embeddings=max_positions, tie_word_embeddings=m.tie_word_embeddings,
                hidden_act=m.hidden_act, attention_dropout=0.0)


def _moe_kwargs(m: ModelConfig) -> dict:
    return dict(num_experts=m.n_routed_experts, moe_intermediate_size=m.moe_intermediate_size,
                num_experts_per_tok=m.num_experts_per_tok, norm_topk_prob=m.norm_topk_prob, decoder_sparse_step=1,
                mlp_only_layers=[], output_router_logits=False)


#: memlib family -> (transformers config class, its keyword arguments from memlib's fields and the longest
#: sequence); memlib's ``gpt`` is built as GPT-2 (see :mod:`memlib.ledgers.hf`)
HF_CONFIGS = {
    "llama": ("LlamaConfig", lambda m, n: {**_gqa_kwargs(m, n), "intermediate_size": m.intermediate_size,
                                           "attention_bias": m.qkv_bias, "mlp_bias": m.mlp_bias}),
    "qwen3": ("Qwen3Config", lambda m, n: {**_gqa_kwargs(m, n), "intermediate_size": m.intermediate_size,
                                           "attention_bias": m.qkv_bias}),
    "mixtral": ("MixtralConfig", lambda m, n: {**_gqa_kwargs(m, n), "num_local_experts": m.n_routed_experts,
                                               "intermediate_size": m.moe_intermediate_size,
                                               "num_experts_per_tok": m.num_experts_per_tok,
                                               "router_jitter_noise": 0.0, "output_router_logits": False}),
    "qwen2_moe": ("Qwen2MoeConfig", lambda m, n: {**_gqa_kwargs(m, n), **_moe_kwargs(m), "qkv_bias": m.qkv_bias,
                                                  "shared_expert_intermediate_size": m.shared_expert_intermediate_size,
                                                  "intermediate_size": m.intermediate_size or m.moe_intermediate_size}),
    "qwen3_moe": ("Qwen3MoeConfig", lambda m, n: {**_gqa_kwargs(m, n), **_moe_kwargs(m), "attention_bias": m.qkv_bias,
                                                  "intermediate_size": m.intermediate_size or m.moe_intermediate_size}),
    "gpt2": ("GPT2Config", lambda m, n: dict(
        vocab_size=m.vocab_size, n_embd=m.hidden_size, n_layer=m.num_hidden_layers, n_head=m.num_attention_heads,
        n_positions=m.max_position_embeddings, n_inner=m.intermediate_size, activation_function=m.hidden_act,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=m.tie_word_embeddings,
        bos_token_id=None, eos_token_id=None)),
}
HF_CONFIGS["gpt"] = HF_CONFIGS["gpt2"]


def hf_config(m: ModelConfig | str, *, arch: str | None = None, attn: str = "eager", max_positions: int = 4096):
    """The ``transformers`` config of ``m``.  A DeepSeek model: ``DeepseekV3Config``, or ``DeepseekV2Config``
    when ``arch`` is ``None`` and the model has no router bias (DeepSeek-V2's greedy routing), with memlib's
    fields and the routing made valid for any N (``n_group = topk_group = 1``, which changes which experts
    are picked, not what is saved).  Any other family: its :data:`HF_CONFIGS` entry, every dropout 0."""
    _, transformers = require()

    m = load_model(m)
    _check_hf_compatible(m)
    if m.family != "deepseek":
        name, kwargs = HF_CONFIGS[m.family]
        cfg = getattr(transformers, name)(**kwargs(m, max_positions))
        cfg._attn_implementation = attn
        return cfg
    from transformers import DeepseekV2Config, DeepseekV3Config

    if arch is None:
        arch = "v3" if m.router_bias else "v2"
    common = dict(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
        moe_intermediate_size=m.moe_intermediate_size, num_hidden_layers=m.num_hidden_layers,
        num_attention_heads=m.num_attention_heads, num_key_value_heads=m.num_attention_heads,
        n_shared_experts=m.n_shared_experts, n_routed_experts=m.n_routed_experts,
        kv_lora_rank=m.kv_lora_rank, q_lora_rank=m.q_lora_rank, qk_rope_head_dim=m.qk_rope_head_dim,
        v_head_dim=m.v_head_dim, qk_nope_head_dim=m.qk_nope_head_dim, n_group=1, topk_group=1,
        num_experts_per_tok=m.num_experts_per_tok, first_k_dense_replace=m.first_k_dense_replace,
        max_position_embeddings=max_positions, tie_word_embeddings=m.tie_word_embeddings,
        attn_implementation=attn,
    )
    if arch == "v3":
        return DeepseekV3Config(**common)
    if arch == "v2":
        return DeepseekV2Config(**common, topk_method="greedy")
    raise ConfigError(f"arch={arch!r} must be v2 or v3")


def _model_class(cfg):
    from transformers import AutoModelForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM

    if cfg.model_type.startswith("deepseek"):
        return DeepseekV3ForCausalLM if cfg.model_type == "deepseek_v3" else DeepseekV2ForCausalLM
    return AutoModelForCausalLM._model_mapping[type(cfg)]


# ------------------------------------------------------------------------------------------------
# parameters on the meta device
# ------------------------------------------------------------------------------------------------
#: memlib's per-expert name -> the fused 3-D tensor of transformers 5
_EXPERT_HF = {"mlp.experts.*.gate_proj.weight": "mlp.experts.gate_up_proj",
              "mlp.experts.*.up_proj.weight": "mlp.experts.gate_up_proj",
              "mlp.experts.*.down_proj.weight": "mlp.experts.down_proj"}


#: transformers class -> its names of memlib's tensors (memlib names them as Llama does) and its decoder-layer
#: prefix; GPT-2's fused c_attn holds W^Q, W^K and W^V and their biases
_HF_NAMES = {"GPT2LMHeadModel": ({
    "model.embed_tokens.weight": "transformer.wte.weight", "model.norm.weight": "transformer.ln_f.weight",
    "model.norm.bias": "transformer.ln_f.bias",
    **{f"self_attn.{p}_proj.{w}": f"attn.c_attn.{w}" for p in "qkv" for w in ("weight", "bias")},
    "self_attn.o_proj.weight": "attn.c_proj.weight", "self_attn.o_proj.bias": "attn.c_proj.bias",
    **{f"{n}.{w}": f"{g}.{w}" for n, g in (("input_layernorm", "ln_1"), ("post_attention_layernorm", "ln_2"))
       for w in ("weight", "bias")}}, "transformer.h.")}


def _hf_name(m: ModelConfig, name: str) -> str:
    """The name of memlib's Hugging Face tensor ``name`` in ``m``'s transformers class."""
    from ..ledgers.hf import HF_CODE

    code = HF_CODE.get(m.family)
    if code is None or code.cls not in _HF_NAMES:
        return name
    names, layers = _HF_NAMES[code.cls]
    if name.startswith("model.layers."):
        i, rest = name[len("model.layers."):].split(".", 1)
        return f"{layers}{i}." + names.get(rest, rest)
    return names.get(name, name)


def memlib_hf_tensors(m: ModelConfig) -> dict[str, dict]:
    """memlib's tensors of the main model grouped by the Hugging Face tensor that holds them:
    name -> {"count", "block", "buffer", "keys"} (fused tensors gather several memlib tensors)."""
    from ..model.architecture import decoder_layer_tensors, embedding_tensors, head_tensors
    from ..model.params import values

    vals = values(m)
    out: dict[str, dict] = {}

    def add(name, t):
        name = _hf_name(m, name)
        d = out.setdefault(name, {"count": 0, "block": t.block, "buffer": t.kind == "buffer", "keys": []})
        d["count"] += int(t.numel.xreplace(vals))
        d["keys"].append(t.key)

    for t in embedding_tensors(m):
        add(t.hf, t)
    for i, kind in enumerate(m.layer_kinds):
        for t in decoder_layer_tensors(m, kind):
            add(f"model.layers.{i}." + _EXPERT_HF.get(t.hf, t.hf), t)
    for t in head_tensors(m):
        add(t.hf, t)
    return out


def param_check(model: ModelConfig | str, *, arch: str | None = None) -> dict:
    """Parameter (and buffer) counts of ``model`` built by ``transformers`` on the meta device, against
    memlib's: per Hugging Face tensor, per memlib block and in total.  ``ok`` is True iff every
    count, every block and the total agree exactly and both list the same tensors."""
    torch, _ = require()
    from ..model.params import buffer_params, by_block, model_params, values

    m = load_model(model)
    cfg = hf_config(m, arch=arch)
    t0 = time.perf_counter()
    with torch.device("meta"):
        hf = _model_class(cfg)(cfg)
    build_s = time.perf_counter() - t0
    seen, hf_counts = set(), {}
    for name, p in hf.named_parameters(remove_duplicate=False):
        if id(p) in seen:          # tied head: one tensor under two names
            continue
        seen.add(id(p))
        hf_counts[name] = (p.numel(), False)
    persistent = {n for n, _ in hf.state_dict().items()}
    for name, buf in hf.named_buffers():
        if name in persistent:     # the RoPE frequencies are non-persistent helpers, not model state
            hf_counts[name] = (buf.numel(), True)
    mine = memlib_hf_tensors(m)
    rows = []
    for name in sorted(set(hf_counts) | set(mine), key=_natural):
        got, buf = hf_counts.get(name, (None, None))
        exp = mine.get(name)
        rows.append({"hf": name, "block": exp["block"] if exp else None,
                     "memlib": exp["count"] if exp else None, "transformers": got,
                     "memlib_buffer": exp["buffer"] if exp else None, "transformers_buffer": buf})
    vals = values(m)
    blocks_memlib = by_block(model_params(m)).evaluate(vals)
    blocks_hf: dict[str, int] = {}
    for r in rows:
        if r["block"] and r["transformers"] is not None and not r["transformers_buffer"]:
            blocks_hf[r["block"]] = blocks_hf.get(r["block"], 0) + r["transformers"]
    total_hf = sum(n for n, b in hf_counts.values() if not b)
    total_memlib = model_params(m).evaluate_total(vals)
    buffers_hf = sum(n for n, b in hf_counts.values() if b)
    buffers_memlib = buffer_params(m).evaluate_total(vals)
    def agrees(r):      # an empty tensor that memlib does not list (no shared experts) agrees with nothing
        if not r["memlib"] and not r["transformers"]:
            return True
        return r["memlib"] == r["transformers"] and r["memlib_buffer"] == r["transformers_buffer"]

    for r in rows:
        r["ok"] = agrees(r)
    ok = (all(r["ok"] for r in rows)
          and blocks_hf == blocks_memlib and total_hf == total_memlib and buffers_hf == buffers_memlib)
    return {"model": m.name, "class": type(hf).__name__, "build_seconds": build_s,
            "tensors": rows, "blocks": {k: {"memlib": blocks_memlib.get(k), "transformers": blocks_hf.get(k)}
                                        for k in blocks_memlib | blocks_hf},
            "total": {"memlib": total_memlib, "transformers": total_hf},
            "buffers": {"memlib": buffers_memlib, "transformers": buffers_hf}, "ok": ok}


def _natural(name: str):
    import re

    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", name)]


# ------------------------------------------------------------------------------------------------
# activations: what autograd keeps
# ------------------------------------------------------------------------------------------------
#: the largest model :func:`measure_activations` builds for real (on the CPU, in bf16)
MAX_MEASURED_PARAMS = 200_000_000


def _check_small(m: ModelConfig, device: str = "cpu") -> None:
    from ..model.params import model_params, values

    n = model_params(m).evaluate_total(values(m))
    if "moe" in m.layer_kinds and (m.hidden_size % 8 or m.moe_intermediate_size % 8):
        width = _config_field(m, "moe_intermediate_size")
        raise ConfigError(f"hidden_size={m.hidden_size}, {width}={m.moe_intermediate_size}: "
                          f"transformers' grouped_mm experts need both to be multiples of 8 (16-byte strides in bf16)")
    if n > MAX_MEASURED_PARAMS and device == "cpu":
        raise ConfigError(f"model={m.name} has {n} parameters, more than {MAX_MEASURED_PARAMS} that measure builds "
                          f"on the CPU; use a small config (the presets' parameters are checked on the meta device)")


#: transformers class -> (base model attribute, token embedding, RoPE module or None, decoder layers, final
#: norm) within it; None: the Llama layout, which DeepSeek, Qwen and Mixtral share
_MODULES = {None: ("model", "embed_tokens", "rotary_emb", "layers", "norm"),
            "GPT2LMHeadModel": ("transformer", "wte", None, "h", "ln_f")}


def _config_field(m: ModelConfig, field: str) -> str:
    """The config.json name of ModelConfig's ``field`` in ``m``'s family (Mixtral's expert width is
    ``intermediate_size``)."""
    from ..config import FAMILIES

    fam = next((f for f in FAMILIES if f.name == m.family), None)
    return next((hf for name, hf, _ in (fam.fields if fam else ()) if name == field and hf), field)


class _Packed:
    """What the pack hook hands autograd: the tensor and where it was saved."""

    __slots__ = ("tensor", "region", "order", "__weakref__")

    def __init__(self, tensor, region, order):
        self.tensor, self.region, self.order = tensor, region, order


@dataclass
class Measurement:
    """One forward/backward/step of a small model."""

    model: ModelConfig
    micro_batch: int
    seq_len: int
    attn: str
    regions: dict[str, int]                     #: saved bytes per region (embedding, layer.i, ...)
    storages: list[dict] = field(default_factory=list)   #: every counted storage
    gradients: int | None = None                #: bytes of .grad after backward
    optimizer_states: int | None = None         #: bytes of AdamW state after one step
    parameters: int | None = None               #: bytes of the parameters
    #: on a CUDA device: the caching allocator's bytes before the forward pass, after it (with the
    #: loss and logits still alive), its peak during it, and what it had reserved
    allocator: dict | None = None

    @property
    def total(self) -> int:
        return sum(self.regions.values())


def _storage_key(t):
    s = t.untyped_storage()
    return (s.data_ptr(), s.nbytes(), str(t.device))


class SavedTensors:
    """What autograd holds for backward: a :func:`torch.autograd.graph.saved_tensors_hooks` pair
    that records every saved tensor with the region it was saved in (``region()`` at pack time).

    :meth:`storages` lists the tensors still held (a tensor saved by a node autograd already freed
    is not), **each storage once** (a view, or a tensor saved by two nodes, costs its storage once),
    storages in ``exclude`` (parameters, buffers) left out."""

    def __init__(self, exclude=frozenset(), region=lambda: ""):
        self.exclude, self.region, self.packed = set(exclude), region, []

    def pack(self, t):
        p = _Packed(t, self.region(), len(self.packed))
        self.packed.append(weakref.ref(p))
        return p

    @staticmethod
    def unpack(p):
        return p.tensor

    def hooks(self):
        import torch

        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def storages(self, relabel: dict | None = None) -> list[dict]:
        """Every held storage once, in the order first saved: region, bytes, dtype, shape, elements.
        ``relabel`` moves chosen storages to another region."""
        relabel = relabel or {}
        alive = [p for p in (r() for r in self.packed) if p is not None]
        by_storage: dict = {}
        for p in sorted(alive, key=lambda p: p.order):
            t = p.tensor
            key = _storage_key(t)
            if key in self.exclude or key in by_storage:
                continue
            by_storage[key] = {"region": relabel.get(key, p.region), "bytes": key[1],
                               "dtype": str(t.dtype).replace("torch.", ""), "shape": tuple(t.shape),
                               "storage_elements": key[1] // t.element_size()}
        return list(by_storage.values())


def measure_activations(model: ModelConfig | str, micro_batch: int, seq_len: int, *, attn: str = "eager",
                        seed: int = 0, step: bool = True, device: str = "cpu") -> Measurement:
    """Saved-for-backward bytes of one bf16 training forward pass (see the module docstring).

    ``device="cuda"`` runs it on a GPU and also records the caching allocator's counters."""
    torch, _ = require()
    from transformers import AutoModelForCausalLM

    m = load_model(model)
    _check_small(m, device)
    if m.positions == "learned" and seq_len > m.max_position_embeddings:
        raise ConfigError(f"seq_len={seq_len} exceeds max_position_embeddings={m.max_position_embeddings}, the "
                          f"positions {m.name} has embeddings for")
    cfg = hf_config(m, arch="v3", attn=attn, max_positions=max(seq_len, 2))
    torch.manual_seed(seed)
    with warnings.catch_warnings():       # no shared experts: empty Linears warn that init is a no-op
        warnings.simplefilter("ignore", UserWarning)
        with torch.device(device):      # built where it runs: no host copy of a large model
            hf = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    hf.train()
    params = {_storage_key(p) for p in hf.parameters()} | {_storage_key(x) for x in hf.buffers()}

    region = ["input"]
    hooks = []

    def enter(name):
        def pre(_mod, _args, *_kw):
            region[0] = name
        return pre

    def leave(name):
        def post(_mod, _args, _out, *_kw):
            region[0] = name
        return post

    rope_outputs: set = set()

    def rope_post(_mod, _args, out):
        for t in out:
            rope_outputs.add(_storage_key(t))

    core, embed, rotary, layers, norm = _MODULES.get(type(hf).__name__, _MODULES[None])
    core = getattr(hf, core)
    hooks.append(getattr(core, embed).register_forward_pre_hook(enter("embedding")))
    if rotary is not None:
        hooks.append(getattr(core, rotary).register_forward_hook(rope_post))
    for i, layer in enumerate(getattr(core, layers)):
        hooks.append(layer.register_forward_pre_hook(enter(f"layer.{i}")))
        hooks.append(layer.register_forward_hook(leave("between")))
    hooks.append(getattr(core, norm).register_forward_pre_hook(enter("final_norm")))
    hooks.append(hf.lm_head.register_forward_pre_hook(enter("head")))
    hooks.append(hf.lm_head.register_forward_hook(leave("loss")))

    saved = SavedTensors(exclude=params, region=lambda: region[0])

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, m.vocab_size, (micro_batch, seq_len), generator=g).to(device)
    labels = ids.clone()
    cuda = str(device).startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    with saved.hooks():
        out = hf(input_ids=ids, labels=labels, use_cache=False)
    allocator = None
    if cuda:
        torch.cuda.synchronize()
        allocator = {"before": before, "after_forward": torch.cuda.memory_allocated(),
                     "peak_forward": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.memory_reserved(),
                     "logits": out.logits.untyped_storage().nbytes()}
    for hnd in hooks:
        hnd.remove()
    storages = saved.storages(relabel={k: "embedding" for k in rope_outputs})
    regions: dict[str, int] = {}
    for d in storages:
        regions[d["region"]] = regions.get(d["region"], 0) + d["bytes"]
    meas = Measurement(m, micro_batch, seq_len, attn, regions, storages, allocator=allocator)
    meas.parameters = sum(p.numel() * p.element_size() for p in hf.parameters())
    if step:
        out.loss.backward()
        del out, saved
        meas.gradients = sum(p.grad.numel() * p.grad.element_size() for p in hf.parameters() if p.grad is not None)
        opt = torch.optim.AdamW(hf.parameters(), lr=1e-3)
        opt.step()
        meas.optimizer_states = sum(v.numel() * v.element_size() for st in opt.state.values()
                                    for v in st.values() if torch.is_tensor(v))
    return meas


# ------------------------------------------------------------------------------------------------
# prediction and comparison
# ------------------------------------------------------------------------------------------------
def region_of_key(key: str, layer: int | None = None) -> str:
    """The measurement region of a ledger entry key (``layer`` for a decoder-layer entry)."""
    head = key.split(".")[0]
    if layer is not None:
        return f"layer.{layer}"
    return {"final_norm": "final_norm", "head": "head", "loss": "loss"}.get(head, "embedding")


def predicted(model: ModelConfig | str, micro_batch: int, seq_len: int, profile: str = "hf-eager") -> dict:
    """The ledger's bytes per region (embedding, layer.i, final_norm, head, loss), per entry, and
    gradient and AdamW-state bytes of the bf16 model (DeepSeek's router weight is kept in fp32)."""
    from ..ledgers.base import ledger_bytes, training_values
    from ..config import TrainingConfig
    from ..model.profiles import act_profile
    from ..model.params import values

    m = load_model(model)
    _check_hf_compatible(m)
    ap = act_profile(profile)
    t = TrainingConfig(micro_batch=micro_batch, seq_len=seq_len, profile=profile, precision="paper")
    vals = {**values(m), **training_values(t)}
    rec = t.recipe
    regions: dict[str, int] = {}
    entries: dict[str, dict[str, int]] = {}

    def add(reg, ledger):
        d = ledger_bytes(ledger, t, rec).evaluate(vals)
        entries.setdefault(reg, {})
        for k, x in d.items():
            entries[reg][k] = entries[reg].get(k, 0) + x
        regions[reg] = regions.get(reg, 0) + sum(d.values())

    for e in ap.embedding(m):
        add(region_of_key(e.key), [e])
    for i, kind in enumerate(m.layer_kinds):
        add(f"layer.{i}", ap.layer(m, kind))
    for e in ap.head(m):
        add(region_of_key(e.key), [e])
    states = _predicted_states(m)
    return {"regions": regions, "entries": entries, **states}


def _predicted_states(m: ModelConfig) -> dict:
    """bf16 parameters and gradients (DeepSeek's fp32 router weights, as transformers keeps them); AdamW keeps
    two moments in each parameter's dtype and a 4-byte fp32 step counter per tensor."""
    tensors = memlib_hf_tensors(m)
    param_bytes, n_tensors = 0, 0
    for name, d in tensors.items():
        if d["buffer"]:
            continue
        if name.startswith("lm_head") and m.tie_word_embeddings:
            continue
        # DeepSeek's router weight is kept in fp32 (_keep_in_fp32_modules_strict); the others' are bf16
        param_bytes += d["count"] * (4 if d["block"] == "router" and m.family == "deepseek" else 2)
        n_tensors += 1
    if m.family == "deepseek" and not m.n_shared_experts:   # transformers still builds DeepSeek's shared
        n_tensors += 3 * m.layer_kinds.count("moe")           # experts, as three empty Linears
    return {"parameters": param_bytes, "gradients": param_bytes, "optimizer_states": 2 * param_bytes + 4 * n_tensors}


def compare(model: ModelConfig | str, micro_batch: int, seq_len: int, profile: str = "hf-eager", *,
            seed: int = 0, step: bool = True) -> dict:
    """Measured against predicted, per region and in total, with the difference."""
    if profile not in MEASURE_PROFILES:
        raise ConfigError(f"profile={profile!r} must be one of {', '.join(MEASURE_PROFILES)} "
                          f"(the ledgers of what transformers saves)")
    m = load_model(model)
    pred = predicted(m, micro_batch, seq_len, profile)
    meas = measure_activations(m, micro_batch, seq_len, attn=MEASURE_PROFILES[profile], seed=seed, step=step)
    names = list(pred["regions"])
    for r in meas.regions:
        if r not in names:
            names.append(r)
    rows = [{"region": r, "predicted": pred["regions"].get(r, 0), "measured": meas.regions.get(r, 0),
             "difference": meas.regions.get(r, 0) - pred["regions"].get(r, 0)} for r in names]
    total_p, total_m = sum(pred["regions"].values()), meas.total
    out = {"model": m.name, "profile": profile, "micro_batch": micro_batch, "seq_len": seq_len, "seed": seed,
           "regions": rows,
           "activations": {"predicted": total_p, "measured": total_m, "difference": total_m - total_p},
           "entries": pred["entries"]}
    if step:
        for k in ("gradients", "optimizer_states"):
            out[k] = {"predicted": pred[k], "measured": getattr(meas, k),
                      "difference": getattr(meas, k) - pred[k]}
    out["exact"] = all(r["difference"] == 0 for r in rows) and all(
        out[k]["difference"] == 0 for k in ("gradients", "optimizer_states") if k in out)
    out["storages"] = meas.storages
    return out


