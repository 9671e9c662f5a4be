"""`dynamics.gates` as a whole and the `dynamics gates` command; the gates tests' shared TINY, FAST,
`_hand_nll` and fixtures (`one_thread`, `tiny`). Each module's own tests are in tests/test_gates_<module>.py.

The validation tests train one small mixture model once (module fixture) and check CHG against
single-head ablation, as Nam et al. 2025 (arXiv 2505.13737) validate it.
"""

import re
import shutil
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import xarray as xr

from dynamics import cli, store
from dynamics.config import ConfigError, from_dict
from dynamics.gates import (
    CHG_ROLES,
    UNFITTED,
    GateOptions,
    ablation_losses,
    chg_roles,
    chg_snapshot,
    component_weights,
    fit_chg,
    fit_contrastive,
    gate_report,
    head_importance,
    pruning_curves,
    report_lines,
)
from dynamics.tasks import make_batch
from dynamics.train import build, load_run_model, train_run
from tests.conftest import interrupt_at

TINY = {
    "model": {"n_layers": 2, "d_model": 16, "n_heads": 2, "attn_only": True, "vocab_size": 16, "context": 16},
    "task": {"name": "mixture", "components": ["offset_copy", "markov"], "delta": 2},
}
FAST = GateOptions(steps=12, init_steps=3, restarts=1, batch_size=4, fit_batches=2, eval_batches=1)


def _hand_nll(model, cfg, steps, batch_size, gates=None, component=None) -> float:
    # Mean next-token NLL over eval-split batches, by a plain forward: what the fits' attrs should equal.
    total = 0.0
    for step in steps:
        tokens = torch.from_numpy(make_batch(cfg, "eval", step, batch_size, component=component).tokens)
        g = None if gates is None else gates.expand(tokens.shape[0], *gates.shape[-2:])
        with torch.no_grad():
            logits = model(tokens[:, :-1], head_gates=g)
        total += F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).item()
    return total / len(steps)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Tiny matmuls: a second intra-op thread only adds contention on the shared cores.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(name="tiny")
def tiny_model():
    # `name`: test_gates_ablation, _contrastive and _report import it, and their tests' argument `tiny`
    # would otherwise read to ruff as a redefinition of the import (F811)
    cfg = from_dict(TINY)
    return build(cfg, torch.device("cpu")), cfg


# ----------------------------------------------------------------------------- every fit


def test_fits_refuse_a_model_of_another_config_and_a_float64_default(tiny):
    # The model's own data would have been another task's: plausible numbers, or an IndexError
    # deep in the embedding; under a float64 default, a dtype mismatch inside the forward.
    from dataclasses import replace

    model, cfg = tiny
    other = replace(cfg, model=replace(cfg.model, vocab_size=32))
    for call in (lambda: fit_chg(model, other, FAST), lambda: head_importance(model, other, FAST),
                 lambda: ablation_losses(model, other, np.zeros((2, 2), bool), options=FAST),
                 lambda: fit_contrastive(model, other, "markov", "offset_copy", FAST)):
        with pytest.raises(ConfigError, match=r"the model was built from another config than cfg.model "
                                              r"\(vocab_size 16 in the model, 32 in cfg\)"):
            call()
    with pytest.raises(ConfigError, match="retain and forget are both 'markov'"):
        fit_contrastive(model, cfg, "markov", "markov", FAST)
    with pytest.raises(ConfigError, match="gates.steps: must be positive, got 0"):
        chg_snapshot(model, cfg, steps=0)  # read as "the default", 200 updates
    torch.set_default_dtype(torch.float64)
    try:
        with pytest.raises(RuntimeError, match="torch's default dtype is torch.float64"):
            head_importance(model, cfg, FAST)
    finally:
        torch.set_default_dtype(torch.float32)


