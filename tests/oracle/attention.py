"""Independent NumPy float64 oracle of attention with every map (tests only).

Written from the definitions, not from softk's code:

    s_ij = scale * q_i . k_j  (+ the additive mask; -inf where a bool mask is
           False or, causal, where j > i),
    p_i  = map(s_i)  row by row, with the maps of tests/oracle.py (bisection
           for lambda to adjacent floats; a row with no finite entry gives 0,
           one with a single finite entry gives 1 on it),
    o_i  = sum_j p_ij v_j.

GQA: query head h reads key/value head h // (H / H_kv).  Gradients (the
implicit function theorem on sum_j f(s_ij - lambda_i) = 1): with
d_j = f'(s_ij - lambda_i) written through p (softmax p, sparsemax 1[p > 0],
alpha-entmax p^(2 - alpha) on the support) the row Jacobian is
J = diag(d) - d d^T / sum d (0 where sum d = 0), so dS = J dP with
dP = dO V^T, dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO.  The alpha
gradient is a central finite difference of the forward.
"""

from __future__ import annotations

import numpy as np

from . import maps as oracle


def _expand(t, h):
    """(B, H_kv, ...) -> (B, H, ...): head h reads head h // (H / H_kv)."""
    return np.repeat(t, h // t.shape[1], axis=1)


def scores(q, k, mask=None, causal=False, scale=None):
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * np.einsum("bhle,bhse->bhls", q, _expand(k, q.shape[1]))
    if mask is not None:
        mask = np.asarray(mask)
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask.astype(np.float64)
    if causal:
        L, S = s.shape[-2:]
        s = np.where(np.arange(S)[None, :] > np.arange(L)[:, None], -np.inf, s)
    return s


def _row_map(row, name, alpha):
    if name == "softmax":
        return oracle.softmax(row)
    if name == "sparsemax":
        return oracle.sparsemax(row)
    return oracle.entmax(row, 1.5 if name == "entmax15" else alpha)


def weights(s, name, alpha=None):
    """P row by row; ``alpha`` a float or one value per head."""
    p = np.zeros_like(s)
    B, H, L, _ = s.shape
    for b in range(B):
        for h in range(H):
            a = alpha if alpha is None or np.isscalar(alpha) else float(alpha[h])
            for i in range(L):
                p[b, h, i] = _row_map(s[b, h, i], name, a)
    return p


def attention(q, k, v, mask=None, causal=False, scale=None, name="entmax15", alpha=None):
    """(out (B, H, L, Ev), p (B, H, L, S)) for 4-D inputs."""
    p = weights(scores(q, k, mask, causal, scale), name, alpha)
    return np.einsum("bhls,bhse->bhle", p, _expand(np.asarray(v, np.float64), p.shape[1])), p


def _slope(p, name, alpha):
    if name == "softmax":
        return p
    if name == "sparsemax":
        return (p > 0).astype(np.float64)
    a = 1.5 if name == "entmax15" else np.asarray(alpha, np.float64).reshape(-1, 1, 1)  # per head
    return np.where(p > 0, np.power(np.where(p > 0, p, 1.0), 2.0 - a), 0.0)


def _fold(t, hkv):
    """(B, H, ...) -> (B, H_kv, ...): the gradient of a head shared by a group is the group's sum."""
    B, H = t.shape[:2]
    return t.reshape(B, hkv, H // hkv, *t.shape[2:]).sum(2)


def grads(q, k, v, dout, mask=None, causal=False, scale=None, name="entmax15", alpha=None):
    """(dq, dk, dv) of sum(dout * out), from the row Jacobians."""
    q, k, v, dout = (np.asarray(t, np.float64) for t in (q, k, v, dout))
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    _, p = attention(q, k, v, mask, causal, scale, name, alpha)
    H, hkv = q.shape[1], k.shape[1]
    ke, ve = _expand(k, H), _expand(v, H)
    dP = np.einsum("bhle,bhse->bhls", dout, ve)
    d = _slope(p, name, alpha)
    sd = d.sum(-1, keepdims=True)
    coef = np.where(sd > 0, (d * dP).sum(-1, keepdims=True) / np.where(sd > 0, sd, 1.0), 0.0)
    dS = d * (dP - coef)
    dq = scale * np.einsum("bhls,bhse->bhle", dS, ke)
    dk = scale * np.einsum("bhls,bhle->bhse", dS, q)
    dv = np.einsum("bhls,bhle->bhse", p, dout)
    return dq, _fold(dk, hkv), _fold(dv, hkv)


def dalpha(q, k, v, dout, alpha, mask=None, causal=False, scale=None, eps=1e-6):
    """d sum(dout * out) / d alpha_h for alpha-entmax with one alpha per head (central differences)."""
    alpha = np.asarray(alpha, np.float64)
    out = np.zeros_like(alpha)
    for h in range(alpha.size):
        up, down = alpha.copy(), alpha.copy()
        up[h] += eps
        down[h] -= eps
        fu = (attention(q, k, v, mask, causal, scale, "entmax", up)[0] * dout).sum()
        fd = (attention(q, k, v, mask, causal, scale, "entmax", down)[0] * dout).sum()
        out[h] = (fu - fd) / (2 * eps)
    return out
