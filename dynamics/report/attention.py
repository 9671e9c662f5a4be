"""The attention maps of every head of one run, one PNG per shown snapshot (at most MAX_FRAMES), and the slider markup."""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

from dynamics import store
from dynamics.analysis import ROLES
from dynamics.report.data import _Ctx, _Section
from dynamics.report.draw import _figure, _probe_sensitive_sentence, _prose, _token_unseen_sentence, _voita_sentence
from dynamics.schema import FINISHED_STATUSES


def _distill_starts(d: dict) -> dict[int, int]:
    """Student layer -> the step its attention distillation switches on (the curriculum of
    `dynamics.interventions.distill`: ``order``, ``stage_steps``)."""
    layers = sorted({int(p[0]) for p in d.get("pairs", [])})
    order, stage = d.get("order", "together"), int(d.get("stage_steps") or 0)
    ranks = layers if order != "deep_first" else layers[::-1]
    return {layer: 0 if order == "together" else r * stage for r, layer in enumerate(ranks)}


def _intervention_note(described: dict | None, steps: int | None = None,
                       weights: np.ndarray | None = None) -> str:
    """Caption sentence naming the heads a run's interventions acted on, from its ``interventions``
    attribute: a templated or distilled head's map is pulled toward what the intervention asked
    for (clamped to it where hard), so a reader must not take its role for one it learned.
    ``steps``: the run's train.steps, past which a distillation stage never switched on;
    ``weights``: (snapshot, layer, head) its recorded ``distill_weight``, which says so itself
    (a schedule that ended first, a run that diverged first)."""
    if not described:
        return ""
    parts, whole_model = [], False
    t = described.get("templates") or {}
    weight = float(t.get("weight", 0))
    # at weight 0 only hard heads are acted on: the soft ones train freely
    acting = [h for h in t.get("heads", []) if weight > 0 or h.get("hard")]
    if acting:
        heads = [f"L{h['layer']}H{h['head']} {h['pattern']}" + (" (clamped: hard)" if h.get("hard") else "")
                 for h in acting]
        pull = f" (weight {weight:g}, {t.get('schedule', 'constant')})" if weight > 0 else ""
        parts.append(f"templates pull {', '.join(heads)}{pull}")
    d = described.get("distill")
    if d:
        # a layer whose stage starts at or after the run's last step was never distilled (a run
        # shortened below its curriculum): it was named as shaped by the teacher all the same
        starts = _distill_starts(d)
        heads = sorted({(int(p[0]), int(p[1])) for p in d.get("pairs", [])})
        if weights is not None:  # what the run recorded, where it has it
            acted = np.nan_to_num(np.asarray(weights, dtype=np.float64)).max(0) > 0  # (layer, head)
            on = [(l, h) for l, h in heads if acted[l, h]]
        else:
            on = [(l, h) for l, h in heads if steps is None or starts.get(l, 0) < steps]
        off = [f"L{l}H{h} (from step {starts[l]})" for l, h in heads if (l, h) not in on]
        if float(d.get("attention_weight", 0)) > 0 and on:
            never = ("its weight 0 at every recorded snapshot" if weights is not None else
                     f"its stage starting after the run's {steps} steps")
            parts.append(f"attention of {', '.join(f'L{l}H{h}' for l, h in on)} distilled from run {d.get('teacher_run')}"
                         + (f" ({', '.join(off)} never, {never})" if off else ""))
        if float(d.get("logits_weight", 0)) > 0:
            whole_model = True
            parts.append(f"logits distilled from run {d.get('teacher_run')}")
    g = described.get("conditioned_gates")
    if g:
        parts.append(f"conditioned gates scale the heads of layer(s) {', '.join(map(str, g.get('layers', [])))}")
    if not parts:
        return ""
    named = len(parts) > whole_model  # heads named, besides the logits term that names none
    shaped = ("Those heads' maps and roles are shaped by the intervention" if named else "") + (
        (", and every head's may be by the teacher's logits" if named else
         "Every head's map and role may be shaped by the teacher's logits") if whole_model else "")
    return " Trained with interventions: " + "; ".join(parts) + f". {shaped}, not learned freely (run attribute `interventions`)."