def test_fits_name_init_logits_masks_and_a_float64_model(tiny):
    # Each failed inside the model's forward, naming its head_gates argument, or (numpy logits)
    # with an AttributeError; a flat mask of set_ablation was first padded into another shape.
    model, cfg = tiny
    init = np.zeros((1, 2, 2), np.float32)
    xr.testing.assert_identical(fit_chg(model, cfg, FAST, init_logits=init),
                                fit_chg(model, cfg, FAST, init_logits=torch.from_numpy(init)))
    for logits, shape in ((torch.zeros(2, 2), r"got \(2, 2\) \(one set of restarts: init_logits\[None\]\)"),
                          (torch.zeros(1, 2, 3), r"got \(1, 2, 3\)$"), (torch.zeros(0, 2, 2), r"got \(0, 2, 2\)$")):
        for fit, args in ((fit_chg, ()), (fit_contrastive, ("markov", "offset_copy"))):
            with pytest.raises(ConfigError, match=r"init_logits must have shape \(restart, layer, head\) = "
                                                  r"\(k, 2, 2\) for this model, " + shape):
                fit(model, cfg, *args, FAST, init_logits=logits)
    with pytest.raises(ConfigError, match="fit_chg: init_logits holds values that are not finite in float32"):
        fit_chg(model, cfg, FAST, init_logits=torch.full((1, 2, 2), float("nan")))
    from dynamics.gates.ablation import set_ablation

    for call, name in ((ablation_losses, "ablation_losses"), (set_ablation, "set_ablation")):
        for mask in (np.zeros(4, bool), np.zeros((1, 2, 3), bool), np.zeros((0, 2, 2)), np.zeros(0)):
            with pytest.raises(ConfigError, match=rf"{name}: ablate must be a bool array of shape \(layer, head\) "
                                                  rf"= \(2, 2\) or \(set, layer, head\) for this model, got shape "
                                                  rf"{re.escape(str(mask.shape))}"):
                call(model, cfg, mask, options=FAST)
    # G- values, or NaN, where a mask belongs: cast to bool they removed every head, a plausible loss
    for mask in (np.full((2, 2), 0.3), np.full((2, 2), np.nan)):
        with pytest.raises(ConfigError, match=r"ablation_losses: ablate must be a bool array \(True where a head is "
                                              r"removed\), got float64 values other than 0 and 1"):
            ablation_losses(model, cfg, mask, options=FAST)
    xr.testing.assert_identical(ablation_losses(model, cfg, np.eye(2), options=FAST),
                                ablation_losses(model, cfg, np.eye(2, dtype=bool), options=FAST))
    wide = build(cfg, torch.device("cpu")).double()
    for call in (lambda: fit_chg(wide, cfg, FAST), lambda: head_importance(wide, cfg, FAST),
                 lambda: ablation_losses(wide, cfg, np.zeros((2, 2), bool), options=FAST)):
        with pytest.raises(ConfigError, match="the model's parameters are torch.float64, but gates are fitted and "
                                              r"scored in float32, the dtype runs train in: pass model.float\(\)"):
            call()


def test_fits_run_under_a_callers_inference_mode(tiny):
    # "element 0 of tensors does not require grad": torch.enable_grad does not leave inference_mode
    model, cfg = tiny
    want = head_importance(model, cfg, FAST)
    want_chg = fit_chg(model, cfg, FAST)
    with torch.inference_mode():
        got = head_importance(model, cfg, FAST)
        got_chg = fit_chg(model, cfg, FAST)
    xr.testing.assert_identical(got, want)
    xr.testing.assert_identical(got_chg, want_chg)


# ----------------------------------------------------------------------------- a trained model

TRAINED = {
    "model": {"n_layers": 2, "d_model": 32, "n_heads": 4, "d_mlp": 64, "vocab_size": 32, "context": 32},
    "task": {"name": "mixture", "components": ["offset_copy", "markov"], "delta": 2, "p": 0.9},
    "train": {"steps": 250, "lr": 1e-2, "batch_size": 32, "warmup_steps": 20, "eval_batches": 1},
    "record": {"dense_until": 0, "every": 1000, "n_probe": 1, "head_weights": "off", "eval_batch_size": 16},
}
REPORT = GateOptions(steps=120, init_steps=10, restarts=2, batch_size=16, fit_batches=4, eval_batches=2)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, one_thread):
    path = str(tmp_path_factory.mktemp("gates") / "s.zarr")
    result = train_run(from_dict(TRAINED), path)
    assert result.status == "completed"
    model, cfg, _ = load_run_model(path, result.run_id)
    return path, result.run_id, model, cfg


@pytest.fixture(scope="module")
def report(trained):
    _, _, model, cfg = trained
    return gate_report(model, cfg, REPORT)


