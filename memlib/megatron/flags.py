"""Megatron-LM's own launch flags read as a memlib configuration (``memlib estimate --megatron-args``).

:func:`parse_megatron_args` reads the flags of a ``pretrain_gpt.py`` run (:mod:`~memlib.megatron.reader`)
and returns a :class:`MegatronRun`: the :class:`~memlib.config.ModelConfig`, the
:class:`~memlib.config.TrainingConfig` (profile ``megatron``), the flags it mapped, the flags known not to
change memory, and the flags memlib does not model (one warning line).  Semantics and defaults are
Megatron-LM's at commit d98e8a64dd and megatron-core 0.19.2: how each flag maps (model, vocabulary,
parallelism, layout strings, precision) and which flags are refused or warned about.

The model's half of the reading is :class:`~memlib.megatron.model_flags.ModelFlags`; the tables of flags are
:mod:`~memlib.megatron.tables`, the vocabulary and precision rules :mod:`~memlib.megatron.rules`.  The
derivation, with its sources (file:line), is in ``docs/derivations/megatron_flags.md``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Mapping, Optional

from ..ledgers.base import MODULES as RECOMPUTE_MODULES
from ..config import (
    FP8_FORMATS, FP8_RECIPES, LIMITS, OFFLOAD_MODULES, ConfigError, ModelConfig, TrainingConfig, model_from_dict,
    show,
)
from ..config.strategies import CP_COMM_TYPES, AttnBackend, LoadBalancing, TransformerImpl
from ..config.versions import DEFAULT_VERSION, parse_version
from ..device.peak import Framework
from .layout import MegatronLayout, layout_stages, megatron_layout, parse_layout
from .model_flags import ModelFlags
from .reader import Flag, _fraction, _Flags, read_env, read_flags
from .rules import DTYPE_FLAGS, precision_spec
from .tables import EARLY, FIELD_FLAGS, OVERRIDABLE, SOURCE, has_no_effect

__all__ = ["MegatronRun", "parse_megatron_args", "parse_megatron_config"]


# ------------------------------------------------------------------------------------------------
# the result
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MegatronRun:
    """A Megatron-LM run read from its flags."""

    model: ModelConfig
    train: TrainingConfig
    world_size: int
    vocab: dict                       #: tokenizer, size (before padding), padded, divisible_by, source
    mapped: dict                      #: flag -> its value as written ("" for a switch), flags memlib turned into fields
    no_effect: tuple[str, ...]        #: flags known not to change device memory
    not_modelled: tuple[str, ...]     #: the warning list: flags (and Megatron defaults) memlib does not count
    overridden: dict = field(default_factory=dict)   #: field -> {"file": value, "given": value}
    #: how the framework is built (memlib.device.peak.Framework: fusions, grouped GEMM, dispatcher), from the flags
    framework: Framework = field(default_factory=Framework)
    #: the environment variables memlib reads (megatron.reader.ENV_READ), as the launch sets them
    env: dict = field(default_factory=dict)

    def warning(self) -> str:
        """One line naming what memlib does not model ("" when nothing)."""
        if not self.not_modelled:
            return ""
        return f"not modelled ({len(self.not_modelled)}): " + ", ".join(self.not_modelled)

    def values(self) -> dict:
        """For the JSON output."""
        return {"model": self.model.values(), "config": self.train.values(), "framework": self.framework.values(),
                "world_size": self.world_size,
                "vocab": dict(self.vocab), "mapped": dict(self.mapped), "no_memory_effect": list(self.no_effect),
                "not_modelled": list(self.not_modelled),
                "overridden": {k: {"file": _plain(v["file"]), "given": _plain(v["given"])}
                               for k, v in self.overridden.items()}}


def _plain(x):
    if isinstance(x, (bool, int, str)) or x is None:
        return x
    if isinstance(x, (tuple, list)):
        return [_plain(y) for y in x]
    return str(x)


# ------------------------------------------------------------------------------------------------
# the mapping
# ------------------------------------------------------------------------------------------------
def parse_megatron_args(text: str, world_size: Optional[int] = None, vocab_size: Optional[int] = None,
                        overrides: Optional[Mapping] = None, name: str = "megatron") -> MegatronRun:
    """Read Megatron-LM flags (a launch script, a flag list or a ``model_config.yaml``).

    ``world_size`` is the number of GPUs (needed unless the file implies it or ``overrides`` gives
    ``dp``); ``vocab_size`` the tokenizer's vocabulary before padding (overrides the file's);
    ``overrides`` maps :class:`~memlib.config.TrainingConfig` fields to values that replace the
    file's (the CLI's explicit options): TP, PP, CP, EP and ETP before anything is derived from them
    (DP, the padded vocabulary, the layout), the rest on the result."""
    over = dict(overrides or {})
    _check_call(over, world_size, vocab_size)
    mapper = _Mapper(read_flags(text, name), world_size, vocab_size, over, name)
    mapper.env = read_env(text)
    return mapper.run()


def parse_megatron_config(model_args: Mapping, env_vars: Optional[Mapping] = None, world_size: Optional[int] = None,
                          vocab_size: Optional[int] = None, overrides: Optional[Mapping] = None,
                          name: str = "megatron") -> MegatronRun:
    """:func:`parse_megatron_args` of a ``model_config.yaml`` already read: its ``MODEL_ARGS`` and ``ENV_VARS``
    mappings (the validation set reads hundreds of them)."""
    from .reader import ENV_READ, mapping_flags

    over = dict(overrides or {})
    _check_call(over, world_size, vocab_size)
    mapper = _Mapper(mapping_flags(dict(model_args), f"megatron_args={show(name, 120)}"), world_size, vocab_size,
                     over, name)
    mapper.env = {k: str(v) for k, v in (env_vars or {}).items() if k in ENV_READ and v is not None}
    return mapper.run()


def _check_call(over: dict, world_size, vocab_size) -> None:
    unknown = sorted(set(over) - set(OVERRIDABLE))
    if unknown:
        raise ConfigError(f"overrides={show(unknown)}: only TrainingConfig fields {', '.join(OVERRIDABLE)} may be given")
    if world_size is not None and (isinstance(world_size, bool) or not isinstance(world_size, int)
                                   or not 1 <= world_size <= LIMITS["ranks"] * LIMITS["pp"]):
        raise ConfigError(f"world_size={show(world_size)} must be a positive integer")
    if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int)
                                   or not 1 <= vocab_size <= LIMITS["width"]):
        raise ConfigError(f"vocab_size={show(vocab_size)} must be a positive integer")




class _Mapper(ModelFlags):
    def __init__(self, flags: list[Flag], world_size, vocab_size, overrides: dict, name: str):
        self.f = _Flags(flags)
        for fld in overrides:
            self.f.lenient.update(FIELD_FLAGS.get(fld, ()))
        if world_size is not None:
            self.f.lenient.add("--world-size")
        self.world_arg, self.vocab_arg, self.over, self.name = world_size, vocab_size, overrides, name
        #: the Megatron-LM version whose rules apply (memlib.config.versions): the CLI's, else memlib's pin
        self.version = parse_version(overrides.get("megatron_version") or DEFAULT_VERSION)
        self.notes: list[str] = []          # not modelled, with a reason
        self.flagged: set[str] = set()      # flags read but not modelled
        self.overridden: dict = {}
        self.env: dict[str, str] = {}       # the launch's environment variables memlib reads (reader.ENV_READ)

    # -- helpers ---------------------------------------------------------------------------------
    def not_modelled(self, flag: str, entry: Optional[str] = None) -> None:
        """``flag`` (given, read) is not modelled; ``entry`` is the warning text (default the flag)."""
        self.flagged.add(flag)
        self.notes.append(entry or flag)

    def carried(self, entry: str) -> None:
        """A mapped flag whose memory memlib does not count (the field is carried): a warning entry."""
        self.notes.append(entry)

    def override(self, fld: str, file_value):
        if fld in self.over:
            given = self.over[fld]
            text = [self.f.unresolved[x] for x in FIELD_FLAGS.get(fld, ()) if x in self.f.unresolved]
            if text:
                file_value = text[0]
            if given != file_value:
                self.overridden[fld] = {"file": file_value, "given": given}
            return given
        return file_value

    # -- the run ---------------------------------------------------------------------------------
    def run(self) -> MegatronRun:
        f = self.f
        if f.has("--hybrid-layer-pattern", "--hybrid-override-pattern"):
            raise ConfigError(f"--hybrid-layer-pattern={show(f.text('--hybrid-layer-pattern') or f.text('--hybrid-override-pattern'))}: "
                              f"hybrid (Mamba) models cannot be expressed; memlib models DeepSeek-style MLA transformers")
        self.mla = f.switch("--multi-latent-attention")
        if self.mla and f.switch("--group-query-attention"):
            raise ConfigError("--group-query-attention=on with --multi-latent-attention: Megatron-LM refuses the pair")
        model, dense = self.model_fields() if self.mla else self.gqa_fields()
        par = self.parallel(model, dense)
        train_kw = {**par, **self.recompute(), **self.kernels(dense), **self.precision(par["zero"])}
        model = self.vocabulary(model, par["tp"])
        self.structure(dense)
        train_kw = self.apply_overrides(train_kw)
        try:
            train = TrainingConfig(profile="megatron", **train_kw)
        except TypeError as exc:
            raise ConfigError(f"megatron_args={show(self.name, 120)}: {exc}") from None
        source = f"Megatron-LM flags ({SOURCE}; the rules of Megatron-LM {self.version.text})"
        m = model_from_dict(model, name=self.name, source=source) if self.mla else ModelConfig(
            **model, name=self.name, source=source)
        fw = Framework(gradient_accumulation_fusion=not f.switch("--no-gradient-accumulation-fusion"),
                       rope_fusion=not f.has("--no-rope-fusion"), moe_grouped_gemm=f.has("--moe-grouped-gemm"),
                       token_dispatcher=" ".join(f.values.get("--moe-token-dispatcher-type", ("allgather",))),
                       permute_fusion=f.switch("--moe-permute-fusion"), deterministic=self.deterministic,
                       attention_mask_in_batch=not f.switch("--no-create-attention-mask-in-dataloader"),
                       rerun_mode=f.one("--rerun-mode") or "validate_results",
                       cublas_workspace_config=self.env.get("CUBLAS_WORKSPACE_CONFIG"),
                       expandable_segments="expandable_segments:true" in self.env.get(
                           "PYTORCH_CUDA_ALLOC_CONF", "").lower().replace(" ", ""))
        no_effect, unmodelled = [], []
        for flag in f.order:
            if flag in f.read:
                continue                    # mapped, or not modelled with its own note
            (no_effect if has_no_effect(flag, dense) else unmodelled).append(flag)
        mapped = {x: " ".join(f.values[x]) for x in f.order if x in f.read and x not in self.flagged}
        return MegatronRun(m, train, self.world, self.vocab, mapped, tuple(no_effect),
                           tuple(self.notes + unmodelled), self.overridden, fw, dict(self.env))

    # -- parallelism -----------------------------------------------------------------------------
    def parallel(self, m: dict, dense: bool) -> dict:
        f, ranks = self.f, LIMITS["ranks"]
        tp = self.override("tp", f.int("--tensor-model-parallel-size", 1, bound=ranks))
        pp = self.override("pp", f.int("--pipeline-model-parallel-size", 1, bound=LIMITS["pp"]))
        cp = self.override("cp", f.int("--context-parallel-size", 1, bound=ranks))
        ep = self.override("ep", f.int("--expert-model-parallel-size", 1, bound=ranks))
        etp = self.override("etp", f.int("--expert-tensor-parallel-size", tp, bound=ranks))
        if dense and "etp" not in self.over:
            etp = 1                     # a model without experts has none to split (ETP defaults to TP)
        if dense and ep > 1:
            raise ConfigError(f"--expert-model-parallel-size={ep} needs --num-experts (Megatron-LM's rule)")
        if not dense and m["n_routed_experts"] % ep:
            raise ConfigError(f"--expert-model-parallel-size={ep} must divide --num-experts={m['n_routed_experts']}")
        self.world = self._world(tp, pp, cp)
        dp = self.world // (tp * pp * cp)
        if (dp * tp * cp) % (ep * etp):
            raise ConfigError(f"ep*etp={ep * etp} (--expert-model-parallel-size={ep}, --expert-tensor-parallel-size="
                              f"{etp}) must divide dp*tp*cp={dp * tp * cp} (world size {self.world})")
        sp = f.switch("--sequence-parallel") and tp > 1
        if not dense and tp > 1 and not sp and "sp" not in self.over:
            raise ConfigError(f"--tensor-model-parallel-size={tp} with --num-experts needs --sequence-parallel "
                              f"(Megatron-Core's MoE layer refuses TP without it in training)")
        zero = 1 if f.switch("--use-distributed-optimizer") else 0
        mbs = self.override("micro_batch", f.int("--micro-batch-size", None, bound=LIMITS["micro_batch"]))
        if mbs is None:
            raise ConfigError("--micro-batch-size is required (Megatron-LM requires it)")
        seq = self.override("seq_len", f.int("--seq-length", None, bound=LIMITS["seq_len"]))
        if seq is None:
            raise ConfigError("--seq-length is required (memlib needs the sequence length)")
        if cp > 1 and seq % (2 * cp):
            raise ConfigError(f"--seq-length={seq} must be a multiple of 2*cp={2 * cp} (Megatron-LM's rule)")
        gbs = f.int("--global-batch-size", mbs * dp, bound=LIMITS["num_microbatches"] * LIMITS["micro_batch"])
        if f.has("--rampup-batch-size"):
            self.not_modelled("--rampup-batch-size", "--rampup-batch-size (memlib takes the final global batch)")
        if "num_microbatches" in self.over:
            mb = self.override("num_microbatches", None)
        else:
            if gbs % (mbs * dp):
                raise ConfigError(f"--global-batch-size={gbs} must be divisible by micro-batch*dp={mbs * dp} "
                                  f"(--micro-batch-size={mbs}, dp={dp})")
            mb = gbs // (mbs * dp)
        layout, vpp = self.pipeline(m["num_hidden_layers"], pp, m["num_nextn_predict_layers"])
        out = {"dp": dp, "tp": tp, "pp": pp, "ep": ep, "etp": etp, "cp": cp, "sp": sp, "zero": zero,
               "micro_batch": mbs, "seq_len": seq, "num_microbatches": mb, "vpp": vpp, "layout": layout,
               "schedule": "interleaved" if vpp > 1 else "1f1b",
               "overlap_grad_reduce": f.switch("--overlap-grad-reduce"),
               "overlap_param_gather": f.switch("--overlap-param-gather"),
               "ddp_bucket_size": f.int("--ddp-bucket-size", None, bound=LIMITS["bytes"])}
        if out["overlap_param_gather"] and not (out["overlap_grad_reduce"] and zero):
            raise ConfigError("--overlap-param-gather=on needs --overlap-grad-reduce and --use-distributed-optimizer "
                              "(Megatron-LM's rule)")
        return out

    def _world(self, tp: int, pp: int, cp: int) -> int:
        f = self.f
        model_ranks = tp * pp * cp
        if "dp" in self.over:
            dp = self.over["dp"]
            world = dp * model_ranks
            if self.world_arg is not None and self.world_arg != world:
                raise ConfigError(f"world_size={self.world_arg} but dp={dp} gives dp*tp*pp*cp={world}")
            self.overridden["dp"] = {"file": None, "given": dp}      # the file's DP needs the world size
            return world
        file_world = f.int("--world-size", None, bound=LIMITS["ranks"] * LIMITS["pp"])
        launcher = None
        nproc = f.values.get("--nproc_per_node") or f.values.get("--nproc-per-node")
        nnodes = f.values.get("--nnodes")
        number = re.compile(r"[0-9]{1,6}")
        if (nproc and len(nproc) == 1 and number.fullmatch(nproc[0])
                and (not nnodes or (len(nnodes) == 1 and number.fullmatch(nnodes[0])))):
            launcher = int(nproc[0]) * (int(nnodes[0]) if nnodes else 1) or None     # torchrun's own count
        if file_world is not None and launcher is not None and file_world != launcher:
            raise ConfigError(f"--world-size={file_world} but torchrun's --nproc_per_node and --nnodes give {launcher}")
        implied = file_world if file_world is not None else launcher
        world = self.world_arg if self.world_arg is not None else implied
        if world is None:
            raise ConfigError("world_size=unknown: give --world-size N, the number of GPUs (the flags do not say "
                              "how many there are)")
        if self.world_arg is not None and implied is not None and implied != self.world_arg:
            self.overridden["world_size"] = {"file": implied, "given": self.world_arg}
        if world % model_ranks:
            raise ConfigError(f"world_size={world} must be divisible by tp*pp*cp={model_ranks} "
                              f"(tp={tp}, pp={pp}, cp={cp})")
        return world

    def pipeline(self, layers: int, pp: int, mtp: int) -> tuple[tuple[int, ...], int]:
        """The layout and VPP of the file, or of the CLI's ``layout`` and ``vpp`` where given."""
        layout, vpp = self._file_pipeline(layers, pp, mtp)
        given_layout, given_vpp = self.over.get("layout"), self.over.get("vpp")
        if isinstance(given_layout, MegatronLayout):
            lay, lvpp = layout_stages(given_layout, pp, layers, mtp or None, name="layout")
            if given_vpp is not None and given_vpp != lvpp:
                raise ConfigError(f"vpp={given_vpp} but layout={given_layout} has {len(lay)} stages: vpp={lvpp} "
                                  f"on pp={pp}")
            new = (lay, lvpp)
        elif given_layout is not None:
            new = (tuple(given_layout), given_vpp or vpp)
        elif given_vpp is not None and given_vpp != vpp:
            if self.f.has("--pipeline-model-parallel-layout"):
                raise ConfigError(f"vpp={given_vpp} contradicts --pipeline-model-parallel-layout (vpp={vpp} on "
                                  f"pp={pp}); give a layout too")
            if given_vpp > 1 and pp == 1:
                raise ConfigError(f"vpp={given_vpp} needs pp > 1")
            new = (megatron_layout(layers, pp, given_vpp, *self._uneven), given_vpp)
        else:
            return layout, vpp
        for fld, file_value, value in (("layout", layout, new[0]), ("vpp", vpp, new[1])):
            if _plain(file_value) != _plain(value):
                self.overridden[fld] = {"file": file_value, "given": value}
        return new

    def _file_pipeline(self, layers: int, pp: int, mtp: int) -> tuple[tuple[int, ...], int]:
        f = self.f
        text = f.one("--pipeline-model-parallel-layout")
        nvs = f.int("--num-virtual-stages-per-pipeline-rank", None, "--virtual-pipeline-model-parallel-size")
        nlpvs = f.int("--num-layers-per-virtual-pipeline-stage", None)
        first = f.int("--decoder-first-pipeline-num-layers", None, "--num-layers-in-first-pipeline-stage")
        last = f.int("--decoder-last-pipeline-num-layers", None, "--num-layers-in-last-pipeline-stage")
        emb = f.switch("--account-for-embedding-in-pipeline-split")
        loss = f.switch("--account-for-loss-in-pipeline-split")
        self._uneven = (first, last, emb, loss)
        given = [n for n, v in (("--pipeline-model-parallel-layout", text),
                                ("--num-virtual-stages-per-pipeline-rank", nvs),
                                ("--num-layers-per-virtual-pipeline-stage", nlpvs)) if v is not None]
        if len(given) > 1:
            raise ConfigError(f"{given[0]}={f.text(given[0])} and {given[1]}={f.text(given[1])} contradict each "
                              f"other: Megatron-LM takes one of them")
        if text is not None:
            if first is not None or last is not None or emb or loss:
                raise ConfigError(f"--pipeline-model-parallel-layout={text} cannot be combined with uneven first/last "
                                  f"stages or --account-for-embedding/loss-in-pipeline-split (Megatron-Core refuses it)")
            layout, vpp = layout_stages(parse_layout(text), pp, layers, mtp or None)
        else:
            if nlpvs is not None:
                if first is not None or last is not None:
                    raise ConfigError(f"--num-layers-per-virtual-pipeline-stage={nlpvs} with uneven first/last stages: "
                                      f"Megatron-LM asks for --num-virtual-stages-per-pipeline-rank instead")
                n = layers + emb + loss
                if n % pp or (n // pp) % nlpvs:
                    raise ConfigError(f"--num-layers-per-virtual-pipeline-stage={nlpvs} must divide the "
                                      f"{n / pp:g} layers of each of the pp={pp} pipeline ranks")
                vpp = (n // pp) // nlpvs
            else:
                vpp = nvs or 1
            if vpp > 1 and pp == 1:
                raise ConfigError(f"virtual pipeline stages (vpp={vpp}) need --pipeline-model-parallel-size > 1")
            layout = megatron_layout(layers, pp, vpp, first, last, emb, loss)
        return layout, vpp

    # -- recomputation ---------------------------------------------------------------------------
    def recompute(self) -> dict:
        f = self.f
        gran = f.choice("--recompute-granularity", None, ("full", "selective"))
        if f.switch("--recompute-activations"):
            if gran == "full":
                raise ConfigError("--recompute-activations (selective) and --recompute-granularity=full contradict "
                                  "each other")
            gran = "selective"
        method = f.choice("--recompute-method", None, ("uniform", "block"))
        num = f.int("--recompute-num-layers", None, minimum=0, bound=LIMITS["num_hidden_layers"])
        modules = f.many("--recompute-modules")
        moe_layer = f.switch("--moe-layer-recompute")
        if moe_layer:
            if gran == "full":
                raise ConfigError("--moe-layer-recompute with --recompute-granularity=full: Megatron-Core refuses it")
            gran = "selective"
        if f.switch("--distribute-saved-activations"):
            self.not_modelled("--distribute-saved-activations")
        if method is not None and gran != "full":
            raise ConfigError(f"--recompute-method={method} needs --recompute-granularity full "
                              f"(granularity: {gran or 'none'})")
        if modules is not None and gran != "selective":
            raise ConfigError(f"--recompute-modules={' '.join(modules)} applies with --recompute-granularity selective "
                              f"only (granularity: {gran or 'none'})")
        if gran == "full":
            if method is None:
                raise ConfigError("--recompute-granularity=full needs --recompute-method uniform or block")
            if num is None:
                raise ConfigError("--recompute-granularity=full needs --recompute-num-layers")
            if method == "block":
                return {"recompute": f"full-block:{num}" if num else "none"}
            if num < 1:
                raise ConfigError("--recompute-num-layers=0 with --recompute-method=uniform: it must be at least 1")
            if num > 1:
                self.not_modelled("--recompute-num-layers", f"--recompute-num-layers={num} with uniform recompute "
                                  f"(memlib checkpoints every layer's input, as with 1)")
            return {"recompute": "full"}
        if gran == "selective":
            if num is not None:
                raise ConfigError(f"--recompute-num-layers={num} applies to --recompute-granularity full only "
                                  f"(Megatron-Core refuses it with selective)")
            mods = list(dict.fromkeys(modules or ("core_attn",)))
            if moe_layer and "moe" not in mods:
                mods.append("moe")
            bad = [x for x in mods if x not in RECOMPUTE_MODULES]
            if bad:
                raise ConfigError(f"--recompute-modules={bad[0]} is not a module memlib models "
                                  f"({', '.join(RECOMPUTE_MODULES)})")
            if "moe_act" in mods and not f.switch("--moe-grouped-gemm"):
                raise ConfigError("--recompute-modules=moe_act needs --moe-grouped-gemm (Megatron-Core's rule)")
            return {"recompute": ",".join(mods)}
        if num is not None:
            raise ConfigError(f"--recompute-num-layers={num} without --recompute-granularity full has no effect: "
                              f"give the granularity")
        return {"recompute": "none"}

    # -- kernels ---------------------------------------------------------------------------------
    def kernels(self, dense: bool) -> dict:
        f = self.f
        impl = f.choice("--transformer-impl", "transformer_engine", ("transformer_engine", "local",
                                                                     "inference_optimized"))
        if impl == "inference_optimized":
            raise ConfigError("--transformer-impl=inference_optimized is for inference; memlib models training")
        self.impl = TransformerImpl(impl)
        backend = f.choice("--attention-backend", "auto", tuple(x.value for x in AttnBackend))
        fusion = f.switch("--cross-entropy-loss-fusion")
        ce_impl = f.choice("--cross-entropy-fusion-impl", "native", ("native", "te"))
        if f.has("--cross-entropy-fusion-impl") and not self.version.has("cross_entropy_fusion_impl"):
            raise ConfigError(f"--cross-entropy-fusion-impl={ce_impl}: Megatron-LM {self.version.text} has no such flag "
                              f"(it came with 3b141a2471, 2025-04-05; --cross-entropy-loss-fusion runs the native kernel)")
        if fusion and ce_impl == "te" and self.version.has("te_cross_entropy_refused"):
            raise ConfigError(f"--cross-entropy-loss-fusion with --cross-entropy-fusion-impl=te: Megatron-LM "
                              f"{self.version.text} refuses it (from 168cb15d70, 2026-06-03; core_r0.18.0 and older "
                              f"accept it: give --megatron-version of the run)")
        self.deterministic = f.switch("--deterministic-mode")
        if fusion and self.deterministic:
            raise ConfigError("--deterministic-mode=on with --cross-entropy-loss-fusion: Megatron-LM refuses the pair")
        softmax_fp32 = f.switch("--attention-softmax-in-fp32") | f.switch("--apply-query-key-layer-scaling")
        cp_types = f.many("--cp-comm-type")
        cp_comm = "p2p"
        if cp_types is not None:
            types = ["allgather" if x == "all_gather" else x for x in cp_types]
            bad = [x for x in types if x not in CP_COMM_TYPES]
            if bad:
                raise ConfigError(f"--cp-comm-type={show(bad[0])} must be one of {', '.join(CP_COMM_TYPES)}")
            if len(set(types)) > 1:
                raise ConfigError(f"--cp-comm-type={' '.join(cp_types)}: memlib models one communication type for "
                                  f"every layer")
            cp_comm = types[0]
        out = {"cp_comm_type": cp_comm, "hidden_dropout": f.number("--hidden-dropout", Fraction(1, 10)),
               "attention_dropout": f.number("--attention-dropout", Fraction(1, 10)),
               "megatron_version": self.version.text}
        out |= {"transformer_impl": impl, "attention_backend": backend, "attention_softmax_in_fp32": softmax_fp32,
               "bias_swiglu_fusion": self.bias_activation_fusion(), "cross_entropy_loss_fusion": fusion,
               "cross_entropy_fusion_impl": ce_impl, "moe_a2a_overlap": f.switch("--overlap-moe-expert-parallel-comm")}
        offload = f.switch("--fine-grained-activation-offloading")
        mods = f.many("--offload-modules")
        if mods is not None and not offload:
            raise ConfigError(f"--offload-modules={' '.join(mods)} applies with --fine-grained-activation-offloading only")
        if offload:
            if mods is None:
                raise ConfigError("--fine-grained-activation-offloading=on needs --offload-modules (Megatron-Core's rule)")
            if impl != "transformer_engine":
                raise ConfigError(f"--fine-grained-activation-offloading=on needs --transformer-impl transformer_engine "
                                  f"(--transformer-impl={impl})")
            bad = [x for x in mods if x not in OFFLOAD_MODULES]
            if bad:
                raise ConfigError(f"--offload-modules={bad[0]} is not one of {', '.join(OFFLOAD_MODULES)}")
            out["offload_modules"] = tuple(dict.fromkeys(mods))
        out["moe_aux_loss"] = LoadBalancing.NONE if dense else self.load_balancing()
        return out

    def bias_activation_fusion(self) -> bool:
        """Megatron-LM's ``bias_activation_fusion`` (memlib's ``bias_swiglu_fusion``): ``--bias-swiglu-fusion``
        with ``--swiglu``, else ``--bias-gelu-fusion``, which Megatron-LM turns off without biases
        (argument_utils.py:317-319, arguments.py:1605-1606 at the pin)."""
        f = self.f
        swiglu_off, gelu_off = f.switch("--no-bias-swiglu-fusion"), f.switch("--no-bias-gelu-fusion")
        if f.switch("--swiglu"):
            return not swiglu_off
        return not gelu_off and not f.switch("--disable-bias-linear")

    def load_balancing(self) -> LoadBalancing:
        f = self.f
        types = f.many("--moe-router-load-balancing-type") or ("aux_loss",)
        coeffs = [_fraction("--moe-aux-loss-coeff", c) for c in (f.many("--moe-aux-loss-coeff") or ("0",))]
        choices = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "quantile_balancing", "none")
        for t in types:
            if t not in choices:
                raise ConfigError(f"--moe-router-load-balancing-type={show(t)} must be one of {', '.join(choices)}")
        if len(coeffs) not in (1, len(types)):
            raise ConfigError(f"--moe-aux-loss-coeff={' '.join(map(str, coeffs))} has {len(coeffs)} values for "
                              f"{len(types)} load-balancing types")
        coeff = coeffs * len(types) if len(coeffs) == 1 else coeffs
        active = [t for t, c in zip(types, coeff) if c > 0 and t != "none"]
        if "sinkhorn" in types:
            raise ConfigError("--moe-router-load-balancing-type=sinkhorn cannot be expressed (memlib: seq_aux_loss, "
                              "aux_loss or none)")
        if not active:
            return LoadBalancing.NONE
        if len(active) > 1 or active[0] not in ("seq_aux_loss", "aux_loss"):
            raise ConfigError(f"--moe-router-load-balancing-type={' '.join(active)} (with a positive "
                              f"--moe-aux-loss-coeff) cannot be expressed (memlib: one of seq_aux_loss, aux_loss)")
        return LoadBalancing(active[0])

    # -- precision -------------------------------------------------------------------------------
    def precision(self, zero: int) -> dict:
        f = self.f
        bf16, fp16 = f.switch("--bf16"), f.switch("--fp16")
        fp8 = f.choice("--fp8-format", None, FP8_FORMATS)
        fp8_recipe = f.choice("--fp8-recipe", "delayed", FP8_RECIPES)
        if f.has("--fp8-recipe") and fp8 is None:
            raise ConfigError(f"--fp8-recipe={fp8_recipe} needs --fp8-format (Megatron-LM ignores it otherwise)")
        fp8_param = f.switch("--fp8-param-gather")
        if fp8_param and fp8 is None:
            raise ConfigError("--fp8-param-gather=on needs --fp8-format")
        if fp8_param and zero < 1:
            raise ConfigError("--fp8-param-gather=on needs --use-distributed-optimizer (Megatron-LM's rule)")
        pao = f.switch("--use-precision-aware-optimizer")
        dtypes = {flag: f.choice(flag, "fp32", choices) for flag, choices in DTYPE_FLAGS.items()}
        grad_bf16 = f.switch("--grad-reduce-in-bf16")
        acc32 = f.switch("--accumulate-allreduce-grads-in-fp32")
        if grad_bf16 and acc32:
            raise ConfigError("--grad-reduce-in-bf16=on and --accumulate-allreduce-grads-in-fp32=on contradict each other")
        if grad_bf16 and not bf16:
            raise ConfigError("--grad-reduce-in-bf16=on needs --bf16")
        if acc32 and bf16 and dtypes["--main-grads-dtype"] != "fp32":
            raise ConfigError(f"--accumulate-allreduce-grads-in-fp32=on needs --main-grads-dtype fp32 (--main-grads-dtype={dtypes['--main-grads-dtype']})")
        if f.switch("--optimizer-cpu-offload"):
            self.not_modelled("--optimizer-cpu-offload", "--optimizer-cpu-offload (memlib keeps the optimizer states "
                                                         "on the GPU)")
        opt = f.choice("--optimizer", "adam", ("adam", "sgd", "muon", "dist_muon", "lion", "soap", "adaptive_muon"))
        if opt != "adam":
            raise ConfigError(f"--optimizer={opt} cannot be expressed: memlib's recipes are Adam's (two moments)")
        spec = precision_spec(bf16=bf16, fp16=fp16, fp8_param_gather=fp8_param, grad_reduce_in_bf16=grad_bf16,
                              accumulate_in_fp32=acc32, precision_aware=pao,
                              main_grads=dtypes["--main-grads-dtype"], main_params=dtypes["--main-params-dtype"],
                              exp_avg=dtypes["--exp-avg-dtype"], exp_avg_sq=dtypes["--exp-avg-sq-dtype"],
                              fp8=fp8, fp8_recipe=fp8_recipe)
        if fp8 is not None:
            mods = self.f.values.get("--recompute-modules", ())
            if fp8_recipe == "delayed" and self.f.values.get("--recompute-granularity") == ("selective",) and (
                    "moe_act" in mods or "layernorm" in mods):
                raise ConfigError("--fp8-recipe=delayed with --recompute-modules moe_act or layernorm: Megatron-Core "
                                  "refuses it")
        return {"precision": spec, "fp8": fp8, "fp8_recipe": fp8_recipe}

    # -- the CLI's explicit options --------------------------------------------------------------
    def apply_overrides(self, kw: dict) -> dict:
        out = dict(kw)
        for fld in OVERRIDABLE:
            if fld in self.over and fld not in EARLY:
                self._set(out, fld, self.over[fld])
        return out

    def _set(self, out: dict, fld: str, given) -> None:
        file_value = out.get(fld)
        if _plain(file_value) != _plain(given):
            self.overridden[fld] = {"file": file_value, "given": given}
        out[fld] = given
