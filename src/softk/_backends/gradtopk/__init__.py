"""The two ways GradTopK's k-subset marginals are computed, both PyTorch code.

``scan`` (the elementary-symmetric-polynomial recursion over the entries,
O(n·k) per row) and ``tree`` (products of polynomials up a binary tree,
O(n log k) per row plus one table); :mod:`softk._ops.gradtopk` picks one per
call and holds the autograd rule.  They import nothing from softk, and only
:mod:`softk._ops.gradtopk` imports them.
"""
