"""What memlib accepts and refuses (issue #20): one integer parser for every integer the command line and the
files read (plain ASCII digits), list options that refuse unknown names and keep precision specs whole,
``--fix`` that contradicts a list, config fields that are not integers, flags a Megatron-LM file holds that
memlib does not know.  Every refusal is one line naming the field and its value (exit 2 at the CLI)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from memlib.cli import main
from memlib.config import ConfigError, model_from_dict
from memlib.megatron.flags import parse_megatron_args

import tiny as T


def _refused(argv: list[str], capsys, *needles: str) -> str:
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and err.count("\n") == 1 and err.startswith("memlib: error: "), (argv, rc, err)
    assert "Traceback" not in err
    for n in needles:
        assert n in err, (argv, err)
    return err


PLAN = ["plan", "--model", "deepseek-v2-lite", "--gpus", "8", "--gpu-memory", "80GB", "--global-batch", "32"]

#: digits that are not ASCII, as offsets from '0': str.isdigit() accepts them all, int() and \\d in a regular
#: expression some of them (Arabic-Indic, fullwidth, mathematical bold; superscripts only isdigit)
_SCRIPTS = {"arabic": 0x0660, "fullwidth": 0xFF10, "bold": 0x1D7CE}
_SUPERSCRIPT = "⁰¹²³⁴⁵⁶⁷⁸⁹"


def spellings(n: str) -> list[str]:
    """``n`` written with non-ASCII digits: all of them in each script, its last digit only, superscripts."""
    out = ["".join(chr(base + int(c)) for c in n) for base in _SCRIPTS.values()]
    out.append(n[:-1] + chr(_SCRIPTS["arabic"] + int(n[-1])))
    out.append("".join(_SUPERSCRIPT[int(c)] for c in n))
    return out


_MEGATRON = ("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --multi-latent-attention --num-experts 8 "
             "--micro-batch-size 1 --seq-length 64 --bf16 --tokenizer-type NullTokenizer --vocab-size 1000")

#: every place an integer is read: (name, the argv with {} for the integer, a valid integer there, a field the
#: error names)
SITES = {
    "fix": (PLAN + ["--fix", "tp={}", "--top", "1"], "2", "fix="),
    "zero": (PLAN + ["--zero", "0,{}", "--top", "1"], "1", "zero="),
    "estimate": (["estimate", "--tp", "{}"], "2", "tp="),
    "layout": (["estimate", "--pp", "2", "--layout", "30,{}"], "31", "layout"),
    "layout_string": (["estimate", "--pp", "1", "--layout", "Et*{}mL"], "61", "layout"),
    "full_block": (["estimate", "--recompute", "full-block:{}"], "2", "recompute="),
    "megatron_int": (_MEGATRON.replace("--num-layers 4", "--num-layers {}"), "4", "--num-layers"),
    "moe_layer_freq": (_MEGATRON + " --moe-layer-freq {}", "2", "--moe-layer-freq"),
    "moe_layer_list": (_MEGATRON + " --moe-layer-freq '[1]*{}'", "4", "--moe-layer-freq"),
    "megatron_layout": (_MEGATRON + " --pipeline-model-parallel-layout 'Et*{}L'", "4",
                        "--pipeline-model-parallel-layout"),
}


def _argv(site: str, value: str, tmp_path) -> list[str]:
    template = SITES[site][0]
    if isinstance(template, str):           # a Megatron-LM flag file
        path = tmp_path / "run.args"
        path.write_text(template.replace("{}", value))
        return ["estimate", "--megatron-args", str(path), "--world-size", "1"]
    return [x.replace("{}", value) for x in template]


@pytest.mark.parametrize("site", sorted(SITES))
def test_every_integer_is_ascii_digits(site, capsys, tmp_path):
    """Wherever memlib reads an integer, the valid value is read and the same value in other digits is
    refused (``tp=²`` was a traceback, ``tp=١`` and ``tp=１`` were read as 1, a layout's ``t*6١`` as 61)."""
    _, n, field = SITES[site]
    assert main(_argv(site, n, tmp_path)) == 0, capsys.readouterr().err
    capsys.readouterr()
    for bad in spellings(n):
        _refused(_argv(site, bad, tmp_path), capsys, field)


def test_fix_reads_ascii_digits_and_names_a_bad_one(capsys):
    err = _refused(PLAN + ["--fix", "tp=²"], capsys, "fix='tp=²'")
    assert "integer" in err


# ------------------------------------------------------------------------------------------------
# plan's list options
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("option,value,needle", [
    ("--precision", "megatron,bogus", "precision='bogus'"),
    ("--profile", "megatron,bogus", "profile='bogus'"),
    ("--recompute", "none,bogus", "recompute='bogus'"),
    ("--recompute", "none,full-block:x", "recompute='full-block:x'"),
    ("--precision", "megatron:exp_avg=fp7", "precision='megatron:exp_avg=fp7'"),
])
def test_an_unknown_name_in_a_list_is_refused(option, value, needle, capsys):
    _refused(PLAN + [option, value], capsys, needle)


def _plan_json(argv, capsys) -> dict:
    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_precision_spec_with_commas_is_one_item(capsys):
    """``megatron:exp_avg=bf16,exp_avg_sq=bf16`` is one recipe (it was split into two items, the second
    dropped as invalid); beside another recipe in the list, both are searched."""
    from memlib.search.plan import SearchSpace, search

    spec = "megatron:exp_avg=bf16,exp_avg_sq=bf16"
    one = _plan_json(PLAN + ["--precision", spec, "--top", "0"], capsys)
    assert one["searched"] == search("deepseek-v2-lite", 8, SearchSpace(global_batch=32, precisions=(spec,))).searched
    both = _plan_json(PLAN + ["--precision", f"fp32,{spec}", "--top", "0"], capsys)
    assert both["searched"] == search("deepseek-v2-lite", 8, SearchSpace(global_batch=32, precisions=("fp32", spec))).searched
    assert both["searched"] == 2 * one["searched"]


@pytest.mark.parametrize("extra,needle", [
    (["--zero", "0,1", "--fix", "zero=3"], "zero=3"),
    (["--max-micro-batch", "4", "--fix", "b=8"], "b=8"),
    (["--max-vpp", "3", "--fix", "vpp=4"], "vpp=4"),
    (["--schedule", "1f1b,gpipe", "--fix", "vpp=2"], "vpp=2"),
])
def test_fix_that_contradicts_a_list_is_refused(extra, needle, capsys):
    """``--fix zero=3`` replaced ``--zero 0,1`` silently; a pinned knob outside what the other options search
    is an error naming both."""
    _refused(PLAN + extra, capsys, needle)


def test_fix_inside_the_list_pins_it(capsys):
    data = _plan_json(PLAN + ["--zero", "0,1", "--fix", "zero=1", "--top", "5"], capsys)
    assert data["configs"] and all(c["config"]["zero"] == 1 for c in data["configs"])


# ------------------------------------------------------------------------------------------------
# config.json fields: integers are integers
# ------------------------------------------------------------------------------------------------
def _families() -> dict[str, tuple[dict, list[str]]]:
    """A valid small config of every family and the integer fields memlib reads from it."""
    from memlib.config.model import FAMILIES, _BOOL_FIELDS, _STR_FIELDS

    configs = T.FAMILY_CONFIGS
    out = {}
    for fam in FAMILIES:
        d = configs[fam.name]
        if fam.name == "deepseek":
            ints = [k for k, v in d.items() if type(v) is int]
        else:
            ints = [hf for field, hf, _ in fam.fields if hf is not None and hf in d
                    and field not in _BOOL_FIELDS and field not in _STR_FIELDS]
            if fam.moe is not None:
                ints.append("decoder_sparse_step")
        model_from_dict(d)          # the base is valid
        out[fam.name] = (d, ints)
    return out


FAMILY_FIELDS = [(fam, key) for fam, (_, keys) in _families().items() for key in keys]


@pytest.mark.parametrize("family,key", FAMILY_FIELDS, ids=[f"{f}.{k}" for f, k in FAMILY_FIELDS])
def test_an_integer_field_refuses_booleans_floats_and_strings(family, key):
    """``decoder_sparse_step: true`` or ``1.0`` and ``num_nextn_predict_layers: false`` or ``0.0`` were read as
    integers where ``num_hidden_layers: 2.0`` is refused: every integer field refuses them alike."""
    d, _ = _families()[family]
    value = d[key]
    for bad in (True, False, float(value), str(value)):
        with pytest.raises(ConfigError) as e:
            model_from_dict({**d, key: bad})
        msg = str(e.value)
        assert key in msg and "\n" not in msg, (key, bad, msg)


@pytest.mark.parametrize("q,needle", [
    ({"quant_method": "fp8", "weight_block_size": [0, 128]}, "weight_block_size"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "two integers"),
    ({"quant_method": "fp8", "weight_block_size": [128.0, 128]}, "weight_block_size"),
    ({"quant_method": "fp8", "weight_block_size": "128x128"}, "two integers"),
    ("fp8", "must be an object"),
])
def test_a_bad_fp8_block_is_refused(q, needle):
    """A block-FP8 checkpoint's ``weight_block_size`` is read (it decides how many scales the files store):
    anything but two positive integers is a one-line error naming the field."""
    d, _ = _families()["deepseek"]
    with pytest.raises(ConfigError) as e:
        model_from_dict({**d, "quantization_config": q})
    msg = str(e.value)
    assert "quantization_config" in msg and needle in msg and "\n" not in msg, msg


# ------------------------------------------------------------------------------------------------
# Megatron-LM flags memlib does not know
# ------------------------------------------------------------------------------------------------
BASE = ("--num-layers 4 --hidden-size 64 --ffn-hidden-size 96 --num-attention-heads 4 --multi-latent-attention "
        "--q-lora-rank 24 --kv-lora-rank 16 --qk-head-dim 8 --qk-pos-emb-head-dim 4 --v-head-dim 8 "
        "--micro-batch-size 1 --seq-length 64 --bf16 --swiglu --normalization RMSNorm --disable-bias-linear "
        "--qk-layernorm --position-embedding-type rope --attention-dropout 0.0 --hidden-dropout 0.0 "
        "--vocab-size 1000 --tokenizer-type NullTokenizer ")


@pytest.mark.parametrize("flag", ["--über-flag 3", "--flag\u00e9 1", "--ﬂag", "--x+y 2"])
def test_a_flag_memlib_cannot_read_is_warned_not_dropped(flag):
    run = parse_megatron_args(BASE + "--num-experts 8 " + flag, world_size=1)
    name = flag.split()[0]
    assert name in run.not_modelled and name in run.warning()


def test_an_unknown_moe_flag_on_a_dense_model_is_not_modelled():
    """A dense model ignores Megatron-LM's --moe-* flags; one Megatron-LM does not define is not known to
    have no memory effect (it is warned, as on an MoE model)."""
    run = parse_megatron_args(BASE + "--moe-made-up-flag 2 --moe-router-topk 2 --moe-token-dispatcher-type alltoall",
                              world_size=1)
    assert "--moe-made-up-flag" in run.not_modelled and "--moe-made-up-flag" not in run.no_effect
    assert {"--moe-router-topk", "--moe-token-dispatcher-type"} <= set(run.no_effect)
    moe = parse_megatron_args(BASE + "--num-experts 8 --moe-made-up-flag 2", world_size=1)
    assert "--moe-made-up-flag" in moe.not_modelled


def test_the_known_moe_flags_are_megatron_lms():
    """memlib's list of Megatron-LM's --moe-* flags (those a dense model ignores) holds every MoE field of the
    installed megatron-core's TransformerConfig (read from its source: the module needs a GPU stack to import)."""
    import ast
    import importlib.util

    from memlib.megatron.tables import MOE_FLAGS

    spec = importlib.util.find_spec("megatron.core")
    if spec is None:
        pytest.skip("megatron-core is not installed")
    path = Path(spec.origin).parent / "transformer" / "transformer_config.py"
    tree = ast.parse(path.read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "TransformerConfig")
    fields = {"--" + n.target.id.replace("_", "-") for n in cls.body
              if isinstance(n, ast.AnnAssign) and n.target.id.startswith("moe_")}
    assert fields and fields <= MOE_FLAGS, sorted(fields - MOE_FLAGS)


@pytest.mark.parametrize("value", ["foo", ":4096", "4096:8", ":4096:8:", ":a:8"])
def test_a_cublas_workspace_config_that_is_not_size_count_pairs_is_refused(value, capsys):
    """``CUBLAS_WORKSPACE_CONFIG`` is ``:SIZE:COUNT`` pairs: anything else would set no workspace at all."""
    _refused(["estimate", "--model", "llama-3-8b", "--cublas-workspace-config", value], capsys,
             "cublas_workspace_config=")


def test_a_cublas_workspace_config_sets_the_workspaces(capsys):
    """Eight 4 MiB workspaces (:4096:8) on an A100 replace its default 4096 KiB x 2 + 16 KiB x 8 on each of the two
    cuBLAS handles torch makes in a Megatron-LM step: 2 x (24 MiB - 128 KiB) more on every rank (a Megatron-LM
    functional test's setting)."""
    def peak(*extra):
        assert main(["estimate", "--model", "llama-3-8b", "--profile", "megatron", "--precision", "megatron", "--gpu",
                     "A100", "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)["peak_allocated"]
    assert peak("--cublas-workspace-config", ":4096:8") - peak() == 2 * (32 * 2**20 - (8 * 2**20 + 128 * 2**10))
