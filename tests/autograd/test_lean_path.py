"""The lean eager path (softk._ops.lean): plain eager calls skip torch.library.

What must hold: in plain eager mode a call runs the backend's kernel
directly (no custom op is registered or called, neither torch._dynamo nor
triton is imported); every other context (a dispatch or function mode,
torch.func transforms, compile) takes the library path; and both paths give
the same numbers, bit for bit, since the same kernels serve them.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.autograd import forward_ad
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import softk
from softk import _validate

from ..oracle.maps import sparsemax as np_sparsemax

pytestmark = pytest.mark.usefixtures("each_cpu_backend")

MAPS = {
    "softmax": lambda x: softk.softmax(x, tau=0.7),
    "sparsemax": softk.sparsemax,
    "entmax15": lambda x: softk.entmax15(x, dim=0),
    "entmax1.3": lambda x: softk.entmax(x, 1.3),
    "entmax_tensor_alpha": lambda x: softk.entmax(x, torch.full((x.shape[0], 1), 1.7, dtype=x.dtype)),
    "soft_topk_exp": lambda x: softk.soft_topk(x, 2, method="exp"),
    "soft_topk_row_k": lambda x: softk.soft_topk(x, torch.full((x.shape[0], 1), 2.5, dtype=x.dtype)),
    "soft_topk_grad": lambda x: softk.soft_topk(x, 2, method="grad"),
    "log_softmax": softk.log_softmax,
    "logsumexp": softk.logsumexp,
}


class _Passthrough(TorchFunctionMode):
    """A mode that changes nothing but forces the library path."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _Ops(TorchDispatchMode):
    """Records the ops that reach the dispatcher."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def _value_and_grad(fn, x, g):
    x = x.clone().requires_grad_()
    y = fn(x)
    (dx,) = torch.autograd.grad(y, x, g)
    return y.detach(), dx


# log_softmax and logsumexp take torch's fused ops on the eager CPU path and
# plain tensor code elsewhere: the same maths, not the same rounding.
ROUNDED = {"log_softmax", "logsumexp"}


@pytest.mark.parametrize("name", sorted(MAPS))
def test_both_paths_agree(name):
    """The lean path and the library path run the same kernels (bit for
    bit; log_softmax/logsumexp to a few ulps)."""
    fn = MAPS[name]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 7, dtype=torch.float64, generator=g) * 3
    x[1, 2] = float("-inf")
    y_lean, dx_lean = _value_and_grad(fn, x, torch.randn(fn(x).shape, dtype=x.dtype, generator=g))
    g = torch.Generator().manual_seed(1)
    x2 = torch.randn(5, 7, dtype=torch.float64, generator=g) * 3
    x2[1, 2] = float("-inf")
    gy = torch.randn(fn(x2).shape, dtype=x2.dtype, generator=g)
    with _Passthrough():
        y_lib, dx_lib = _value_and_grad(fn, x2, gy)
    if name in ROUNDED:
        torch.testing.assert_close(y_lean, y_lib, rtol=4e-16, atol=4e-16)
        torch.testing.assert_close(dx_lean, dx_lib, rtol=4e-16, atol=4e-16)
    else:
        assert torch.equal(y_lean, y_lib)
        assert torch.equal(dx_lean, dx_lib)


def test_a_dispatch_mode_sees_the_library_op():
    x = torch.randn(3, 6, dtype=torch.float64)
    with _Ops() as mode:
        p = softk.sparsemax(x)
    assert any("softk.threshold" in op for op in mode.seen), mode.seen
    expected = np_sparsemax(x.numpy())
    np.testing.assert_allclose(p.numpy(), expected, rtol=0, atol=1e-14)


def test_forward_mode_ad_on_the_lean_path():
    """A dual tensor in eager mode: the tangent is J v, J = diag(s) − s sᵀ/|S| on the support."""
    x = torch.tensor([[0.5, 1.2, -0.3, 1.0]], dtype=torch.float64)
    v = torch.tensor([[0.1, -0.2, 0.3, 0.4]], dtype=torch.float64)
    with forward_ad.dual_level():
        p, t = forward_ad.unpack_dual(softk.sparsemax(forward_ad.make_dual(x, v)))
    s = (p > 0).to(x.dtype)
    expected = s * v - s * (s * v).sum() / s.sum()
    torch.testing.assert_close(t, expected, rtol=0, atol=1e-15)
    assert t.abs().sum() > 0


def test_jit_trace_records_the_op():
    """torch.jit.trace takes the library path: the traced function computes
    the map on new inputs (a kernel called directly would be a constant)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on Python ints
        traced = torch.jit.trace(lambda x: softk.sparsemax(x * 2.0), torch.randn(2, 5, dtype=torch.float64))
    x = torch.tensor([[0.1, 1.0, 1.5, -2.0, 0.0]], dtype=torch.float64).expand(2, 5)
    np.testing.assert_allclose(traced(x).numpy(), np_sparsemax(2.0 * x.numpy()), rtol=0, atol=1e-15)