def test_chg_agrees_with_single_head_ablation(trained, report):
    _, _, model, cfg = trained
    minus = report.chg.sel(fit="minus").mean("restart").values
    plus = report.chg.sel(fit="plus").mean("restart").values
    delta = (report.delta_loss.values * component_weights(cfg)).sum(-1)  # (L, H)
    rho = report.attrs["rho"]
    print(f"\nG-:\n{minus.round(3)}\nablation delta:\n{delta.round(3)}\nSpearman rho = {rho:.3f}")
    assert rho >= 0.7
    # The robust part of the agreement: every head G- shuts costs less to ablate than any it keeps.
    shut = minus < 0.05
    assert shut.any() and (~shut).any()
    assert delta[shut].max() < delta[~shut].min()

    curves = pruning_curves(model, cfg, plus, minus, delta, n_random=6, options=REPORT)
    loss = curves.loss
    print("pruning loss (chg, importance, ablation, random):\n", loss.values.round(3))
    inner = slice(1, -1)  # all heads kept / all removed are the same model in every order
    assert (loss.sel(order="chg")[inner] < loss.sel(order="random")[inner]).all()
    np.testing.assert_allclose(loss.values[:, 0], loss.values[0, 0], rtol=1e-6)
    np.testing.assert_allclose(loss.values[:, -1], loss.values[0, -1], rtol=1e-6)
    order = np.argsort(head_importance(model, cfg, REPORT).values.ravel(), kind="stable")
    assert curves.order_heads.sel(order="importance").values.tolist() == order.tolist()
    assert curves.order_heads.sel(order="ablation").values.tolist() == np.argsort(delta.ravel(), kind="stable").tolist()
    with pytest.raises(ConfigError, match="n_random"):
        pruning_curves(model, cfg, plus, minus, delta, n_random=0, options=REPORT)
    # Labelled input is read by its dims: transposed, the same orders; a per-component delta is refused.
    named = xr.DataArray(minus, dims=("layer", "head")).transpose("head", "layer")
    again = pruning_curves(model, cfg, plus, named, delta, n_random=1, options=REPORT)
    assert again.order_heads.sel(order="chg").values.tolist() == curves.order_heads.sel(order="chg").values.tolist()
    # and by its labels: heads sorted the other way (each value kept with its head) were read by
    # position, the masks put on other heads than the values'
    L, H = minus.shape
    labelled = xr.DataArray(minus, dims=("layer", "head"), coords={"layer": range(L), "head": range(H)})
    flipped = pruning_curves(model, cfg, plus, labelled.sortby("head", ascending=False), delta, n_random=1,
                             options=REPORT)
    assert flipped.order_heads.sel(order="chg").values.tolist() == curves.order_heads.sel(order="chg").values.tolist()
    np.testing.assert_array_equal(flipped.loss.sel(order="chg").values, curves.loss.sel(order="chg").values)
    from dynamics.gates.pruning import per_head

    with pytest.raises(ValueError, match=r"minus must hold each head 0..3 of this model once, got head labels \[1, 2, 3, 4\]"):
        per_head("minus", labelled.assign_coords(head=labelled["head"] + 1), L, H)
    with pytest.raises(ValueError, match="delta must be one value per head"):
        pruning_curves(model, cfg, plus, minus, report.delta_loss.values, n_random=1, options=REPORT)
    # The hint names the dims the value has: G+ of every restart was told to reduce over components.
    with pytest.raises(ValueError, match=rf"got shape \({L}, {H}, \d+\) \(reduce over restart first, e\.g\. \.mean\('restart'\)\)"):
        per_head("plus", report.chg.sel(fit="plus"), L, H)
    with pytest.raises(ValueError, match="fit_chg's restarts by a mean, head_ablation's components weighted"):
        per_head("plus", report.chg.sel(fit="plus").values, L, H)
    # G+ and G- side by side: a mean over fit is neither; components: weighted, not a plain mean
    with pytest.raises(ValueError, match=r"\(pick one fit first, \.sel\(fit='minus'\), then reduce over restart\)"):
        per_head("minus", report.chg, L, H)
    with pytest.raises(ValueError, match=r"\(pick one fit first, \.sel\(fit='plus'\)\)$"):  # G+ for plus
        per_head("plus", report.chg.mean("restart"), L, H)
    with pytest.raises(ValueError, match=r"\(reduce over component first, weighted by gates\.component_weights\(cfg\)\)"):
        per_head("delta", report.delta_loss, L, H)


