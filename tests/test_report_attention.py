"""The attention section: the step slider's frames of the shown run, and what its captions and
notes say of a run recorded in part or that cannot be read."""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from dynamics import store
from dynamics.report import write_report
from tests._report_store import _frames, _unwritten_run


def test_slider_scrubs_every_recorded_snapshot_of_the_median_run(built):
    path, page, ids = built
    text = page.read_text()
    chosen = re.search(r"Per-run figures show run <code>(\w+)</code> \(of the 2 completed run\(s\), the one with the "
                       r"median final loss, the lower for an even count; --run ID shows another\)\.", text).group(1)
    losses = {k: store.run_attrs(path, ids[k])["last_loss"] for k in ("A", "B")}
    assert chosen == ids[min(losses, key=losses.get)]  # lower median of the two completed runs
    frames = _frames(text)
    steps = store.open_run(path, chosen)["step"].values.tolist()
    assert [f["step"] for f in frames] == steps
    assert len({f["src"] for f in frames}) == len(frames)
    assert f'max="{len(frames) - 1}"' in text and 'type="range"' in text
    # A browser that restores form values on reload (Firefox) would show frame 0 at another position.
    assert re.search(r'<input type="range" id="step-slider" autocomplete="off"', text)
    assert "probe sequence 0" in text  # the caption says which probe is shown
    # "one fixed sequence of 2" read as a 2-token sequence: say what the count is, and the length.
    assert "the first of the 2 fixed probe sequences, 16 tokens long" in text
    assert sorted(p.name for p in (page.parent / frames[0]["src"]).parent.iterdir()) == [Path(f["src"]).name for f in frames]


def test_a_run_whose_arrays_cannot_be_read_is_not_said_to_have_no_snapshots(tmp_path):
    path = tmp_path / "s.zarr"
    _unwritten_run(path, "completed")
    meta = path / "runs" / "r0" / "attention" / "zarr.json"
    meta.write_bytes(meta.read_bytes()[:40])
    text = html.unescape(write_report(path, tmp_path / "out").read_text())
    assert ("Not available: attention maps because run r0 (damaged) could not be read (StoreError: "
            in text)
    assert "runs/r0/attention/zarr.json of runs/r0 cannot be read" in text
    assert "no recorded snapshot" not in text


def test_a_diverged_runs_captions_do_not_wait_for_more_snapshots(built, tmp_path):
    # Run C's 6 of 9 snapshots, relabelled as a run that diverged there: it will record no more,
    # so its captions must not say "so far", as they do for a run that may still be resumed.
    path, _, ids = built
    copy = tmp_path / "store.zarr"
    shutil.copytree(path, copy)
    store.update_run_attrs(copy, ids["C"], status="diverged")
    text = html.unescape(write_report(copy, tmp_path / "out", run_id=ids["C"]).read_text())
    assert "Only 6 of 9 snapshots were recorded (diverged)." in text
    assert "(the last snapshot recorded before it diverged)" in text and "so far (diverged)" not in text
    live = html.unescape(write_report(path, tmp_path / "live", run_id=ids["C"]).read_text())
    assert "Only 6 of 9 snapshots are recorded so far (stopped)." in live


def test_frame_snapshots_keeps_every_recorded_one_up_to_the_cap_and_spreads_the_cap_over_more():
    from dynamics.report.attention import frame_snapshots

    recorded = np.array([True, False, True, True, False, True])
    assert frame_snapshots(recorded, cap=4).tolist() == [0, 2, 3, 5]  # all 4 recorded: none dropped
    assert frame_snapshots(recorded, cap=2).tolist() == [0, 5]  # the first and the last
    # positions 0, 1.5 (rounded half to even: 2) and 3 among the recorded snapshots 0, 2, 3, 5
    assert frame_snapshots(recorded, cap=3).tolist() == [0, 3, 5]
    assert frame_snapshots(np.zeros(3, dtype=bool), cap=5).tolist() == []
    many = frame_snapshots(np.ones(4001, dtype=bool), cap=250)
    assert many.size == 250 and many[0] == 0 and many[-1] == 4000
    assert set(np.diff(many).tolist()) <= {16, 17}  # 4000 / 249 = 16.06: evenly spaced, none repeated
    with pytest.raises(ValueError, match="cap must be at least 2"):
        frame_snapshots(recorded, cap=1)


