"""The maps behind softk's public functions, one file per concept:
``simplex`` (softmax, sparsemax, entmax), ``soft_topk``, ``hard`` (hard top-k,
top-k softmax), ``iterative``, ``topk_sum``, ``normmax``, ``budget``,
``routing``, ``support`` and ``properties`` (the checks of what each map
promises).  Import them from :mod:`softk`.  Imported by ``softk/__init__``
and the floors above (losses, attention, compat, nn, the CLI); imports
:mod:`softk._ops` and below, never a loss.
"""
