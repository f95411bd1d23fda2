"""Drop-in replacements for other packages' APIs, running on softk.

* :mod:`softk.compat.entmax`: the entmax package (deep-spin/entmax 1.3 and
  master): ``import softk.compat.entmax as entmax``.

Nothing here is imported by ``import softk``; import the submodule you need.
No softk package imports it; it imports the losses, maps and ops below it.
"""
