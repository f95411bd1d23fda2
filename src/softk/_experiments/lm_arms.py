"""The arms of ``softk experiment lm`` by name (strings only, so that the command
line lists them without importing the experiment): ``regime/loss/attention``.

>>> ARMS[:2]
('scratch/cross_entropy/softmax', 'scratch/sparsemax/softmax')
"""

# every loss trained from scratch with softmax attention (ts2_adaptive: loss "ts2", adaptive=True)
LOSS_ARMS = ("cross_entropy", "sparsemax", "entmax15", "ts2", "ts2_adaptive", "topk_softmax_ce")
# attention name -> transformers attn_implementation ("sdpa": torch's softmax attention)
ATTENTIONS = {"softmax": "sdpa", "entmax15": "softk_entmax15", "entmax_learned": "softk_entmax_learned"}
# the losses of the fine-tuning stage after cross-entropy pre-training
FT_LOSSES = ("cross_entropy", "topk_softmax_ce", "ts2")
REGIMES = ("scratch", "finetune")
ARMS = tuple([f"scratch/{loss}/softmax" for loss in LOSS_ARMS]
             + [f"scratch/cross_entropy/{att}" for att in ATTENTIONS if att != "softmax"]
             + [f"finetune/{loss}/softmax" for loss in FT_LOSSES])
