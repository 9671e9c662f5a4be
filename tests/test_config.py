"""Config: TOML in, overrides, and one-line errors that name the key."""

import datetime
import math
import re
from pathlib import Path

import pytest

from dynamics.config import ConfigError, RunConfig, from_dict, load_config, parse_override, with_values


def nested(depth: int) -> list:
    value: list | int = 1
    for _ in range(depth):
        value = [value]
    return value


def write(tmp_path, text):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_defaults_are_valid_and_resolve_head_dim():
    cfg = from_dict({})
    assert cfg.model.head_dim == cfg.model.d_model // cfg.model.n_heads
    assert from_dict({"model": {"d_model": 64, "n_heads": 4, "d_head": 8}}).model.head_dim == 8


def test_load_and_override(tmp_path):
    p = write(tmp_path, "[model]\nn_heads = 4\n[train]\nlr = 0.01\n")
    cfg = load_config(p, ["train.lr=0.5", "task.name=offset_copy", "model.attn_only=true"])
    assert cfg.train.lr == 0.5 and cfg.task.name == "offset_copy" and cfg.model.attn_only is True


def test_configs_are_hashable_and_equal_ones_hash_alike():
    # frozen, yet hash() raised "unhashable type: 'dict'" on the intervene and sweep tables, so a
    # config could not key a dict of results or sit in a set
    root = Path(__file__).parents[1] / "experiments"
    a, b = load_config(root / "conditioned_gates.toml"), load_config(root / "conditioned_gates.toml")
    assert a.intervene and a.sweep.axes and a is not b and a == b and hash(a) == hash(b)
    assert len({a, b, from_dict({}), RunConfig()}) == 2
    assert {a: "run"}[b] == "run"
    other = load_config(root / "conditioned_gates.toml", ["intervene.conditioned_gates.lr=0.123"])
    assert other != a and len({a, other}) == 2
    # as == compares: the tables in any order, an int lr and its float alike
    c = from_dict({"intervene": {"templates": {"layer": 0, "head": 1}}, "sweep": {"train.seed": [0, 1]}})
    d = from_dict({"intervene": {"templates": {"head": 1, "layer": 0}}, "sweep": {"train.seed": [0, 1]}})
    assert c == d and hash(c) == hash(d)
    assert hash(from_dict({"train": {"lr": 1}})) == hash(from_dict({"train": {"lr": 1.0}}))


def test_int_accepted_for_float_but_not_reverse():
    assert from_dict({"train": {"lr": 1}}).train.lr == 1.0
    with pytest.raises(ConfigError, match="train.steps: expected an integer"):
        from_dict({"train": {"steps": 1.5}})


