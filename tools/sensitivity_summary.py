#!/usr/bin/env python3
"""Summary of the gradient sensitivity in a `ratekv calibrate --sensitivity` file.

usage: sensitivity_summary.py STATS.safetensors [PLOT.png]

Prints (markdown) the per-layer and per-head spread of
  grad:       w_K = E_t ||dL/dk||^2 (sum of grad_sq_k_post), w_V = E_t ||dL/dv||^2 (grad_sq_v)
  activation: w_K = E_t ||k||^2 (sum of k_block_energy),      w_V = E_t ||v||^2 (v_sq)
(docs/calibration_stats.md): max/min over all (layer, KV head) components, AM/GM (RateQuant's
predicted gain bound for w alone), the most sensitive layers, the Spearman rank correlation
between the two estimators, and grad x energy (w times E||x||^2: the loss weight of a relative MSE,
i.e. w*alpha for a quantizer whose MSE scales with the vector energy, as TQ-MSE's does). With PLOT.png, a per-layer plot (log scale, mean over KV heads).
"""
import json
import struct
import sys

import numpy as np

if len(sys.argv) not in (2, 3):
    sys.exit(__doc__)
path = sys.argv[1]
f = open(path, 'rb')
n = struct.unpack('<Q', f.read(8))[0]
h = json.loads(f.read(n))
base = 8 + n


def tensor(name):
    m = h[name]
    a, b = m['data_offsets']
    f.seek(base + a)
    return np.frombuffer(f.read(b - a), dtype=np.float32).reshape(m['shape']).astype(np.float64)


meta = json.loads(h['__metadata__']['ratekv'])
if 'sensitivity' not in meta:
    sys.exit(f'{path}: no gradient sensitivity (run ratekv calibrate --sensitivity)')
s = meta['sensitivity']
w = {
    ('grad', 'K'): tensor('grad_sq_k_post').sum(-1),
    ('grad', 'V'): tensor('grad_sq_v').sum(-1),
    ('activation', 'K'): tensor('k_block_energy').sum(-1),
    ('activation', 'V'): tensor('v_sq').sum(-1),
}
# w·E||x||^2: the first-order loss increase per unit *relative* MSE (a quantizer whose MSE scales
# with the vector energy, as TQ-MSE's does: alpha ~ E||x||^2), what RateQuant's w·alpha weighs.
w[('grad x energy', 'K')] = w[('grad', 'K')] * w[('activation', 'K')]
w[('grad x energy', 'V')] = w[('grad', 'V')] * w[('activation', 'V')]
kpre = tensor('grad_sq_k_pre').sum(-1)
L, H = w[('grad', 'K')].shape


def ranks(x):
    r = np.empty(len(x))
    r[np.argsort(x, kind='stable')] = np.arange(len(x))
    return r


def spearman(a, b):
    return float(np.corrcoef(ranks(a.ravel()), ranks(b.ravel()))[0, 1])


print(f"Model {meta['model']['file']} ({L} layers x {H} KV heads), text {meta['text']['file']}: "
      f"{s['n_sequences']} sequences x {s['seq_len']} tokens, mean loss {s['mean_loss']:.4f} nats.")
print(f"Pre- vs post-RoPE key sums: max relative difference "
      f"{np.max(np.abs(kpre - w[('grad', 'K')]) / w[('grad', 'K')]):.1e} (RoPE is orthogonal).\n")
print('| estimator | side | max/min over components | AM/GM | max/min of layer means | top-5 layers (layer mean) |')
print('| --- | --- | --- | --- | --- | --- |')
for (est, side), x in w.items():
    lm = x.mean(1)
    top = np.argsort(-lm)[:5]
    am, gm = x.mean(), np.exp(np.log(x).mean())
    print(f"| {est} | {side} | {x.max() / x.min():.1f} | {am / gm:.2f} | {lm.max() / lm.min():.1f} | "
          + ', '.join(f'{i} ({lm[i] / lm.mean():.2f}x)' for i in top) + ' |')
print()
print(f"Spearman rank correlation grad vs activation over the {L * H} components: "
      f"K {spearman(w[('grad', 'K')], w[('activation', 'K')]):.2f}, "
      f"V {spearman(w[('grad', 'V')], w[('activation', 'V')]):.2f}; "
      f"grad K vs grad V {spearman(w[('grad', 'K')], w[('grad', 'V')]):.2f}.")
gk, gv = w[('grad', 'K')].mean(1), w[('grad', 'V')].mean(1)
print(f"Layer means, grad (relative to the mean over layers): layer 0 K {gk[0] / gk.mean():.2f}x "
      f"V {gv[0] / gv.mean():.2f}x; layer {L - 1} K {gk[-1] / gk.mean():.2f}x V {gv[-1] / gv.mean():.2f}x; "
      f"rank of layer 0 / {L - 1} among {L} layers (1 = most sensitive): "
      f"K {int(L - ranks(gk)[0])} / {int(L - ranks(gk)[-1])}, V {int(L - ranks(gv)[0])} / {int(L - ranks(gv)[-1])}.")
ek, ev = w[('grad x energy', 'K')].mean(1), w[('grad x energy', 'V')].mean(1)
print(f"grad x energy: layer 0 K {ek[0] / ek.mean():.2f}x V {ev[0] / ev.mean():.2f}x; layer {L - 1} K "
      f"{ek[-1] / ek.mean():.2f}x V {ev[-1] / ev.mean():.2f}x; ranks of layer 0 / {L - 1}: "
      f"K {int(L - ranks(ek)[0])} / {int(L - ranks(ek)[-1])}, V {int(L - ranks(ev)[0])} / {int(L - ranks(ev)[-1])}.")
print('\nPer-layer grad sensitivity (mean over KV heads; K | V), relative to the mean over layers:')
print(' '.join(f'{l}:{gk[l] / gk.mean():.2f}|{gv[l] / gv.mean():.2f}' for l in range(L)))

if len(sys.argv) == 3:
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 3, figsize=(14, 3.8))
    for i, est in enumerate(['grad', 'activation', 'grad x energy']):
        for side, c in (('K', 'tab:blue'), ('V', 'tab:orange')):
            x = w[(est, side)]
            ax[i].plot(range(L), x.mean(1) / x.mean(), '-o', ms=3, color=c, label=f'{side} (mean over heads)')
            for hh in range(H):
                ax[i].plot(range(L), x[:, hh] / x.mean(), '.', ms=2, color=c, alpha=0.5)
        ax[i].set_yscale('log')
        ax[i].set_xlabel('layer')
        ax[i].set_title({'grad': 'grad: E||dL/dK||^2, E||dL/dV||^2',
                         'activation': 'activation: E||K||^2, E||V||^2',
                         'grad x energy': 'grad x energy (w x alpha for MSE ~ energy)'}[est], fontsize=9)
        ax[i].legend(fontsize=8)
    ax[0].set_ylabel('w / mean over components')
    fig.suptitle(f"{meta['model']['file']}: sensitivity per layer ({s['n_sequences']}x{s['seq_len']} tokens)",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