def _train_steps(attrs: dict) -> int | None:
    steps = attrs.get("steps_total")
    return int(steps) if isinstance(steps, (int, float)) and not isinstance(steps, bool) else None


MAX_FRAMES = 250
"""The most attention frames a report draws. The report of a run recorded at every one of 4,000
steps (the tests' tiny config) drew 3,997 frames, about 50 ms each, and took 3 min 41 s on the 2-core
Zen 3 AMD EPYC; with this cap, 22 s. A slider of 250 positions is as fine as a reader can use."""


def frame_snapshots(recorded: np.ndarray, cap: int = MAX_FRAMES) -> np.ndarray:
    """The snapshots the slider shows: every recorded one up to `cap`, else `cap` of them evenly
    spaced by snapshot, the first and the last recorded included.

    Examples
    --------
    >>> frame_snapshots(np.array([True, False, True, True]), cap=5).tolist()
    [0, 2, 3]
    >>> frame_snapshots(np.ones(10, dtype=bool), cap=4).tolist()
    [0, 3, 6, 9]
    """
    if cap < 2:
        raise ValueError(f"frame_snapshots: cap must be at least 2 (the first and last); got {cap}")
    indices = np.flatnonzero(recorded)
    if indices.size <= cap:
        return indices
    # spacing (n - 1) / (cap - 1) > 1, so no two rounded positions coincide
    return indices[np.linspace(0, indices.size - 1, cap).round().astype(int)]


def _frame_alt(step: int, labels: np.ndarray | None, layers, heads) -> str:
    """A frame's alt text: its step, and each head's role where the frame's titles show one (a
    screen reader had the roles, drawn as pixels in the titles, nowhere).

    >>> _frame_alt(40, np.array([["previous_token", "none"]]), [0], [0, 1])
    'attention maps of every head at step 40; roles: L0 H0 previous_token, L0 H1 none'
    >>> _frame_alt(0, None, [0], [0])
    'attention maps of every head at step 0'
    """
    alt = f"attention maps of every head at step {step}"
    if labels is None:
        return alt
    return alt + "; roles: " + ", ".join(f"L{layer} H{head} {labels[li, hi]}" for li, layer in enumerate(layers)
                                         for hi, head in enumerate(heads))


def _attention_frames(fig, images, titles, suptitle, attn, run, roles_by_step, layers, heads, out: Path,
                      indices: np.ndarray):
    """Write one PNG per snapshot in `indices` (recorded ones); yields (relative path, step).

    Layout, axes and tick labels are identical in every frame, so they are drawn once and
    the frames blit only the images and titles onto a copy of that background (a full
    ``savefig`` per frame measured about 20x slower: tick and layout work dominates).
    """
    from PIL import Image

    canvas = fig.canvas
    moving = [*images, *titles, suptitle]
    for artist in moving:
        artist.set_animated(True)  # left out of canvas.draw(): the background has no data
    # One draw both runs the constrained layout (which sizes animated titles too, here the
    # widest a frame can get) and paints the background; a second full draw cost as much again.
    canvas.draw()
    fig.set_layout_engine("none")
    background = canvas.copy_from_bbox(fig.bbox)
    L, H = len(layers), len(heads)
    # One read of every shown snapshot (S, L, H, T, T): per-snapshot reads each pay zarr's overhead.
    probe0 = np.asarray(attn.isel(probe=0, snapshot=indices).values, dtype=float)
    T = probe0.shape[-1]
    probe0[..., np.triu(np.ones((T, T), dtype=bool), k=1)] = np.nan  # future keys: masked, drawn grey
    for n, s in enumerate(indices):
        step = int(run.steps[s])
        block = probe0[n]  # (L, H, T, T)
        labels = roles_by_step.get(step)
        for li in range(L):
            for hi in range(H):
                images[li * H + hi].set_data(np.ma.masked_invalid(block[li, hi]))
                role = f" · {labels[li, hi]}" if labels is not None else ""
                titles[li * H + hi].set_text(f"L{layers[li]} H{heads[hi]}{role}")
        suptitle.set_text(f"run {run.run_id} · step {step} · probe 0")
        canvas.restore_region(background)
        for artist in moving:
            fig.draw_artist(artist)
        rel = f"attention/snapshot_{n:04d}.png"
        Image.fromarray(np.asarray(canvas.buffer_rgba())).convert("RGB").save(out / rel, optimize=False)
        yield rel, step


