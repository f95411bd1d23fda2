"""softk inside other libraries' models.

* :mod:`softk.integrations.transformers`: :func:`~softk.integrations.transformers.apply_softk`
  makes a Hugging Face causal language model train on softk's fused linear
  loss (cross-entropy or a Fenchel–Young loss) without ever holding the
  N×V logits; :func:`~softk.integrations.transformers.remove_softk` and the
  :func:`~softk.integrations.transformers.softk_loss` context manager undo it.
* ``softk.integrations.hf_attention`` (its own module, with a ``register()``
  function): sparse attention registered with transformers' attention
  interface.
* :mod:`softk.integrations.hf_moe`: :func:`~softk.integrations.hf_moe.apply_softk_router`
  replaces the router of every mixture-of-experts layer of a transformers
  model with a softk map (sparsemax, entmax, soft top-k, budget), zero
  weights skipping their expert; :func:`~softk.integrations.hf_moe.remove_softk_router`
  undoes it.
* :mod:`softk.integrations.megatron`: :func:`~softk.integrations.megatron.megatron_loss`
  gives every softk loss Megatron-LM's cross-entropy signature
  ``target(logits[s, b, V/tp], labels, tp_group) -> [s, b]`` on the
  vocab-parallel logits (no Megatron import).
* :mod:`softk.integrations.torchtitan`: :class:`~softk.integrations.torchtitan.SoftkLoss`,
  every softk loss with torchtitan's loss-object interface (no torchtitan import).
* :mod:`softk.integrations.torchtitan_attention`: :func:`~softk.integrations.torchtitan_attention.apply_softk_attention`
  puts softk's attention in a torchtitan decoder's inner-attention slot,
  context-parallel on torchtitan's sequence shards when asked.

Nothing here imports transformers at ``import softk`` time; each submodule is
imported on its own (``pip install "softk[hf]"``).  No softk package imports
this one; it imports nn, attention, distributed, the losses and below.
"""
