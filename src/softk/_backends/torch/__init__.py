"""The torch kernels: plain tensor code on every device, the reference the
native and Triton kernels are checked against (:mod:`.threshold`: the
threshold maps' forward and backward)."""
