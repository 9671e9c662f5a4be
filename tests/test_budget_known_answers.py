"""The memory estimate, term by term, on a config small enough to count by hand.

test_budget.py checks that configs far too large are refused; a term dropped or halved in the
estimate (the optimiser's moments, the eval rows of a mixture's second component, the maps'
conversion) still refused those, and let through runs that cannot fit.
"""

import pytest

from dynamics.budget import MEMORY_ENV, DoesNotFit, cgroup_limit, check_fits, check_memory, estimate
from dynamics.config import from_dict

# 1 layer, d_model 8, 2 heads of 4, MLP 16, vocabulary 8, context 8: weight entries
# 2*8*8 (embed, unembed) + 4*2*8*4 (W_Q/W_K/W_V/W_O) + 2*8*16 (MLP) = 640
SMALL = {
    "model": {"n_layers": 1, "d_model": 8, "n_heads": 2, "d_mlp": 16, "vocab_size": 8, "context": 8},
    "task": {"name": "offset_copy", "delta": 1, "pool_size": 7},
    "train": {"steps": 10, "batch_size": 3, "eval_batches": 2, "warmup_steps": 1},
    "record": {"n_probe": 2, "eval_batch_size": 5, "dense_until": 4, "every": 5},
}
ROW = 8 * 9  # one int64 row of context + 1 tokens
GRADS = 4 * 4 * 1 * 2 * 8 * 4  # the previous snapshot's W_Q/W_K/W_V/W_O gradients, float32
# snapshots at 0, 1, 2, 4, 5, 10: 6; loss curve 4 bytes a step
CURVE = 4 * 10 + 88 * 6
MAPS = 1 * 2 * 2 * 8 * 8  # layers x heads x probe rows x context x context


def small(**sections) -> dict:
    raw = {name: dict(table) for name, table in SMALL.items()}
    for name, table in sections.items():
        raw[name].update(table)
    return from_dict(raw)


def test_each_part_of_a_cpu_run_is_counted():
    est = estimate(small())
    assert est.held == {
        "the model": 4 * 640 * (2 + 2) + GRADS,  # weights, gradients and AdamW's two moments
        "the tokens": ROW * (2 + 2 * 5 + 7),  # probe, eval_batches x eval_batch_size rows, pool
        "the loss curve and snapshot schedule": CURVE,
    }
    per_position = 1 * (2 * 8 + 4 * 2 * 4 + 2 * 16) + 2 * 8  # LayerNorm out, q/k/v/z, MLP; logits
    assert est.phases == {
        "a training step": 3 * (ROW + 4 * 8 * per_position),
        "an evaluation": 4 * (2 * 5) * 8 * 2 * 8,  # logits and log-softmax of 10 rows
        "an attention snapshot": (4 + 4 + 2) * MAPS,  # cached, stacked, converted to float16
    }
    assert est.peak == sum(est.held.values()) + est.phases["a training step"] == 22632


def test_a_gpu_run_is_split_between_the_device_and_the_host():
    device, host = estimate(small(), "device"), estimate(small(), "host")
    # the pool stays on the host, and the curve and schedule are never on the device
    assert device.held == {"the model": 4 * 640 * 4 + GRADS, "the tokens": ROW * (2 + 2 * 5)}
    assert device.phases["an attention snapshot"] == (4 + 4) * MAPS  # converted on the host
    assert host.held == {"the loss curve and snapshot schedule": CURVE, "the tokens": ROW * (2 + 7)}
    assert host.phases == {"a training step": 3 * ROW, "an attention snapshot": (4 + 2) * MAPS}


@pytest.mark.parametrize("train, moments", [
    ({"optimizer": "adamw"}, 2),
    ({"optimizer": "sgd", "beta1": 0.9}, 1),  # momentum
    ({"optimizer": "sgd", "beta1": 0.0}, 0),  # plain SGD keeps no moment
])
def test_the_optimiser_moments_are_counted(train, moments):
    assert estimate(small(train=train)).held["the model"] == 4 * 640 * (2 + moments) + GRADS


def test_an_attention_only_model_has_no_mlp_to_count():
    est = estimate(small(model={"attn_only": True}))
    assert est.held["the model"] == 4 * (640 - 2 * 8 * 16) * 4 + GRADS
    assert est.phases["a training step"] == 3 * (ROW + 4 * 8 * (1 * (2 * 8 + 4 * 2 * 4) + 2 * 8))


def test_a_mixture_holds_eval_rows_for_each_component():
    cfg = small(task={"name": "mixture", "components": ["offset_copy", "markov"]})
    assert estimate(cfg).held["the tokens"] == ROW * (2 + 2 * (2 * 5) + 7)


