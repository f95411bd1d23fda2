"""torch.compile(fullgraph=True) captures softk's maps and losses with no
graph break, and the compiled model matches eager (CPU, both CPU backends)."""

import pytest
import torch

import softk
from softk.losses import entmax15_loss, sparsemax_loss

pytestmark = pytest.mark.usefixtures("each_cpu_backend")


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 70)
        self.b = torch.nn.Linear(70, 5)

    def forward(self, x, y):
        h = softk.sparsemax(self.a(x)) + softk.soft_topk(self.a(x), 4, tau=0.5) + softk.entmax(self.a(x), 1.3)
        z = self.b(h)
        return sparsemax_loss(z, y) + entmax15_loss(z, y) + softk.topk_sum(z, 2).mean() + softk.softmax(z).amax(-1).mean()


@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
@pytest.mark.slow
def test_compiled_model_matches_eager(compiler):
    torch._dynamo.reset()
    model = Tiny()
    x = torch.randn(16, 8)
    y = torch.randint(0, 5, (16,))
    eager = model(x, y)
    g_eager = torch.autograd.grad(eager, list(model.parameters()))
    compiled = torch.compile(model, fullgraph=True, backend=compiler)
    out = compiled(x, y)
    g = torch.autograd.grad(out, list(model.parameters()))
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-6)
    for a, b in zip(g, g_eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_bad_target_still_refused_inside_a_compiled_graph():
    """Eagerly a class index out of range is a ValueError naming it; in a
    compiled graph the value check is an assertion in the graph, not a
    graph break, and it still stops the call."""
    torch._dynamo.reset()
    f = torch.compile(lambda t, y: sparsemax_loss(t, y), fullgraph=True, backend="aot_eager")
    x = torch.randn(2, 3)
    assert torch.isfinite(f(x, torch.tensor([0, 2])))
    with pytest.raises(ValueError, match="class index 3"):
        sparsemax_loss(x, torch.tensor([0, 3]))
    with pytest.raises(RuntimeError, match="invalid input"):
        f(x, torch.tensor([0, 3]))


def _sparsemax_jacobian(x):
    """diag(s) − s sᵀ/|S| on sparsemax's support S, from a float64 sort."""
    z = torch.sort(x, descending=True).values
    cs = torch.cumsum(z, 0)
    r = torch.arange(1, x.numel() + 1, dtype=x.dtype)
    k = int((1 + r * z > cs).sum())
    s = (x > (cs[k - 1] - 1) / k).to(x.dtype)
    return torch.diag(s) - torch.outer(s, s) / s.sum()


_TRANSFORMS = {
    "jacfwd": torch.func.jacfwd,
    "jacrev": torch.func.jacrev,
    "jvp": lambda f: lambda y: torch.func.jvp(f, (y,), (torch.linspace(-1, 1, y.numel(), dtype=y.dtype),))[1],
    "jvp_of_vmap": lambda f: lambda y: torch.func.jvp(torch.func.vmap(f), (y[None],),
                                                      (torch.linspace(-1, 1, y.numel(), dtype=y.dtype)[None],))[1][0],
}


@pytest.mark.parametrize("transform", sorted(_TRANSFORMS))
def test_a_transform_inside_torch_compile_differentiates_the_map(transform):
    # Dynamo traces a transform by differentiating what it traced, and the
    # custom op inside a map has no forward-mode formula: compiled jvp and
    # jacfwd gave zeros, silently, and compiled grad and jacrev failed to trace
    # (with a −inf mask, whose δ = x − x̄ was NaN: NaN rows)
    t = _TRANSFORMS[transform]
    for x in (torch.tensor([0.3, -1.2, 0.9, 0.85, 2.0, -0.1], dtype=torch.float64),
              torch.tensor([0.3, float("-inf"), 0.9, 0.85, 2.0, -0.1], dtype=torch.float64)):
        torch._dynamo.reset()
        v = torch.linspace(-1, 1, x.numel(), dtype=x.dtype)
        for f, jac in ((softk.softmax, torch.func.jacrev(lambda y: torch.softmax(y, -1))(x)),
                       (softk.sparsemax, _sparsemax_jacobian(x))):
            got = torch.compile(t(f), fullgraph=True, backend="eager")(x)
            want = jac if transform.startswith("jac") else jac @ v
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("name", ["entmax1.3", "soft_topk_sigmoid", "normmax", "log_softmax"])
def test_second_derivatives_inside_torch_compile(name):
    # the compiled transform runs the op's own jvp formula as tensor code,
    # halved over the point and the point moved along it, so that the
    # second derivative is the op's (once alone it would be doubled); the
    # reference is the eager Hessian, which the autograd tests hold to the
    # closed forms
    torch._dynamo.reset()
    f = {"entmax1.3": lambda y: softk.entmax(y, 1.3), "soft_topk_sigmoid": lambda y: softk.soft_topk(y, 2, method="sigmoid"),
         "normmax": softk.normmax, "log_softmax": softk.log_softmax}[name]
    x = torch.tensor([0.3, -1.2, 0.9, 0.85, 2.0, -0.1], dtype=torch.float64)
    w = torch.linspace(-1, 2, x.numel(), dtype=x.dtype)
    h = torch.func.hessian(lambda y: (f(y) * w).sum())
    torch.testing.assert_close(torch.compile(h, fullgraph=True, backend="eager")(x), h(x), rtol=1e-10, atol=1e-12)
    g = torch.func.grad(lambda y: (f(y) * w).sum())
    torch.testing.assert_close(torch.compile(g, fullgraph=True, backend="eager")(x), g(x), rtol=1e-12, atol=1e-14)


def test_a_tensor_tau_inside_torch_compile():
    # τ's value check read it with .item(): a graph break, an error under fullgraph
    torch._dynamo.reset()
    x = torch.randn(3, 6)
    t = torch.tensor(0.7, requires_grad=True)
    out = torch.compile(lambda x, t: softk.softmax(x, tau=t), fullgraph=True, backend="eager")(x, t)
    torch.testing.assert_close(out, torch.softmax(x / 0.7, -1))


def test_gradtopk_refuses_a_transform_inside_torch_compile():
    # its derivatives stop at the first order: under torch.compile around
    # jvp it raises rather than give a zero tangent, also where a vmap lies
    # between (jvp of vmap gave a wrong tangent); a vmap alone runs
    torch._dynamo.reset()
    x = torch.tensor([0.3, -1.2, 0.9, 0.85], dtype=torch.float64)
    f = lambda y: softk.soft_topk(y, 2, method="grad")  # noqa: E731
    v = torch.linspace(-1, 1, 4, dtype=torch.float64)[None]
    for t in (torch.func.jacfwd(f), lambda y: torch.func.jvp(torch.func.vmap(f), (y[None],), (v,))[1]):
        with pytest.raises(Exception, match="no forward-mode formula"):
            torch.compile(t, fullgraph=True, backend="eager")(x)
    got = torch.compile(torch.func.vmap(f), fullgraph=True, backend="eager")(x[None])
    torch.testing.assert_close(got, f(x)[None], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["softmax", "sparsemax", "soft_topk", "topk_sum"])
def test_a_transform_in_tau_inside_torch_compile(name):
    # τ's check asked whether it was a functorch tensor, which Dynamo cannot
    # trace: compiled grad in τ raised under fullgraph
    torch._dynamo.reset()
    f = {"softmax": lambda y, t: softk.softmax(y, tau=t), "sparsemax": lambda y, t: softk.sparsemax(y, tau=t),
         "soft_topk": lambda y, t: softk.soft_topk(y, 2, tau=t), "topk_sum": lambda y, t: softk.topk_sum(y, 2, tau=t)}[name]
    x = torch.tensor([[0.3, -1.2, 0.9, 0.85]], dtype=torch.float64)
    w = torch.arange(4.0, dtype=torch.float64)
    g = torch.func.grad(lambda t: (f(x, t) * (w if name != "topk_sum" else 1.0)).sum())
    t = torch.tensor(0.7, dtype=torch.float64)
    torch.testing.assert_close(torch.compile(g, fullgraph=True, backend="eager")(t), g(t), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("name", ["normmax", "softmax", "sparsemax", "entmax1.3"])
def test_a_fully_masked_row_inside_a_compiled_transform(name):
    # normmax's ∂p/∂α formula read log ‖p‖ through a logsumexp over a row of
    # −inf, whose derivative is NaN: 0 times it (α's zero step in the
    # compiled transform) made the row's tangent NaN, where eager gives 0
    torch._dynamo.reset()
    f = {"normmax": softk.normmax, "softmax": softk.softmax, "sparsemax": softk.sparsemax,
         "entmax1.3": lambda y: softk.entmax(y, 1.3)}[name]
    x = torch.stack([torch.full((6,), float("-inf"), dtype=torch.float64),
                     torch.linspace(-1, 2, 6, dtype=torch.float64)])
    v = torch.linspace(-1, 1, 6, dtype=torch.float64).expand(2, 6)
    t = lambda y: torch.func.jvp(f, (y,), (v,))[1]  # noqa: E731
    got = torch.compile(t, fullgraph=True, backend="eager")(x)
    assert torch.equal(got[0], torch.zeros(6, dtype=torch.float64))
    torch.testing.assert_close(got, t(x), rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("name", ["entmax", "entmax_loss", "normmax", "soft_topk_k"])
def test_a_float_argument_that_changes_between_calls(name):
    # From its second value Dynamo traces a changing float argument (an
    # annealed α, a budget schedule) as a symbolic float, which the argument
    # checks' math.isfinite could not take: fullgraph=True raised
    import numpy as np

    from ..oracle import losses as oracle_losses
    from ..oracle import maps as oracle
    from ..oracle import normmax as oracle_normmax

    torch._dynamo.reset()
    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0, 1, 2, 3])
    calls = {
        "entmax": (lambda v, a: softk.entmax(v, alpha=a), lambda a: oracle.entmax(x.numpy(), a), (1.3, 1.7, 2.5)),
        "entmax_loss": (lambda v, a: softk.losses.entmax_loss(v, t, alpha=a, reduction="none"),
                        lambda a: oracle_losses.fy_loss("entmax", x.numpy(), np.eye(6)[t.numpy()], alpha=a),
                        (1.3, 1.7, 2.5)),
        "normmax": (lambda v, a: softk.normmax(v, alpha=a), lambda a: oracle_normmax.normmax(x.numpy(), a),
                    (1.5, 2.0, 3.0)),
        "soft_topk_k": (lambda v, a: softk.soft_topk(v, a, method="exp"),
                        lambda a: oracle.soft_topk(x.numpy(), a, method="exp"), (1.5, 2.5, 3.25)),
    }
    fn, ref, values = calls[name]
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    for a in values:
        np.testing.assert_allclose(compiled(x, a).numpy(), ref(a), rtol=0, atol=1e-9)
    # and the backward, which normmax's passed α to as a Python float: from the
    # second value a guard on a symbolic float, which fullgraph refuses
    w = torch.linspace(-1, 2, 24, dtype=torch.float64).reshape(4, 6)
    for a in values:
        xr = x.clone().requires_grad_()
        got, want = compiled(xr, a), fn(xr, a)
        (got,) = torch.autograd.grad((got * w[..., : got.shape[-1]]).sum(), xr)  # (a loss's rows: one weight each)
        (want,) = torch.autograd.grad((want * w[..., : want.shape[-1]]).sum(), xr)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