@pytest.mark.parametrize(
    "raw, needle",
    [
        ({"model": {"foo": 1}}, "unknown key 'model.foo'"),
        ({"bogus": {}}, "unknown section 'bogus'"),
        ({"model": {"d_model": "wide"}}, "model.d_model: expected an integer"),
        ({"model": {"d_model": 64, "n_heads": 5}}, "model.n_heads: 5 does not divide model.d_model 64"),
        ({"train": {"lr": 0}}, "train.lr: must be > 0"),
        ({"train": {"lr": -1e-3}}, "train.lr: must be > 0"),
        ({"model": {"context": 16}, "task": {"max_period": 16}}, "model.context: 16 is too short for induction"),
        # the bound given, as induction's is: "too short for task.delta 32" said nothing of what is enough
        ({"model": {"context": 64}, "task": {"name": "offset_copy", "delta": 32}},
         "model.context: 64 is too short for task.delta 32 (needs >= 65)"),
        ({"model": {"context": 64}, "task": {"name": "markov", "markov_order": 64}},
         "model.context: 64 is too short for task.markov_order 64 (needs >= 65)"),
        ({"task": {"name": "nope"}}, "task.name: unknown task"),
        # byte tasks have no look-back of their own; the analysers need a second position
        ({"model": {"context": 1, "vocab_size": 256}, "task": {"name": "corpus"}}, "model.context: must be >= 2"),
        ({"model": {"pos": "alibi"}}, "model.pos: unknown scheme"),
        ({"task": {"name": "corpus"}}, "model.vocab_size: byte-level task needs >= 256"),
        ({"task": {"name": "mixture", "components": ["induction", "x"]}}, "unknown component 'x'"),
        ({"sweep": {"model": {"nope": [1]}}}, "sweep: unknown axis 'model.nope'"),
        ({"sweep": 3}, "sweep: expected a table, got 3"),
        ({"intervene": 3}, "intervene: expected a table, got 3"),
        ({"task": {"name": "mixture", "components": ["induction", "markov"], "weights": ["a", "b"]}},
         "task.weights[0]: expected a number, got 'a'"),
        ({"task": {"name": "mixture", "components": ["induction", "markov"], "weights": [float("inf"), 1.0]}},
         "task.weights[0]: expected a finite number"),
        # each finite, but their sum overflows: every normalised weight was 0 and the run failed
        ({"task": {"name": "mixture", "components": ["induction", "markov"], "weights": [1e308, 1e308]}},
         "task.weights: must be non-negative with a positive, finite sum"),
        ({"task": {"name": "mixture", "components": ["induction", 3]}}, "task.components[1]: expected a string"),
        ({"model": {"rope_base": -1.0}}, "model.rope_base: must be > 1"),
        # finite, accepted, then "value cannot be converted to type float without overflow" in a
        # failed run in the store
        ({"model": {"gates": "learned", "gate_init": 1e39}}, "model.gate_init: must be within"),
        ({"train": {"weight_decay": float("inf")}}, "train.weight_decay: expected a finite number"),
        # finite, but inf in the model's float32: the run was made and recorded "diverged after 0 steps"
        ({"model": {"init_scale": 1e300}}, "model.init_scale: must be at most 3.403e+38 (float32), got 1e+300"),
        ({"train": {"lr": 1e305}}, "train.lr: must be at most 3.403e+38 (float32), got 1e+305"),
        ({"train": {"weight_decay": 1e39}}, "train.weight_decay: must be at most 3.403e+38 (float32), got 1e+39"),
        ({"model": {"gates": "learned", "gate_l1": 1e300}}, "model.gate_l1: must be at most 3.403e+38 (float32)"),
        # inf in the float32 RoPE table: 1e39 and 1e300 trained the same run under two run ids
        ({"model": {"rope_base": 1e39}}, "model.rope_base: must be at most 3.403e+38 (float32), got 1e+39"),
        # 0 in float32: the run trained nothing and said it completed
        ({"train": {"lr": 1e-320}}, "train.lr: must be > 0 in float32 (it rounds to 0 there), got 1e-320"),
        ({"train": {"grad_clip": 1e-50}},
         "train.grad_clip: must be 0 (off) or > 0 in float32 (it rounds to 0 there), got 1e-50"),
        # 0 in float32, so they train as 0 does: 1e-320 and 0 were one run under two run ids
        *(({sec: {key: 1e-320}}, f"{sec}.{key}: must be 0 or > 0 in float32 (it rounds to 0 there), got 1e-320")
          for sec, key in (("train", "weight_decay"), ("train", "beta1"), ("train", "beta2"),
                           ("train", "min_lr_frac"), ("model", "gate_l1"))),
        # the head width from d_model / n_heads, d_head left at 0: the line named model.d_head only
        ({"model": {"d_model": 34, "n_heads": 2}},
         "model.d_model / model.n_heads (34 / 2, d_head 0): RoPE needs an even head width, got 17"),
        ({"model": {"d_head": 5}}, "model.d_head: RoPE needs an even head width, got 5"),
        # cast to float32 unbounded, numpy's overflow warning made the refusal three lines
        ({"train": {"grad_clip": 1e308}}, "train.grad_clip: must be at most 3.403e+38 (float32), got 1e+308"),
        # 0 in float32: every attention weight was 0 (no gradient reaches them), and 1e-50 and
        # 1e-300 trained the same run under two run ids
        ({"model": {"init_scale": 1e-50}}, "model.init_scale: must be at least 1.175e-38 (the smallest normal float32; "
                                           "smaller scales make every attention weight 0 there), got 1e-50"),
        ({"model": {"init_scale": 1e-45}}, "model.init_scale: must be at least 1.175e-38"),  # a subnormal: all 0 too
        # both spellings of one axis: the axes table's silently replaced the other
        ({"sweep": {"train.seed": [0, 1, 2], "axes": {"train.seed": [7]}}},
         "sweep.train.seed: given twice (in [sweep] and in its axes table)"),
        ({"model": {"gate_init": float("nan")}}, "model.gate_init: expected a finite number"),
        ({"sweep": {"train": {"seed": []}}}, "sweep.train.seed: empty list"),
        # the file's dotted key beside a --set of its table: the line named neither, nor the way out
        ({"sweep": {"train.seed": [0, 1], "train": {"seed": [1, 2]}}},
         r"sweep.train.seed: given twice (as a dotted key and in a table, in the file or one by --set; "
         r"--set sweep.train.seed=[...] replaces the file's either way)"),
        # --set 'sweep.intervene.templates={}' swept nothing and trained the file's grid
        ({"sweep": {"train.seed": [0, 1], "intervene": {"templates": {}}}},
         "sweep.intervene.templates: an empty table holds no axis (an axis is a list of values, "
         "e.g. sweep.intervene.templates.<key> = [...])"),
        # bounded before any work: the loss curve and schedule are allocated whole, and torch
        # seeds are 64-bit
        ({"train": {"steps": 10**8 + 1}}, "train.steps: must be in [1, 100,000,000], got 100000001"),
        ({"train": {"seed": -1}}, "train.seed: must be in [0, 2**63)"),
        # TOML integers are unbounded: past int64 a size failed in the memory check's float
        # division, and a warm-up in the learning rate's, with a traceback after the store was made
        ({"train": {"seed": 2**63}}, "train.seed: expected an integer within +-2**63, got 9223372036854775808"),
        ({"train": {"warmup_steps": 10**400}},
         "train.warmup_steps: expected an integer within +-2**63, got an integer of 401 digits"),
        ({"record": {"n_probe": -(10**320)}}, "record.n_probe: expected an integer within +-2**63, got a negative integer of 321 digits"),
        # a TOML date where a string was meant: the run id's JSON failed with a traceback
        ({"intervene": {"distill": {"teacher": datetime.date(2024, 1, 1)}}},
         'intervene.distill.teacher: a TOML date or time (2024-01-01), which no setting takes (quoted, "2024-01-01" '
         'is a string)'),
        ({"sweep": {"train.seed": [datetime.time(7, 32)]}}, "sweep.train.seed[0]: a TOML date or time (07:32:00)"),
        ({"model": {"pos": datetime.datetime(1979, 5, 27, 7, 32)}}, "model.pos: a TOML date or time (1979-05-27T07:32:00)"),
        # walked recursively (a RecursionError traceback at a few hundred levels)
        ({"intervene": {"templates": {"heads": nested(40)}}},
         "intervene.templates.heads[0][0]"),
        # past it a run failed once recorded (gates' own limit), or the CHG note overflowed
        ({"record": {"chg_every": 1, "chg_steps": 2 * 10**8}}, "record.chg_steps: must be in [1, 100,000,000]"),
        ({"record": {"chg_every": 10**18}}, "record.chg_every: must be in [0, 100,000,000], got 1000000000000000000"),
        # torch hands a mistyped count to OpenMP, which died starting threads after the store was made
        ({"train": {"threads": 10**6}}, "train.threads: must be in [1, 1024], got 1000000"),
        ({"train": {"threads": 0}}, "train.threads: must be in [1, 1024], got 0"),
        # allocating the model failed after the store and a 'failed' run were made
        ({"model": {"d_model": 640000}}, "model: 3,277,537,280,000 weights (vocab_size 64, d_model 640000"),
        ({"model": {"vocab_size": 10**9}}, "is more than the 10,000,000,000 a run may have"),
        # torch.device would refuse these only once training starts, after the store is written
        ({"train": {"device": "cudaa"}}, "train.device: expected cpu, cuda or cuda:<index>, got 'cudaa'"),
        ({"train": {"device": "cuda:"}}, "train.device: expected cpu, cuda or cuda:<index>, got 'cuda:'"),
        ({"train": {"device": "cuda:x"}}, "train.device: expected cpu, cuda or cuda:<index>, got 'cuda:x'"),
        # TOML integers are unbounded: one past the float range is no number a float key can hold
        ({"train": {"lr": 10**400}}, "train.lr: expected a finite number, got an integer beyond the float range"),
    ],
)
def test_errors_name_the_key(raw, needle):
    import warnings

    with pytest.raises(ConfigError) as e, warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning printed beside the refusal makes it more than one line
        from_dict(raw)
    assert needle in str(e.value)
    assert "\n" not in str(e.value)


