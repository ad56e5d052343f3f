"""Named formulas: every equation the book displays, by a stable name, for ``memlib formula``.

Each entry builds a SymPy expression from memlib's own functions (nothing is restated here), for a
model whose *structure* comes from a preset (sizes stay symbols).  A reader can take the exact
expression into their own work: ``memlib formula params.mla --latex``.

>>> sorted(FORMULAS)[3:6]
['activations.paper.mla', 'activations.paper.mla_full', 'activations.paper.moe']
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import sympy as sp

from .activations import ledger_bytes, parse_policy
from .config import ConfigError, ModelConfig, TrainingConfig, load_model, show
from .ledgers import gpt_layer, paper_layer
from .params import activated_params, by_block, expert_params, layer_params, mtp_params, readable, total_formula
from .states import sharded_count, states_formula

__all__ = ["Formula", "FORMULAS", "formula"]


@dataclass(frozen=True)
class Formula:
    name: str
    description: str
    build: Callable[[ModelConfig], sp.Expr]


def _block(kind: str, block: str) -> Callable[[ModelConfig], sp.Expr]:
    # a block the model does not have (no shared experts) has no parameters: 0, not an error
    return lambda m: readable(by_block(layer_params(m, kind)).get(block, sp.Integer(0)))


def _act(block: str, policy: str = "none", sp_on: bool = True) -> Callable[[ModelConfig], sp.Expr]:
    def build(m: ModelConfig) -> sp.Expr:
        entries = [e for e in paper_layer(m, "moe") if e.block == block]
        return ledger_bytes(entries, TrainingConfig(sp=sp_on), None, parse_policy(policy)).total
    return build


def _gpt(policy: str, sp_on: bool) -> Callable[[ModelConfig], sp.Expr]:
    return lambda m: ledger_bytes(gpt_layer(), TrainingConfig(sp=sp_on), None, parse_policy(policy)).total


FORMULAS: dict[str, Formula] = {f.name: f for f in (
    Formula("params.mla", "MLA parameters of one layer (eight matrices and two latent norms)", _block("moe", "attention")),
    Formula("params.norms", "block RMSNorm parameters of one layer", _block("moe", "norms")),
    Formula("params.dense_ffn", "dense FFN parameters of one layer", _block("dense", "dense_ffn")),
    Formula("params.router", "router parameters of one MoE layer", _block("moe", "router")),
    Formula("params.shared_experts", "shared-expert parameters of one MoE layer", _block("moe", "shared_experts")),
    Formula("params.routed_experts", "routed-expert parameters of one MoE layer", _block("moe", "routed_experts")),
    Formula("params.expert", "parameters of one routed expert", expert_params),
    Formula("params.moe_layer", "all parameters of one MoE decoder layer", lambda m: layer_params(m, "moe").total),
    Formula("params.dense_layer", "all parameters of one dense decoder layer", lambda m: layer_params(m, "dense").total),
    Formula("params.total", "parameters of the main model (no MTP, no buffers)", total_formula),
    Formula("params.activated", "parameters activated per token", lambda m: activated_params(m).total),
    Formula("params.mtp", "parameters of the MTP modules", lambda m: mtp_params(m).total),
    Formula("states.sharded", "parameters one device owns once ZeRO shards them", lambda m: sharded_count()),
    *(Formula(f"states.zero{z}", f"model-state bytes per device under ZeRO-{z}", (lambda z: lambda m: states_formula(z).total)(z))
      for z in range(4)),
    Formula("activations.paper.mla", "MLA activation bytes of one layer per micro-batch (paper, SP on)", _act("attention")),
    Formula("activations.paper.mla_full", "MLA activation bytes kept under full recomputation (paper, SP on)",
            _act("attention", "full")),
    Formula("activations.paper.moe", "MoE activation bytes of one layer per micro-batch (paper, SP on)", _act("moe")),
    Formula("activations.paper.moe_full", "MoE activation bytes kept under full recomputation (paper, SP on)",
            _act("moe", "full")),
    Formula("activations.gpt.layer", "dense GPT layer activation bytes, TP without SP (Korthikanti et al.)", _gpt("none", False)),
    Formula("activations.gpt.layer_sp", "dense GPT layer activation bytes, TP with SP (Korthikanti et al.)", _gpt("none", True)),
    Formula("activations.gpt.selective_sp", "dense GPT layer, TP + SP + selective recomputation", _gpt("selective", True)),
)}


def formula(name: str, model: str | ModelConfig = "deepseek-v3") -> sp.Expr:
    """The expression called ``name`` for the structure of ``model``."""
    try:
        f = FORMULAS[name]
    except KeyError:
        raise ConfigError(f"formula={show(name)} is unknown; known: {', '.join(sorted(FORMULAS))}") from None
    return f.build(load_model(model))
