"""A Megatron-Core measurement beside the ``megatron`` profile's ledger, per region, block and entry.

:func:`predicted` is the ledger of one device holding the whole model, as the estimate adds it up;
:func:`compare` (and :func:`compare_many`, :func:`compare_result`) measures with
:func:`memlib.measure.megatron.measure_many` and puts the two side by side, ``exact`` when every block,
the parameters and ``main_grad`` agree to the byte.
"""
from __future__ import annotations

from ..config import ConfigError, ModelConfig, TrainingConfig, load_model
from .megatron import _TRAIN_FIELDS, Request, measure_many, site_block

__all__ = ["predicted", "entry_block", "compare_result", "compare_many", "compare"]


def entry_block(key: str) -> str:
    """The block of an entry key within its region: ``attention``, ``moe``, ``dense_ffn``, ``head``,
    ``embedding`` or ``mtp`` (an MTP module's own entries)."""
    parts = key.split(".")
    if parts[0] == "mtp":
        return parts[1] if parts[1] in ("attention", "moe", "dense_ffn", "head") else "mtp"
    return parts[0]


def predicted(model: ModelConfig | str, train: TrainingConfig) -> dict:
    """The ``megatron`` ledger of one device holding the whole model (PP = 1): bytes per region, per
    (region, block) and per entry, as :func:`memlib.device.estimate.estimate` adds them up, for the CPU
    (``runtime=cpu``: the measurement runs there, whatever ``train.runtime`` says)."""
    from dataclasses import replace

    from ..config.strategies import Runtime
    from ..ledgers.base import ledger_bytes, parse_policy, training_values
    from ..ledgers import act_profile
    from ..model.partition import Partition

    train = replace(train, runtime=Runtime.CPU)
    m = load_model(model)
    if train.pp != 1:
        raise ConfigError(f"pp={train.pp}: measure builds the whole model on every rank (pp=1)")
    part = Partition(m, train)
    ap = act_profile("megatron", train)
    policy = parse_policy(train.recompute)
    vals = {**part.values, **training_values(train)}
    regions: dict[str, int] = {}
    blocks: dict[str, dict[str, int]] = {}
    entries: dict[str, dict[str, int]] = {}

    def add(region, ledger, pol):
        for key, x in ledger_bytes(ledger, train, _recipe(train), pol).evaluate(vals).items():
            entries.setdefault(region, {})[key] = entries.get(region, {}).get(key, 0) + x
            blk = blocks.setdefault(region, {})
            blk[entry_block(key)] = blk.get(entry_block(key), 0) + x
            regions[region] = regions.get(region, 0) + x

    add("embedding", ap.embedding(m), None)
    for i, kind in enumerate(m.layer_kinds):
        recomputed = not policy.full or policy.block_layers is None or i < policy.block_layers
        add(f"layer.{i}", ap.layer(m, kind), policy if recomputed else None)
    add("head", ap.head(m), None)
    if part.profile.include_mtp:
        for j in range(m.num_nextn_predict_layers):
            add(f"mtp.{j}", ap.mtp(m, j), policy)
    return {"regions": regions, "blocks": blocks, "entries": entries, "states": _predicted_states(part, train)}


def _recipe(train: TrainingConfig):
    from ..model.states import recipe

    return recipe(train.precision)


def _predicted_states(part, train: TrainingConfig) -> dict:
    """Parameters and main_grad bytes on one device per memlib block (ZeRO 0)."""
    from ..model.params import by_block

    rec = _recipe(train)
    st = part.stages[0]
    counts = by_block(part.params(st)).evaluate(part.values)
    return {"blocks": {k: int(x) for k, x in counts.items()}, "parameters": rec.weights * sum(counts.values()),
            "main_grad": rec.gradients * sum(counts.values())}


