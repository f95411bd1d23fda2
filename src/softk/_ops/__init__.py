"""Every autograd rule and every ``softk::`` op, above every backend.

* ``lean``: the one way an op is registered: an eager Function for plain
  calls (the eager path), the torch.library op (registered on first use)
  for everything else (the library path);
* ``op``: ``threshold_map``: forward, backward, jvp, vmap and double
  backward of every threshold map, and its ops;
* ``per_row_k``: the same with one k per row;
* ``entmax_alpha``: α-entmax with a tensor α, and α's gradient;
* ``entmax_dense``: the dense α-entmax (0 < α < 1) of the entmax drop-in;
* ``log_softmax``: log_softmax and logsumexp, on the Triton kernels or as tensor code;
* ``normmax``: α-normmax on rows, with its α-gradient;
* ``gradtopk``: GradTopK's marginals, their Hessian-vector product and
  log e_k, on the scan or the tree of :mod:`softk._backends.gradtopk`;
* ``potential``: the Fenchel–Young potential Φ, and Φ of a regulariser Ω_α;
* ``fenchel_young``: the Fenchel–Young value given p, and a tensor α's term;
* ``fused_loss``: the fused Fenchel–Young loss (the loss and its gradient
  in one kernel per row);
* ``topk_softmax_ce``: Su's top-k softmax cross-entropy, its tensor code and
  the rule of its compiled kernel;
* ``fused_linear``: the fused linear loss's pass over chunks of rows;
* ``attention``: sparse attention on the blockwise and Triton kernels;
* ``distributed``: the vocabulary-parallel map and losses;
* ``family_keys``: a family as an op argument.
* ``sharding``: the DTensor sharding rules of the ops on rows (registered
  with the ops, where ``torch.distributed.tensor`` imports).

The kernel that runs a call is picked by :func:`softk._backends.dispatch.pick`
from the registry :mod:`softk._backends.kernels`, and the eager-or-library
choice is :mod:`.lean`'s; the maths is :mod:`softk.threshold`'s.  The maps, losses, attention,
compat and distributed import from here; this package imports only the
backends, the core maths and ``softk._validate`` (what a rule needs from
above, such as the collectives that find λ, comes in as a function).
"""