def test_a_run_with_more_recorded_snapshots_than_the_cap_shows_the_cap_and_says_so(built, tmp_path, monkeypatch):
    # A run recorded at every one of 4,000 steps drew 4,000 frames, 3 min 41 s of its report.
    from dynamics.report import attention

    path, _, ids = built
    monkeypatch.setattr(attention, "MAX_FRAMES", 4)
    page = write_report(path, tmp_path / "out", run_id=ids["C"])  # 6 of its 9 snapshots recorded
    text = html.unescape(page.read_text())
    frames = _frames(text)
    steps = store.open_run(path, ids["C"])["step"].values
    assert [f["step"] for f in frames] == [int(steps[i]) for i in (0, 2, 3, 5)]
    assert [f["label"] for f in frames] == [f"step {int(steps[i])} (snapshot {i + 1} of 6)" for i in (0, 2, 3, 5)]
    assert 'max="3"' in text
    assert ("The slider shows 4 of the 6 recorded snapshots, evenly spaced by snapshot, the first and last "
            "included (a report draws at most 4); the store holds every one.") in text
    assert len(list((page.parent / frames[0]["src"]).parent.iterdir())) == 4
    monkeypatch.setattr(attention, "MAX_FRAMES", 6)  # as many as it recorded: every one, and no such sentence
    again = html.unescape(write_report(path, tmp_path / "all", run_id=ids["C"]).read_text())
    assert len(_frames(again)) == 6 and "The slider shows" not in again


@pytest.mark.parametrize("n_layers, n_heads", [(1, 1), (1, 4), (2, 2), (4, 8)])
def test_the_weight_scale_label_fits_inside_the_figure_at_any_layer_count(n_layers, n_heads):
    # At one layer the figure is 2.9 in high, and the label, one line at the default size, ran
    # past its top and bottom: the page showed "tention weight (fraction of row, sqrt scal".
    from dynamics.report.attention import _frame_grid

    fig, images, titles = _frame_grid(np.arange(n_layers), np.arange(n_heads), 16, "previous_token")
    assert len(images) == len(titles) == n_layers * n_heads
    fig.canvas.draw()  # the constrained layout runs as the figure is drawn
    renderer = fig.canvas.get_renderer()
    [bar] = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    label = bar.yaxis.label
    assert label.get_text().replace("\n", " ") == "attention weight (fraction of row, sqrt scale)"
    extent, frame = label.get_window_extent(renderer), fig.bbox
    assert frame.y0 <= extent.y0 and extent.y1 <= frame.y1 and frame.x0 <= extent.x0 and extent.x1 <= frame.x1


def test_the_frame_grid_is_layers_by_heads_labelled_on_its_outer_edges_and_titled_for_the_widest_role():
    # Each was open to a swap no test saw: the key-position labels on the top row, the query
    # labels on the right, a figure of H rows by L columns (a square grid hides it), and titles
    # without the role, which the layout (computed once) then had no room for.
    from dynamics.report.attention import _frame_grid

    fig, images, titles = _frame_grid(np.array([0, 1]), np.array([0, 1, 2]), 5, "previous_token")
    assert tuple(fig.get_size_inches()) == (2.0 * 3 + 1.3, 2.0 * 2 + 0.9)  # heads across, layers down
    frames = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(frames) == len(images) == 6
    assert [i for i, ax in enumerate(frames) if ax.get_xlabel()] == [3, 4, 5]  # the bottom row
    assert [i for i, ax in enumerate(frames) if ax.get_ylabel()] == [0, 3]  # the left column
    assert titles[3].get_text() == "L1 H0 · previous_token" and titles[2].get_text() == "L0 H2 · previous_token"


def test_each_frames_alt_text_names_every_heads_role_at_its_step(built):
    # The roles were drawn as pixels in the panel titles only: a screen reader had none of them
    from dynamics.analysis import ROLES, analyse_run

    path, page, ids = built
    text = page.read_text()
    chosen = re.search(r"Per-run figures show run <code>(\w+)</code>", text).group(1)
    analysis = store.open_analysis(path, chosen, dask=False)
    if analysis is None:  # the page analysed the run itself
        analysis = analyse_run(store.open_run(path, chosen, dask=False))
    frames = _frames(text)
    assert html.unescape(re.search(r'<img id="frame" src="[^"]*" alt="([^"]*)"', text).group(1)) == frames[0]["alt"]
    for f in frames:
        codes = analysis["role"].sel(step=f["step"]).transpose("layer", "head").values
        want = ", ".join(f"L{li} H{hi} {ROLES[c]}" for li, row in enumerate(codes) for hi, c in enumerate(row))
        assert f["alt"] == f"attention maps of every head at step {f['step']}; roles: {want}"
    assert len({f["alt"] for f in frames}) > 1  # the roles change over training, and so does the text
    assert "if (f.alt) { img.alt = f.alt; }" in text  # the slider carries it to the image it shows