def _frame_grid(layers: np.ndarray, heads: np.ndarray, T: int, widest: str) -> tuple:
    """The attention figure before any frame is drawn: a (layer, head) grid of T x T maps, each
    titled with room for the `widest` role name, and the weight scale beside them.

    Returns ``(fig, images, titles)``, the images and titles in (layer, head) order."""
    L, H = len(layers), len(heads)
    fig = _figure(2.0 * H + 1.3, 2.0 * L + 0.9)
    grid = fig.subplots(L, H, squeeze=False, sharex=True, sharey=True)
    images, titles = [], []
    from matplotlib import colormaps
    from matplotlib.colors import PowerNorm
    from matplotlib.ticker import MaxNLocator

    # Square-root colour scale: diffuse early attention (~1/query) stays visible next to peaks of 1.
    norm = PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)
    cmap = colormaps["magma"].with_extremes(bad="#d9d9d9")  # grey: keys a query cannot see (causal mask)
    for li in range(L):
        for hi in range(H):
            ax = grid[li, hi]
            im = ax.imshow(np.zeros((T, T)), norm=norm, cmap=cmap, interpolation="nearest")
            images.append(im)
            # The widest title a frame can get, so the layout computed once below fits all frames.
            titles.append(ax.set_title(f"L{layers[li]} H{heads[hi]} · {widest}", fontsize=8))
            ax.tick_params(labelsize=6)
            ax.xaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))  # positions are whole tokens
            ax.yaxis.set_major_locator(MaxNLocator(nbins=4, integer=True))
            if li == L - 1:
                ax.set_xlabel("key position (tokens)", fontsize=7)
            if hi == 0:
                ax.set_ylabel("query position (tokens)", fontsize=7)
    # two lines at the axis labels' size: one at the default size ran past the top and bottom of a
    # one-layer figure (2.9 in high), which showed "tention weight (fraction of row, sqrt scal"
    fig.colorbar(images[0], ax=grid, shrink=0.8).set_label("attention weight\n(fraction of row, sqrt scale)", fontsize=7)
    return fig, images, titles


