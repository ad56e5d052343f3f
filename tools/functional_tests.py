"""Extract memlib's validation set from Megatron-LM's functional tests into memlib/data/functional_tests.json.gz.

Usage: ``python tools/functional_tests.py /path/to/Megatron-LM.git [OUT]`` (a clone or bare mirror that holds
commit ``COMMIT``, the Megatron-LM commit memlib pins, and its history; a few minutes).  The output is gzipped JSON
(written byte for byte the same on every run: the long release runs log ten thousand steps).

Every directory under ``tests/functional_tests/test_cases/`` whose golden-values files log
``mem-max-allocated-bytes`` is one test.  For each, the file holds

``model_args``, ``env_vars``
    the ``MODEL_ARGS`` and ``ENV_VARS`` mappings of its ``model_config.yaml`` at ``COMMIT``, values as YAML reads
    them (``true`` a switch, ``false`` a flag left out, as ``_run_training.sh`` turns them into a command line);
``recipes``
    each entry of ``tests/test_utils/recipes/*/*.yaml`` at ``COMMIT`` that lists the test (its recipe, environment,
    platform and ``nodes`` x ``gpus``), commented-out entries included and marked so;
``goldens``
    per golden-values file (one environment and GPU platform): the memory metrics per logged step
    (``mem-allocated-bytes``: after the optimizer step; ``mem-max-allocated-bytes``: the allocator's running maximum,
    both on the last global rank) as the file holds them; ``last_commit``, the commit that last changed the file
    at ``COMMIT``, and ``values_commit``, the commit that wrote these memory values (the oldest commit, walking the
    file's history back across renames, whose file still holds them: later commits may rename or reformat the file
    without a new run); ``model_args_at_values`` and ``env_vars_at_values``, the test's ``model_config.yaml`` at
    ``values_commit`` where it differs from ``COMMIT``'s (``null`` where it is the same); the world size from the
    recipe entry of the file's environment and platform (``world_size_source`` says which), or ``null`` where no
    recipe gives it (memlib derives it from the logged post-step allocation then, and says so); ``container``, the
    NGC PyTorch container the CI image of the file's environment was built on at ``values_commit``
    (``docker/.ngc_version.<env>``, or before that file the build stage's matrix), which fixes the PyTorch and, for
    the ``lts`` image, the Transformer Engine the values were measured with.

Everything is read with ``git`` from the mirror; nothing is run.  The values are copied, not interpreted: memlib
(memlib.scenarios.measured) reads them.  Megatron-LM is BSD 3-Clause licensed; this is reference data.
"""
from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from memlib.config.versions import MEGATRON_COMMIT

COMMIT = MEGATRON_COMMIT
ROOT = "tests/functional_tests/test_cases"
RECIPES = "tests/test_utils/recipes"
#: where the recipes lived before (the test system's older layout)
OLD_RECIPES = ("tests/functional_tests/jet_recipes",)
METRICS = ("mem-allocated-bytes", "mem-max-allocated-bytes")
OUT = Path(__file__).resolve().parents[1] / "memlib" / "data" / "functional_tests.json.gz"
#: GPU platform of a golden-values file name when it names none (``golden_values_lts.json``): the recipes'
#: default platform (``spec.platforms``)
DEFAULT_PLATFORM = "dgx_a100"


