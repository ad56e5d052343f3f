"""Ground truth for the transient peak: the allocation timeline of a whole Megatron-Core training step on the CPU.

:func:`measure_peak` runs Megatron-Core's own training step (forward and backward over the pipeline
schedule's micro-batches, gradient reduction, the optimizer step) on the CPU in a worker process, with
every storage recorded by :mod:`~memlib.measure.tracker` as the CUDA caching allocator would count it,
and returns the peak of each phase with what was alive at it, by category (:class:`PeakResult`,
:func:`format_text`).  ``memlib measure --framework megatron-core --peak`` runs it (:func:`cli`).

The derivation, with its sources (file:line), is in ``docs/derivations/measure_step.md``.
"""
from __future__ import annotations

import gc
import json
import sys
from dataclasses import asdict, dataclass, field

from ..config import ConfigError, ModelConfig, TrainingConfig, load_model
from .cpu_shims import _cuda_as_cpu_mode
from .megatron import Request
from .tracker import AllocationTracker

__all__ = ["PeakRequest", "Value", "PhasePeak", "Moment", "PeakResult",
           "measure_peak", "measure_peak_many", "result_of", "format_text", "region_of", "OPTIMIZER_IMPLS"]

#: torch's Adam standing in for Transformer Engine's FusedAdam
OPTIMIZER_IMPLS = ("fused", "foreach")


# ------------------------------------------------------------------------------------------------
# a request: a measurement request with the step's options
# ------------------------------------------------------------------------------------------------
@dataclass
class PeakRequest(Request):
    """One training step to measure: a model, the training options and the step's own."""

    num_microbatches: int = 1
    distributed_optimizer: bool = True
    optimizer_impl: str = "fused"
    iterations: int = 2
    #: weight gradients accumulated into main_grad by one GEMM (Megatron-LM's default; off: a bf16 weight
    #: gradient per Linear, added to main_grad by DDP's hook)
    gradient_accumulation_fusion: bool = True
    activations: bool = False     #: also :mod:`memlib.measure.megatron`'s saved-activation measurement, first

    def to_json(self) -> dict:
        return {**super().to_json(), "num_microbatches": self.num_microbatches,
                "distributed_optimizer": self.distributed_optimizer, "optimizer_impl": self.optimizer_impl,
                "iterations": self.iterations, "gradient_accumulation_fusion": self.gradient_accumulation_fusion,
                "activations": self.activations}

    def label(self) -> str:
        return (f"M={self.num_microbatches} distributed_optimizer={self.distributed_optimizer} "
                f"adam={self.optimizer_impl} grad_accum_fusion={self.gradient_accumulation_fusion} "
                + super().label())


# ------------------------------------------------------------------------------------------------
# the measuring process
# ------------------------------------------------------------------------------------------------
#: the optimizer methods whose temporaries are labelled (MegatronOptimizer, its subclasses, the torch optimizer)
_OPTIMIZER_METHODS = ("prepare_grads", "_copy_model_grads_to_main_grads", "get_grad_norm", "clip_grad_norm",
                      "count_zeros", "step_with_ready_grads", "_copy_main_params_to_model_params")


def region_of(label: str) -> str:
    """The region of a label's module path: ``embedding``, ``layer.i``, ``mtp.j``, ``head`` (final norm, output
    layer, the loss inside GPTModel), or the label's own name outside the model (``loss_func``, ``optimizer``, ...)."""
    path = label.split(":", 1)[1] if ":" in label else label
    parts = path.split(".")
    if parts[0] == "embedding":
        return "embedding"
    if parts[0] == "decoder" and len(parts) > 2 and parts[1] == "layers":
        return f"layer.{parts[2]}"
    if parts[0] == "mtp" and len(parts) > 2 and parts[1] == "layers":
        return f"mtp.{parts[2]}"
    if parts[0] in ("output_layer", "gpt") or path.startswith("decoder.final_layernorm"):
        return "head"
    return path or "step"


def _measure_peak(req: dict) -> dict:
    """Two training iterations of the request's model under the tracker: see the module docstring."""
    if req.get("activations"):
        from .megatron import _measure

        return {"activations": _measure({**req, "gradient_accumulation_fusion": False}), **_measure_step(req)}
    return _measure_step(req)