def test_report_names_the_heads_whose_labels_a_fit_left_unsettled(report):
    # A fit stopped while its gates still moved gave labels with no sign they were provisional.
    from dynamics.gates.maths import unsettled

    assert unsettled(np.array([0.55, 0.9, 0.5]), np.array([0.1, 0.1, 0.0]), 0.5).tolist() == [True, False, True]
    ds = report  # the trained model's fit, shared with the tests around it
    assert ds.settle.dims == ("restart", "stage", "layer", "head")
    [fits] = [x for x in report_lines(ds) if x.startswith("convergence of the fits")]
    moved = ds.settle.max(("restart", "layer", "head"))
    assert f"{float(moved.sel(stage='minus')):.3f} (G-, last 12 of 120 updates)" in fits
    assert "(lambda=0, last 1 of 10 updates)" in fits
    calm = ds.copy(deep=True)
    calm["settle"] = calm.settle * 0.0
    calm["chg"] = calm.chg * 0.0 + 0.9  # every gate 0.4 from the threshold, and none moved
    assert [x for x in report_lines(calm) if x.startswith("convergence of the labels")] == [
        "convergence of the labels: settled (every G+ and G- gate sits farther from the 0.5 threshold than it "
        "moved over its last tenth)"]
    calm["settle"].loc[{"stage": "minus", "layer": 1, "head": 0}] = 0.5  # one G- gate moved 0.5 at the end
    [labels] = [x for x in report_lines(calm) if x.startswith("convergence of the labels")]
    assert labels.startswith("convergence of the labels: not settled at L1H0 (")
    calm["settle"].loc[{"stage": "minus"}] = 0.0
    calm["settle"].loc[{"stage": "init"}] = 0.5  # the lambda = 0 stage labels nothing
    [labels] = [x for x in report_lines(calm) if x.startswith("convergence of the labels")]
    assert labels.startswith("convergence of the labels: settled")


def test_contrastive_fit_keeps_retain_and_raises_forget(trained):
    _, _, model, cfg = trained
    opts = GateOptions(steps=60, restarts=1, batch_size=16, fit_batches=4, eval_batches=2)
    ds = fit_contrastive(model, cfg, "offset_copy", "markov", opts)
    loss = ds.contrast_loss.sel(restart=0)
    full_r, gated_r = loss.sel(side="retain", state="full").item(), loss.sel(side="retain", state="gated").item()
    full_f, gated_f = loss.sel(side="forget", state="full").item(), loss.sel(side="forget", state="gated").item()
    print(f"\nretain offset_copy {full_r:.3f} -> {gated_r:.3f}; forget markov {full_f:.3f} -> {gated_f:.3f}")
    print("gates:", ds.contrast_gate.values.round(3).tolist())
    assert gated_r < full_r + 0.1
    assert gated_f > full_f + 0.3


def test_cli_gates_prints_a_table_and_saves_the_fit(trained, capsys):
    path, run_id, _, _ = trained
    assert cli.main(["gates", path, "--steps", "4", "--init-steps", "2", "--restarts", "1"]) == 0
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    # Progress on stderr, each stage from its start to its end: the table alone is on stdout.
    err = captured.err.splitlines()
    for stage, total, unit in (("lambda=0", 2, "updates"), ("G+/G-", 4, "updates"), ("ablation", 1, "passes")):
        assert f"[gates {run_id}] {stage}: 0/{total} {unit}" in err and f"[gates {run_id}] {stage}: {total}/{total} {unit}" in err
    header = out[1].split()
    assert header[:5] == ["layer", "head", "G+", "G-", "label"] and "dloss" in header
    rows = [line.split() for line in out[2:10]]
    assert [(r[0], r[1]) for r in rows] == [(str(layer), str(head)) for layer in range(2) for head in range(4)]
    assert all(r[4] in CHG_ROLES for r in rows)
    saved = store.open_derived(path, f"gates.{run_id}")
    assert saved is not None and saved.chg.dims == ("restart", "layer", "head", "fit")
    assert saved.attrs["step"] == store.run_attrs(path, run_id)["checkpoint_step"]  # where the report puts it