def test_a_config_nested_past_the_limit_is_one_line_from_a_file_and_from_set(tmp_path):
    deep = "[" * 500 + "]" * 500  # tomllib itself recursed past Python's limit
    path = tmp_path / "deep.toml"
    path.write_text(f"[train]\nlr = {deep}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: nested more than 32 tables or lists deep, which no config is$"):
        load_config(path)
    ok = tmp_path / "ok.toml"
    ok.write_text("[train]\nsteps = 3\n")
    with pytest.raises(ConfigError, match=r"^--set train.lr: nested more than 32 tables or lists deep"):
        load_config(ok, [f"train.lr={deep}"])
    # a dotted key of 40 parts: nested 40 deep by TOML itself
    path.write_text("[sweep]\n" + ".".join(["a"] * 40) + " = [1]\n")
    with pytest.raises(ConfigError, match=r"^sweep(\.a)+: nested more than 32"):
        load_config(path)


def test_negative_zero_is_zero_so_the_same_training_has_one_run_id():
    # -0.0 trained bitwise what 0.0 does, under another run id (its JSON is "-0.0"), and was no twin
    neg, pos = from_dict({"train": {"weight_decay": -0.0}}), from_dict({"train": {"weight_decay": 0.0}})
    assert math.copysign(1.0, neg.train.weight_decay) == 1.0
    assert neg.run_id() == pos.run_id()
    with pytest.raises(ConfigError, match=r"train.grad_clip=0.0 and train.grad_clip=-0.0 are the same experiment"):
        from dynamics.sweep import expand_grid

        expand_grid(from_dict({"sweep": {"train.grad_clip": [0.0, -0.0]}}))