def _measure_step(req: dict) -> dict:
    import torch
    import megatron.core.pipeline_parallel.schedules as schedules
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from torch.utils._pytree import tree_leaves

    from . import cpu_shims as shims
    from .megatron_model import _build

    t, m = req["train"], req["model"]
    M, iterations = req["num_microbatches"], req["iterations"]
    b, s, v = t["micro_batch"], t["seq_len"], m["vocab_size"]
    # the data loader's batches, on the host (not counted): pretrain_gpt.get_batch copies each to the device
    g = torch.Generator().manual_seed(req["seed"])
    batches = []
    for _ in range(M * iterations):
        tokens = torch.randint(0, v, (b, s + 1), generator=g)
        batches.append({
            "tokens": tokens[:, :-1].clone(), "labels": tokens[:, 1:].clone(),
            "loss_mask": torch.ones(b, s, dtype=torch.float),
            "attention_mask": (torch.tril(torch.ones(s, s)) < 0.5).unsqueeze(0).unsqueeze(0).expand(b, 1, s, s).contiguous(),
            "position_ids": torch.arange(s).unsqueeze(0).expand(b, s).contiguous()})
    data = iter(batches)

    tracker = AllocationTracker(count_existing=False)    # everything on the device is built under it
    state = {"backward": False, "mb": 0, "it": 0}
    hooks, restore = [], []

    def fused(fn, *args, **kwargs):
        return tracker.fused(fn, *args, **kwargs)

    def share(dst, src):
        with tracker.paused():
            dst.untyped_storage().resize_(src.untyped_storage().nbytes())
            dst.untyped_storage().copy_(src.untyped_storage())
        tracker.share(dst, src)

    def prehook_for(path: str, accumulate: bool):
        def prehook(grads):
            tracker.label = "bwd:" + path
            if accumulate:
                for x in grads:
                    blk = tracker.block_of(x) if x is not None else None
                    if blk is not None and blk.kind is None and blk.window.endswith("backward"):
                        blk.kind = "weight_grad"
        return prehook

    def label_graph(out, path: str):
        todo = [x.grad_fn for x in tree_leaves(out) if isinstance(x, torch.Tensor) and x.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node is None:
                continue
            md = node.metadata
            if "memlib" in md:
                continue
            md["memlib"] = path
            node.register_prehook(prehook_for(path, type(node).__name__ == "AccumulateGrad"))
            todo.extend(n for n, _ in node.next_functions)

    def created(out):
        """Label the autograd nodes an op or an autograd Function just created by the module running (when
        they are created, so that a submodule's graph walk never claims its parent's nodes)."""
        label = tracker.label
        if torch.is_grad_enabled() and label != "build":   # (DDP's expand_as to reach the AccumulateGrad nodes)
            label_graph(out, label.split(":", 1)[1] if ":" in label else label)

    function_apply = torch.autograd.Function.__dict__["apply"]

    def apply(cls, *args, **kwargs):
        out = function_apply.__func__(cls, *args, **kwargs)
        created(out)
        return out

    gc.disable()                                     # frees at deterministic moments (Megatron-LM's --manual-gc)
    shims._FUSED_HOOK, shims._SHARE_HOOK = fused, share
    restore.extend(_collectives_on_copies(tracker))
    torch.autograd.Function.apply = classmethod(apply)
    restore.append(lambda: setattr(torch.autograd.Function, "apply", function_apply))
    try:
        with _cuda_as_cpu_mode(created), tracker:
            tracker.window("build")
            tracker.label = "build"
            model, cfg = _build(req, {"use_distributed_optimizer": req["distributed_optimizer"],
                                         "check_for_nan_in_grad": True})
            opt = _optimizer(torch, get_megatron_optimizer, OptimizerConfig, cfg, model, req)
            core = model.module.module if cfg.bf16 else model.module
            names = {mod: (name or "gpt") for name, mod in core.named_modules()}
            stack: list[str] = []

            def prefix():
                return "recompute:" if state["backward"] else "fwd:"

            def pre(mod, args):
                name = names.get(mod)
                if name is not None:
                    stack.append(name)
                    tracker.label = prefix() + name

            def post(mod, args, out):
                name = names.get(mod)
                if name is None:
                    return
                stack.pop()
                if torch.is_grad_enabled():
                    label_graph(out, name)
                tracker.label = prefix() + (stack[-1] if stack else "schedule")

            hooks.append(torch.nn.modules.module.register_module_forward_pre_hook(pre))
            hooks.append(torch.nn.modules.module.register_module_forward_hook(post))

            def pack(x):
                blk = tracker.block_of(x)
                if blk is not None and blk.kind is None:
                    blk.kind = "saved"
                return x

            def loss_func(loss_mask, output_tensor):        # pretrain_gpt.py's loss_func
                tracker.label = "fwd:loss_func"
                losses = output_tensor.view(-1).float()
                loss_mask = loss_mask.view(-1).float()
                loss = torch.sum(losses * loss_mask)
                num_tokens = loss_mask.sum().clone().detach().to(torch.int)
                report = {"lm loss": torch.cat([loss.clone().detach().view(1), num_tokens.view(1)])}
                label_graph(loss, "loss_func")
                tracker.label = "fwd:schedule"
                return loss, num_tokens, report

            def forward_step(data_iterator, model):         # pretrain_gpt.py's forward_step
                state["backward"] = False
                tracker.window(f"{state['it']}.mb{state['mb']}.forward")
                tracker.label = "fwd:get_batch"
                batch = {k: x.cuda(non_blocking=True).clone() for k, x in next(data_iterator).items()}
                tracker.label = "fwd:schedule"
                output = model(batch["tokens"], batch["position_ids"], batch["attention_mask"],
                               labels=batch["labels"], loss_mask=batch["loss_mask"])
                return output, _partial(loss_func, batch["loss_mask"])

            original_backward_step = schedules.backward_step

            def backward_step(*args, **kwargs):
                state["backward"] = True
                tracker.window(f"{state['it']}.mb{state['mb']}.backward")
                tracker.label = "bwd:schedule"
                try:
                    return original_backward_step(*args, **kwargs)
                finally:
                    state["mb"] += 1
                    state["backward"] = False
                    tracker.label = "schedule"

            schedules.backward_step = backward_step
            restore.append(lambda: setattr(schedules, "backward_step", original_backward_step))

            def finalize(*args, **kwargs):
                tracker.window(f"{state['it']}.finalize")
                tracker.label = "finalize_model_grads"
                return finalize_model_grads(*args, **kwargs)

            cfg.finalize_model_grads_func = finalize
            cfg.grad_scale_func = opt.scale_loss
            restore.extend(_label_optimizer(tracker, opt))
            forward_backward = get_forward_backward_func()

            iters = []
            gc.collect(0)                            # what building left in reference cycles (all young: no
                                                     # collection has run since gc.disable())
            tracker.reset_peak()
            for it in range(1, iterations + 1):
                state["it"], state["mb"] = it, 0
                tracker.window(f"{it}.zero_grad")
                tracker.label = "zero_grad"
                before = tracker.current
                model.zero_grad_buffer()
                opt.zero_grad()
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
                    store = forward_backward(forward_step_func=forward_step, data_iterator=data, model=[model],
                                             num_microbatches=M, seq_length=s, micro_batch_size=b,
                                             decoder_seq_length=s, forward_only=False)
                tracker.window(f"{it}.optimizer")
                tracker.label = "optimizer"
                update_ok, grad_norm, _ = opt.step()
                del store
                tracker.label = "step"
                after = tracker.current
                collected = gc.collect(0)
                iters.append({"iteration": it, "before": before, "after": after,
                              "after_gc": tracker.current, "gc_objects": collected,
                              "update_ok": bool(update_ok), "grad_norm": float(grad_norm or 0.0)})
            tracker.window("end")
            persistent = _persistent_blocks(tracker, model, core, opt)
    finally:
        shims._FUSED_HOOK = shims._SHARE_HOOK = None
        for h in hooks:
            h.remove()
        for f in restore:
            f()
        gc.enable()
    return _summary(tracker, iters, persistent, model, opt, req)


#: ProcessGroup methods that run a collective (and Work.wait, which completes one)
_COLLECTIVES = ("allreduce", "allreduce_coalesced", "allgather", "_allgather_base", "allgather_coalesced",
                "allgather_into_tensor_coalesced", "all_gather_single", "all_gather_single_coalesced", "reduce_scatter",
                "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "reduce_scatter_single",
                "reduce_scatter_single_coalesced", "alltoall", "alltoall_base", "all_to_all_single", "broadcast",
                "reduce", "gather", "scatter", "barrier", "send", "recv", "_start_coalescing", "_end_coalescing")


def _collectives_on_copies(tracker) -> list:
    """Run every collective of a one-process group on copies, untracked; the functions that undo it.

    NCCL writes into the tensors it is given and allocates nothing from the caching allocator, so nothing a
    collective does is counted (gloo's coalesced reduce-scatter, for one, copies).  And gloo's worker thread
    holds the tensors of a collective until it drops its work, after the work is complete: a tensor whose
    last reference that was would be freed in that thread at a moment that varies from run to run.  So
    gloo gets copies (made and dropped untracked) and the results are copied back once the work is done;
    in a group of several processes too (tensor parallelism, benchmarks/allocator_replay.py), where every
    rank runs the same collective, so waiting for it at once cannot hang; point-to-point ``send`` and
    ``recv`` run as they are."""
    import torch
    from torch._C._distributed_c10d import ProcessGroup, Work
    from torch.utils._pytree import tree_flatten, tree_unflatten

    undo = []

    def wrap(cls, name, on_copies):
        descriptor = cls.__dict__.get(name)           # pybind's instancemethod: restored as it was
        if descriptor is None:
            return
        fn = getattr(cls, name)

        def run(*args, **kwargs):
            with tracker.paused():
                if not (on_copies and args):
                    return fn(*args, **kwargs)
                leaves, spec = tree_flatten((args[1:], kwargs))
                copies = [x.detach().clone() if isinstance(x, torch.Tensor) else x for x in leaves]
                rest, kw = tree_unflatten(copies, spec)
                work = fn(args[0], *rest, **kw)
                if work is not None:
                    work.wait()
                with torch.no_grad():
                    for x, c in zip(leaves, copies):
                        if isinstance(x, torch.Tensor) and x.numel():
                            x.copy_(c)
                return work

        setattr(cls, name, run)
        undo.append(lambda: setattr(cls, name, descriptor))

    for name in _COLLECTIVES:
        wrap(ProcessGroup, name, on_copies=not name.endswith("_coalescing") and name not in ("send", "recv"))
    wrap(Work, "wait", on_copies=False)
    return undo


def _partial(fn, *args):
    import functools

    return functools.partial(fn, *args)


def _optimizer(torch, get_megatron_optimizer, OptimizerConfig, cfg, model, req):  # noqa: N803
    """``get_megatron_optimizer`` with Adam (torch's AdamW, ``fused`` or ``foreach``, as megatron-core's fallback)."""
    impl = req["optimizer_impl"]
    original = torch.optim.AdamW

    class AdamW(original):
        def __init__(self, params, **kwargs):
            kwargs[impl] = True
            super().__init__(params, **kwargs)

    oc = OptimizerConfig(optimizer="adam", lr=1e-4, weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.95,
                         adam_eps=1e-8, clip_grad=1.0, bf16=cfg.bf16, params_dtype=cfg.params_dtype,
                         use_distributed_optimizer=req["distributed_optimizer"])
    torch.optim.AdamW = AdamW
    try:
        return get_megatron_optimizer(oc, [model])
    finally:
        torch.optim.AdamW = original


def _optimizers(opt) -> list:
    return list(getattr(opt, "chained_optimizers", None) or [opt])


def _label_optimizer(tracker, opt) -> list:
    """Label what each step of the optimizer allocates by the method or the function of ``clip_grads`` that
    runs; the functions that undo the module-level wrapping."""
    import megatron.core.optimizer.optimizer as optimizer_module

    def wrap(obj, name, label):
        fn = getattr(obj, name, None)
        if fn is None:
            return None

        def run(*args, **kwargs):
            previous = tracker.label
            tracker.label = label
            try:
                return fn(*args, **kwargs)
            finally:
                tracker.label = previous

        setattr(obj, name, run)
        return fn

    for o in [opt] + [x for x in _optimizers(opt) if x is not opt]:
        for name in _OPTIMIZER_METHODS:
            wrap(o, name, f"optimizer.{name}")
        if hasattr(o, "optimizer"):
            wrap(o.optimizer, "step", "optimizer.adam")
    undo = []
    for name in ("clip_grad_by_total_norm_fp32", "get_grad_norm_fp32", "count_zeros_fp32"):
        fn = wrap(optimizer_module, name, f"optimizer.{name}")
        undo.append(lambda name=name, fn=fn: setattr(optimizer_module, name, fn))
    return undo


def _persistent_blocks(tracker, model, core, opt) -> dict:
    """id(block) -> what it holds, for the blocks of the model's and the optimizer's persistent tensors."""
    import torch

    out: dict[int, str] = {}

    def mark(x, kind):
        if isinstance(x, torch.Tensor):
            blk = tracker.block_of(x)
            if blk is not None and id(blk) not in out:
                out[id(blk)] = kind

    for p in model.parameters():
        mark(p, "parameters")
    for buf in list(model.buffers) + list(model.expert_parallel_buffers):
        mark(buf.grad_data, "grad_buffer")
        if getattr(buf, "param_data", None) is not None:
            mark(buf.param_data, "param_buffer")
    for _, x in core.named_buffers():
        mark(x, "module_buffers")
    for o in _optimizers(opt):
        for groups in ("shard_fp32_from_float16_groups", "fp32_from_float16_groups", "shard_fp32_groups",
                       "fp32_from_fp32_groups"):
            for group in getattr(o, groups, None) or []:
                for p in group:
                    mark(p, "main_params")
        for st in o.optimizer.state.values():
            for k, x in st.items():
                mark(x, "optimizer_step_counters" if k == "step" else "optimizer_states")
        for group in o.optimizer.param_groups:
            for p in group["params"]:
                mark(p, "main_params")
    try:
        from megatron.core.parallel_state import _GLOBAL_MEMORY_BUFFER
        if _GLOBAL_MEMORY_BUFFER is not None:
            for x in _GLOBAL_MEMORY_BUFFER.buffer.values():
                mark(x, "global_memory_buffer")
    except ImportError:
        pass
    for blk in tracker.alive_at(tracker.tick):
        if id(blk) not in out and blk.window.startswith("1."):
            # created in the first iteration, kept to the end: the RoPE cos/sin caches, the loss scales, the
            # auxiliary-loss trackers, the expert bias's token counts
            out[id(blk)] = "first_iteration_state"
    return out


def _category(blk, persistent: dict) -> str:
    kind = persistent.get(id(blk))
    if kind is not None:
        return kind
    if blk.label == "baseline":
        return "baseline"
    if blk.window == "build":
        return "build_state"        # the optimizer's scalars, RoPE's frequencies, ...
    phase = blk.window.rsplit(".", 1)[-1]
    if phase == "forward":
        return "saved_activations" if blk.kind == "saved" else "forward_held"
    if phase == "backward":
        if blk.label.startswith("recompute:"):
            return "recompute_saved" if blk.kind == "saved" else "recompute_held"
        if blk.kind == "weight_grad":
            return "weight_grads"
        if blk.kind == "saved":
            return "backward_saved"
        return "backward_transients"
    if phase == "optimizer":
        return "optimizer_transients"
    if phase in ("zero_grad", "finalize"):
        return f"{phase}_transients"
    return f"{phase}_other"          # allocated while building, not the model's nor the optimizer's


def _categories(tracker, tick: int, persistent: dict) -> dict:
    """Bytes alive at ``tick`` per category."""
    cats: dict[str, int] = {}
    for blk in tracker.alive_at(tick):
        c = _category(blk, persistent)
        cats[c] = cats.get(c, 0) + blk.bytes
    return cats


def _breakdown(tracker, tick: int, persistent: dict) -> dict:
    """What is alive at ``tick``: bytes per category, per (category, window, region), the largest blocks."""
    alive = tracker.alive_at(tick)
    cats: dict[str, int] = {}
    rows: dict[tuple, list[int]] = {}
    for blk in alive:
        c = _category(blk, persistent)
        cats[c] = cats.get(c, 0) + blk.bytes
        key = (c, "" if c in persistent.values() else blk.window,
               "" if c in persistent.values() else region_of(blk.label))
        r = rows.setdefault(key, [0, 0])
        r[0] += blk.bytes
        r[1] += 1
    largest = sorted(alive, key=lambda x: -x.bytes)[:12]
    return {"categories": cats,
            "rows": [{"category": c, "window": w, "region": reg, "bytes": n, "blocks": k}
                     for (c, w, reg), (n, k) in sorted(rows.items(), key=lambda kv: -kv[1][0])],
            "largest": [{"bytes": x.bytes, "category": _category(x, persistent), "window": x.window,
                         "label": x.label, "op": x.op, "dtype": x.dtype, "shape": list(x.shape)} for x in largest]}


def _summary(tracker, iters, persistent, model, opt, req) -> dict:
    windows = []
    names = [w.name for w in tracker.windows]
    for i, w in enumerate(tracker.windows):
        if w.name in ("build", "end"):
            continue
        end_tick = tracker.windows[i + 1].start_tick if i + 1 < len(names) else tracker.tick
        windows.append({"window": w.name, "start": w.start, "peak": w.peak, "end": w.end, "label": w.label,
                        "tick": w.tick, **_breakdown(tracker, w.tick, persistent),
                        "end_rows": _breakdown(tracker, end_tick, persistent)["rows"],
                        "end_categories": _categories(tracker, end_tick, persistent)})
    top = max(windows, key=lambda w: (w["peak"], -w["tick"]))
    peak_window = next(w for w in tracker.windows if w.name == top["window"])
    persistent_bytes: dict[str, int] = {}
    for blk in tracker.alive_at(tracker.tick):
        kind = persistent.get(id(blk))
        if kind is not None:
            persistent_bytes[kind] = persistent_bytes.get(kind, 0) + blk.bytes
    return {
        "iterations": iters,
        "max": tracker.peak,
        "max_window": top["window"], "max_label": peak_window.label,
        "fixed_segments": _fixed_segments(tracker),
        "windows": windows,
        "persistent": persistent_bytes,
        "baseline": tracker.baseline,
        "timeline": _segments(tracker),
        "param_count": sum(p.numel() for p in model.parameters()),
        "param_numels": [p.numel() for p in model.parameters()],
        "grad_buffer_numel": sum(buf.grad_data.numel() for buf in list(model.buffers)
                                 + list(model.expert_parallel_buffers)),
        "ops": tracker.ops,
        "blocks": len(tracker.blocks),
    }


def _fixed_segments(tracker) -> dict:
    """The step as the caching allocator without expandable segments counts it: every block of the tracker
    replayed, in the order it was allocated and freed, through :class:`memlib.device.allocator.CachingAllocator`
    (a request served from a cached block at most 1 MiB larger holds all of it): the peak of each window and
    what is allocated at the end."""
    import bisect

    from ..device.allocator import CachingAllocator

    events = []
    for k, blk in enumerate(tracker.blocks):
        if blk.pending or blk.nbytes <= 0:
            continue
        events.append((blk.born, 1, k))
        if blk.died is not None:
            events.append((blk.died, 0, k))
    events.sort()
    names = [w.name for w in tracker.windows]
    starts = [w.start_tick for w in tracker.windows]
    alloc, live, peaks = CachingAllocator(expandable_segments=False), {}, {}
    for tick, kind, k in events:
        if kind:
            live[k] = alloc.malloc(tracker.blocks[k].nbytes)
            name = names[bisect.bisect_left(starts, tick) - 1] if starts else ""
            peaks[name] = max(peaks.get(name, 0), alloc.allocated)
        else:
            alloc.free(live.pop(k))
    return {"peaks": peaks, "max": alloc.peak, "end": alloc.allocated}


def _segments(tracker) -> list[list]:
    """The timeline, one run per module boundary: consecutive ops with the same window and label, as
    ``[window, label, peak, end]`` (the live bytes at the run's highest op and at its last)."""
    out = []
    last = None
    for current, lid, wid in tracker.timeline:
        if (lid, wid) != last:
            w = tracker.windows[wid].name if wid >= 0 else ""
            out.append([w, tracker.labels[lid], current, current])
            last = (lid, wid)
        else:
            seg = out[-1]
            if current > seg[2]:
                seg[2] = current
            seg[3] = current
    return out


# ------------------------------------------------------------------------------------------------
# the caller's side: requests, results
# ------------------------------------------------------------------------------------------------
@dataclass
class Value:
    """A measured byte count, and (once memlib predicts it) the prediction beside it."""

    measured: int
    predicted: int | None = None

    @property
    def difference(self) -> int | None:
        return None if self.predicted is None else self.measured - self.predicted


@dataclass
class PhasePeak:
    """One phase of one iteration (``zero_grad``, ``forward`` or ``backward`` of a micro-batch, ``finalize``,
    ``optimizer``): the bytes allocated when it starts and ends, its peak (``max_memory_allocated`` after
    ``reset_peak_memory_stats`` at its start), what ran at the peak, and what was alive then."""

    iteration: int
    phase: str
    microbatch: int | None
    start: int
    peak: Value
    end: int
    label: str                               #: what ran at the peak: ``bwd:decoder.layers.1.mlp``, ...
    categories: dict[str, int]               #: bytes alive at the peak, per kind
    rows: list[dict]                         #: ... per (kind, window allocated in, region)
    largest: list[dict]                      #: the largest blocks alive at the peak
    end_categories: dict[str, int]           #: bytes alive at the phase's end, per kind
    end_rows: list[dict] = field(repr=False, default_factory=list)   #: ... per (kind, window, region)

    @property
    def name(self) -> str:
        mb = f".mb{self.microbatch}" if self.microbatch is not None else ""
        return f"{self.iteration}{mb}.{self.phase}"


@dataclass
class Moment:
    """A run of ops between two module boundaries: the live bytes at its highest op and at its last."""

    window: str
    label: str
    peak: int
    end: int


@dataclass
class PeakResult:
    """A measured training step (see the module docstring); every byte count is a CUDA caching-allocator
    block count, each :class:`Value` with room for a prediction."""

    model: str
    label: str
    request: dict
    before: list[Value]                     #: memory_allocated before each iteration's step
    after: list[Value]                      #: ... after its optimizer step
    max: Value                              #: max_memory_allocated over every iteration
    max_phase: str
    max_label: str
    phases: list[PhasePeak]
    persistent: dict[str, int]              #: what stays allocated after the last step, per kind
    param_count: int
    grad_buffer_numel: int
    iterations: list[dict]
    param_numels: list[int] = field(repr=False, default_factory=list)
    timeline: list[Moment] = field(repr=False, default_factory=list)
    ops: int = 0
    blocks: int = 0
    activations: dict | None = field(repr=False, default=None)   #: with ``activations``: measure_megatron's result
    #: the same step as the caching allocator without expandable segments counts it (``max``, ``end``, ``peaks`` per
    #: phase; :func:`_fixed_segments`): where it exceeds ``max``, requests held cached blocks up to 1 MiB larger
    fixed_segments: dict | None = field(repr=False, default=None)

    def phase(self, name: str) -> PhasePeak:
        """The phase called ``name`` (``2.mb0.backward``, ``2.optimizer``, ...)."""
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(name)

    def top_moments(self, n: int = 10, iteration: int | None = None) -> list[Moment]:
        """The ``n`` runs with the highest live bytes (of one iteration, or of all)."""
        ms = [m for m in self.timeline if iteration is None or m.window.startswith(f"{iteration}.")]
        return sorted(ms, key=lambda m: -m.peak)[:n]

    def to_json(self, timeline: bool = False) -> dict:
        d = asdict(self)
        if not timeline:
            d.pop("timeline")
        return d


def _phase(w: dict) -> PhasePeak:
    parts = w["window"].split(".")
    mb = int(parts[1][2:]) if len(parts) == 3 else None
    return PhasePeak(iteration=int(parts[0]), phase=parts[-1], microbatch=mb, start=w["start"], peak=Value(w["peak"]),
                     end=w["end"], label=w["label"], categories=w["categories"], rows=w["rows"],
                     largest=w["largest"], end_categories=w["end_categories"], end_rows=w["end_rows"])


def result_of(req: PeakRequest, raw: dict) -> PeakResult:
    """A worker's answer for ``req`` as a :class:`PeakResult` (:class:`ConfigError` if megatron-core failed)."""
    if not raw.get("ok"):
        raise ConfigError(f"megatron-core failed to run the configuration: {raw.get('error')}")
    its = raw["iterations"]
    return PeakResult(
        model=req.model.name, label=req.label(), request=req.to_json(),
        before=[Value(x["before"]) for x in its], after=[Value(x["after"]) for x in its],
        max=Value(raw["max"]), max_phase=raw["max_window"], max_label=raw["max_label"],
        phases=[_phase(w) for w in raw["windows"]], persistent=raw["persistent"], param_count=raw["param_count"],
        grad_buffer_numel=raw["grad_buffer_numel"], iterations=its, param_numels=raw["param_numels"],
        timeline=[Moment(*x) for x in raw["timeline"]], ops=raw["ops"], blocks=raw["blocks"],
        activations=raw.get("activations"), fixed_segments=raw.get("fixed_segments"))


def _check_peak(r: PeakRequest) -> None:
    if r.num_microbatches < 1:
        raise ConfigError(f"num_microbatches={r.num_microbatches} must be a positive integer")
    if r.optimizer_impl not in OPTIMIZER_IMPLS:
        raise ConfigError(f"optimizer_impl={r.optimizer_impl!r} must be one of {', '.join(OPTIMIZER_IMPLS)}")
    if r.iterations < 2:
        raise ConfigError(f"iterations={r.iterations} must be at least 2 (Adam's state is created at the first step)")
    if r.train.dp != 1 or r.train.tp != 1 or r.train.ep != 1 or r.train.cp != 1:
        raise ConfigError(f"dp={r.train.dp} tp={r.train.tp} ep={r.train.ep} cp={r.train.cp}: the step is measured "
                          f"in one process (all 1)")


def measure_peak_many(requests: list[PeakRequest], *, timeout: float = 900) -> list[PeakResult]:
    """Measure every request's training step in one worker process."""
    from .megatron import measure_many

    for r in requests:
        _check_peak(r)
    raws = measure_many(requests, timeout=timeout, worker="memlib.measure.step")
    return [result_of(r, x) for r, x in zip(requests, raws)]


def measure_peak(model: ModelConfig | str, train: TrainingConfig, *, num_microbatches: int = 1,
                 distributed_optimizer: bool = True, optimizer_impl: str = "fused", seed: int = 0) -> PeakResult:
    """One training step measured (one worker process): see the module docstring."""
    req = PeakRequest(load_model(model), train, seed, True, num_microbatches, distributed_optimizer, optimizer_impl)
    return measure_peak_many([req])[0]


# ------------------------------------------------------------------------------------------------
# text
# ------------------------------------------------------------------------------------------------
def format_text(r: PeakResult, top: int = 10) -> str:
    """The measurement as the CLI prints it."""
    t = r.request["train"]
    lines = [f"{r.model} · megatron-core (transformer_impl local, CPU): allocation of a training step · "
             f"b={t['micro_batch']} s={t['seq_len']} M={r.request['num_microbatches']} · recompute {t['recompute']} · "
             f"precision {t['precision']} · "
             f"{'distributed optimizer' if r.request['distributed_optimizer'] else 'optimizer not distributed'} · "
             f"Adam {r.request['optimizer_impl']} · seed {r.request['seed']}",
             "(bytes as torch.cuda.memory_allocated counts them: every tensor storage a block rounded up to 512 bytes; "
             "peaks per phase as max_memory_allocated after reset_peak_memory_stats at the phase's start)"]
    n = len(r.before)
    head = f"{'':<28}" + "".join(f"{'iteration ' + str(i + 1):>16}" for i in range(n))
    lines += ["", head, f"{'before the step':<28}" + "".join(f"{v.measured:>16,}" for v in r.before)]
    names = []
    for p in r.phases:
        key = (p.phase, p.microbatch)
        if key not in names:
            names.append(key)
    for phase, mb in names:
        label = f"{'mb' + str(mb) + ' ' if mb is not None else ''}{phase} peak"
        cells = []
        for i in range(n):
            p = next((x for x in r.phases if x.iteration == i + 1 and x.phase == phase and x.microbatch == mb), None)
            cells.append(f"{p.peak.measured:>16,}" if p else f"{'':>16}")
        lines.append(f"{label:<28}" + "".join(cells))
    lines.append(f"{'after the step':<28}" + "".join(f"{v.measured:>16,}" for v in r.after))
    lines += ["", f"max over the {n} iterations: {r.max.measured:,} bytes in {r.max_phase}, at {r.max_label}"]
    at = r.phase(r.max_phase)
    lines += ["", f"alive at the max ({r.max_phase}):"]
    width = max([len(k) for k in at.categories] + [10]) + 2
    for k, x in sorted(at.categories.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {k:<{width}}{x:>14,}")
    lines.append(f"  {'total':<{width}}{sum(at.categories.values()):>14,}")
    lines += ["", "  by where it was allocated (transients and activations):"]
    for row in at.rows:
        if row["window"]:
            lines.append(f"    {row['category']:<24}{row['window']:<18}{row['region']:<28}{row['bytes']:>12,}"
                         f"  ({row['blocks']} blocks)")
    lines += ["", "persistent after the last step: " + ", ".join(f"{k} {x:,}" for k, x in r.persistent.items()),
              f"parameters {r.param_count:,} elements; grad buffer {r.grad_buffer_numel:,} elements"]
    lines += ["", f"top {top} moments of iteration {n} (runs of ops between module boundaries; live bytes):"]
    for m in r.top_moments(top, iteration=n):
        lines.append(f"  {m.peak:>14,}  {m.window:<18}{m.label}")
    return "\n".join(lines)


if __name__ == "__main__":      # the measuring process
    from memlib.measure.megatron import _worker

    sys.exit(_worker(sys.argv[1:], _measure_peak))


def cli(model: ModelConfig, train: TrainingConfig, args) -> int | None:
    """``memlib measure --framework megatron-core``'s step options: None without ``--peak`` (after checking that
    no option of it is given), else the measurement printed and the exit code."""
    options = {"num_microbatches": 1, "distributed_optimizer": True, "adam": "fused"}
    if not args.peak:
        for name, default in options.items():
            if getattr(args, name) != default:
                raise ConfigError(f"{name}={getattr(args, name)} applies to --peak only")
        return None
    if not args.step:
        raise ConfigError("step=False: --peak measures a whole training step (drop --no-step)")
    req = PeakRequest(model, train, args.seed, True, args.num_microbatches, args.distributed_optimizer, args.adam)
    r = measure_peak_many([req])[0]
    if args.json:
        print(json.dumps({**r.to_json(), "top_moments": [asdict(m) for m in r.top_moments(20, len(r.before))]},
                         indent=2))
    else:
        print(format_text(r))
    return 0
