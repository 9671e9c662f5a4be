"""Attention distillation from a finished teacher run, and logits-only distillation.

The student adds, on each training batch,

``w_att(step) * sum_{(s, t) in pairs} c_s(step) KL(A^teacher_t || A^student_s) / |pairs|
+ w_log(step) * tau^2 * mean_positions KL(softmax(z^teacher / tau) || softmax(z^student / tau))``

where each pair maps a student head s to a teacher head t, KL is taken per query row and
averaged over the batch and the queries, and ``c_s(step)`` in {0, 1} is the curriculum gate of
the student head's layer. Attention transfer follows Zagoruyko and Komodakis 2017 ("Paying
More Attention to Attention", arXiv 1612.03928) with attention maps in place of activation
maps, as in MiniLM (Wang et al. 2020, arXiv 2002.10957, which distils self-attention
distributions by KL); the logit term is Hinton, Vinyals, Dean 2015 (arXiv 1503.02531), whose
tau^2 keeps gradient scales comparable across temperatures. Setting ``attention_weight = 0``
and ``logits_weight > 0`` is the logits-only baseline; both weights 0 records the two KLs of a
free student.

The teacher sees exactly the student's batches (``tokens[:, :-1]``) and is frozen. Head
mapping (``map``):

- ``layer``: student layer l copies teacher layer ``round(l (L_t - 1) / (L_s - 1))`` (depth-
  proportional, so unequal layer counts line up shallow-to-shallow and deep-to-deep); head h
  copies head h for ``h < min(H_s, H_t)``, and the student's extra heads are left free. The
  rounding is Python's, a half to the even layer, so a tie does not always go the same way (7
  student layers onto 4: teacher layers 0, 0, 1, 2, 2, 2, 3); it is part of what runs recorded,
  so it stays, and ``map = "heads"`` gives any other pairing;
- ``heads``: an explicit list, each entry naming the teacher head either by position
  (``teacher_layer``, ``teacher_head``) or by ``role``: the teacher head whose final role label
  (``dynamics.analysis.assign_roles`` on the teacher's last recorded attention) is that role,
  with the highest score for it.

Order (the essay's advice to align shallow and middle layers first): ``together`` switches all
pairs on at step 0; ``shallow_first`` switches the distilled student layers on one by one, the
r-th shallowest at step ``r * stage_steps``; ``deep_first`` is the reverse, for comparison.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import torch
from torch import Tensor

from dynamics.checkpoint import load_checkpoint, load_run_model
from dynamics.config import ConfigError, RunConfig, recorded_config
from dynamics.interventions.common import (
    check_schedule,
    fail,
    forward_changes,
    kl_rows,
    parse_heads,
    parse_table,
    schedule_factor,
)
from dynamics.limits import FLOAT32_MAX
from dynamics.paths import absolute

MAPS = ("layer", "heads")
ORDERS = ("together", "shallow_first", "deep_first")


@dataclass(frozen=True)
class DistillHead:
    """One student head and its source: ``{ layer, head, teacher_layer, teacher_head }`` or ``{ layer, head, role }``."""

    layer: int
    """Student layer."""
    head: int
    """Student head."""
    teacher_layer: int = -1
    """Teacher layer (with teacher_head), or -1 when `role` names the source."""
    teacher_head: int = -1
    """Teacher head (with teacher_layer), or -1 when `role` names the source."""
    role: str = ""
    """A role of dynamics.analysis.ROLES: copy the teacher's best head with that final label."""