def test_sweep_table_and_zip(tmp_path):
    p = write(tmp_path, '[sweep]\n"train.seed" = [0, 1]\nmodel = { init_scale = [0.5, 2.0] }\nzip = [["train.seed", "model.init_scale"]]\n')
    cfg = load_config(p)
    assert cfg.sweep.axes == {"train.seed": (0, 1), "model.init_scale": (0.5, 2.0)}
    assert cfg.sweep.zip == (("train.seed", "model.init_scale"),)


def test_a_sweep_axis_spelled_twice_is_refused_and_set_replaces_either_spelling(tmp_path):
    # Quoted and as a table's key, one axis used to keep only the last list, silently.
    p = write(tmp_path, '[sweep]\n"model.init_scale" = [0.5]\nmodel.init_scale = [2.0, 4.0]\n')
    with pytest.raises(ConfigError, match=r"sweep.model.init_scale: given twice"):
        load_config(p)
    for axis in ('"model.init_scale" = [0.5, 1.0]', "model = { init_scale = [0.5, 1.0] }",
                 'axes = { "model.init_scale" = [0.5, 1.0] }'):  # the last as RunConfig.to_dict() writes it
        p = write(tmp_path, f'[sweep]\n{axis}\n"train.seed" = [0, 1]\n')
        cfg = load_config(p, ["sweep.model.init_scale=[3.0]"])
        assert list(cfg.sweep.axes.items()) == [("model.init_scale", (3.0,)), ("train.seed", (0, 1))], axis

def test_a_grid_past_the_point_limit_is_refused_before_any_point_is_checked(monkeypatch):
    # 10^5 points were checked for three minutes, silently, before the one line about the last
    from dynamics.sweep import grid

    cfg = from_dict({"sweep": {"train": {"seed": list(range(101))}, "model": {"init_scale": [0.1 * i for i in
                                                                                            range(1, 101)]}}})
    monkeypatch.setattr(grid, "with_values", lambda *a: pytest.fail("a point was checked"))
    with pytest.raises(ConfigError, match=r"^sweep: 10,100 points \(101 x 100\) is more than the 10,000 a sweep may have$"):
        grid.expand_grid(cfg)


def test_zip_lengths_must_match():
    with pytest.raises(ConfigError, match="different lengths"):
        from_dict({"sweep": {"train": {"seed": [0, 1]}, "model": {"init_scale": [1.0]}, "zip": [["train.seed", "model.init_scale"]]}})


def test_an_axis_twice_in_one_zip_group_is_named_as_such():
    with pytest.raises(ConfigError, match=r"'train.seed' appears twice in the group \['train.seed', 'train.seed'\]"):
        from_dict({"sweep": {"train": {"seed": [0, 1]}, "zip": [["train.seed", "train.seed"]]}})
    for group in (["train.seed", ["train.seed"]], [{"a": 1}]):  # were TypeError: unhashable type
        with pytest.raises(ConfigError, match="sweep.zip: expected a list of lists of axis names"):
            from_dict({"sweep": {"train": {"seed": [0, 1]}, "zip": [group]}})