def compare_result(req: Request, meas: dict) -> dict:
    """A measurement of ``req`` (one rank's) beside the ledger: see :func:`compare`."""
    m, t = req.model, req.train
    if not meas.get("ok"):
        return {"model": m.name, "label": req.label(), "exact": False, "error": meas.get("error"),
                "traceback": meas.get("traceback")}
    pred = predicted(m, t)
    kinds = {f"layer.{i}": kind for i, kind in enumerate(m.layer_kinds)}
    kinds.update({f"mtp.{j}": m.layer_kinds[-1] for j in range(m.num_nextn_predict_layers)})
    measured_blocks: dict[str, dict[str, int]] = {}
    for d in meas["storages"]:
        blk = site_block(d["region"], d["site"], kinds.get(d["region"], "dense"))
        d["block"] = blk
        r = measured_blocks.setdefault(d["region"], {})
        r[blk] = r.get(blk, 0) + d["bytes"]
    names = list(pred["regions"]) + [r for r in meas["regions"] if r not in pred["regions"]]
    rows, block_rows = [], []
    for r in names:
        p, x = pred["regions"].get(r, 0), meas["regions"].get(r, 0)
        rows.append({"region": r, "predicted": p, "measured": x, "difference": x - p})
        pb, mb = pred["blocks"].get(r, {}), measured_blocks.get(r, {})
        for blk in list(pb) + [k for k in mb if k not in pb]:
            block_rows.append({"region": r, "block": blk, "predicted": pb.get(blk, 0), "measured": mb.get(blk, 0),
                               "difference": mb.get(blk, 0) - pb.get(blk, 0)})
    total_p, total_m = sum(pred["regions"].values()), sum(meas["regions"].values())
    held = [c for c in meas["ctx_held"] if not c["rng_state"]]
    out = {"model": m.name, "label": req.label(), "train": {f: str(getattr(t, f)) for f in _TRAIN_FIELDS},
           "seed": req.seed, "regions": rows, "blocks": block_rows, "entries": pred["entries"],
           "activations": {"predicted": total_p, "measured": total_m, "difference": total_m - total_p},
           "ctx_held": held, "rng_states": sum(c["bytes"] for c in meas["ctx_held"] if c["rng_state"]),
           "storages": meas["storages"]}
    st = pred["states"]
    pblocks = {k: x for k, x in st["blocks"].items() if x}
    mblocks = {k: x["count"] for k, x in meas["parameters"].items() if x["count"]}
    out["parameters"] = {"predicted": st["parameters"], "measured": sum(x["bytes"] for x in meas["parameters"].values()),
                         "blocks_predicted": pblocks, "blocks_measured": mblocks}
    out["parameters"]["difference"] = out["parameters"]["measured"] - out["parameters"]["predicted"]
    if "main_grad" in meas:
        out["main_grad"] = {"predicted": st["main_grad"], "measured": meas["main_grad"],
                            "difference": meas["main_grad"] - st["main_grad"]}
    out["exact"] = (all(x["difference"] == 0 for x in block_rows) and not held and pblocks == mblocks
                    and out["parameters"]["difference"] == 0
                    and ("main_grad" not in out or out["main_grad"]["difference"] == 0))
    return out


def compare_many(pairs: list[tuple[ModelConfig | str, TrainingConfig]], *, seed: int = 0, step: bool = True,
                 world: int = 1) -> list[dict]:
    """:func:`compare` for many (model, training) pairs in one worker process (seeds ``seed``, ``seed + 1``, ...)."""
    reqs = [Request(load_model(m), t, seed + i, step) for i, (m, t) in enumerate(pairs)]
    results = measure_many(reqs, world=world)
    if world == 1:
        return [compare_result(r, x) for r, x in zip(reqs, results)]
    return [[compare_result(r, x) for x in ranks] for r, ranks in zip(reqs, results)]


def compare(model: ModelConfig | str, train: TrainingConfig, *, seed: int = 0, step: bool = True) -> dict:
    """Measured against the ``megatron`` ledger: per region, per (region, block), parameters and
    main_grad bytes; ``exact`` when every one agrees."""
    return compare_many([(model, train)], seed=seed, step=step)[0]
