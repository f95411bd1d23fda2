"""A row whose entries of both signs lie near the float max, at a τ > 1 that
brings it back to ordinary size (tests only; shared by the torch/native
tests and the Triton interpreter tests).

x = max·[1, −1, 0.75, −0.25] at τ = max/2 is the row z = [0, −4, −0.5, −2.5]:
(x − x₁)/τ is finite, but x − x₁ is not (−2·max overflows).  Every map, loss
and potential must see z, not [0, −inf, −0.5, −inf].  The references are the
independent float64 ones at z (τ = 1), with gradients by central differences
or the Fenchel–Young closed form (p − y)/τ.
"""

from __future__ import annotations

import numpy as np
import torch

import softk
from tests.oracle import losses as oracle_losses
from tests.oracle import maps as oracle
from tests.oracle import normmax as oracle_normmax

SHAPE = np.array([1.0, -1.0, 0.75, -0.25])  # x / max
Z = 2.0 * (SHAPE - 1.0)  # (x − x₁)/τ at τ = max/2, exactly
COTANGENT = np.array([1.0, 2.0, -1.0, 0.5])
TARGET = 2  # a class inside every map's support


def row(dtype, requires_grad=False):
    """(x, τ) for ``dtype``: the float max times SHAPE, and max/2."""
    big = torch.finfo(dtype).max
    return torch.tensor(SHAPE * big, dtype=dtype).requires_grad_(requires_grad), big / 2


# name: (the map at (x, τ), its float64 reference at z)
MAPS = {
    "softmax": (lambda x, t: softk.softmax(x, tau=t), oracle.softmax),
    "log_softmax": (lambda x, t: softk.log_softmax(x, tau=t), lambda z: np.log(oracle.softmax(z))),
    "entmax_a1.05": (lambda x, t: softk.entmax(x, 1.05, tau=t), lambda z: oracle.entmax(z, 1.05)),
    "entmax_a1.05_tensor": (lambda x, t: softk.entmax(x, torch.tensor([1.05], dtype=x.dtype), tau=t),
                            lambda z: oracle.entmax(z, 1.05)),
    "sparsemax": (lambda x, t: softk.sparsemax(x, tau=t), oracle.sparsemax),
    "normmax": (lambda x, t: softk.normmax(x, tau=t), lambda z: oracle_normmax.normmax(z, 2.0)),
    "topk_sigmoid": (lambda x, t: softk.soft_topk(x, 2, tau=t, method="sigmoid"),
                     lambda z: oracle.soft_topk(z, 2, method="sigmoid")),
    "topk_exp": (lambda x, t: softk.soft_topk(x, 2, tau=t, method="exp"),
                 lambda z: oracle.soft_topk(z, 2, method="exp")),
}


def _fy(name, alpha=None):
    def ref(z, target):
        return float(oracle_losses.fy_row(name, z, np.eye(z.size)[target], alpha=alpha))
    return ref


def _loss(fn, **kw):
    return lambda x, t, target: fn(x[None], torch.tensor([target]), tau=t, **kw)


# name: (the loss of the row at (x, τ) against a class, its value at z, p at z)
LOSSES = {
    "cross_entropy": (_loss(softk.losses.cross_entropy), _fy("softmax"), oracle.softmax),
    "softmax_loss": (_loss(softk.losses.softmax_loss), _fy("softmax"), oracle.softmax),
    "entmax_loss_a1.05": (_loss(softk.losses.entmax_loss, alpha=1.05), _fy("entmax", 1.05),
                          lambda z: oracle.entmax(z, 1.05)),
    "normmax_loss": (_loss(softk.losses.normmax_loss),
                     lambda z, target: oracle_normmax.normmax_loss_row(z, np.eye(z.size)[target], 2.0),
                     lambda z: oracle_normmax.normmax(z, 2.0)),
}
#: the targets: a class of every map's support, and the entry whose x − x₁ overflows
TARGETS = (TARGET, 1)


def check_map(name, dtype, learnable=False):
    """The map's value and its x-gradient against the float64 reference at z."""
    call, ref = MAPS[name]
    x, tau = row(dtype, requires_grad=True)
    t = torch.tensor(tau, dtype=torch.float64 if dtype == torch.float64 else torch.float32,
                     requires_grad=True) if learnable else tau
    out = call(x, t)
    eps = torch.finfo(dtype).eps
    np.testing.assert_allclose(out.detach().double().numpy(), ref(Z), rtol=0, atol=8 * eps)
    (gx,) = torch.autograd.grad(out, x, torch.tensor(COTANGENT, dtype=out.dtype))
    want = oracle.numerical_jacobian(ref, Z).T @ COTANGENT  # ∂/∂z; ∂/∂x = ∂/∂z / τ
    np.testing.assert_allclose(gx.double().numpy() * tau, want, rtol=0, atol=32 * eps + 1e-9)  # (differences' error ~1e-10)


def check_loss(name, dtype):
    """The loss and its x-gradient (p − y)/τ against the float64 reference at
    z, for each of TARGETS."""
    call, ref, ref_p = LOSSES[name]
    eps = torch.finfo(dtype).eps
    for target in TARGETS:
        x, tau = row(dtype, requires_grad=True)
        out = call(x, tau, target)
        np.testing.assert_allclose(out.item(), ref(Z, target), rtol=8 * eps, err_msg=f"target {target}")
        (gx,) = torch.autograd.grad(out, x)
        want = ref_p(Z) - np.eye(Z.size)[target]
        np.testing.assert_allclose(gx.double().numpy() * tau, want, rtol=0, atol=8 * eps, err_msg=f"target {target}")
