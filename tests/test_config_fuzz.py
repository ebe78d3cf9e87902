"""A seeded config fuzz test (third audit): generated bad configs end in exit 2 with the key
named and one line, never a traceback.

Each case takes the tiny glyph config (one method), replaces the value at one key path with a
value of the wrong kind, writes it as YAML and runs ``pml-rank check`` on it. A mutation that
still makes a valid config may pass (exit 0); anything else must be exit 2, one line on stderr
naming a component of the mutated key path.
"""

from __future__ import annotations

import copy
import random

import pytest
import yaml

from pml_rank_plugins.cli import main
from tests.running.test_tune import glyph_config

# libyaml's emitter when PyYAML has it (a quarter of the pure-Python one's CPU); same YAML
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
CASES = 300
SEED = 0
BAD_VALUES = [5, -1, "x", "", [1], [], None, {}, {"a": 1}, True, 1.5e300, [[1]], {"x": {"y": 2}}]


def base_config() -> dict:
    cfg = glyph_config()
    cfg["methods"] = {"m": cfg["methods"]["plugin FastAP"]}
    return cfg


def key_paths(node, prefix=()) -> list[tuple]:
    """Every key path of ``node`` as a tuple (class names hold dots), sections included."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append(prefix + (k,))
            out += key_paths(v, prefix + (k,))
    return out


def set_path(config: dict, path: tuple, value) -> None:
    node = config
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def mutations(n: int, seed: int) -> list[tuple[tuple, object]]:
    rng = random.Random(seed)
    paths = key_paths(base_config())
    return [(rng.choice(paths), copy.deepcopy(rng.choice(BAD_VALUES))) for _ in range(n)]


@pytest.mark.slow
def test_generated_bad_configs_exit_2_naming_the_key(tmp_path, capsys):
    problems = []
    for i, (path, value) in enumerate(mutations(CASES, SEED)):
        cfg = base_config()
        set_path(cfg, path, value)
        file = tmp_path / f"c{i}.yaml"
        file.write_text(yaml.dump(cfg, Dumper=DUMPER))
        rc = main(["check", str(file)])
        err = capsys.readouterr().err.strip()
        # `methods: null` leaves a config without methods: the missing section is named instead
        named = any(str(part) in err for part in path) or "missing required section" in err
        if rc == 0:
            continue
        if rc != 2 or "Traceback" in err or len(err.splitlines()) != 1 or not named:
            problems.append(f"{'.'.join(map(str, path))}={value!r}: rc {rc}: {err[:300]}")
    assert not problems, f"{len(problems)} of {CASES} cases:\n" + "\n".join(problems[:20])


# --------------------------------------------------------------------------- issue 43's classes
# Each class of bad input below passed `check` (exit 0) or was refused without naming its key.
# Every case must end in exit 2 with one line naming the key (and no traceback).


def check_refuses(tmp_path, capsys, cfg, *words, sets=(), name="c.yaml"):
    file = tmp_path / name
    file.write_text(yaml.dump(cfg, Dumper=DUMPER))
    argv = ["check", str(file)] + [a for s in sets for a in ("--set", s)]
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


NON_PATHS = [5, [1], 2.5, True, {"a": 1}, [], ""]


@pytest.mark.parametrize("value", NON_PATHS, ids=repr)
def test_a_data_root_that_is_no_path_is_refused(tmp_path, capsys, value):
    cfg = base_config()
    cfg["data_root"] = value
    check_refuses(tmp_path, capsys, cfg, "data_root: expected a folder path")


@pytest.mark.parametrize("text", ["5", "[]", "{a: 1}", "true", "2.5"])
def test_a_data_root_set_to_no_path_is_refused(tmp_path, capsys, text):
    check_refuses(
        tmp_path,
        capsys,
        base_config(),
        "data_root: expected a folder path",
        sets=[f"data_root={text}"],
    )


def numeric_arguments(node, prefix=()) -> list[tuple]:
    """Key paths of every number given to a class (``{Name: {key: number}}``) in ``node``."""
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and prefix:
                name = str(prefix[-1])
                if name[:1].isupper() or "." in name or ":" in name:  # a class's keyword
                    out.append(prefix + (k,))
            out += numeric_arguments(v, prefix + (k,))
    return out


NUMERIC_ARGUMENTS = numeric_arguments(base_config())


def test_the_base_config_gives_classes_numbers():  # so the next test tests something
    keys = {p[-1] for p in NUMERIC_ARGUMENTS}
    assert {"image_size", "images_per_class", "embedding_dim", "num_bins", "lr"} <= keys


@pytest.mark.parametrize("path", NUMERIC_ARGUMENTS, ids=lambda p: ".".join(map(str, p)))
def test_a_string_where_a_class_takes_a_number_is_refused(tmp_path, capsys, path):
    """Classes store many numbers and use them only in forward (a miner's margin) or when a
    dataset is read: the declared type (annotation, else numeric default) refuses them up front
    (or the class itself, or the runner's integer check, each naming the class and the key)."""
    cfg = base_config()
    set_path(cfg, path, "x")
    check_refuses(tmp_path, capsys, cfg, str(path[-2]), str(path[-1]), "'x'")


@pytest.mark.parametrize(
    "assignment, key",
    [
        ("mining_funcs.tuple_miner={TripletMarginMiner: {margin: x}}", "TripletMarginMiner.margin"),
        ("mining_funcs.tuple_miner={MultiSimilarityMiner: {epsilon: [1]}}", "epsilon"),
        ("loss_funcs.metric_loss={ContrastiveLoss: {pos_margin: x}}", "ContrastiveLoss.pos_margin"),
        ("optimizers.trunk_optimizer.betas=[0.9]", "trunk_optimizer.Adam.betas"),
        ("optimizers.trunk_optimizer.amsgrad=x", "trunk_optimizer.Adam.amsgrad"),
        ("dataset.GlyphDataset.image_size=x", "dataset.GlyphDataset.image_size"),
        ("dataset.GlyphDataset.images_per_class=x", "dataset.GlyphDataset.images_per_class"),
        ("models.trunk.ConvEmbedder.in_channels=true", "in_channels"),
    ],
)
def test_class_arguments_of_the_wrong_type_name_their_key(tmp_path, capsys, assignment, key):
    err = check_refuses(tmp_path, capsys, base_config(), key, sets=[assignment])
    assert "tune.space" not in err  # never blamed on the search space


def test_a_build_error_outside_the_space_is_not_blamed_on_the_space(tmp_path, capsys):
    # betas[1] = 2.0 has the right type; Adam refuses it when built: named as the optimizer's
    sets = ["optimizers.trunk_optimizer.betas=[0.9, 2.0]"]
    err = check_refuses(tmp_path, capsys, base_config(), "optimizers.trunk_optimizer", sets=sets)
    assert "tune.space" not in err


@pytest.mark.parametrize(
    "section, key",
    [
        ({"space": "x"}, "tune.space"),
        ({"space": [1]}, "tune.space"),
        ({"space": 0}, "tune.space"),
        ({"space": {"optimizers.trunk_optimizer.lr": {"float": "x"}}}, "tune.space.optimizers"),
        ({"trials": "x"}, "tune.trials"),
        ({"sampler": 5}, "tune.sampler"),
        ({"bogus": 1}, "tune: unknown key"),
    ],
    ids=repr,
)
def test_an_ignored_top_level_tune_section_is_still_checked(tmp_path, capsys, section, key):
    """The method's own tune section replaces these parts of the top-level one (nothing reads
    them), but a file holding them is wrong all the same."""
    cfg = base_config()
    cfg["tune"] = section
    cfg["methods"]["m"]["tune"] = {
        "trials": 2,
        "sampler": {"RandomSampler": {"seed": 0}},
        "space": {"loss_funcs.metric_loss.num_bins": {"int": [5, 20]}},
    }
    err = check_refuses(tmp_path, capsys, cfg, key)
    assert "method" not in err.split(key)[0]  # the top-level key itself, not a method's


@pytest.mark.parametrize(
    "slot, spec, key",
    [
        ("sampler", {"TPESampler": {"gamma": "x"}}, "TPESampler.gamma"),
        ("sampler", {"TPESampler": {"n_startup_trials": "x"}}, "TPESampler.n_startup_trials"),
        ("sampler", {"TPESampler": {"seed": [0]}}, "TPESampler.seed"),
        ("sampler", {"RandomSampler": {"seed": "a"}}, "RandomSampler.seed"),
        ("pruner", {"MedianPruner": {"n_warmup_steps": "x"}}, "MedianPruner.n_warmup_steps"),
        ("pruner", {"PercentilePruner": {"percentile": "x"}}, "PercentilePruner.percentile"),
    ],
)
def test_optuna_arguments_of_the_wrong_type_are_refused(tmp_path, capsys, slot, spec, key):
    """Optuna builds (or only warns about) these; the first trial that uses them fails."""
    cfg = base_config()
    cfg["tune"][slot] = spec
    check_refuses(tmp_path, capsys, cfg, f"tune.{slot}.{key}", "expected")


@pytest.mark.parametrize(
    "dimension",
    [{"int": [1, 1]}, {"choice": [1]}, {"int": [1, 3]}],
    ids=repr,
)
def test_a_space_that_leaves_no_positive_pair_is_refused(tmp_path, capsys, dimension):
    """One item per class in a batch: no query has a positive. The sampler refuses the value
    when it is built, which the space check now does for values that reach the sampler."""
    cfg = base_config()
    cfg["methods"]["m"]["tune"]["space"]["sampler.samples_per_class"] = dimension
    check_refuses(tmp_path, capsys, cfg, "tune.space.sampler.samples_per_class", "positive")