def test_an_override_holds_one_value():
    assert parse_override("sweep.train.seed=[0,\n 1]") == ("sweep.train.seed", [0, 1])  # a TOML array may span lines
    with pytest.raises(ConfigError, match=r"^--set train.steps: one value per --set, got more lines: '5\\ntrain.lr=-1'$"):
        parse_override("train.steps=5\ntrain.lr=-1")


def test_a_zip_group_of_fewer_than_two_axes_is_refused():
    for group in ([], ["train.seed"]):
        with pytest.raises(ConfigError, match=rf"sweep.zip: the group {re.escape(str(group))} pairs nothing"):
            from_dict({"sweep": {"train": {"seed": [0, 1]}, "zip": [group]}})


def test_run_id_is_stable_and_depends_on_config():
    a, b = RunConfig(), from_dict({})
    assert a.run_id() == b.run_id()
    assert with_values(a, {"train.seed": 3}).run_id() != a.run_id()
    # the device does not change the experiment
    assert with_values(a, {"train.device": "cuda"}).run_id() == a.run_id()


def test_an_intervene_axis_through_a_value_is_a_config_error():
    # intervene.* axes are free-form; one descending into a number or a list raised a TypeError
    base = from_dict({"intervene": {"templates": {"weight": 1.0, "heads": [{"layer": 0, "head": 0, "pattern": "uniform"}]}}})
    for key, parent in (("intervene.templates.weight.x", "intervene.templates.weight"),
                        ("intervene.templates.heads.layer", "intervene.templates.heads")):
        with pytest.raises(ConfigError, match=f"sweep axis '{key}': {parent} is not a table"):
            with_values(base, {key: 1})


def test_override_parsing():
    assert parse_override("train.lr=1e-3") == ("train.lr", 1e-3)
    assert parse_override("task.name=induction") == ("task.name", "induction")
    with pytest.raises(ConfigError):
        parse_override("lr")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "none.toml")
    with pytest.raises(ConfigError, match="is a directory, not a config file"):
        load_config(tmp_path)


def test_a_config_named_by_a_url_is_named_as_given_and_not_fetched():
    # Path() made "https://h/c.toml" "https:/h/c.toml": "config file not found: https:/h/c.toml"
    with pytest.raises(ConfigError, match=r"^config file not found: https://h/c\.toml \(a URL is not fetched: "
                                          r"download the file, give its path\)$"):
        load_config("https://h/c.toml")


def test_a_local_file_whose_path_holds_a_url_scheme_is_read_not_refused(tmp_path, monkeypatch):
    # "h://c.toml" is the file c.toml in the folder "h:" (POSIX folds the slashes): a URL only
    # where no such file is (from a mutation audit: the existence check dropped, it was refused)
    (tmp_path / "h:").mkdir()
    (tmp_path / "h:" / "c.toml").write_text("[train]\nsteps = 7\n")
    monkeypatch.chdir(tmp_path)
    assert load_config("h://c.toml").train.steps == 7


def test_a_config_named_by_a_file_url_is_read_as_a_store_named_so_is():
    # Path("file:///x/c.toml") is "file:/x/c.toml": "config file not found" for a file that is there
    from urllib.parse import quote

    path = Path(__file__).resolve().parents[1] / "experiments" / "quickstart.toml"
    assert load_config("file://" + quote(str(path))) == load_config(path)



def test_a_config_from_a_pipe_is_read(tmp_path):
    # `dynamics run <(sed ... base.toml)`: /dev/fd/N is no regular file, and was "not found"
    import os
    import threading

    fifo = tmp_path / "cfg.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("[train]\nsteps = 7\n"))
    writer.start()
    assert load_config(fifo).train.steps == 7
    writer.join()


def test_a_key_set_twice_is_refused(tmp_path):
    # The last value would win silently; one of the two is a mistake.
    p = write(tmp_path, "[train]\nsteps = 10\n")
    with pytest.raises(ConfigError, match="--set train.lr: given twice"):
        load_config(p, ["train.lr=1e-3", "model.n_heads=2", "train.lr=1e-2"])
    assert load_config(p, ["train.lr=1e-3"]).train.lr == 1e-3
    # a table and a key inside it, either order: the last replaced the other's value silently
    table = 'intervene.templates={heads=[{layer=0,head=0,pattern="previous_token"}]}'
    with pytest.raises(ConfigError, match=r"--set intervene.templates: given twice \(also --set "
                                          r"intervene.templates.weight, inside it\); give it once"):
        load_config(p, ["intervene.templates.weight=0.5", table])
    with pytest.raises(ConfigError, match=r"--set intervene.templates.weight: given twice \(also --set "
                                          r"intervene.templates, around it\)"):
        load_config(p, [table, "intervene.templates.weight=0.5"])
    # keys that only share a prefix of letters are two keys
    assert load_config(p, ["train.warmup_steps=2", "train.steps=10"]).train.warmup_steps == 2