@dataclass(frozen=True)
class DistillOptions:
    """``[intervene.distill]``."""

    teacher: str
    """Store path of the finished teacher run (relative paths are to the working directory; in a
    sweep, the launcher's, wherever its workers run)."""
    run: str = ""
    """Teacher run id; may be omitted when the store holds one run and the student is written to another store."""
    map: str = "layer"
    """Head mapping: layer (layer-to-layer, head h to head h) | heads (the explicit `heads` list)."""
    layers: tuple[int, ...] = ()
    """map = layer: the student layers to distil; empty means all."""
    heads: tuple[DistillHead, ...] = ()
    """map = heads: the student heads and their teacher heads (array of inline tables)."""
    attention_weight: float = 1.0
    """Weight of the mean attention KL over mapped heads at full strength; 0 records only."""
    logits_weight: float = 0.0
    """Weight of the tau^2-scaled KL between teacher and student next-token distributions."""
    temperature: float = 1.0
    """Softmax temperature tau of the logits term (> 0)."""
    schedule: str = "constant"
    """Schedule of both weights: constant | warmup | linear_decay | cosine_decay."""
    ramp_steps: int = 0
    """Length of the warm-up or decay in steps; 0 means train.steps."""
    order: str = "together"
    """Curriculum over student layers: together | shallow_first | deep_first."""
    stage_steps: int = 0
    """shallow_first/deep_first: steps between layer switch-ons; 0 means train.steps // (layers + 1)."""


@dataclass(frozen=True)
class Teacher:
    """What the checks learn about the teacher run."""

    path: str
    run_id: str
    cfg: RunConfig


_BASE: ContextVar[str | None] = ContextVar("dynamics_teacher_base", default=None)


@contextlib.contextmanager
def relative_to(directory: str) -> Iterator[None]:
    """Within this block (this thread or task only), relative teacher paths are to ``directory``.

    A relative teacher path is to the working directory of the command that names it. A sweep's
    tasks run in workers whose working directory may be another (an external cluster), so a task
    resolves it against its launcher's: otherwise the run failed "not found" there, or, worse,
    distilled from whatever store that path named in the worker's directory.
    """
    token = _BASE.set(directory)
    try:
        yield
    finally:
        _BASE.reset(token)


def teacher_path(written: str) -> str:
    """Where a teacher path as written points: a relative local path joined to the directory of
    :func:`relative_to` when inside one, else left to the working directory."""
    base = _BASE.get()
    if base is None or "://" in written or os.path.isabs(written):
        return written
    return os.path.join(base, written)


def _teacher(opts: DistillOptions, cfg: RunConfig) -> Teacher:
    """Find the teacher run and check it against the student; ConfigError naming the key."""
    from dynamics import store

    key = "intervene.distill.teacher"
    path = teacher_path(opts.teacher)
    if "://" not in path and not Path(path).exists():
        fail(f"{key}: teacher store {path} not found")
    try:
        store.check_store(path)  # a damaged root or a newer version said as every command says it
    except store.StoreError as e:
        fail(f"{key}: {e}")
    runs = store.list_runs(path)
    if not runs:
        fail(f"{key}: teacher store {path} holds no runs")
    more = f", and {len(runs) - 8} more" if len(runs) > 8 else ""  # 8 of 12 named as if they were all
    if opts.run:
        if opts.run not in runs:
            fail(f"intervene.distill.run: no run {opts.run!r} in {path} (runs: {', '.join(runs[:8])}{more})")
        run_id = opts.run
    elif len(runs) != 1:
        fail(f"intervene.distill.run: {path} holds {len(runs)} runs; name one ({', '.join(runs[:8])}{more})")
    else:
        run_id = runs[0]
    attrs = store.run_attrs(path, run_id)
    if attrs.get("status") != "completed":
        # run_status: a killed teacher's attrs still say "running", which it will never finish
        fail(f"{key}: teacher run {run_id} is {store.run_status(path, run_id, attrs)}, not completed")
    if not store.has_checkpoint(path, run_id):
        fail(f"{key}: teacher run {run_id} in {path} has no checkpoint to load")
    try:  # here, with the other checks: loaded first once training had begun, a damaged one failed the student
        load_checkpoint(path, run_id)
    except store.StoreError as e:
        fail(f"{key}: {e}")
    tcfg = recorded_config(attrs.get("config"), f"{key}: teacher run {run_id} in {path}")
    t, s = tcfg.model, cfg.model
    if t.vocab_size != s.vocab_size:
        fail(f"{key}: teacher model.vocab_size {t.vocab_size} differs from the student's {s.vocab_size}")
    if t.pos == "learned" and t.context < s.context:
        fail(f"{key}: teacher has learned positions for {t.context} tokens, the student's batches have {s.context}")
    if forward_changes(tcfg.intervene):
        fail(f"{key}: teacher run {run_id} was trained with interventions that change its forward pass "
             "(hard templates or conditioned gates); its checkpoint alone does not reproduce its attention")
    return Teacher(path, run_id, tcfg)


