"""The two optimisers training offers, as torch.optim computes them, without torch.optim.

torch.optim's ``step`` (and its state_dict methods) import torch._dynamo on first use, for a
graph break that matters only under torch.compile: about 2 s on a 2-core host, paid by every
``dynamics run`` and every sweep worker before its first update. These classes make the same
calls (AdamW: ``torch.optim.AdamW(fused=True)``'s one fused kernel; SGD: the per-tensor loop
``torch.optim.SGD`` runs on a CPU), so the weights they give are bitwise the same, and their
state dicts are torch's: a checkpoint written by either loads into the other
(tests/test_optim.py checks both).

Only what training uses is here: one or more parameter groups whose ``lr`` the loop sets each
step, ``step()``, ``zero_grad()``, ``state_dict()`` and ``load_state_dict()``. No closures,
hooks, amsgrad, nesterov or maximize.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import Tensor


class _Optimizer:
    """Parameter groups and per-parameter state, kept and saved in torch.optim's layout."""

    #: the keys of one parameter's state, as torch.optim names them
    state_keys: tuple[str, ...] = ()

    def __init__(self, params: Iterable[Tensor], defaults: dict):
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        self.defaults = defaults
        self.param_groups: list[dict] = [{**defaults, "params": params}]
        self.state: dict[Tensor, dict] = {}  # keyed by the parameter itself, as torch.optim's

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={v}" for k, v in self.defaults.items())
        return f"{type(self).__name__}({settings})"

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the grads of the groups' parameters (None, or zeros in place), as torch.optim's."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    def state_dict(self) -> dict:
        """torch.optim.Optimizer.state_dict's layout: parameters numbered across the groups in
        order, state under those numbers. The tensors are the live ones, not copies."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            for p in group["params"]:
                index.setdefault(id(p), len(index))
            groups.append({**{k: v for k, v in group.items() if k != "params"},
                           "params": [index[id(p)] for p in group["params"]]})
        return {"state": {index[id(p)]: s for p, s in self.state.items()}, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Take a state dict of :meth:`state_dict`'s layout (torch.optim's), refusing with a
        ValueError one that does not fit these parameters: a checkpoint copied in from another
        run. torch.optim checks the group sizes only, so a moment of another shape failed at the
        next update instead, with the run already resumed."""
        saved = copy.deepcopy(state_dict["param_groups"])
        if len(saved) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(self.param_groups, saved, strict=True)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                             "optimizer's group")
        by_index = {i: p for g, s in zip(self.param_groups, saved, strict=True)
                    for i, p in zip(s["params"], g["params"], strict=True)}
        state: dict[Tensor, dict] = {}
        for i, entry in state_dict["state"].items():
            if i not in by_index:
                raise ValueError(f"loaded state dict holds state for parameter {i}, which no group lists")
            p = by_index[i]
            missing = [k for k in self.state_keys if k not in entry]
            if missing:
                raise ValueError(f"loaded state dict's parameter {i} has no {missing[0]!r}")
            state[p] = {k: self._cast(k, v, p) for k, v in entry.items()}
        for group, s in zip(self.param_groups, saved, strict=True):
            # a key an older torch did not write takes its default, as torch.optim's __setstate__ does
            for key, value in self.defaults.items():
                s.setdefault(key, value)
            self._check_group(s)  # refused now, not at the first update of a resumed run
            s["params"] = group["params"]
        self.param_groups = saved
        self.state = state

    def _check_group(self, group: dict) -> None:
        """ValueError for a group setting :meth:`step` does not implement."""

    @staticmethod
    def _cast(key: str, value, p: Tensor):
        # torch.optim's policy: moments take the parameter's dtype and device; a fused AdamW's
        # step count is float32 on the parameter's device.
        if not isinstance(value, Tensor):
            return value
        if key == "step":
            return value.to(dtype=torch.float32, device=p.device)
        if value.shape != p.shape:
            raise ValueError(f"loaded state dict's {key} has shape {tuple(value.shape)}, its parameter "
                             f"{tuple(p.shape)}")
        return value.to(dtype=p.dtype, device=p.device) if p.is_floating_point() else value.to(device=p.device)


class AdamW(_Optimizer):
    """``torch.optim.AdamW(params, lr, betas, eps, weight_decay, fused=True)``: decoupled weight
    decay, bias-corrected moments, one fused kernel over all the parameters of a device and dtype."""

    state_keys = ("step", "exp_avg", "exp_avg_sq")

    def __init__(self, params: Iterable[Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2):
        # torch.optim.AdamW(fused=True)'s group, key for key, so its load_state_dict takes ours
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                                  "amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                                  "differentiable": False, "fused": True, "decoupled_weight_decay": True})
        for p in self.param_groups[0]["params"]:
            if not (p.is_floating_point() and p.dtype in (torch.float64, torch.float32, torch.float16,
                                                          torch.bfloat16)):
                raise ValueError(f"AdamW's fused kernel takes floating-point parameters, not {p.dtype}")

    def _check_group(self, group: dict) -> None:
        if group["amsgrad"] or group["maximize"] or not group["decoupled_weight_decay"]:
            raise ValueError("this AdamW implements neither amsgrad, maximize nor coupled weight decay")

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            self._check_group(group)
            # one kernel call per device and dtype, as torch.optim groups them
            lists: dict[tuple, tuple[list, list, list, list, list]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                s = self.state.get(p)
                if s is None:  # lazily, at the first update, as torch.optim does
                    s = self.state[p] = {
                        "step": torch.zeros((), dtype=torch.float32, device=p.device),
                        "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                        "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                    }
                for into, t in zip(lists.setdefault((p.device, p.dtype), ([], [], [], [], [])),
                                   (p, p.grad, s["exp_avg"], s["exp_avg_sq"], s["step"]), strict=True):
                    into.append(t)
            beta1, beta2 = group["betas"]
            for params, grads, exp_avgs, exp_avg_sqs, steps in lists.values():
                torch._foreach_add_(steps, 1)
                torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False,
                                    lr=float(group["lr"]), beta1=float(beta1), beta2=float(beta2),
                                    weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)


class SGD(_Optimizer):
    """``torch.optim.SGD(params, lr, momentum, weight_decay)``: L2 weight decay added to the
    gradient, a momentum buffer that starts as the first step's gradient."""

    state_keys = ("momentum_buffer",)

    def __init__(self, params: Iterable[Tensor], lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": 0, "weight_decay": weight_decay,
                                  "nesterov": False, "maximize": False, "foreach": None, "differentiable": False,
                                  "fused": None})

    def _check_group(self, group: dict) -> None:
        if group["nesterov"] or group["maximize"]:
            raise ValueError("this SGD implements neither nesterov nor maximize")

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            self._check_group(group)
            lr, momentum, decay, damp = float(group["lr"]), group["momentum"], group["weight_decay"], group["dampening"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad.add(p, alpha=decay) if decay != 0 else p.grad
                if momentum != 0:
                    s = self.state.setdefault(p, {})
                    buf = s.get("momentum_buffer")
                    if buf is None:
                        buf = s["momentum_buffer"] = grad.detach().clone()
                    else:
                        buf.mul_(momentum).add_(grad, alpha=1 - damp)
                    grad = buf
                p.add_(grad, alpha=-lr)