def test_cli_gates_contrast_adds_its_fit_and_lines_to_the_same_chg_fit(trained, capsys):
    # The command's contrastive path (the fit merged into the CHG one, then printed and saved) had
    # no test past its refusals: its lines, its columns, and a CHG fit the merge leaves as it was.
    path, run_id, _, _ = trained
    fast = ["--steps", "4", "--init-steps", "2", "--restarts", "1"]
    assert cli.main(["gates", path, *fast]) == 0
    plain = store.open_derived(path, f"gates.{run_id}").load()
    capsys.readouterr()
    assert cli.main(["gates", path, *fast, "--contrast", "retain=offset_copy,forget=markov"]) == 0
    out = capsys.readouterr().out.splitlines()
    header = out[1].split()
    assert header[-2:] == ["keep", "k.agree"]
    assert any(line.startswith("contrast retain offset_copy: held-out NLL ") for line in out)
    assert any(line.startswith("contrast forget markov: held-out NLL ") for line in out)
    saved = store.open_derived(path, f"gates.{run_id}").load()
    assert (saved.attrs["retain"], saved.attrs["forget"]) == ("offset_copy", "markov")
    assert saved.contrast_gate.dims == ("restart", "layer", "head") and saved.contrast_gate.shape == (1, 2, 4)
    assert float(saved.contrast_gate.min()) >= 0 and float(saved.contrast_gate.max()) <= 1
    assert "contrast_loss" in saved
    xr.testing.assert_identical(saved.chg, plain.chg)  # the same seed: the same CHG fit, contrast or not
    np.testing.assert_array_equal(saved.delta_loss.values, plain.delta_loss.values)


