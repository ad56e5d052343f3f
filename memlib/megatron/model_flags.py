"""The model half of reading Megatron-LM flags: sizes, attention, MoE, the vocabulary, the layer structure.

:class:`ModelFlags` is the part of :mod:`~memlib.megatron.flags`' reader that builds the
:class:`~memlib.config.ModelConfig` fields (multi-latent or grouped-query attention, the router and
experts, the padded vocabulary) and refuses or warns about the flags that change the layer's structure.
How each flag maps, with its sources: ``docs/derivations/megatron_flags.md`` ("Model", "Vocabulary").
"""
from __future__ import annotations

from ..config import LIMITS, ConfigError, show
from .listexpr import moe_layer_pattern, pattern_to_hf
from .reader import _fraction
from .rules import pad_vocab
from .tables import SENTENCEPIECE, TIKTOKEN_DEFAULT, TOKENIZER_SIZES


class ModelFlags:
    """The model's fields from the flags (a part of the reader: ``self.f`` holds the flags, ``self.version`` the
    Megatron-LM version whose rules apply, ``not_modelled`` records a warning)."""

    def _sizes(self) -> tuple[int, int, int]:
        """``--num-layers``, ``--hidden-size``, ``--num-attention-heads`` (required), with Megatron-LM's rule on
        the head width."""
        f = self.f
        layers = f.int("--num-layers", None, bound=LIMITS["num_hidden_layers"])
        hidden = f.int("--hidden-size")
        heads = f.int("--num-attention-heads")
        for flag, v in (("--num-layers", layers), ("--hidden-size", hidden), ("--num-attention-heads", heads)):
            if v is None:
                raise ConfigError(f"{flag} is required (Megatron-LM requires it)")
        if "--kv-channels" not in f.values and hidden % heads:
            raise ConfigError(f"--hidden-size={hidden} must be divisible by --num-attention-heads={heads} "
                              f"(Megatron-LM's rule when --kv-channels is not given)")
        return layers, hidden, heads

    def model_fields(self) -> tuple[dict, bool]:
        f = self.f
        layers, hidden, heads = self._sizes()
        swiglu = f.switch("--swiglu")
        ffn = f.int("--ffn-hidden-size", (hidden // 24) * 64 if swiglu else 4 * hidden)
        if ffn < 1:
            raise ConfigError(f"--hidden-size={hidden}: Megatron's default FFN width int(8h/3/64)*64 is 0; "
                              f"give --ffn-hidden-size")
        experts = f.int("--num-experts", None, minimum=0)
        dense = not experts
        m = {
            "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "intermediate_size": ffn,
            "qk_nope_head_dim": f.int("--qk-head-dim", 128), "qk_rope_head_dim": f.int("--qk-pos-emb-head-dim", 64),
            "v_head_dim": f.int("--v-head-dim", 128), "q_lora_rank": f.int("--q-lora-rank", None),
            "kv_lora_rank": f.int("--kv-lora-rank", 32),
            "num_nextn_predict_layers": f.int("--mtp-num-layers", 0, minimum=0, bound=LIMITS["num_nextn_predict_layers"]),
            "tie_word_embeddings": not f.switch("--untie-embeddings-and-output-weights"),
        }
        if dense:
            m.update(moe_intermediate_size=ffn, n_routed_experts=1, n_shared_experts=0, num_experts_per_tok=1,
                     first_k_dense_replace=layers, moe_layer_freq=1)
            return m, True
        moe_ffn, shared, topk, k, freq, score, bias, groups, group_topk, pre_softmax = self._router(layers, ffn)
        if score == "softmax" and pre_softmax:
            self.not_modelled("--moe-router-pre-softmax")
        m.update(moe_intermediate_size=moe_ffn, n_routed_experts=experts,
                 n_shared_experts=0 if shared is None else shared // moe_ffn, num_experts_per_tok=topk,
                 first_k_dense_replace=k, moe_layer_freq=freq,
                 n_group=groups if group_topk else 1, topk_group=group_topk or 1, scoring_func=score)
        m["topk_method"] = "noaux_tc" if bias else "greedy"
        f.switch("--moe-grouped-gemm")      # TE's grouped GEMM: what memlib's ledger assumes for the experts
        return m, False

    def _router(self, layers: int, ffn: int) -> tuple:
        """The MoE layers' flags both attention kinds read: (expert width, shared width or None, top-k, the HF
        pattern's first_k_dense_replace and moe_layer_freq, score function, expert bias, groups, group top-k,
        pre-softmax), with Megatron-Core's rules on them."""
        f = self.f
        moe_ffn = f.int("--moe-ffn-hidden-size", ffn)
        shared = f.int("--moe-shared-expert-intermediate-size", None)
        if shared is not None and shared % moe_ffn:
            raise ConfigError(f"--moe-shared-expert-intermediate-size={shared} must be a multiple of "
                              f"--moe-ffn-hidden-size={moe_ffn} (memlib counts shared experts of the routed width)")
        topk = f.int("--moe-router-topk", 2)
        k, freq = pattern_to_hf(moe_layer_pattern(f.one("--moe-layer-freq") or "1", layers))
        score = f.choice("--moe-router-score-function", "softmax", ("softmax", "sigmoid", "sqrtsoftplus"))
        if score == "sqrtsoftplus":
            raise ConfigError("--moe-router-score-function=sqrtsoftplus cannot be expressed (memlib: softmax or sigmoid)")
        bias = f.switch("--moe-router-enable-expert-bias")
        if bias and score != "sigmoid":
            raise ConfigError(f"--moe-router-enable-expert-bias with --moe-router-score-function={score}: Megatron-Core "
                              f"allows the expert bias with sigmoid only")
        groups = f.int("--moe-router-num-groups", None)
        group_topk = f.int("--moe-router-group-topk", None)
        if group_topk and not groups:
            raise ConfigError(f"--moe-router-group-topk={group_topk} needs --moe-router-num-groups (Megatron-Core's rule)")
        pre_softmax = f.switch("--moe-router-pre-softmax")      # sigmoid scores: it changes nothing
        sinkhorn = "sinkhorn" in (f.many("--moe-router-load-balancing-type") or ())
        if topk == 1 and score == "softmax" and not pre_softmax and not sinkhorn:
            raise ConfigError("--moe-router-topk=1 with softmax scores needs --moe-router-pre-softmax (Megatron-Core's "
                              "rule, sinkhorn load balancing excepted)")
        return moe_ffn, shared, topk, k, freq, score, bias, groups, group_topk, pre_softmax

    def gqa_fields(self) -> tuple[dict, bool]:
        """A model without ``--multi-latent-attention``: grouped-query (or multi-head) attention, the dense FFN
        (SwiGLU with ``--swiglu``, else GeLU), LayerNorm or RMSNorm, learned absolute positions or RoPE, biases
        unless ``--disable-bias-linear`` (``--add-qkv-bias`` keeps those of q, k, v), Mixtral-style MoE layers
        (softmax after the top-k) or DeepSeek-style ones (softmax first or sigmoid scores, shared experts) whose
        experts are MLPs of the model's kind (SwiGLU or GeLU, biased with the rest): ModelConfig's fields, given
        directly (``family`` names the nearest preset family)."""
        f = self.f
        layers, hidden, heads = self._sizes()
        head_dim = f.int("--kv-channels", hidden // heads)
        kv = f.int("--num-query-groups", 1) if f.switch("--group-query-attention") else heads
        if heads % kv:
            raise ConfigError(f"--num-query-groups={kv} must divide --num-attention-heads={heads}")
        for flag in ("--squared-relu", "--quick-geglu", "--multi-latent-attention"):
            if f.switch(flag) and flag != "--multi-latent-attention":
                raise ConfigError(f"{flag}=on: memlib's feed-forward is SwiGLU (--swiglu) or GeLU (the default)")
        if f.has("--activation-func"):
            raise ConfigError(f"--activation-func={show(f.text('--activation-func'))}: memlib's feed-forward is "
                              f"SwiGLU (--swiglu) or GeLU (the default)")
        swiglu = f.switch("--swiglu")
        ffn = f.int("--ffn-hidden-size", (hidden // 24) * 64 if swiglu else 4 * hidden)
        if ffn < 1:
            raise ConfigError(f"--hidden-size={hidden}: Megatron's default FFN width int(8h/3/64)*64 is 0; "
                              f"give --ffn-hidden-size")
        norm = f.choice("--normalization", "LayerNorm", ("LayerNorm", "RMSNorm"))
        pos = f.choice("--position-embedding-type", "learned_absolute",
                       ("learned_absolute", "rope", "yarn", "mrope", "relative", "none"))
        if pos not in ("learned_absolute", "rope"):
            raise ConfigError(f"--position-embedding-type={pos}: memlib models learned absolute positions and RoPE "
                              f"for attention without --multi-latent-attention")
        if f.has("--rotary-percent") and _fraction("--rotary-percent", f.one("--rotary-percent")) != 1:
            self.not_modelled("--rotary-percent", f"--rotary-percent={f.text('--rotary-percent')} (memlib's RoPE "
                                                  f"cache covers the whole head)")
        bias = not f.switch("--disable-bias-linear")
        qkv_bias = bias or f.switch("--add-qkv-bias")
        max_pos = f.int("--max-position-embeddings", None, bound=LIMITS["seq_len"])
        if pos == "learned_absolute" and max_pos is None:
            raise ConfigError("--max-position-embeddings is required with learned absolute positions (Megatron-LM's "
                              "rule)")
        experts = f.int("--num-experts", None, minimum=0)
        dense = not experts
        m = {
            "hidden_size": hidden, "intermediate_size": ffn, "num_attention_heads": heads,
            "qk_nope_head_dim": None, "qk_rope_head_dim": None, "v_head_dim": None, "q_lora_rank": None,
            "kv_lora_rank": None, "num_hidden_layers": layers,
            "num_nextn_predict_layers": f.int("--mtp-num-layers", 0, minimum=0, bound=LIMITS["num_nextn_predict_layers"]),
            "tie_word_embeddings": not f.switch("--untie-embeddings-and-output-weights"),
            "attention": "gqa", "mlp": "swiglu" if swiglu else "gelu", "norm": norm.lower(),
            "positions": "learned" if pos == "learned_absolute" else "rope", "num_key_value_heads": kv,
            "head_dim": head_dim, "qk_norm": f.switch("--qk-layernorm"), "qkv_bias": qkv_bias, "o_bias": bias,
            "mlp_bias": bias, "max_position_embeddings": max_pos if pos == "learned_absolute" else None,
            "hidden_act": "silu" if swiglu else "gelu", "scoring_func": "softmax",
        }
        if m["num_nextn_predict_layers"]:
            raise ConfigError(f"--mtp-num-layers={m['num_nextn_predict_layers']} without --multi-latent-attention: "
                              f"memlib models MTP modules of MLA models")
        if dense:
            m.update(moe_intermediate_size=None, n_routed_experts=None, n_shared_experts=0, num_experts_per_tok=None,
                     first_k_dense_replace=layers, moe_layer_freq=1, moe=None,
                     family="llama" if swiglu else "gpt")
            return m, True
        if f.switch("--moe-shared-expert-gate"):
            raise ConfigError("--moe-shared-expert-gate=on cannot be expressed without --multi-latent-attention yet")
        moe_ffn, shared, topk, k, freq, score, bias_e, groups, group_topk, pre_softmax = self._router(layers, ffn)
        mixtral = score == "softmax" and not pre_softmax and not shared and not group_topk
        m.update(moe_intermediate_size=moe_ffn, n_routed_experts=experts,
                 n_shared_experts=0 if shared is None else shared // moe_ffn, num_experts_per_tok=topk,
                 first_k_dense_replace=k, moe_layer_freq=freq, n_group=groups if group_topk else 1,
                 topk_group=group_topk or 1, scoring_func=score, router_bias=bias_e,
                 moe="mixtral" if mixtral else "deepseek", family="mixtral",
                 intermediate_size=ffn if k or freq > 1 else None)
        f.switch("--moe-grouped-gemm")
        return m, False

    def vocabulary(self, m: dict, tp: int) -> dict:
        f = self.f
        tok = f.choice("--tokenizer-type", "GPT2BPETokenizer", (
            "BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer", "SentencePieceTokenizer",
            "GPTSentencePieceTokenizer", "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer",
            "MultimodalTokenizer", "NullTokenizer", "NullMultimodalTokenizer", "SFTTokenizer"))
        model_file = f.text("--tokenizer-model")
        f.text("--vocab-file"), f.text("--merge-file")
        divisible = f.int("--make-vocab-size-divisible-by", 128)
        padded_flag = f.int("--padded-vocab-size", None)
        no_pad = f.switch("--no-pad-vocab-size", "--disable-pad-vocab-size")
        file_size = f.int("--vocab-size", None)
        if f.has("--tokenizer-special-tokens"):
            self.not_modelled("--tokenizer-special-tokens", "--tokenizer-special-tokens (tokens added to the vocabulary)")
        if f.int("--vocab-extra-ids", 0, minimum=0):
            self.not_modelled("--vocab-extra-ids")
        vocab = {"tokenizer": tok, "model_file": model_file, "divisible_by": divisible}
        size, source = None, ""
        if self.vocab_arg is not None:
            size, source = self.vocab_arg, "given (vocab_size)"
        elif tok in ("NullTokenizer", "TikTokenizer"):
            size = file_size if file_size is not None else (TIKTOKEN_DEFAULT if tok == "TikTokenizer" else None)
            source = f"--vocab-size ({tok})" if file_size is not None else f"{tok}'s default"
            if size is None and padded_flag is None:
                raise ConfigError("--tokenizer-type=NullTokenizer needs --vocab-size (its vocabulary)")
            if tok == "NullTokenizer" and size is not None and not self.version.has("null_tokenizer_eod"):
                size += 1
                source += (f" + 1: NullTokenizer's end-of-document token, added before Megatron-LM c9dfe34798 "
                           f"(version {self.version.text})")
        else:
            base = model_file.rsplit("/", 1)[-1] if model_file else None
            key = (tok, base if tok in SENTENCEPIECE else None)
            if file_size is not None:
                self.not_modelled("--vocab-size", f"--vocab-size (Megatron-LM ignores it for {tok})")
            if key in TOKENIZER_SIZES:
                size, source = TOKENIZER_SIZES[key]
            elif padded_flag is None:
                what = f"{tok} with {base}" if base else tok
                raise ConfigError(f"vocab_size is unknown for --tokenizer-type={what}: give memlib the tokenizer's "
                                  f"vocabulary (memlib estimate --vocab-size N; memlib pads it as Megatron does)")
        if padded_flag is not None:
            padded, source = padded_flag, (source + "; " if source else "") + "--padded-vocab-size, used as it is"
        elif no_pad:
            raise ConfigError("--no-pad-vocab-size=on without --padded-vocab-size leaves Megatron-LM without a model "
                              "vocabulary size; give --padded-vocab-size")
        else:
            padded = pad_vocab(size, divisible, tp)
        vocab.update(size=size, padded=padded, source=source)
        self.vocab = vocab
        return {**m, "vocab_size": padded}

    def structure(self, dense: bool) -> None:
        """Megatron defaults (and flags) that build what memlib does not count."""
        f = self.f
        if not self.mla:
            self.structure_common(dense)
            return
        if not f.switch("--disable-bias-linear"):
            self.notes.append("biases (no --disable-bias-linear)")
        if f.switch("--add-qkv-bias"):
            self.not_modelled("--add-qkv-bias")
        norm = f.choice("--normalization", "LayerNorm", ("LayerNorm", "RMSNorm"))
        if norm != "RMSNorm":
            if f.has("--normalization"):
                self.not_modelled("--normalization", "--normalization=LayerNorm (memlib counts RMSNorm)")
            else:
                self.notes.append("--normalization=LayerNorm (Megatron's default; memlib counts RMSNorm)")
        if not f.has("--swiglu"):
            self.notes.append("no --swiglu (memlib counts a SwiGLU feed-forward)")
        if not f.switch("--qk-layernorm"):
            self.notes.append("no --qk-layernorm (memlib counts MLA's latent RMSNorms)")
        pos = f.choice("--position-embedding-type", "learned_absolute",
                       ("learned_absolute", "rope", "yarn", "mrope", "relative", "none"))
        if pos in ("learned_absolute", "mrope", "relative"):
            entry = f"--position-embedding-type={pos}" + ("" if f.has("--position-embedding-type") else
                                                          " (Megatron's default)")
            if f.has("--position-embedding-type"):
                self.not_modelled("--position-embedding-type", entry)
            else:
                self.notes.append(entry)
        self.structure_common(dense)

    def structure_common(self, dense: bool) -> None:
        """What every model shares: the token dispatcher, the router's dtype, the RoPE fusion."""
        f = self.f
        if not dense:
            dispatcher = f.choice("--moe-token-dispatcher-type", "allgather", ("allgather", "alltoall", "flex"))
            if dispatcher == "flex":    # DeepEP or HybridEP: the tokens move as with alltoall; their buffers not counted
                f.switch("--moe-enable-deepep")
                f.choice("--moe-flex-dispatcher-backend", "deepep", ("deepep", "hybridep"))
            if dispatcher not in ("alltoall", "flex"):
                if f.has("--moe-token-dispatcher-type"):
                    self.not_modelled("--moe-token-dispatcher-type",
                                      f"--moe-token-dispatcher-type={dispatcher} (memlib counts alltoall)")
                else:
                    self.notes.append("--moe-token-dispatcher-type=allgather (Megatron's default; memlib counts "
                                      "alltoall)")
            rdtype = f.choice("--moe-router-dtype", None, ("fp32", "fp64"))
            if rdtype != "fp32":
                if f.has("--moe-router-dtype"):
                    self.not_modelled("--moe-router-dtype", f"--moe-router-dtype={rdtype} (memlib counts fp32)")
                else:
                    self.notes.append("no --moe-router-dtype (memlib counts an fp32 router)")
        if f.switch("--no-rope-fusion") and self.impl.uses_te:
            self.not_modelled("--no-rope-fusion", "--no-rope-fusion (memlib counts the fused MLA RoPE with "
                                                  "transformer_engine)" if self.mla else
                              "--no-rope-fusion (memlib counts the fused RoPE of grouped-query attention with "
                              "transformer_engine)")
