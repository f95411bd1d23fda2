"""An ignored row (``ignore_index``) whose scores are all −inf, as padding is
masked: it adds nothing to the loss and gets no gradient, and the other
rows' gradients are those of the loss without it.  (``cross_entropy`` is
torch's, whose gradient there is NaN: not checked here.)"""

import math

import pytest
import torch

import softk
from softk.losses import topk_softmax_cross_entropy, ts2_loss

pytestmark = pytest.mark.usefixtures("each_cpu_backend")

NEG_INF = -math.inf


@pytest.mark.parametrize("loss", [
    lambda x, t: ts2_loss(x, t),
    lambda x, t: ts2_loss(x, t, adaptive=True),
    lambda x, t: topk_softmax_cross_entropy(x, t, k=2),
    lambda x, t: softk.losses.sparsemax_loss(x, t),
])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_an_ignored_row_of_minus_inf_gets_no_gradient(loss, reduction):
    # ts2's log_softmax and the top-k CE's logsumexp on the torch path ran on
    # the masked row: NaN there, and 0·NaN = NaN in its gradient
    rows = [[0.0, 1.0, 2.0], [0.3, -0.4, 1.1]]
    x = torch.tensor([[NEG_INF] * 3] + rows, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([-100, 2, 0])
    got = loss(x, t)
    (gx,) = torch.autograd.grad(got, x)
    plain = torch.tensor(rows, dtype=torch.float64, requires_grad=True)
    want = loss(plain, t[1:])
    (gp,) = torch.autograd.grad(want, plain)
    torch.testing.assert_close(got, want, rtol=1e-15, atol=0)
    assert torch.equal(gx[0], torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(gx[1:], gp, rtol=1e-15, atol=1e-17)
