"""``memlib plan``: every parallel configuration of N GPUs that fits, ranked by the predicted step, as a table or JSON;
each listed configuration with the ``memlib estimate`` flags that give its peak again (:func:`estimate_args`)."""
from __future__ import annotations

import json
import sys
from fractions import Fraction

from ..config import ConfigError, parse_count, show
from ..core.units import fmt_bytes
from .options import _fraction, _list, _precisions, _size

#: a plan configuration's fields that ``memlib estimate`` takes as they are, by option
_PLAIN = (("dp", "--dp"), ("tp", "--tp"), ("pp", "--pp"), ("ep", "--ep"), ("etp", "--etp"), ("cp", "--cp"),
          ("zero", "--zero"), ("precision", "--precision"), ("profile", "--profile"),
          ("micro_batch", "--micro-batch"), ("seq_len", "--seq-len"), ("recompute", "--recompute"),
          ("schedule", "--schedule"), ("num_microbatches", "--num-microbatches"), ("vpp", "--vpp"),
          ("transformer_impl", "--transformer-impl"), ("attention_backend", "--attention-backend"),
          ("cross_entropy_fusion_impl", "--cross-entropy-fusion-impl"),
          ("moe_aux_loss", "--moe-router-load-balancing-type"), ("fp8_recipe", "--fp8-recipe"),
          ("routing_imbalance", "--routing-imbalance"), ("runtime", "--runtime"), ("cp_comm_type", "--cp-comm-type"),
          ("hidden_dropout", "--hidden-dropout"), ("attention_dropout", "--attention-dropout"),
          ("megatron_version", "--megatron-version"))
#: its switches: field -> (the option, the value that gives it)
_SWITCHES = {"sp": ("--no-sp", False), "attention_softmax_in_fp32": ("--attention-softmax-in-fp32", True),
             "bias_swiglu_fusion": ("--no-bias-swiglu-fusion", False),
             "cross_entropy_loss_fusion": ("--cross-entropy-loss-fusion", True),
             "moe_a2a_overlap": ("--overlap-moe-expert-parallel-comm", True),
             "overlap_grad_reduce": ("--overlap-grad-reduce", True),
             "overlap_param_gather": ("--overlap-param-gather", True)}
#: the framework's switches estimate takes (each off by its option)
_FRAMEWORK_SWITCHES = {"gradient_accumulation_fusion": "--no-gradient-accumulation-fusion",
                       "rope_fusion": "--no-rope-fusion", "moe_grouped_gemm": "--no-moe-grouped-gemm",
                       "permute_fusion": "--no-moe-permute-fusion"}
#: fields that follow from the others (checked by estimate itself)
_DERIVED = ("edp", "world_size")


def estimate_args(model: str, config: dict, gpu: str | None = None) -> list[str]:
    """``memlib estimate`` arguments that give ``config`` (a ``plan`` configuration, as its JSON lists it) again:
    every field as its option (a field with no option, or a framework estimate does not build, is refused)."""
    from ..device.peak import COMPUTE_CAPABILITY, Framework

    args = ["estimate", "--model", model]
    seen = set(_DERIVED) | {"framework", "overhead", "layout"}
    for key, opt in _PLAIN:
        args += [opt, str(config[key])]
        seen.add(key)
    for key, (opt, value) in _SWITCHES.items():
        if config[key] == value:
            args.append(opt)
        seen.add(key)
    args += ["--layout", ",".join(map(str, config["layout"]))]
    for key, opt in (("fp8", "--fp8-format"), ("ddp_bucket_size", "--ddp-bucket-size")):
        if config[key] is not None:
            args += [opt, str(config[key])]
        seen.add(key)
    if config["offload_modules"]:
        args += ["--offload-modules", ",".join(config["offload_modules"])]
    seen.add("offload_modules")
    fw = dict(config["framework"])
    cc = fw["compute_capability"]
    names = [g for g in ((gpu,) if gpu else ()) + tuple(COMPUTE_CAPABILITY) if COMPUTE_CAPABILITY.get(g) == cc]
    for key, opt in _FRAMEWORK_SWITCHES.items():
        if fw[key] is False:
            args.append(opt)
    if fw["token_dispatcher"] != Framework().token_dispatcher:
        args += ["--moe-token-dispatcher-type", fw["token_dispatcher"]]
    built = {**Framework(compute_capability=cc).values(), **{k: fw[k] for k in (*_FRAMEWORK_SWITCHES, "token_dispatcher")}}
    if not names or fw != built:
        raise ConfigError(f"framework={show(fw, 200)}: estimate builds {built} from its options")
    args += ["--gpu", names[0]]
    ov = config["overhead"]
    args += ["--cuda-context", str(ov["cuda_context"]), "--comm-buffers", str(ov["comm_buffers"]),
             "--fragmentation", str(Fraction(ov["fragmentation"]))]
    left = set(config) - seen
    if left:
        raise ConfigError(f"plan configuration field(s) {sorted(left)} have no estimate option")
    return args