def _attention_section(ctx: _Ctx) -> _Section:
    path, runs, chosen, out = ctx.path, ctx.runs, ctx.chosen, ctx.out
    sec = _Section("attention", "Attention maps of every head, snapshot by snapshot")
    run = next((r for r in runs if r.run_id == chosen), None)
    if run is None:
        sec.missing.append("Not available: attention maps because the store holds no runs.")
        return sec
    if run.n_recorded == 0 and run.analysis_note.startswith("could not be read"):
        # a run whose arrays cannot be opened has recordings that cannot be read, not none
        sec.missing.append(f"Not available: attention maps because run {run.run_id} ({run.status}) {run.analysis_note}.")
        return sec
    if run.n_recorded == 0:
        yet = "" if run.status in FINISHED_STATUSES else " yet"  # a run diverged at step 0 records none, ever
        sec.missing.append(f"Not available: attention maps because run {run.run_id} ({run.status}) has no recorded "
                           f"snapshot{yet}.")
        return sec
    ds = store.open_run(path, run.run_id, dask=False)  # plain zarr reads: a dask graph per chunk cost 3x
    analysis, source = ctx.chosen_analysis()
    roles_by_step: dict[int, np.ndarray] = {}
    if analysis is not None and "role" in analysis:
        codes = analysis["role"].values
        for i, step in enumerate(analysis["step"].values):
            roles_by_step[int(step)] = np.asarray(ROLES)[np.clip(codes[i], 0, len(ROLES) - 1)]
    attn = ds["attention"]
    L, H, P, T = (attn.sizes[d] for d in ("layer", "head", "probe", "query"))
    layers = ds["layer"].values if "layer" in ds.coords else np.arange(L)
    heads = ds["head"].values if "head" in ds.coords else np.arange(H)

    widest = max(ROLES, key=len) if roles_by_step else ""
    fig, images, titles = _frame_grid(layers, heads, T, widest)
    suptitle = fig.suptitle(f"run {run.run_id} · step {int(run.steps.max())} · probe 0", fontsize=9)
    shown = frame_snapshots(run.recorded, MAX_FRAMES)
    weights = (ds["distill_weight"].isel(snapshot=np.flatnonzero(run.recorded)).transpose("snapshot", "layer", "head").values
               if "distill_weight" in ds else None)  # (snapshot, layer, head)
    rank = np.cumsum(run.recorded)  # a snapshot's place among the recorded ones, from 1
    frames = [
        {"src": ctx.href + src, "step": step, "label": f"step {step} (snapshot {rank[s]} of {run.n_recorded})",
         "alt": _frame_alt(step, roles_by_step.get(step), layers, heads)}
        for s, (src, step) in zip(shown, _attention_frames(
            fig, images, titles, suptitle, attn, run, roles_by_step, layers, heads, out, shown), strict=True)
    ]

    role_note = {
        "stored": "Panel titles: layer, head and the role assigned at that snapshot (stored analysis).",
        "computed": "Panel titles: layer, head and the role assigned at that snapshot (analysed for this report).",
    }.get(source, f"Panel titles: layer and head only; role labels not available because {source}.")
    if roles_by_step:
        role_note += (_token_unseen_sentence([run], chosen=True) + _voita_sentence([run], chosen=True)
                      + _probe_sensitive_sentence([run], chosen=True))
    if run.n_recorded == run.n_snapshots:
        partial = ""
    elif run.status in FINISHED_STATUSES:  # a diverged run records nothing more
        partial = f" Only {run.n_recorded} of {run.n_snapshots} snapshots were recorded ({run.status})."
    else:
        partial = f" Only {run.n_recorded} of {run.n_snapshots} snapshots are recorded so far ({run.status})."
    if len(shown) < run.n_recorded:
        partial += (f" The slider shows {len(shown)} of the {run.n_recorded} recorded snapshots, evenly spaced by "
                    f"snapshot, the first and last included (a report draws at most {MAX_FRAMES}); the store holds "
                    f"every one.")
    caption = (f"Attention of every head (rows: layers, columns: heads) of run {run.run_id} on probe sequence 0 "
               f"(the first of the {P} fixed probe sequences, {T} tokens long; not a mean, which would blur content-dependent heads such as induction), "
               f"at the step chosen with the slider. Axes: query and key position (tokens); colour: attention weight (fraction "
               f"of the query's attention, 0-1, square-root scale; grey: future keys, masked). "
               f"{role_note}{partial}{_intervention_note(ds.attrs.get('interventions'), _train_steps(ds.attrs), weights)}")
    first = frames[0]
    data = json.dumps(frames).replace("</", "<\\/")
    sec.html = f"""
<figure class="frames">
  <div class="controls">
    <button type="button" id="play">Play</button>
    <input type="range" id="step-slider" autocomplete="off" min="0" max="{len(frames) - 1}" value="0" step="1"
           aria-label="snapshot" aria-valuetext="{html.escape(first["label"])}">
    <span id="step-label" aria-live="polite">{html.escape(first["label"])}</span>
  </div>
  <img id="frame" src="{html.escape(first["src"])}" alt="{html.escape(first["alt"])}">
  <figcaption>{_prose(caption)}</figcaption>
</figure>
<script type="application/json" id="frames-data">{data}</script>"""
    return sec