class Repo:
    """A git directory read through one ``git cat-file --batch`` process."""

    def __init__(self, path: str):
        self.path = path
        self._cat = subprocess.Popen(["git", "--git-dir", path, "cat-file", "--batch"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)

    def git(self, *args: str) -> str:
        return subprocess.run(["git", "--git-dir", self.path, *args], capture_output=True, text=True,
                              check=True).stdout

    def show(self, commit: str, path: str) -> str | None:
        """The file at ``commit`` (None where it does not exist)."""
        self._cat.stdin.write(f"{commit}:{path}\n".encode())
        self._cat.stdin.flush()
        head = self._cat.stdout.readline().decode().split()
        if len(head) < 3 or head[1] != "blob":
            return None
        data = self._cat.stdout.read(int(head[2]) + 1)[:-1]
        return data.decode("utf-8")


def _golden_files(repo: Repo) -> list[str]:
    out = repo.git("grep", "-l", "mem-max-allocated-bytes", COMMIT, "--", ROOT)
    return sorted(line.split(":", 1)[1] for line in out.splitlines()
                  if Path(line.split(":", 1)[1]).name.startswith("golden_values"))


def _environment_platform(name: str) -> tuple[str, str, bool]:
    """(environment, platform, second run) of ``golden_values_<env>[_<platform>][_2nd].json``."""
    stem = name.removeprefix("golden_values_").removesuffix(".json")
    second = stem.endswith("_2nd")
    env, _, platform = stem.removesuffix("_2nd").partition("_")
    return env, platform or DEFAULT_PLATFORM, second


def _config(repo: Repo, commit: str, directory: str) -> tuple[dict | None, dict | None, str | None]:
    text = repo.show(commit, f"{directory}/model_config.yaml")
    if text is None:
        return None, None, None
    doc = yaml.safe_load(text) or {}
    return doc.get("MODEL_ARGS"), doc.get("ENV_VARS"), doc.get("TEST_TYPE")


def _recipes(repo: Repo, commit: str = COMMIT) -> dict[str, list[dict]]:
    """test case -> the recipe entries at ``commit`` that list it (live and commented out)."""
    out: dict[str, list[dict]] = {}
    paths = repo.git("ls-tree", "-r", "--name-only", commit, RECIPES, *OLD_RECIPES).split()
    for path in paths:
        text = repo.show(commit, path)
        try:
            doc = yaml.safe_load(text) or {}
        except yaml.YAMLError:
            continue
        spec = doc.get("spec") if isinstance(doc, dict) else None
        if not isinstance(spec, dict) or "nodes" not in spec or "gpus" not in spec:
            continue
        rel = path if commit != COMMIT else path.removeprefix(RECIPES + "/")
        default = spec.get("platforms", DEFAULT_PLATFORM)

        def entry(case, env, platform, scope, commented):
            out.setdefault(case, []).append({
                "recipe": rel, "environment": env, "platform": platform, "nodes": spec["nodes"],
                "gpus": spec["gpus"], "world_size": spec["nodes"] * spec["gpus"], "scope": scope,
                "commented_out": commented})

        def walk(products, commented):
            for group in products or []:
                for case in _as_list(group.get("test_case")):
                    for p in group.get("products") or []:
                        for env in _as_list(p.get("environment")):
                            for platform in _as_list(p.get("platforms", default)):
                                entry(case, env, platform, _as_list(p.get("scope")), commented)

        try:
            walk(doc.get("products"), False)
        except (AttributeError, TypeError):
            continue
        # the commented-out entries: the same YAML with its '# ' prefixes taken off, block by block
        for block in re.findall(r"(?m)((?:^\s*#\s*- test_case:.*\n)(?:^\s*#.*\n)*)", text):
            lines = [re.sub(r"^(\s*)#\s?", r"\1", ln) for ln in block.splitlines()]
            try:
                parsed = yaml.safe_load("\n".join(ln.split(" #")[0] for ln in lines))
            except yaml.YAMLError:
                continue
            if isinstance(parsed, list):
                walk([g for g in parsed if isinstance(g, dict)], True)
    return out


def _as_list(x) -> list:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _metrics(text: str | None) -> dict | None:
    if text is None:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not all(m in data for m in METRICS):
        return None
    return {m: data[m] for m in METRICS}


def _history(repo: Repo, path: str) -> list[tuple[str, str, str, str]]:
    """(commit, date, subject, path at that commit) of every commit that changed the file, newest first,
    following renames."""
    out = repo.git("log", "--follow", "--format=%x01%H%x00%cs%x00%s", "--name-status", COMMIT, "--", path)
    rows = []
    for chunk in out.split("\x01")[1:]:
        head, _, rest = chunk.partition("\n")
        sha, day, subject = head.split("\x00")
        names = [ln.split("\t") for ln in rest.splitlines() if ln.strip()]
        at = names[-1][-1] if names else path
        rows.append((sha, day, subject, at))
    return rows


def _writer(repo: Repo, path: str, metrics: dict) -> tuple[dict, dict]:
    """(last commit, the commit that wrote the memory values) of the golden file."""
    hist = _history(repo, path)
    last = {"sha": hist[0][0], "date": hist[0][1], "subject": hist[0][2]}
    wrote = dict(last, path=hist[0][3])
    for sha, day, subject, at in hist:
        if _metrics(repo.show(sha, at)) != metrics:
            break
        wrote = {"sha": sha, "date": day, "subject": subject, "path": at}
    return last, wrote


#: where the CI's base image (the NGC PyTorch container) is named: a file per environment since 2025-11-05, the
#: build stage's matrix before
NGC_VERSION = "docker/.ngc_version.{env}"
BUILD_STAGES = (".gitlab/stages/01.build.yml", ".gitlab/stages/01.test.yml")


def _container(repo: Repo, commit: str, env: str) -> str | None:
    """The NGC PyTorch container the CI image of ``env`` (dev or lts) was built on at ``commit``."""
    text = (repo.show(commit, NGC_VERSION.format(env=env)) or "").strip()
    if text:
        return text
    for stage in BUILD_STAGES:
        try:
            doc = yaml.safe_load(repo.show(commit, stage) or "") or {}
        except yaml.YAMLError:
            continue
        for job in doc.values() if isinstance(doc, dict) else ():
            matrix = ((job or {}).get("parallel") or {}).get("matrix") if isinstance(job, dict) else None
            for row in matrix or ():
                if (isinstance(row, dict) and row.get("IMAGE") == f"CI_MCORE_{env.upper()}_IMAGE"
                        and "nvcr.io/nvidia/pytorch" in str(row.get("BASE_IMAGE", ""))):
                    return row["BASE_IMAGE"]
    return None


def _listed(recipes: list[dict], env: str, platform: str, where: str) -> tuple[int | None, str]:
    """The world size of the recipe entries for ``env`` and ``platform`` (live ones first)."""
    live = [r for r in recipes if r["environment"] == env and r["platform"] == platform and not r["commented_out"]]
    gone = [r for r in recipes if r["environment"] == env and r["platform"] == platform and r["commented_out"]]
    for found, note in ((live, ""), (gone, " (entry commented out)")):
        worlds = sorted({r["world_size"] for r in found})
        if len(worlds) == 1:
            r = found[0]
            return worlds[0], f"{where}{r['recipe']}: nodes {r['nodes']} x gpus {r['gpus']}{note}"
        if len(worlds) > 1:
            return None, f"recipes disagree: {', '.join(r['recipe'] for r in found)}"
    return None, ""


#: the GPU family of a platform: a recipe of the same family sizes a run of another platform of it
_FAMILY = {"dgx_a100": "h100", "dgxa100_dracooci": "h100", "dgxa100_dracooci-ord": "h100", "dgx_h100": "h100",
           "dgxh100_dgxc": "h100", "dgx_gb200": "gb200"}
_NODES_GPUS = re.compile(r"_(\d+)N(\d+)G(?:_|$)")


def _world(repo: Repo, recipes: list[dict], env: str, platform: str, wrote: dict, case: str,
           cache: dict) -> tuple[int | None, str]:
    """The world size of a golden file: the pinned recipes' entry for its environment and platform; else the
    test's directory name at the commit that wrote the values (``..._1N8G``); else the recipes at that commit;
    else the pinned recipes' entries of the test for the other platforms of the same GPU family, when they
    agree; else None."""
    world, how = _listed(recipes, env, platform, RECIPES + "/")
    if world is not None or how:
        return world, how
    old = wrote["path"].rsplit("/", 2)[-2]
    m = _NODES_GPUS.search(old)
    if m:
        n, g = int(m.group(1)), int(m.group(2))
        return n * g, f"the test's directory name when the values were written ({old}): {n} nodes x {g} GPUs"
    if wrote["sha"] not in cache:
        cache[wrote["sha"]] = _recipes(repo, wrote["sha"])
    then = cache[wrote["sha"]]
    for name in (case, old):
        world, how = _listed(then.get(name, []), env, platform, f"at {wrote['sha'][:10]} ")
        if world is not None:
            return world, how
    fam = [r for r in recipes if not r["commented_out"] and r["recipe"].split("/")[0] == _FAMILY.get(platform)]
    worlds = sorted({r["world_size"] for r in fam})
    if len(worlds) == 1:
        listed = sorted({f"{r['recipe']} ({r['environment']} {r['platform']})" for r in fam})
        return worlds[0], (f"{RECIPES}/{fam[0]['recipe']}: nodes {fam[0]['nodes']} x gpus {fam[0]['gpus']}, the "
                           f"recipe of its GPU family, which lists this test for other environments or platforms: "
                           + ", ".join(listed[:3]))
    return None, "no recipe lists this test for this environment and platform"


def main(repo_path: str, out: Path = OUT) -> None:
    repo = Repo(repo_path)
    day = repo.git("log", "-1", "--format=%cs", COMMIT).strip()
    recipes = _recipes(repo)
    cache: dict = {}
    tests: dict[str, dict] = {}
    for path in _golden_files(repo):
        directory, name = path.rsplit("/", 1)
        folder, case = directory.removeprefix(ROOT + "/").split("/", 1)
        key = f"{folder}/{case}"
        if key not in tests:
            args, env, test_type = _config(repo, COMMIT, directory)
            tests[key] = {"folder": folder, "name": case, "test_type": test_type, "model_args": args,
                          "env_vars": env, "recipes": recipes.get(case, []), "goldens": {}}
        t = tests[key]
        metrics = _metrics(repo.show(COMMIT, path))
        if metrics is None:
            continue
        last, wrote = _writer(repo, path, metrics)
        args, env, _ = _config(repo, wrote["sha"], wrote["path"].rsplit("/", 1)[0])
        environment, platform, second = _environment_platform(name)
        world, how = _world(repo, t["recipes"], environment, platform, wrote, case, cache)
        t["goldens"][name] = {
            "environment": environment, "platform": platform, "second_run": second,
            "container": _container(repo, wrote["sha"], environment),
            "world_size": world, "world_size_source": how,
            "last_commit": last, "values_commit": wrote,
            "model_args_at_values": None if args == t["model_args"] else args,
            "env_vars_at_values": None if env == t["env_vars"] else env,
            **metrics,
        }
        print(key, name, wrote["sha"][:10], wrote["date"], world, file=sys.stderr)
    doc = {
        "_source": f"NVIDIA/Megatron-LM {ROOT}/*/*/ (model_config.yaml, golden_values_*.json) and {RECIPES}/ at "
                   f"commit {COMMIT} ({day}), with the history of each golden-values file; BSD 3-Clause License",
        "_written_by": "tools/functional_tests.py (run it on a Megatron-LM mirror to regenerate this file)",
        "commit": COMMIT, "date": day, "metrics": list(METRICS), "tests": tests,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(doc, indent=None, separators=(",", ":")) + "\n"
    with open(out, "wb") as fh, gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0, compresslevel=9) as gz:
        gz.write(text.encode("utf-8"))
    print(f"{len(tests)} tests, {sum(len(t['goldens']) for t in tests.values())} golden files -> {out}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]) if len(sys.argv) > 2 else OUT)
