"""A/B timing of softk.sparsemax at 256x32000 float32, forward and forward+backward
(p50, p20 in ms over 15 rounds, 1 thread), for comparing two checkouts in
separate processes:  PYTHONPATH=src python benchmarks/cpu/ab_sparsemax_wide.py LABEL
"""
import torch, time, softk, sys
torch.set_num_threads(1)
x = torch.randn(256, 32000)
g = torch.randn(256, 32000)
def t(f, n=15):
    for _ in range(3): f()
    ts=[]
    for _ in range(n):
        a=time.perf_counter(); f(); ts.append(time.perf_counter()-a)
    ts.sort(); return round(ts[n//2]*1e3,2), round(ts[n//5]*1e3,2)
def fb():
    xg = x.clone().requires_grad_()
    y = softk.sparsemax(xg); y.backward(g)
print(sys.argv[1], "fwd", t(lambda: softk.sparsemax(x)), "fwd+bwd", t(fb))
