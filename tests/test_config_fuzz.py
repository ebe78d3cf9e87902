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