def _cost_model(args):
    from ..search.cost import CostModel

    over = {name: None if getattr(args, name) is None else float(_fraction(name, getattr(args, name)))
            for name in ("flops", "nvlink", "network", "efficiency")}
    over["hbm_bw"] = None if args.hbm_bandwidth is None else float(_fraction("hbm_bandwidth", args.hbm_bandwidth))
    return CostModel.of(args.gpu, gpus_per_node=args.gpus_per_node, cp_comm=args.cp_comm, **over)


def _rules(args):
    from dataclasses import replace

    from ..search.plan import FULL, PRACTICAL

    space = FULL if args.space == "full" else PRACTICAL
    changes = {}
    if args.min_cp_tokens is not None:
        changes["min_cp_tokens"] = args.min_cp_tokens
    if args.tp_across_nodes:
        changes["tp_in_node"] = False
    if args.any_etp:
        changes["etp1_fine_grained"] = False
    return replace(space, **changes)


def _plan(args) -> int:
    from ..device.overhead import DEVICE_MEMORY, overheads
    from ..search.plan import DEFAULT_GLOBAL_BATCH, SearchSpace, parse_fix, plan

    zeros = None
    if args.zero is not None:
        zeros = []
        for z in _list("zero", args.zero):
            n = parse_count("zero", z, minimum=0)
            if n not in (0, 1, 2, 3):
                raise ConfigError(f"zero={show(z)} must be one of 0, 1, 2, 3")
            zeros.append(n)
    cost = _cost_model(args)
    capacity = _size("gpu_memory", args.gpu_memory) if args.gpu_memory is not None else DEVICE_MEMORY[cost.gpu.name]
    space = SearchSpace(seq_len=args.seq_len, global_batch=args.global_batch or DEFAULT_GLOBAL_BATCH,
                        profiles=_list("profile", args.profile), precisions=_precisions(args.precision),
                        recomputes=[x.replace("+", ",") for x in _list("recompute", args.recompute)],
                        schedules=_list("schedule", args.schedule), zeros=zeros,
                        layout_rules=_list("layout_rule", args.layout_rule), fix=parse_fix(args.fix),
                        max_micro_batch=args.max_micro_batch, max_vpp=args.max_vpp, rules=_rules(args))
    result = plan(args.model, args.gpus, capacity, space, top=args.top, overhead=overheads(args.overhead), cost=cost,
                  progress=not args.json and sys.stderr.isatty())
    data = result.to_dict()
    for c in data["configs"]:
        c["estimate_args"] = estimate_args(data["model"], c["config"], cost.gpu.name)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    u = args.unit
    cm = data["cost_model"]
    print(f"{data['model']} · {data['gpus']} GPUs {cm['name']} of {fmt_bytes(data['capacity'], u)} · "
          f"{args.space} space · searched {data['searched']:,} configurations, {data['fitting']:,} fit")
    print(f"(ranked by the predicted step of memlib.search.cost: FLOPs at {cm['flops'] / 1e12:,.0f} TFLOP/s x "
          f"efficiency {cm['efficiency']:.2f}, communication not overlapped, bubble, data parallelism, optimizer; "
          f"seconds per step; '=' marks a step within {cm['tie_band']:.0%} of the fastest, the model's tie band)")
    head = ("#", "", "PP", "TP", "CP", "DP", "EP", "ETP", "ZeRO", "b", "M", "schedule", "layout", "recompute",
            "precision", f"peak {u}", "stage", "compute", "TP", "EP", "CP", "PP", "bubble", "DP", "step s")
    rows = []
    for i, c in enumerate(data["configs"], 1):
        cf, co = c["config"], c["cost"]
        sched = cf["schedule"] + (f" V{cf['vpp']}" if cf["vpp"] > 1 else "")
        rows.append((str(i), "=" if c["tie"] else "", str(cf["pp"]), str(cf["tp"]), str(cf["cp"]), str(cf["dp"]),
                     str(cf["ep"]), str(cf["etp"]), str(cf["zero"]), str(cf["micro_batch"]),
                     str(cf["num_microbatches"]), sched, c["layout_rule"], cf["recompute"], cf["precision"],
                     fmt_bytes(c["peak"], u, with_unit=False), str(c["peak_stage"]),
                     *(f"{co[k]:.2f}" for k in ("compute_s", "tp_s", "ep_s", "cp_s", "pp_s", "bubble_s", "dp_s",
                                                  "step_s"))))
    if not rows:
        print("nothing fits")
        return 0
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for r in rows:
        print("  ".join(x.rjust(w) for x, w in zip(r, widths)))
    return 0
