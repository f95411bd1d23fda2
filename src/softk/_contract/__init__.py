"""The one autograd contract of the threshold maps, above every backend.

``op`` (``threshold_map``: forward, backward, jvp, vmap and double backward,
the lean eager route and the torch.library ops), ``per_row_k`` (the same for
one k per row), ``entmax_alpha`` (α-entmax with a tensor α, and α's
gradient), ``family_keys`` (a family as an op argument) and ``potential``
(the Fenchel–Young potential Φ).  The backend that runs a call
is chosen by :mod:`softk._backends.dispatch`; the maths is :mod:`softk.threshold`'s.
"""
