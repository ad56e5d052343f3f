"""Per-device memory: everything one device of each pipeline stage holds, as named terms.

So far: parameters, gradients and optimizer states (model states).  Every stage gets its own
breakdown; the *peak* is the stage whose device needs the most.

>>> from memlib.config import PAPER_TRAINING
>>> est = estimate("deepseek-v3", PAPER_TRAINING)
>>> est.stages[1].parameters
6250364928
>>> est.stages[1].bytes["parameters"]
12500729856
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .breakdown import Breakdown
from .config import ModelConfig, TrainingConfig
from .params import by_block
from .partition import Partition, Stage
from .states import model_states, optimizer_states

__all__ = ["StageMemory", "Estimate", "estimate"]


@dataclass(frozen=True)
class StageMemory:
    """One device of one pipeline stage."""

    stage: Stage
    params: Breakdown            #: parameters stored on the device, per tensor (symbolic)
    parameters: int              #: their exact count
    bytes: dict[str, int]        #: named byte terms: parameters, gradients, optimizer_states
    optimizer: dict[str, int]    #: optimizer-state bytes per state (master copy, moments)
    components: dict[str, int]   #: stored parameters per block (attention, routed_experts, ...)

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


class Estimate:
    """The memory of every stage of a model under a training configuration."""

    def __init__(self, model: ModelConfig | str, train: TrainingConfig):
        self.partition = Partition(model, train)
        self.model = self.partition.model
        self.train = train

    @cached_property
    def stages(self) -> list[StageMemory]:
        part, out = self.partition, []
        for st in part.stages:
            params = part.params(st)
            out.append(StageMemory(
                stage=st,
                params=params,
                parameters=params.evaluate_total(part.values),
                bytes=model_states(part, st).evaluate(),
                optimizer=optimizer_states(part, st).evaluate(),
                components=by_block(params).evaluate(part.values),
            ))
        return out

    @property
    def peak(self) -> StageMemory:
        """The stage whose device needs the most bytes (the first such, on a tie)."""
        return max(self.stages, key=lambda s: (s.total, -s.stage.index))

    def to_dict(self) -> dict:
        """The CLI's JSON contract (see ``memlib estimate --json``)."""
        cfg = {**self.train.values(), "layout": list(self.partition.layout)}
        return {
            "model": self.model.name,
            "config": cfg,
            "stages": [
                {
                    "stage": s.stage.index,
                    "layers": list(s.stage.layers),
                    "parameters": s.parameters,
                    "components": s.components,
                    "bytes": {**s.bytes, "total": s.total},
                    "optimizer_states": s.optimizer,
                }
                for s in self.stages
            ],
            "peak": {"stage": self.peak.stage.index, "bytes": self.peak.total},
        }


def estimate(model: ModelConfig | str, train: TrainingConfig) -> Estimate:
    """Per-stage, per-device memory of ``model`` trained under ``train``."""
    return Estimate(model, train)