def test_float32_maps_are_counted_at_four_bytes():
    assert estimate(small(record={"attention_dtype": "float32"})).phases["an attention snapshot"] == (4 + 4 + 4) * MAPS


def test_a_run_that_needs_exactly_the_memory_there_is_fits():
    cfg = small()
    check_memory(cfg, 22632)
    with pytest.raises(DoesNotFit):
        check_memory(cfg, 22631)


def test_the_message_gives_sizes_from_a_tenth_of_a_gib_in_gib():
    cfg = from_dict({"train": {"batch_size": 1000}})  # 0.46 GiB, nearly all of it the training step
    with pytest.raises(DoesNotFit) as e:
        check_memory(cfg, 300 * 2**20)
    assert str(e.value) == (
        "config needs at least 0.5 GiB of memory (1.8 MiB held throughout + 0.5 GiB for a training step), more than "
        "the 0.3 GiB this machine has: lower train.batch_size, model.context, model.vocab_size, model.d_model, "
        "model.d_mlp or model.n_layers, or set "
        "DYNAMICS_MEMORY_GB to the GB a run may use (the estimate counts only what no run can do without: "
        "dynamics/budget.py)")


def test_a_gpu_run_is_checked_on_both_sides_against_the_given_memory(monkeypatch):
    # With DYNAMICS_MEMORY_GB set, no GPU is asked: the same figure bounds the host and the device,
    # so these hold with or without one.
    monkeypatch.setenv(MEMORY_ENV, "1")
    pool = from_dict({"train": {"device": "cuda"}, "task": {"pool_size": 10**7}})  # 4.8 GiB, on the host only
    assert estimate(pool, "device").peak < 10**9 < estimate(pool, "host").peak
    with pytest.raises(DoesNotFit, match=f"of it for the tokens, .* more than the 0.9 GiB {MEMORY_ENV} allows: lower "
                                         "task.pool_size"):
        check_fits(pool)
    batch = from_dict({"train": {"device": "cuda", "batch_size": 5000}})  # 2.3 GiB of activations, on the device
    assert estimate(batch, "host").peak < 10**9 < estimate(batch, "device").peak
    with pytest.raises(DoesNotFit, match=f"for a training step\\), more than the 0.9 GiB {MEMORY_ENV} allows"):
        check_fits(batch)


def test_a_cgroup_limit_of_zero_is_no_limit(tmp_path):
    # skipped, not taken as the lowest: machine_memory reads a limit of 0 as none, and the real
    # 4 GiB limit beside it would be lost with it
    (tmp_path / "fs" / "job").mkdir(parents=True)
    (tmp_path / "fs" / "memory.max").write_text("0\n")
    (tmp_path / "fs" / "job" / "memory.max").write_text("4294967296\n")
    (tmp_path / "cgroup").write_text("0::/job\n")
    assert cgroup_limit(str(tmp_path / "fs"), str(tmp_path / "cgroup")) == 2**32



@pytest.mark.parametrize("short, need, have", [
    (2**30, "45.8 GiB", "44.8 GiB"),
    (2**26, "45.83 GiB", "45.76 GiB"),  # 64 MiB short: one decimal read 45.8 GiB twice
    (2**20, "45.827 GiB", "45.826 GiB"),
    (1, "49,205,861,392 bytes", "49,205,861,391 bytes"),  # no decimal tells them apart
])
def test_the_need_and_what_is_there_never_read_the_same(short, need, have):
    # Both were rounded to one decimal: "needs at least 16.0 GiB ..., more than the 16.0 GiB".
    cfg = from_dict({"train": {"batch_size": 10**5}})
    peak = estimate(cfg).peak
    assert peak == 49_205_861_392  # 45.8265 GiB
    with pytest.raises(DoesNotFit) as e:
        check_memory(cfg, peak - short)
    assert str(e.value).startswith(f"config needs at least {need} of memory (")
    assert f"more than the {have} this machine has" in str(e.value)


def test_a_gpu_run_is_checked_against_what_the_device_holds_only(monkeypatch):
    # the probe pool, loss curve and schedule stay in host memory: a GPU with room for exactly the
    # device's part holds the run
    from dynamics import budget
    from dynamics.config import RunConfig, with_values

    cfg = with_values(RunConfig(), {"train.device": "cuda", "task.pool_size": 200000})
    monkeypatch.delenv(MEMORY_ENV, raising=False)
    monkeypatch.setattr(budget, "machine_memory", lambda: 2**40)
    device = estimate(cfg, "device").peak
    assert device < estimate(cfg, "all").peak
    monkeypatch.setattr(budget, "gpu_memory", lambda _: device)
    check_fits(cfg)
