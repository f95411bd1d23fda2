"""Autograd rules and torch.library ops, above every backend.

* ``lean``: the one way an op is registered: an eager Function for plain
  calls, the torch.library op (registered on first use) for everything else;
* ``op``: ``threshold_map``: forward, backward, jvp, vmap and double
  backward of every threshold map, and its ops;
* ``per_row_k``: the same with one k per row;
* ``entmax_alpha``: α-entmax with a tensor α, and α's gradient;
* ``softmax_triton``: log_softmax and logsumexp on the Triton kernels;
* ``normmax``: α-normmax on rows, with its α-gradient;
* ``gradtopk``: GradTopK's marginals, their Hessian-vector product and
  log e_k, on the scan or the tree of :mod:`softk._backends.gradtopk`;
* ``fused_loss``: the fused Fenchel–Young loss (the loss and its gradient
  in one kernel per row);
* ``fused_linear``: the fused linear loss's pass over chunks of rows;
* ``family_keys``: a family as an op argument;
* ``potential``: the Fenchel–Young potential Φ.

The backend that runs a call is chosen by :mod:`softk._backends.dispatch`;
the maths is :mod:`softk.threshold`'s.  The maps, losses and attention import
from here; this package imports only the backends, the core maths and
``softk._validate``.
"""