def test_no_grad_call_makes_no_graph():
    x = torch.randn(2, 5, requires_grad=True)
    with torch.no_grad():
        p = softk.entmax15(x)
    assert p.grad_fn is None and not p.requires_grad
    q = softk.entmax15(x)
    assert q.grad_fn is not None


_FRESH = r"""
import sys, io, contextlib
import torch, softk
out = io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
    x = torch.randn(4, 10, requires_grad=True)
    t = torch.randint(0, 10, (4,))
    for fn in (softk.softmax, softk.sparsemax, softk.entmax15, lambda z: softk.entmax(z, 1.3),
               lambda z: softk.entmax(z, torch.full((4, 1), 1.3)), softk.log_softmax, softk.logsumexp,
               lambda z: softk.soft_topk(z, 3), lambda z: softk.soft_topk(z, torch.full((4, 1), 2.5))):
        (dx,) = torch.autograd.grad(fn(x).sum(), x, create_graph=True)
        dx.sum().backward()
    softk.soft_topk(x, 3, method="grad").sum().backward()  # first derivatives only
    for loss in (softk.losses.sparsemax_loss, softk.losses.entmax15_loss, softk.losses.softmax_loss,
                 softk.losses.cross_entropy):
        loss(x, t).backward()
print(repr(out.getvalue()), "torch._dynamo" in sys.modules, "triton" in sys.modules,
      hasattr(torch.ops.softk, "threshold"))
"""


def test_eager_cpu_calls_import_neither_dynamo_nor_triton(each_cpu_backend):
    """Cold start: eager CPU calls (forward, backward, double backward, the
    losses) import neither torch._dynamo nor triton, register no custom op,
    and print nothing."""
    env = {**os.environ, "SOFTK_BACKEND": each_cpu_backend}
    done = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True, check=True, env=env)
    assert done.stderr == ""
    assert done.stdout.split() == ["''", "False", "False", "False"], done.stdout


def test_value_checks_on_a_device_tensor_do_not_sync(monkeypatch):
    """Off the CPU a value check is a device assertion, never a host read."""
    calls = []
    monkeypatch.setattr(torch, "_assert_async", lambda ok, msg="": calls.append(msg))
    ok = torch.ones(3, dtype=torch.bool, device="meta")
    _validate.require(ok, lambda: pytest.fail("the message reads values: it must not be built"))
    assert len(calls) == 1 and "softk" in calls[0]
    tau = torch.tensor(0.5, device="meta", requires_grad=True)
    _validate.check_tau(tau, allow_grad=True)
    assert len(calls) == 2


def test_value_checks_on_the_cpu_still_raise():
    with pytest.raises(ValueError, match="alpha must be finite and >= 1"):
        softk.entmax(torch.randn(2, 3), torch.tensor([[0.5], [2.0]]))
    with pytest.raises(ValueError, match="tau must be a finite number > 0"):
        softk.sparsemax(torch.randn(2, 3), tau=torch.tensor(-1.0, requires_grad=True))


_MODE_BACKWARD = r"""
import torch, softk
from torch.utils._python_dispatch import TorchDispatchMode

class Ops(TorchDispatchMode):
    seen = []
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))

x = torch.tensor([[0.5, 1.2, -0.3, 1.0]], dtype=torch.float64, requires_grad=True)
p = softk.sparsemax(x)
with Ops() as mode:
    (dx,) = torch.autograd.grad(p, x, torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.float64))
import json; print(any("softk.threshold_backward" in op for op in mode.seen), json.dumps(dx.tolist()))
"""


def test_backward_under_a_mode_after_an_eager_forward(each_cpu_backend):
    """A forward on the lean path, then (in a fresh process, so that no op
    is registered yet) a backward inside a dispatch mode: the backward takes
    the library op, registered on demand.  On the support {1, 3} the
    gradient is g − mean(g on S) there, 0 elsewhere."""
    env = {**os.environ, "SOFTK_BACKEND": each_cpu_backend}
    done = subprocess.run([sys.executable, "-c", _MODE_BACKWARD], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    seen, dx = done.stdout.split(" ", 1)
    assert seen == "True"
    assert json.loads(dx) == [[0.0, -1.0, 0.0, 1.0]]