def refuse_other_teacher(recorded: dict, cfg: RunConfig, path: str, run_id: str) -> None:
    """StoreError when the finished run ``run_id`` (its attributes ``recorded``) was distilled from
    another teacher run than ``cfg``'s ``intervene.distill`` names now.

    The table enters the run id as written, and ``teacher`` is a path, maybe relative, with
    ``run`` optional: a teacher store remade with another run, or the same config from another
    directory, named another teacher under the same run id, and the finished student was skipped
    as if distilled from it (`train_run` and the sweep launcher skip finished runs; a resume is
    refused so by its checkpoint). A teacher the config cannot resolve now (gone, several runs,
    not completed) is no evidence either way: the run is left to be skipped, and `dynamics run`
    names that teacher problem before it gets here.
    """
    from dynamics import store

    was = (recorded.get("interventions") or {}).get("distill")
    if not cfg.intervene.get("distill") or not isinstance(was, dict):
        return
    try:
        teacher = _teacher(parse(cfg, cfg.intervene["distill"]), cfg)  # not its roles: no analysis
    except ConfigError:
        return
    if was.get("teacher_run") != teacher.run_id:
        raise store.StoreError(
            f"run {run_id} in {path} was distilled from teacher run {was.get('teacher_run')} "
            f"({was.get('teacher_store')}), but intervene.distill.teacher now names run {teacher.run_id} in "
            f"{teacher.path}; refusing to skip it as this config's run: write the student to another store or "
            f"give intervene.distill.run")


def _same_place(a: str, b: str) -> bool:
    """Whether two store paths (or URLs) name one store; a file:// URL is the local path it names."""
    a, b = (unquote(p[len("file://"):]) if p.startswith("file://") else p for p in (a, b))
    if "://" in a or "://" in b:
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def _absolute(path: str) -> str:
    return path if "://" in path else str(absolute(path))  # `lnk/..` as the store reads it


def check_output(opts: DistillOptions, out: str) -> None:
    """ConfigError when the student is to be written into its teacher's store with no teacher run named.

    ``run`` may be left out only while the store holds one run: the student's own run group
    would make it two, and every later start (a resume, a rerun, the sweep's next point) would
    then be refused for not naming the teacher.
    """
    teacher = teacher_path(opts.teacher)
    if opts.run or not _same_place(teacher, out):
        return
    from dynamics import store

    runs = store.list_runs(teacher) if store.is_store(teacher) else []
    hint = f" (run = {runs[0]!r})" if len(runs) == 1 else ""
    fail(f"intervene.distill.run: required when the student is written into its teacher's store {out}, which "
         f"then holds more than one run; name the teacher run{hint}")


