"""Two of Megatron-LM's rules on flag values: the vocabulary padding and the precision of the mixed-precision flags.

:func:`pad_vocab` pads a tokenizer's vocabulary as Megatron-LM does; :func:`precision_spec` names the memlib
precision recipe (:data:`memlib.model.states.RECIPES`) that ``--bf16``, ``--fp16``, ``--fp8-param-gather``,
``--grad-reduce-in-bf16``, the precision-aware optimizer and its dtype flags amount to.
"""
from __future__ import annotations

from typing import Optional

from ..config import ConfigError
from ..model.states import DTYPE_BYTES, RECIPES, recipe

__all__ = ["pad_vocab", "precision_spec", "DTYPE_FLAGS"]

def pad_vocab(size: int, divisible_by: int, tp: int) -> int:
    """Megatron's padding (``megatron/core/tokenizers/utils/build_tokenizer.py``
    ``vocab_size_with_padding``): up to a multiple of ``divisible_by * tp``.

    >>> pad_vocab(50257, 128, 1), pad_vocab(50257, 3232, 2), pad_vocab(256000, 3232, 2)
    (50304, 51712, 258560)
    """
    multiple = divisible_by * tp
    return -(-size // multiple) * multiple


DTYPE_FLAGS = {"--main-grads-dtype": ("fp32", "bf16"), "--main-params-dtype": ("fp32", "fp16"),
                "--exp-avg-dtype": ("fp32", "fp16", "bf16", "fp8"), "--exp-avg-sq-dtype": ("fp32", "fp16", "bf16", "fp8")}


def precision_spec(*, bf16: bool, fp16: bool, fp8_param_gather: bool = False, grad_reduce_in_bf16: bool = False,
                   accumulate_in_fp32: bool = False, precision_aware: bool = False, main_grads: str = "fp32",
                   main_params: str = "fp32", exp_avg: str = "fp32", exp_avg_sq: str = "fp32",
                   fp8: Optional[str] = None, fp8_recipe: str = "delayed") -> str:
    """The memlib precision (a preset or a recipe spec) of Megatron's mixed-precision flags.

    * the preset: ``megatron`` (bf16), ``megatron-fp16``, ``megatron-fp8-param`` (bf16 with
      ``--fp8-param-gather``), ``fp32`` (neither);
    * the main_grad buffer is bf16 with ``--grad-reduce-in-bf16`` or ``--main-grads-dtype bf16``
      (``gradients=2``); without the precision-aware optimizer the distributed optimizer then copies
      each shard to fp32 for the step (``main_grad=4``, an optimizer state, as the ``megatron-fp16``
      preset counts it);
    * ``--use-precision-aware-optimizer`` hands the gradient buffer to Transformer Engine's FusedAdam
      (no fp32 copy) with moments of ``--exp-avg(-sq)-dtype``; its master weights are
      ``--main-params-dtype``, and with bf16 weights and fp32 master weights FusedAdam keeps only the
      16 remainder bits (``store_param_remainders``, on by default: ``master_weights=2``) where it
      manages them (``megatron/core/optimizer/__init__.py``: not for an FP8 recipe other than delayed).

    >>> precision_spec(bf16=True, fp16=False)
    'megatron'
    >>> precision_spec(bf16=True, fp16=False, precision_aware=True, exp_avg="bf16", exp_avg_sq="bf16")
    'megatron:master_weights=2,exp_avg=2,exp_avg_sq=2'
    >>> precision_spec(bf16=True, fp16=False, grad_reduce_in_bf16=True)
    'megatron:gradients=2,main_grad=4'
    """
    if bf16 and fp16:
        raise ConfigError("--bf16=on and --fp16=on contradict each other: give one")
    if not precision_aware and (main_grads, main_params, exp_avg, exp_avg_sq) != ("fp32",) * 4:
        flag = next(f for f, v in zip(DTYPE_FLAGS, (main_grads, main_params, exp_avg, exp_avg_sq)) if v != "fp32")
        value = dict(zip(DTYPE_FLAGS, (main_grads, main_params, exp_avg, exp_avg_sq)))[flag]
        raise ConfigError(f"{flag}={value} needs --use-precision-aware-optimizer (Megatron-Core keeps fp32 otherwise)")
    if not (bf16 or fp16):
        for flag, on in (("--fp8-param-gather", fp8_param_gather), ("--grad-reduce-in-bf16", grad_reduce_in_bf16),
                         ("--use-precision-aware-optimizer", precision_aware)):
            if on:
                raise ConfigError(f"{flag}=on without --bf16 or --fp16 is not modelled (an fp32 run)")
        return "fp32"
    if fp16:
        if fp8_param_gather or grad_reduce_in_bf16:
            flag = "--fp8-param-gather" if fp8_param_gather else "--grad-reduce-in-bf16"
            raise ConfigError(f"{flag}=on with --fp16 is not modelled (use --bf16)")
        base, changes = "megatron-fp16", {}
        grads = 4 if accumulate_in_fp32 else 2
        if accumulate_in_fp32:
            changes.update(gradients=4, main_grad=0)
        if precision_aware:
            changes.update(gradients=grads, main_grad=0, master_weights=DTYPE_BYTES[main_params],
                           exp_avg=DTYPE_BYTES[exp_avg], exp_avg_sq=DTYPE_BYTES[exp_avg_sq])
    else:
        base = "megatron-fp8-param" if fp8_param_gather else "megatron"
        grads = 2 if (grad_reduce_in_bf16 or main_grads == "bf16") else 4
        changes = {}
        if precision_aware:
            te_managed = main_params != "fp32" or fp8 is None or fp8_recipe == "delayed"
            master = 2 if main_params == "fp16" or (te_managed and not fp8_param_gather) else 4
            changes.update(gradients=grads, master_weights=master, exp_avg=DTYPE_BYTES[exp_avg],
                           exp_avg_sq=DTYPE_BYTES[exp_avg_sq])
        elif grads == 2:
            changes.update(gradients=2, main_grad=4)
    rec = RECIPES[base]
    current = {"gradients": rec.gradients, **dict(rec.optimizer)}
    changes = {k: b for k, b in changes.items() if current.get(k, 0) != b}
    return base if not changes else recipe(base + ":" + ",".join(f"{k}={b}" for k, b in changes.items())).name