def test_a_config_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_bytes(b"\xff\xfe[model]\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == f"{path}: not UTF-8 text (TOML is UTF-8): byte 0"


def test_list_items_are_kept_as_written():
    # Checked item by item but not converted: [1, 3] -> (1.0, 3.0) would change the run id.
    cfg = from_dict({"task": {"name": "mixture", "components": ["induction", "markov"], "weights": [1, 3]}})
    assert cfg.task.weights == (1, 3) and all(type(w) is int for w in cfg.task.weights)


def test_devices_torch_accepts_pass():
    for device in ("cpu", "cuda", "cuda:0", "cuda:12"):
        assert from_dict({"train": {"device": device}}).train.device == device


def test_override_into_a_key_that_is_not_a_table_is_one_line(tmp_path):
    p = write(tmp_path, "model = 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(p, ["model.n_layers=2"])
    assert str(e.value) == "--set model.n_layers: model is not a table, got 3"
    p = write(tmp_path, "[intervene]\ntemplates = 3\n")
    with pytest.raises(ConfigError, match="--set intervene.templates.weight: intervene.templates is not a table"):
        load_config(p, ["intervene.templates.weight=1.0"])


def test_to_dict_round_trips_through_from_dict(tmp_path):
    p = write(tmp_path, '[task]\nname = "mixture"\ncomponents = ["induction", "markov"]\nweights = [1, 3]\n'
                        '[sweep]\n"train.seed" = [0, 1]\nmodel = { init_scale = [0.5, 2.0] }\n'
                        'zip = [["train.seed", "model.init_scale"]]\n')
    cfg = load_config(p)
    back = from_dict(cfg.to_dict())
    assert back == cfg and back.run_id() == cfg.run_id()
    assert back.sweep.axes == {"train.seed": (0, 1), "model.init_scale": (0.5, 2.0)}


def test_seed_settings_and_differing_settings_name_what_sets_configs_apart():
    from dynamics.identity import differing_settings, seed_settings

    a = seed_settings(from_dict({"train": {"seed": 1, "lr": 0.01, "threads": 2}}).to_dict())
    b = seed_settings(from_dict({"train": {"seed": 2, "lr": 0.01}}).to_dict())
    c = seed_settings(from_dict({"train": {"seed": 3, "lr": 0.02}, "model": {"n_heads": 2}}).to_dict())
    assert "train.seed" not in a and "train.threads" not in a and a["train.lr"] == 0.01
    assert a == b  # seeds (and execution settings) do not make another config
    assert differing_settings([a, b]) == []
    assert differing_settings([a, b, c]) == ["model.n_heads", "train.lr"]
    assert differing_settings([{"x": 1}, {}]) == ["x"]  # a missing key differs from a present one


def test_mixture_keys_under_another_task_are_refused(tmp_path):
    # Silently ignored before: a config meant as a mixture but named "induction" trained pure
    # induction, and a sweep over task.components trained the same data under different run ids.
    for key, value in (("components", ["induction", "markov"]), ("weights", [1.0, 2.0])):
        with pytest.raises(ConfigError) as e:
            from_dict({"task": {"name": "induction", key: value}})
        assert str(e.value) == (f"task.{key}: only a mixture has {key}, but task.name is 'induction' "
                                f"(set task.name = \"mixture\", or task.{key} = [])")
    p = write(tmp_path, '[task]\nname = "mixture"\ncomponents = ["induction", "markov"]\n')
    with pytest.raises(ConfigError, match="task.components: only a mixture has components"):
        load_config(p, ["task.name=markov"])
    # the sweep's way to compare a mixture with one of its components: pair the name with the list
    cfg = from_dict({"task": {"name": "mixture", "components": ["induction", "markov"]}})
    assert with_values(cfg, {"task.name": "markov", "task.components": []}).task.component_names == ("markov",)
    with pytest.raises(ConfigError, match="task.components: only a mixture"):
        with_values(cfg, {"task.name": "markov"})


def test_a_recorded_run_with_mixture_keys_under_another_task_still_loads():
    # Runs recorded before the refusal above trained the config without those keys; gates,
    # resume and distillation read their recorded config and must not lose them.
    from dynamics.config import recorded_config

    raw = {"task": {"name": "induction", "components": ["induction", "markov"], "weights": [1.0, 2.0]},
           "sweep": {"train.seed": [0, 1]}}
    assert recorded_config(raw) == from_dict({"task": {"name": "induction"}})
    assert raw["task"]["components"] == ["induction", "markov"]  # the caller's dict is left alone
    mixture = {"task": {"name": "mixture", "components": ["induction", "markov"], "weights": [1.0, 2.0]}}
    assert recorded_config(mixture) == from_dict(mixture)
    with pytest.raises(ConfigError, match="task.weights: 1 weights for 2 components"):
        recorded_config({"task": {"name": "mixture", "components": ["induction", "markov"], "weights": [1.0]}})


@pytest.mark.parametrize("section, values", [("model", {"rope_base": 1e39}), ("model", {"init_scale": 1e-50}),
                                             ("model", {"gate_l1": 1e-320}), ("train", {"beta2": 1e-320})])
def test_a_run_recorded_before_a_value_was_refused_still_loads(section, values):
    # These train, to no use (a RoPE table of inf; all-zero attention weights; a float32 zero),
    # and were accepted until the refusals above: gates, resume and a distillation teacher read
    # the run's recorded config, and refused it ("cannot be read by this version") where they had loaded it.
    from dynamics.config import recorded_config

    got = getattr(recorded_config({section: values}), section)
    assert got == getattr(from_dict({}), section).__class__(**values)
    with pytest.raises(ConfigError, match=f"{section}.{next(iter(values))}: must be"):
        from_dict({section: values})


@pytest.mark.parametrize("model", [{}, {"pos": "learned", "attn_only": True, "n_heads": 3, "d_head": 8, "vocab_size": 50},
                                   {"gates": "learned", "n_layers": 3, "d_mlp": 7}])
def test_weight_entries_count_the_models_matrices(model):
    # The bound on model size is only as good as this count: it must be the built model's own.
    from dynamics.model import Transformer

    m = from_dict({"model": model}).model
    assert m.weight_entries == sum(p.numel() for p in Transformer(m).parameters() if p.dim() >= 2)


@pytest.mark.parametrize("overrides", ["train.lr=0.1", {"train.lr": 0.1}])
def test_overrides_not_given_as_a_list_are_refused_as_such(tmp_path, overrides):
    # A string was iterated character by character: "--set 't': expected section.key=value".
    path = tmp_path / "c.toml"
    path.write_text("")
    with pytest.raises(ConfigError, match=r"^overrides: expected a list of 'section.key=value' strings, got "):
        load_config(path, overrides)


def test_replace_section_checks_types_as_a_file_would():
    # It validated values only: steps=5.5 was accepted and failed later, inside the budget check.
    from dynamics.config import RunConfig, check, replace_section

    with pytest.raises(ConfigError, match="train.steps: expected an integer, got 5.5"):
        replace_section(RunConfig(), "train", steps=5.5)
    assert replace_section(RunConfig(), "train", steps=5).train.steps == 5
    with pytest.raises(ConfigError, match="expected a RunConfig"):
        check({"train": {}})


def test_load_config_names_an_argument_of_the_wrong_type():
    # Python's own errors named neither argument: "'int' object has no attribute 'partition'"
    with pytest.raises(ConfigError, match="^config path: expected a str or path-like, got int 5$"):
        load_config(5)
    for overrides in ([5], 5):
        with pytest.raises(ConfigError, match="^overrides: expected a list of 'section.key=value' strings, got "):
            load_config(Path(__file__).parents[1] / "experiments" / "quickstart.toml", overrides)


def test_a_config_too_long_to_be_one_is_refused_unread(tmp_path):
    # `dynamics run /dev/zero` (or /dev/urandom) read on without end, filling memory, and a data
    # file given by mistake was read whole before TOML refused it
    from dynamics.limits import MAX_CONFIG_BYTES

    path = tmp_path / "big.toml"
    with path.open("wb") as fh:
        fh.truncate(MAX_CONFIG_BYTES + 1)  # sparse: no disk used
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == f"{path}: longer than {MAX_CONFIG_BYTES:,} bytes, which no config is (a data file or a device?)"
    path.write_text("[train]\nsteps = 7\n" + "#" * (MAX_CONFIG_BYTES - 30) + "\n")  # at the bound: read
    assert load_config(path).train.steps == 7


@pytest.mark.parametrize("newline, start", [(b"\n", b""), (b"\r\n", b""), (b"\r", b""), (b"\r\n", b"\xef\xbb\xbf")])
def test_a_config_with_any_line_ends_loads(tmp_path, newline, start):
    # read as bytes (bounded, above), a file of bare CR line ends (old Mac) was invalid TOML,
    # where read_text's newline translation had loaded it; one that Windows Notepad saved, with a
    # byte-order mark first, was "invalid TOML: Invalid statement (at line 1, column 1)"
    path = tmp_path / "c.toml"
    path.write_bytes(start + newline.join([b"[train]", b"steps = 7", b'[task]', b'name = "markov"', b""]))
    cfg = load_config(path)
    assert (cfg.train.steps, cfg.task.name) == (7, "markov")


def test_the_documented_bounds_of_steps_and_threads_are_where_they_are_checked():
    # "train.steps: must be in [1, ...]" and threads in [1, MAX_THREADS], both ends included
    from dynamics.limits import MAX_THREADS

    with pytest.raises(ConfigError, match=r"train.steps: must be in \[1, "):
        from_dict({"train": {"steps": 0}})
    assert from_dict({"train": {"steps": 1}}).train.steps == 1
    assert from_dict({"train": {"threads": MAX_THREADS}}).train.threads == MAX_THREADS
    with pytest.raises(ConfigError, match="train.threads"):
        from_dict({"train": {"threads": MAX_THREADS + 1}})


def test_an_induction_period_past_the_vocabulary_is_noted_not_refused():
    # Segments cannot be distinct past the vocabulary; the task code draws them with repeats on
    # purpose (a harder task, whose runs resume), so validate accepts it and the note says it.
    from dynamics.config_rules import small_vocabulary_note

    def cfg(vocab, max_period, name="induction", **task):
        return from_dict({"model": {"vocab_size": vocab, "context": 2 * max_period + 4},
                          "task": {"name": name, "min_period": 3, "max_period": max_period, **task}})

    assert small_vocabulary_note([cfg(8, 8)]) is None  # distinct: a period of the whole vocabulary
    assert small_vocabulary_note([cfg(8, 12, "offset_copy")]) is None  # reads no period
    note = small_vocabulary_note([cfg(8, 9)])
    assert note.startswith("task.max_period 9 is above model.vocab_size 8: induction segments are drawn with "
                           "tokens that may repeat, in every row") and "\n" not in note
    mixed = cfg(8, 9, "mixture", components=["induction", "markov"])
    assert small_vocabulary_note([mixed]) == note
    assert small_vocabulary_note([cfg(8, 8), cfg(8, 12), cfg(16, 12)]).startswith(
        "1 of the 3 sweep points have task.max_period above model.vocab_size (the first: 12 above 8): ")
    # "in every row": the rows whose period fits the vocabulary hold repeats too, past max_period 8
    import numpy as np

    from dynamics.tasks import make_batch

    def fitting_rows_with_repeats(c):
        b = make_batch(c, "train", 0, 2000)
        period = np.argmax(b.repeat_mask, axis=1) + 1
        return np.mean([len(set(r[:p])) < p for r, p in zip(b.tokens, period, strict=True) if p <= 8])

    assert fitting_rows_with_repeats(cfg(8, 8)) == 0.0
    assert fitting_rows_with_repeats(cfg(8, 9)) > 0.5  # 0.77 expected: 1 - prod(1 - i/8) averaged over P = 3..8


def test_shipped_experiments_and_tiny_are_valid_with_distinct_induction_segments(monkeypatch):
    import tomllib

    from dynamics import interventions
    from dynamics.config_rules import small_vocabulary_note
    from dynamics.sweep.grid import expand_grid
    from tests.conftest import TINY

    monkeypatch.setattr(interventions, "check", lambda cfg: None)  # distill's teacher store is not made here
    root = Path(__file__).parents[1] / "experiments"
    paths = sorted(root.glob("*.toml"))
    assert len(paths) >= 10
    for path in paths:
        cfg = load_config(path)
        points = [p.cfg for p in expand_grid(cfg)] if cfg.sweep.axes else [cfg]
        assert small_vocabulary_note(points) is None, path.name
    assert small_vocabulary_note([from_dict(tomllib.loads(TINY.format(steps=60, every=10)))]) is None


def test_with_values_names_a_key_without_a_section():
    # "intervene" alone raised a bare IndexError from the Python API
    with pytest.raises(ConfigError, match=r"^'intervene': expected section.key$"):
        with_values(RunConfig(), {"intervene": {"templates": {}}})