def teacher_roles(path: str, run_id: str) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Final role labels and scores of every teacher head (``dynamics.analysis.roles``).

    Returns
    -------
    names : numpy.ndarray of str, shape (L_t, H_t)
        Role label of each head at the teacher's last snapshot.
    scores : dict of role -> numpy.ndarray, shape (L_t, H_t)
    """
    from dynamics import store
    from dynamics.analysis import ROLES, assign_roles, role_names, role_scores

    key = "intervene.distill.teacher"
    try:
        # zarr reads a lost chunk as its fill value: lost probe tokens (all 0) labelled every head
        # induction, and the student distilled from the wrong head without a word
        store.check_recorded(path, run_id)
        ds = store.open_run(path, run_id)
        attn = ds["attention"].isel(snapshot=[-1]).astype("float32")  # (1, L, H, P, T, T)
        scores = role_scores(attn, ds["probe_tokens"]).compute()
    except store.StoreError as e:
        fail(f"{key}: {e}")
    except Exception:  # a chunk that cannot be decoded (a failed checksum): zarr's codec error names no chunk
        damage = store.unreadable_chunk(path, run_id)
        if damage is None:
            raise
        fail(f"{key}: {damage}")
    names = role_names(assign_roles(scores).values)[0]  # (L, H)
    return names, {r: scores[r].values[0] for r in ROLES[:-1]}


def _pairs(opts: DistillOptions, cfg: RunConfig, teacher: Teacher) -> list[tuple[int, int, int, int]]:
    """(student layer, student head, teacher layer, teacher head) for every distilled head."""
    s, t = cfg.model, teacher.cfg.model
    if opts.map == "layer":
        layers = opts.layers or tuple(range(s.n_layers))
        out = []
        for layer in layers:
            frac = layer / (s.n_layers - 1) if s.n_layers > 1 else 0.0
            tl = round(frac * (t.n_layers - 1))
            out.extend((layer, h, tl, h) for h in range(min(s.n_heads, t.n_heads)))
        return out
    out, roles = [], None
    for i, h in enumerate(opts.heads):
        key = f"intervene.distill.heads[{i}]"
        if h.role:
            if roles is None:
                roles = teacher_roles(teacher.path, teacher.run_id)
            names, scores = roles
            found = np.argwhere(names == h.role)
            if not len(found):
                have = ", ".join(sorted(set(names.ravel().tolist())))
                fail(f"{key}.role: teacher run {teacher.run_id} has no {h.role!r} head at its last snapshot "
                     f"(its roles: {have})")
            best = max(found.tolist(), key=lambda lh: (scores[h.role][lh[0], lh[1]], -lh[0], -lh[1]))
            out.append((h.layer, h.head, int(best[0]), int(best[1])))
        else:
            if not 0 <= h.teacher_layer < t.n_layers:
                fail(f"{key}.teacher_layer: teacher layer {h.teacher_layer} does not exist "
                     f"(teacher n_layers = {t.n_layers})")
            if not 0 <= h.teacher_head < t.n_heads:
                fail(f"{key}.teacher_head: teacher head {h.teacher_head} does not exist (teacher n_heads = {t.n_heads})")
            out.append((h.layer, h.head, h.teacher_layer, h.teacher_head))
    return out


def parse(cfg: RunConfig, raw: object) -> DistillOptions:
    """Validated :class:`DistillOptions` from ``[intervene.distill]`` (the teacher is checked separately)."""
    from dynamics.analysis import ROLES

    prefix = "intervene.distill"
    kw = parse_table(prefix, raw, DistillOptions, nested=("heads",))
    entries = kw.get("heads", [])
    if not isinstance(entries, list):
        fail(f"{prefix}.heads: expected a list of {{ layer, head, ... }} tables")

    def check(key: str, h: DistillHead) -> None:
        by_index = h.teacher_layer >= 0 or h.teacher_head >= 0
        if h.role and by_index:
            fail(f"{key}: give either role or teacher_layer/teacher_head, not both")
        if not h.role and (h.teacher_layer < 0 or h.teacher_head < 0):
            fail(f"{key}: needs teacher_layer and teacher_head, or role")
        if h.role and (h.role not in ROLES or h.role == "none"):
            fail(f"{key}.role: unknown role {h.role!r} ({' | '.join(ROLES[:-1])})")

    heads = parse_heads(prefix, entries, DistillHead, cfg, check=check,
                        duplicate="student head ({layer}, {head}) is mapped twice")
    opts = DistillOptions(**{**kw, "heads": heads})
    if not opts.teacher:
        fail(f"{prefix}.teacher: required (the store path of a finished run)")
    if opts.map not in MAPS:
        fail(f"{prefix}.map: unknown mapping {opts.map!r} ({' | '.join(MAPS)})")
    if opts.map == "heads" and not heads:
        fail(f"{prefix}.heads: map = 'heads' needs a non-empty list of heads")
    if opts.map == "layer" and heads:
        fail(f"{prefix}.heads: only used with map = 'heads' (map is 'layer')")
    if opts.map == "heads" and opts.layers:
        fail(f"{prefix}.layers: only used with map = 'layer' (map is 'heads')")
    for i, layer in enumerate(opts.layers):
        if not 0 <= layer < cfg.model.n_layers:
            fail(f"{prefix}.layers[{i}]: layer {layer} does not exist (model.n_layers = {cfg.model.n_layers})")
    if len(set(opts.layers)) != len(opts.layers):
        fail(f"{prefix}.layers: duplicate layer")
    for name in ("attention_weight", "logits_weight"):
        if getattr(opts, name) < 0:
            fail(f"{prefix}.{name}: must be >= 0, got {getattr(opts, name)}")
    # tau^2 scales the logits term, 1/tau the logits, both in float32: 1e300 failed with an
    # OverflowError after the store was made, 1e20 and 1e-300 recorded a run diverged at step 0
    low, high = 1 / math.sqrt(FLOAT32_MAX), math.sqrt(FLOAT32_MAX)
    if not low <= opts.temperature <= high:
        fail(f"{prefix}.temperature: must be in [{low:.3g}, {high:.3g}] (tau^2 and 1/tau^2 within float32), "
             f"got {opts.temperature}")
    check_schedule(prefix, opts.schedule, opts.ramp_steps)
    if opts.order not in ORDERS:
        fail(f"{prefix}.order: unknown order {opts.order!r} ({' | '.join(ORDERS)})")
    if opts.stage_steps < 0:
        fail(f"{prefix}.stage_steps: must be >= 0, got {opts.stage_steps}")
    return opts


def resolve(opts: DistillOptions, cfg: RunConfig) -> tuple[Teacher, list[tuple[int, int, int, int]]]:
    """Check the teacher and resolve the head pairs (reads the teacher's store)."""
    teacher = _teacher(opts, cfg)
    return teacher, _pairs(opts, cfg, teacher)


class Distill:
    """Attention (and optionally logits) distillation from a frozen teacher run."""

    name = "distill"

    def __init__(self, opts: DistillOptions, cfg: RunConfig, device: torch.device,
                 resolved: tuple[Teacher, list[tuple[int, int, int, int]]] | None = None):
        self.opts, self.cfg, self.device = opts, cfg, device
        self.teacher_info, self.pairs = resolved or resolve(opts, cfg)
        self.teacher, _, self.teacher_step = load_run_model(self.teacher_info.path, self.teacher_info.run_id,
                                                            device=str(device))
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.layers = sorted({p[0] for p in self.pairs})
        self.teacher_layers = sorted({p[2] for p in self.pairs})
        ranks = self.layers if opts.order != "deep_first" else self.layers[::-1]
        self.rank = {layer: r for r, layer in enumerate(ranks)}
        self.stage = opts.stage_steps or cfg.train.steps // (len(self.layers) + 1)
        self.last_step = 0

    def parameters(self) -> list:
        return []  # the teacher is frozen; nothing of this intervention trains

    def _factor(self, step: int) -> float:
        o = self.opts
        return schedule_factor(o.schedule, step, o.ramp_steps or self.cfg.train.steps)

    def head_weights(self, step: int) -> np.ndarray:
        """Effective attention weight of every student head at a step, (L, H); 0 where unmapped."""
        w = np.zeros((self.cfg.model.n_layers, self.cfg.model.n_heads), dtype=np.float32)
        base = self.opts.attention_weight * self._factor(step)
        for layer, head, _, _ in self.pairs:
            on = self.opts.order == "together" or step >= self.rank[layer] * self.stage
            w[layer, head] = base if on else 0.0
        return w

    def hooks(self, cap: dict, capture: bool = True) -> list:
        """Capture the student's scores on distilled layers (nothing changes the forward)."""
        if not capture:
            return []

        def keep(scores: Tensor, name: str) -> None:
            cap[int(name.split(".")[1])] = scores  # (B, H, Tq, Tk), in the graph
        return [(f"blocks.{layer}.attn.hook_attn_scores", keep) for layer in self.layers]

    @torch.no_grad()
    def _teacher(self, inputs: Tensor, patterns: bool) -> tuple[Tensor, dict[int, Tensor]]:
        """Teacher logits (B, T, V) and, if asked, its patterns by layer, (B, H_t, T, T)."""
        if not patterns:
            return self.teacher(inputs), {}
        names = [f"blocks.{layer}.attn.hook_pattern" for layer in self.teacher_layers]
        logits, cache = self.teacher.run_with_cache(inputs, names)
        return logits, {layer: cache[n] for layer, n in zip(self.teacher_layers, names, strict=True)}

    def _attention_kl(self, cap: dict, t_patterns: dict[int, Tensor]) -> list[Tensor]:
        """KL(teacher || student) per pair, averaged over batch and queries (scalar tensors)."""
        out = []
        for layer, head, tl, th in self.pairs:
            log_s = cap[layer][:, head].float().log_softmax(-1)  # (B, T, T)
            out.append(kl_rows(t_patterns[tl][:, th].float(), log_s).mean())
        return out

    def _logits_kl(self, t_logits: Tensor, logits: Tensor) -> Tensor:
        tau = self.opts.temperature
        p = (t_logits.float() / tau).softmax(-1)  # (B, T, V)
        log_q = (logits.float() / tau).log_softmax(-1)  # (B, T, V)
        return tau**2 * kl_rows(p, log_q).mean()

    def begin_step(self) -> None:
        pass  # no state carried between steps

    def loss(self, step: int, tokens: Tensor, logits: Tensor, cap: dict) -> Tensor:
        self.last_step = step
        w_att = self.head_weights(step)
        w_log = self.opts.logits_weight * self._factor(step)
        total = logits.new_zeros(())
        if not w_att.any() and w_log == 0.0:
            return total
        t_logits, t_patterns = self._teacher(tokens[:, :-1], patterns=bool(w_att.any()))
        if w_att.any():
            kls = self._attention_kl(cap, t_patterns)
            weights = [float(w_att[layer, head]) for layer, head, _, _ in self.pairs]
            total = total + sum(w * kl for w, kl in zip(weights, kls, strict=True) if w) / len(self.pairs)
        if w_log:
            total = total + w_log * self._logits_kl(t_logits, logits)
        return total

    def variables(self, n_snapshots: int) -> dict:
        L, H = self.cfg.model.n_layers, self.cfg.model.n_heads
        lh = (("snapshot", "layer", "head"), (n_snapshots, L, H))
        return {
            "distill_kl": (*lh, "float32"),
            "distill_weight": (*lh, "float32"),
            "distill_source": (*lh, "int32", -1),  # flat teacher head index; 0 is a real head
            "distill_logits_kl": (("snapshot",), (n_snapshots,), "float32"),
        }

    def blocks(self, tokens: Tensor, logits: Tensor, cap: dict) -> dict[str, np.ndarray]:
        L, H = self.cfg.model.n_layers, self.cfg.model.n_heads
        t_logits, t_patterns = self._teacher(tokens, patterns=True)
        kl = np.full((L, H), np.nan, dtype=np.float32)
        source = np.full((L, H), -1, dtype=np.int32)
        for (layer, head, tl, th), value in zip(self.pairs, self._attention_kl(cap, t_patterns), strict=True):
            kl[layer, head] = value.item()
            source[layer, head] = tl * self.teacher_info.cfg.model.n_heads + th  # flat teacher head index
        return {
            "distill_kl": kl,
            "distill_weight": self.head_weights(self.last_step),
            "distill_source": source,
            "distill_logits_kl": np.float32(self._logits_kl(t_logits, logits).item()),
        }

    def describe(self) -> dict:
        o = self.opts
        return asdict(o) | {"ramp_steps": o.ramp_steps or self.cfg.train.steps, "stage_steps": self.stage,
                            "teacher_run": self.teacher_info.run_id, "teacher_step": self.teacher_step,
                            # where the teacher was read: `teacher` is as written, maybe relative
                            "teacher_store": _absolute(self.teacher_info.path),
                            "pairs": [list(p) for p in self.pairs]}  # (layer, head, teacher_layer, teacher_head)

    def state_dict(self) -> dict:
        # Nothing trains here; the identity of the teacher is kept so a resume cannot switch teachers.
        return {"teacher_run": self.teacher_info.run_id, "teacher_step": self.teacher_step}

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()
        if state != mine:
            fail(f"intervene.distill.teacher: the checkpoint was trained against {state}, "
                 f"the teacher now is {mine}; refusing to resume with another teacher")
