"""The peak a device reports: ``torch.cuda.max_memory_allocated()`` over a training step, as named terms.

memlib's per-device ``allocated`` (:mod:`memlib.device.estimate`) is the model states plus the activations that
the schedule keeps in flight.  What PyTorch's allocator reports at its peak has three parts:

persistent
    what stays allocated across steps.  Under the ``megatron`` profile with ZeRO 0 or 1 (DDP, or the
    distributed optimizer) this is :func:`memlib.device.megatron_buffers.persistent_memory`: the contiguous
    parameter and ``main_grad`` buffers with their padding, the optimizer's shards, Transformer Engine's
    workspaces and dummy weight gradients, the RoPE caches, the router's and the token dispatcher's
    buffers, FP8 weight copies.  Otherwise it is memlib's model states.
activations
    the micro-batches the schedule holds at the worst moment of the replay (:mod:`memlib.device.schedule`),
    each chunk's saved tensors (:mod:`memlib.ledgers.paper`) with routed-token entries scaled by the
    routing imbalance, minus what fine-grained activation offloading moved to the host; with the MoE
    all-to-all overlap (``--overlap-moe-expert-parallel-comm``) one more layer's forward: the combined
    1F1B step runs the next micro-batch's forward layer by layer while the current backward frees its
    layers, so one layer of the new forward is alive beyond what the schedule holds.  Fine-grained offloading
    (megatron/core/pipeline_parallel/fine_grained_activation_offload.py at 4e85d74ae9) keeps on the GPU the
    last group of each module name of the first chunk to run its backward (``post_warmup_callback``) and, on
    the last pipeline stage, of the model's last chunk, whose backward follows its forward at once
    (``should_bulk_offload``); with that layer kept, each group start's backward fetches back the groups of the
    layer before it (``bulk_reload``), and a chunk whose own groups are all back fetches the next backward chunk's
    last layer (``pre_reload_last_layer``), which stays through the forward the schedule runs before that
    backward: ``offload_prefetch`` in a forward moment.  Saved-tensor hooks see each save of a tensor, so a layer
    comes back with every saved copy (``Saved.saves``: TE's unfused attention's probabilities, saved by the
    softmax and by P V, come back twice); a backward moment holds its own layer so (``offload_reload``).
transient
    what is alive only while a chunk computes, beyond the micro-batch it holds: the worst of a few
    candidate moments of one micro-batch (:mod:`memlib.device.transient`, built from the chunk's ledgers in the
    order the forward saves them and the order the backward frees them): the end of the forward (the bf16
    logits beside the fp32 softmax, the hidden states ``GPTModel.forward`` holds), the forward of the last
    MoE layer's experts (three copies of the dispatched tokens, four with TE's grouped experts behind the
    fused permutation), the first attention backward (the local softmax's four ``s x s`` tensors, or TE's
    in-place fused softmax: the probabilities' gradient beside the context's, after the later layers' and
    the heads' tensors were freed), the
    recomputation of the last layer or MTP block.  Each as named terms: ``recompute_working_set``,
    ``backward_gradients``, ``cross_entropy_logits``, ``offload_reload`` (in backward moments one layer's offloaded
    tensors reloaded with every saved copy; in an attention's forward the layer's own, not yet offloaded), ``forward_transients`` and ``backward_released`` (negative: what the
    backward freed by then).  The optimizer step allocates nothing that outlives an op at these sizes
    (fused Adam works in place).  Checked against a measured Megatron-Core step on the CPU
    (:mod:`memlib.measure.step`, tests/device/test_peak_cpu.py).

``peak_reserved`` adds the allocator's caching to the peak: the overhead preset's fragmentation
fraction of it (PyTorch's ``max_memory_reserved`` minus ``max_memory_allocated``).

What is not modelled (and so missing from the peak where a run has it): a kernel's internal workspace
that is not a tensor (cuDNN, cuBLASLt), NCCL's own buffers, the flex dispatcher's (DeepEP, HybridEP)
buffers, CUDA graph pools, the allocator's unsplit remainders of activations without ``expandable_segments``
(a request served from a cached block at most 1 MiB larger holds all of it; none can when every large
activation is a multiple of 2 MiB, :func:`memlib.device.allocator.unsplit_remainders_impossible`, and the
step replayed on the CPU, :attr:`memlib.measure.step.PeakResult.fixed_segments`, shows about 1 MiB a layer
where a 3 MiB QKV output meets 4 MiB residual-stream tensors: how many depends on the order of every
request, which the ledgers do not hold), and FP8 recipes' effect on the saved activations
(:attr:`~memlib.config.TrainingConfig.fp8` changes only the persistent FP8 weight copies).
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Mapping, Optional, Sequence

from ..core.breakdown import Breakdown
from ..config import ConfigError, TrainingConfig, ZeroStage, show
from ..config.strategies import Schedule
from ..model.partition import Partition
from .megatron_buffers import MIN_OFFLOADED_ELEMENTS
from .schedule import Moment, default_microbatches
from .transient import FORWARD_CANDIDATES, TERMS

__all__ = ["COMPUTE_CAPABILITY", "Framework", "ChunkLoad", "offloaded_entry", "is_routed_entry", "TRANSIENT_TERMS", "StagePeak",
           "persistent_terms", "stage_peak", "pipeline_pairs_replaced", "MIN_OFFLOADED_ELEMENTS"]

#: CUDA compute capability (major) of the GPUs memlib names: it sizes Transformer Engine's and cuBLAS's
#: workspaces (memlib.device.megatron_buffers)
COMPUTE_CAPABILITY = {"A100": 8, "H100": 9, "H800": 9, "H200": 9, "B200": 10, "GB200": 10}


#: the transient terms, in the order the breakdown lists them (the candidate moments' terms)
TRANSIENT_TERMS = TERMS


@dataclass(frozen=True)
class Framework:
    """How the framework around the model is built: the options of
    :func:`memlib.device.megatron_buffers.persistent_memory` that a :class:`~memlib.config.TrainingConfig`
    does not hold, with the defaults of a DeepSeek-V3-style Megatron-LM run (grouped-GEMM experts, the
    all-to-all dispatcher with fused permutation, RoPE and gradient-accumulation fusion) on a Hopper GPU.
    :func:`memlib.megatron.flags.parse_megatron_args` sets them from a run's flags."""

    compute_capability: int = 9
    gradient_accumulation_fusion: bool = True
    rope_fusion: bool = True
    moe_grouped_gemm: bool = True
    token_dispatcher: str = "alltoall"
    permute_fusion: bool = True
    cublas_workspace_config: Optional[str] = None
    expandable_segments: bool = True
    deterministic: bool = False      #: --deterministic-mode (the embedding's backward: index_put, no partial sums)
    #: the data loader builds the GPT dataset's [b, 1, s, s] bool attention mask (Megatron-LM's default,
    #: create_attention_mask_in_dataloader; off with --no-create-attention-mask-in-dataloader).  memlib's own default
    #: is off: a run read from its flags (parse_megatron_args) gets Megatron-LM's
    attention_mask_in_batch: bool = False
    #: PyTorch with pytorch#175344 (merged 2026-02-19): 32 MiB cuBLAS workspaces on Blackwell too (False: an older
    #: PyTorch, Hopper only; memlib.config.versions.container_rules reads it from an NGC container)
    blackwell_cublas_32mib: bool = True
    #: --rerun-mode (disabled, validate_results: Megatron-LM's default, report_stats): RerunDataIterator saves the
    #: step's micro-batches unless disabled
    rerun_mode: str = "validate_results"
    #: the rank predicted is its tensor-parallel group's first, the one that reads the data loader (get_batch); the
    #: functional tests log the last rank, TP rank TP - 1
    data_loading_rank: bool = True

    def buffer_options(self, train: TrainingConfig, grad_dtype_bytes: int, param_dtype_bytes: int) -> dict:
        """The keyword options of :func:`~memlib.device.megatron_buffers.persistent_memory` for ``train``."""
        opts = {k: getattr(self, k) for k in ("compute_capability", "gradient_accumulation_fusion", "rope_fusion",
                                             "moe_grouped_gemm", "token_dispatcher", "permute_fusion",
                                             "cublas_workspace_config", "expandable_segments",
                                             "blackwell_cublas_32mib", "attention_mask_in_batch", "rerun_mode",
                                             "data_loading_rank")}
        opts.update(distributed_optimizer=train.zero >= ZeroStage.OS, grad_dtype_bytes=grad_dtype_bytes,
                    param_dtype_bytes=param_dtype_bytes, overlap_grad_reduce=train.overlap_grad_reduce,
                    bucket_size=train.ddp_bucket_size, fp8=train.fp8,
                    fp8_recipe=train.fp8_recipe if train.fp8_recipe in ("delayed", "tensorwise") else "delayed")
        return opts

    def values(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


# ------------------------------------------------------------------------------------------------
# which saved tensors the features touch
# ------------------------------------------------------------------------------------------------
#: --offload-modules name -> the ledger entries (key after the layer's prefix) its group saves: each
#: module's *input* and whatever autograd saves inside it (megatron/core/transformer/transformer_layer.py,
#: multi_latent_attention.py, moe/experts.py: the off_interface groups)
_OFFLOAD = {
    "attn_norm": ("attention.norm_input", "attention.norm_rstd"),
    "qkv_linear": ("attention.norm_output", "attention.c_q", "attention.c_q_rstd", "attention.c_q_normed",
                   "attention.c_kv", "attention.c_kv_rstd", "attention.c_kv_normed", "attention.q_proj_norm_rstd",
                   "attention.q_proj_norm_output"),
    "core_attn": ("attention.q", "attention.k", "attention.v", "attention.softmax_lse", "attention.softmax_out",
                  "attention.softmax_fp32"),
    "attn_proj": ("attention.context",),
    "mlp_norm": ("moe.norm_input", "moe.norm_rstd", "mlp.norm_input", "mlp.norm_rstd"),
    "expert_fc1": ("moe.routed.fc1_input",),
    "moe_act": ("moe.routed.swiglu_input",),
}


def _local_key(key: str) -> str:
    return key[4:] if key.startswith("mtp.") else key


def offloaded_entry(key: str, modules: Sequence[str]) -> bool:
    """Whether the ledger entry ``key`` (of a decoder layer or an MTP block) is saved inside one of the
    offloaded ``modules``' groups.  ``attention.context`` is kept by W^O as well: it leaves the GPU only
    when ``attn_proj`` is offloaded too."""
    k = _local_key(key)
    return any(k in _OFFLOAD.get(mod, ()) for mod in modules)


def is_routed_entry(key: str) -> bool:
    """Whether ``key`` is a per-dispatched-token entry (its rows follow the routing)."""
    return _local_key(key).startswith("moe.routed.")


# ------------------------------------------------------------------------------------------------
# one chunk, evaluated
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChunkLoad:
    """One model chunk of a rank, evaluated in bytes: what one micro-batch through it keeps on the GPU
    and what it needs while it computes."""

    held: int                 #: one micro-batch's saved activations kept on the GPU
    offloaded: int            #: one micro-batch's saved activations moved to the host
    working: int              #: the recompute working set (what one layer's policy dropped)
    gradients: int            #: unused since the candidate moments (kept for callers; 0)
    reload: int               #: the offloaded activations of its largest layer, reloaded for backward
    logits: int               #: the bf16 logits of one output head (0 without the head)
    layer: int = 0            #: the largest layer's kept saved tensors (one layer's forward)
    #: the candidate moments of one micro-batch (:func:`memlib.device.transient.candidates`): name -> named terms
    candidates: tuple = ()
    #: one offloaded layer reloaded ahead of its backward, every saved copy (``Saved.saves``): what the previous
    #: backward chunk's last groups fetch back for this chunk (0 when it offloads nothing)
    prefetch: int = 0
    #: the model's last chunk: its forward follows its own previous micro-batch's backward, which prefetches nothing
    #: for it (the next backward chunk, this one, has not finished its forward)
    last: bool = False

    def moment(self) -> str:
        """The name of the candidate moment with the most bytes (the first such)."""
        if not self.candidates:
            return ""
        return max(self.candidates, key=lambda c: sum(c[1].values()))[0]

    def transient(self) -> dict[str, int]:
        """The named terms of the worst candidate moment (:mod:`memlib.device.transient`); without candidates the
        older bound: the working set, the larger of the gradient pair and the logits, the reload."""
        if self.candidates:
            name = self.moment()
            return dict(next(t for n, t in self.candidates if n == name))
        grads, logits = (self.gradients, 0) if self.gradients >= self.logits else (0, self.logits)
        return {**dict.fromkeys(TRANSIENT_TERMS, 0), "recompute_working_set": self.working,
                "backward_gradients": grads, "cross_entropy_logits": logits, "offload_reload": self.reload}


# ------------------------------------------------------------------------------------------------
# the peak of one rank
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StagePeak:
    """The prediction of ``max_memory_allocated()`` on one rank, term by term."""

    stage: int
    persistent: dict[str, int]        #: named persistent terms (buffers, states, framework)
    persistent_source: str            #: megatron_buffers or states
    moment: Moment                    #: the schedule moment of the peak
    activations: dict[str, int]       #: chunk label -> held bytes at that moment (and the overlap's extra)
    transient: dict[str, int]         #: named transient terms at that moment
    fragmentation: int = 0            #: the allocator's caching on top (reserved - allocated)
    candidate: str = ""               #: the computing chunk's worst candidate moment (memlib.device.transient)

    @property
    def peak_allocated(self) -> int:
        return sum(self.persistent.values()) + sum(self.activations.values()) + sum(self.transient.values())

    @property
    def peak_reserved(self) -> int:
        return self.peak_allocated + self.fragmentation

    def breakdown(self) -> Breakdown:
        """Every term, nested by part: persistent, activations, transient."""
        return Breakdown({"persistent": Breakdown(self.persistent), "activations": Breakdown(self.activations),
                          "transient": Breakdown(self.transient)})

    def to_dict(self) -> dict:
        return {"peak_allocated": self.peak_allocated, "peak_reserved": self.peak_reserved,
                "breakdown": {"persistent": dict(self.persistent), "persistent_source": self.persistent_source,
                              "activations": dict(self.activations), "transient": dict(self.transient),
                              "fragmentation": self.fragmentation,
                              "moment": {"in_flight": list(self.moment.counts),
                                         "computing": list(self.moment.running)}}}


#: the optimizer states Megatron-Core's buffers hold (memlib.device.megatron_buffers counts them this way: fp32 main
#: parameters and Adam moments)
MEGATRON_OPTIMIZER = (("master_weights", 4), ("exp_avg", 4), ("exp_avg_sq", 4))


def persistent_terms(part: Partition, stage: int, states: Mapping[str, int], framework: Framework,
                     grad_dtype_bytes: int, param_dtype_bytes: int,
                     optimizer: Sequence[tuple[str, int]] = MEGATRON_OPTIMIZER) -> tuple[dict[str, int], str]:
    """The persistent terms of ``stage``: Megatron-Core's buffers (megatron profile, ZeRO 0 or 1, a precision
    whose optimizer keeps fp32 main parameters and moments, as the buffers count them), otherwise memlib's
    model states ``states`` (parameters, gradients, optimizer_states)."""
    t = part.train
    states_held = tuple((k, b) for k, b in optimizer if k != "main_grad")
    if part.profile.megatron_kernels and t.zero <= ZeroStage.OS and states_held == MEGATRON_OPTIMIZER:
        from .megatron_buffers import persistent_memory

        opts = framework.buffer_options(t, grad_dtype_bytes, param_dtype_bytes)
        terms = persistent_memory(part, stage, **opts).evaluate(part.values)
        return {k: int(v) for k, v in terms.items() if v}, "megatron_buffers"
    return {k: int(v) for k, v in states.items()}, "states"


def pipeline_pairs_replaced(mo: Moment, fed: Sequence[int], train: TrainingConfig, stage: int) -> int:
    """How many of the rank's pipeline input pairs (the persistent term ``pipeline_input_tensors``: a chunk fed
    by the previous stage keeps its last received input and the input's gradient) are gone at ``mo``.  A chunk's
    forward replaces its pair (``set_input_tensor``).  Under 1F1B the pair of the micro-batch just backwarded
    is alive again through the next forward: the steady loop's ``output_tensor`` still holds its autograd
    graph, whose AccumulateGrad node references the received input (megatron/core/pipeline_parallel/
    schedules.py:2390 and 2428 at MEGATRON_COMMIT), so only a rank with fewer than two steady forwards lacks
    it.  The interleaved schedule drops the output with ``backward_step_helper``'s locals (schedules.py:1433):
    a chunk with a micro-batch in flight holds that micro-batch's input among its activations, no pair.
    GPipe runs every forward before any backward."""
    if train.schedule is Schedule.INTERLEAVED:
        return sum(1 for c in fed if mo.counts[c])
    if train.schedule is Schedule.ONE_F_ONE_B:
        m = default_microbatches(train)
        return len(fed) if m - min(train.pp - 1 - stage, m) < 2 else 0
    return len(fed)


def stage_peak(stage: int, persistent: tuple[dict[str, int], str], chunks: Sequence[ChunkLoad],
               moments: Sequence[Moment], train: TrainingConfig, fragmentation: Fraction = Fraction(0)) -> StagePeak:
    """The worst moment of the replay for one rank: held activations, the overlap's extra forward and the
    transient terms of the chunks computing, on top of the persistent terms."""
    if not moments:
        raise ConfigError(f"stage {stage}: the schedule replay has no moment")
    # the chunks fed by the previous stage (all but the model's first) and the pair each keeps
    fed = [c for c in range(len(chunks)) if stage or c]
    pair = persistent[0].get("pipeline_input_tensors", 0) // max(len(fed), 1)

    def at(mo: Moment) -> tuple[dict[str, int], dict[str, int], str]:
        held = {f"chunk{c}": n * chunks[c].held for c, n in enumerate(mo.counts) if n}
        if train.moe_a2a_overlap and mo.running:
            held["a2a_overlap_forward"] = max(chunks[c].layer for c in mo.running)
        gone = pipeline_pairs_replaced(mo, fed, train, stage) if pair else 0
        if gone:
            held["pipeline_inputs_replaced"] = -gone * pair
        # fine-grained offloading's prefetch: a chunk's backward ends by reloading the next backward chunk's last
        # layer, every saved copy, which stays on the GPU through the forward that runs before that backward
        # (``bulk_reload`` -> ``pre_reload_last_layer``): one layer of a held micro-batch other than the running one
        prefetch = max([chunks[c].prefetch for c, n in enumerate(mo.counts) if n - (c in mo.running) > 0] or [0])
        trans, cand, extra = dict.fromkeys(TRANSIENT_TERMS, 0), "", prefetch
        best = None
        for c in mo.running:
            cands = chunks[c].candidates or (("", chunks[c].transient()),)
            for name, terms in cands:
                # a backward moment consumes its own chunk's reloaded layer instead (offload_reload)
                pf = prefetch if name in FORWARD_CANDIDATES and not chunks[c].last else 0
                if best is None or sum(terms.values()) + pf > best[0]:
                    best = (sum(terms.values()) + pf, dict(terms), name, pf)
        if best is not None:
            _, terms, cand, extra = best
            trans.update(terms)
        if extra:
            held["offload_prefetch"] = extra
        return held, trans, cand

    best = None
    for mo in moments:
        held, trans, cand = at(mo)
        total = sum(held.values()) + sum(trans.values())
        if best is None or total > best[0]:
            best = (total, mo, held, trans, cand)
    _, mo, held, trans, cand = best
    pers, source = persistent
    base = sum(pers.values()) + best[0]
    frag = int(-(-Fraction(fragmentation) * base // 1))
    return StagePeak(stage, dict(pers), source, mo, held, trans, frag, cand)


def check_framework(fw: Framework) -> Framework:
    """One-line errors for a :class:`Framework` (the buffer module checks the rest)."""
    if not isinstance(fw, Framework):
        raise ConfigError(f"framework={show(fw)} must be a memlib.device.peak.Framework")
    return fw