def test_cli_gates_unknown_component_exits_2(trained, capsys):
    path, _, _, _ = trained
    code = cli.main(["gates", path, "--contrast", "retain=induction,forget=offset_copy", "--no-save"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "induction" in err[0]


def test_cli_gates_run_without_checkpoint_exits_2(trained, tmp_path, capsys):
    path, run_id, _, _ = trained
    copy = tmp_path / "copy.zarr"
    shutil.copytree(path, copy)
    shutil.rmtree(copy / "checkpoints")
    code = cli.main(["gates", str(copy), "--run", run_id, "--no-save"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "checkpoint" in err[0]


def test_cli_gates_refuses_a_model_whose_loss_is_not_finite(tmp_path, capsys, one_thread):
    # init_scale 1e30: finite float32 weights whose forward pass overflows, so the run diverges at
    # step 0; every gate and NLL fitted to it would be NaN, and was saved as a result.
    raw = {**TRAINED, "model": {**TRAINED["model"], "init_scale": 1e30}, "train": {**TRAINED["train"], "steps": 5}}
    path = str(tmp_path / "d.zarr")
    result = train_run(from_dict(raw), path)
    assert result.status == "diverged"
    code = cli.main(["gates", path, "--steps", "2", "--init-steps", "1", "--restarts", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert f"run {result.run_id} (diverged) at its checkpoint step 0 gives a loss of nan" in err[0]
    assert store.open_derived(path, f"gates.{result.run_id}") is None


def test_chg_recorded_on_a_diverging_run_is_unfitted_without_warnings(tmp_path, one_thread):
    # The run diverges at step 0 and its snapshot fits CHG to a NaN model: the record says
    # unfitted (NaN gates, role -1) and the run is 'diverged'. numpy's empty-slice warning on the
    # all-NaN agreement made it 'failed' wherever warnings are errors (as in the CLI tests).
    raw = {**TRAINED, "model": {**TRAINED["model"], "init_scale": 1e30}, "train": {**TRAINED["train"], "steps": 5},
           "record": {**TRAINED["record"], "chg_every": 1, "chg_steps": 2}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = train_run(from_dict(raw), str(tmp_path / "d.zarr"))
    assert result.status == "diverged"
    ds = store.open_run(str(tmp_path / "d.zarr"))
    assert np.isnan(ds.chg.values[0]).all() and (ds.chg_role.values[0] == UNFITTED).all()


def test_cli_gates_on_an_unfinished_run_says_so_on_stderr(tmp_path, capsys, one_thread):
    # The table alone is on stdout; the note that the fit is of a checkpoint, not a finished model, is not.
    raw = {**TRAINED, "train": {**TRAINED["train"], "steps": 40}, "record": {**TRAINED["record"], "every": 10}}
    path = str(tmp_path / "u.zarr")

    with pytest.raises(KeyboardInterrupt):
        train_run(from_dict(raw), path, progress=interrupt_at(25))
    assert cli.main(["gates", path, "--steps", "2", "--init-steps", "1", "--restarts", "1", "--no-save"]) == 0
    captured = capsys.readouterr()
    assert "is interrupted; these gates are fitted to its checkpoint at step 30 of 40" in captured.err
    assert "note:" not in captured.out


def test_cli_gates_says_when_this_machine_makes_other_data_than_the_run_trained_on(trained, capsys):
    # On the corpus task another machine's standard library is other data: the fit uses this one's.
    path, run_id, _, _ = trained
    recorded = store.run_attrs(path, run_id)["data_hash"]
    store.update_run_attrs(path, run_id, data_hash="0" * 64)
    try:
        assert cli.main(["gates", path, "--steps", "2", "--init-steps", "1", "--restarts", "1", "--no-save"]) == 0
    finally:
        store.update_run_attrs(path, run_id, data_hash=recorded)
    err = capsys.readouterr().err
    assert "this machine makes other data" in err and "000000000000 recorded" in err
    assert cli.main(["gates", path, "--steps", "2", "--init-steps", "1", "--restarts", "1", "--no-save"]) == 0
    assert "other data" not in capsys.readouterr().err


def test_report_cautions_where_g_minus_ranks_heads_against_their_ablation(report):
    # On the mixture model at 400 steps, lambda 0.1 gave rho -0.95 (heads costing 4x the others
    # labelled "irrelevant") with no word; the labels read as causal importance there are wrong.
    caution = [x for x in report_lines(report) if x.startswith("caution: rho")]
    assert caution == [] if report.attrs["rho"] >= 0.3 else len(caution) == 1
    for rho, word in ((-0.952, "against"), (0.1, "barely by")):
        lines = report_lines(report.assign_attrs(rho=rho))
        assert (f"caution: rho {rho:.3f}: G- ranks these heads {word} their {report.attrs['ablation']}-ablation cost, "
                "so the labels are no reading of each head's causal importance here") in "\n".join(lines)
    assert not [x for x in report_lines(report.assign_attrs(rho=0.3)) if x.startswith("caution: rho")]
    assert not [x for x in report_lines(report.assign_attrs(rho=float("nan"))) if x.startswith("caution: rho")]


def test_a_label_its_mean_gates_would_not_give_is_marked(report):
    # G- 0.468 printed beside "facilitating" (restarts 0.41, 0.37, 0.51, 0.59: a 2-2 tie gone to
    # the lower code) read as a label the numbers beside it contradict, unmarked but for the tie
    from dynamics.gates.report import report_table

    assert not [x for x in report_lines(report) if x.startswith("labels marked ^")]
    assert not any(row[4].endswith("^") for row in report_table(report)[1])
    odd = report.copy(deep=True)
    means = chg_roles(odd.chg.sel(fit="plus").mean("restart").values, odd.chg.sel(fit="minus").mean("restart").values)
    odd["role"].values[0, 1] = (means[0, 1] + 1) % 4  # a majority label the means do not give
    [line] = [x for x in report_lines(odd) if x.startswith("labels marked ^")]
    assert line == ("labels marked ^: at L0H1 the mean G+ and G- shown would give another label; the label is the "
                    "restarts' majority, each restart labelled from its own gates")
    rows = report_table(odd)[1]
    assert [row[:2] for row in rows if row[4].endswith("^")] == [["0", "1"]]
    # judged from the means as printed: G- 0.49996 shows 0.500, which gives "facilitating"
    edge = report.copy(deep=True)
    minus = edge["chg"].sel(fit="minus").values  # (restart, layer, head)
    minus[:, 0, 0] = 0.5
    minus[0, 0, 0] = 0.5 - 0.00004 * minus.shape[0]  # the mean 0.49996
    plus = edge["chg"].sel(fit="plus").values
    plus[:, 0, 0] = 1.0
    edge["chg"].loc[{"fit": "minus"}] = minus
    edge["chg"].loc[{"fit": "plus"}] = plus
    edge["role"].values[0, 0] = 0  # facilitating, as 1.000 and 0.500 read
    row = next(r for r in report_table(edge)[1] if r[:2] == ["0", "0"])
    assert row[2:4] == ["1.000", "0.500"] and row[4].rstrip("*") == "facilitating"  # no "^"
    assert not [x for x in report_lines(edge) if x.startswith("labels marked ^") and "L0H0" in x]
