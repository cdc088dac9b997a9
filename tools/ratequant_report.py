#!/usr/bin/env python3
"""Report of tools/ratequant_smollm2.sh: perplexity table (mean ± sd over plan
seeds, effective and code bits per element), the issue-5 claims, the fitted
distortion curves, and plots (per-layer / per-head allocation, sensitivity
profiles, perplexity bars).

usage: ratequant_report.py WORK_DIR OUT_PREFIX [--windows N] [--sensitivity NAME]
Writes OUT_PREFIX.json, OUT_PREFIX.md, OUT_PREFIX_alloc_b<budget>.png,
OUT_PREFIX_sensitivity.png, OUT_PREFIX_ppl.png (plots need matplotlib)."""
import argparse
import glob
import json
import math
import os
import re
import struct
import sys


def load(p):
    with open(p) as f:
        return json.load(f)


def mean_sd(v):
    m = sum(v) / len(v)
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1)) if len(v) > 1 else 0.0
    return m, sd


def claim_verdict(a, b):
    """Whether row `a` has lower perplexity than row `b` beyond the seed spread.

    Rows carry 'ppl' (one value per seed) and 'seeds' (the seed of each value). The
    difference d = mean(b) − mean(a) is compared with the spread s: with both rows run
    on the same ≥ 2 seeds, the sample sd of the paired per-seed differences b_s − a_s;
    otherwise sqrt(sd_a² + sd_b²) (0 for two deterministic rows, e.g. KIVI: one run
    each, no randomness). 'holds' when d > s, 'does not hold' when d < −s, else
    'within the seed spread'. Returns (verdict, d, s)."""
    ma, sa = mean_sd(a['ppl'])
    mb, sb = mean_sd(b['ppl'])
    d = mb - ma
    sa_seeds, sb_seeds = a.get('seeds', []), b.get('seeds', [])
    if len(a['ppl']) >= 2 and sorted(sa_seeds) == sorted(sb_seeds) and len(sa_seeds) == len(a['ppl']) \
            and len(sb_seeds) == len(b['ppl']):
        pa = dict(zip(sa_seeds, a['ppl']))
        pb = dict(zip(sb_seeds, b['ppl']))
        spread = mean_sd([pb[k] - pa[k] for k in sorted(pa)])[1]
    else:
        spread = math.sqrt(sa * sa + sb * sb)
    if d > spread:
        return 'holds', d, spread
    if d < -spread:
        return 'does not hold', d, spread
    return 'within the seed spread', d, spread


def read_safetensors(path):
    """Header metadata and F32 tensors as flat lists (no numpy needed)."""
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == '__metadata__' or v['dtype'] != 'F32':
            continue
        a, b = v['data_offsets']
        out[k] = (v['shape'], list(struct.unpack('<%df' % ((b - a) // 4), data[a:b])))
    return hdr.get('__metadata__', {}), out


def sensitivities(stats_path):
    meta, t = read_safetensors(stats_path)
    m = json.loads(meta['ratekv'])
    L, H, d = m['model']['n_layers'], m['model']['n_kv_heads'], m['model']['head_dim']

    def sums(name, width):
        shape, v = t[name]
        return [sum(v[i * width:(i + 1) * width]) for i in range(L * H)]
    s = {'activation': {'k': sums('k_block_energy', d // 2), 'v': sums('v_sq', d)}}
    if 'grad_sq_k_post' in t:
        s['grad'] = {'k': sums('grad_sq_k_post', d), 'v': sums('grad_sq_v', d)}
    return L, H, s


NAME = re.compile(r'^b(?P<b>[0-9.]+)-(?P<q>kivi|quarot|tq-mse|block-gtq)-(?P<m>.+)\.s(?P<seed>\d+)$')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('work')
    ap.add_argument('out')
    ap.add_argument('--windows', type=int, default=0)
    ap.add_argument('--sensitivity', default='grad')
    a = ap.parse_args()
    W, S = a.work, a.sensitivity
    fp = load(os.path.join(W, 'ppl', 'fp32.json'))
    rows = {}
    for p in sorted(glob.glob(os.path.join(W, 'ppl', '*.json'))):
        name = os.path.basename(p)[:-5]
        mt = NAME.match(name)
        if not mt:
            continue
        key = (mt['b'], mt['q'], mt['m'])
        summ = load(os.path.join(W, 'plans', name + '.summary.json'))
        r = rows.setdefault(key, {'budget': float(mt['b']), 'quantizer': mt['q'], 'method': mt['m'], 'ppl': [],
                                  'seeds': [], 'achieved': summ['achieved'], 'plan_method': summ['method']})
        r['ppl'].append(load(p)['ppl'])
        r['seeds'].append(int(mt['seed']))
        if int(mt['seed']) == 0:
            r['diagnostics'] = summ['diagnostics']
    for r in rows.values():
        r['ppl_mean'], r['ppl_sd'] = mean_sd(r['ppl'])
    L, H, sens = sensitivities(os.path.join(W, 'stats.safetensors'))
    curves = load(os.path.join(W, 'curves.json')) if os.path.exists(os.path.join(W, 'curves.json')) else {}

    def get(b, q, m):
        return rows.get((b, q, m))

    def best_uniform(b, q):
        c = [r for (bb, qq, m), r in rows.items() if bb == b and qq == q and
             (m.startswith('uniform-') or m.startswith('alone-'))]
        return min(c, key=lambda r: r['ppl_mean']) if c else None

    budgets = sorted({k[0] for k in rows}, key=float)
    claims = []

    def claim(text, a_name, a, b_name, b):
        v, d, spread = claim_verdict(a, b)
        return {'claim': text, 'a': a_name, 'a_ppl': a['ppl_mean'], 'b': b_name, 'b_ppl': b['ppl_mean'],
                'difference': d, 'spread': spread, 'verdict': v}
    for b in budgets:
        for q in ['kivi', 'quarot', 'tq-mse', 'block-gtq']:
            u = best_uniform(b, q)
            own = get(b, q, 'ratequant-' + S)
            if u and own:
                claims.append(claim(f'RateQuant ({S}) better than the best uniform split, {q} at {b} bits',
                                    own['method'], own, u['method'], u))
            for (bb, qq, m), r in sorted(rows.items()):
                if bb == b and qq == q and m.startswith(f'ratequant-{S}-curves-') and own:
                    claims.append(claim(f'mismatched curves ({m.split("curves-")[1]}) worse than calibrated, {q} at {b} bits',
                                        own['method'], own, m, r))
            b2 = get(b, q, f'ratequant-{S}-bmin2')
            if u and b2:
                claims.append(claim(f'RateQuant ({S}, widths >= 2) better than the best uniform split, {q} at {b} bits',
                                    b2['method'], b2, u['method'], u))
            alt = get(b, q, 'ratequant-activation')
            if alt and own and S != 'activation':
                claims.append(claim(f'gradient sensitivity better than the activation proxy, {q} at {b} bits',
                                    own['method'], own, alt['method'], alt))
        comp = get(b, 'block-gtq', 'ratequant-' + S)
        if comp:
            alone = best_uniform(b, 'block-gtq')
            rqt = get(b, 'tq-mse', 'ratequant-' + S)
            for other, label in [(alone, 'Block-GTQ alone (best split)'), (rqt, 'RateQuant over TQ-MSE alone')]:
                if other:
                    claims.append(claim(f'composed ratequant+block-gtq better than {label} at {b} bits',
                                        'block-gtq/' + comp['method'], comp,
                                        other['quantizer'] + '/' + other['method'], other))

    # Boundary layers: per-layer mean bits of the RateQuant plans and sensitivity ranks.
    boundary = {}
    for name, s in sens.items():
        per_layer = [sum(s['k'][l * H:(l + 1) * H]) + sum(s['v'][l * H:(l + 1) * H]) for l in range(L)]
        order = sorted(range(L), key=lambda l: -per_layer[l])
        boundary[name] = {'per_layer_k_plus_v': per_layer,
                          'rank_of_layer': {str(l): order.index(l) + 1 for l in [0, 1, L - 2, L - 1]},
                          'top5_layers': order[:5]}
    alloc = {}
    for (b, q, m), r in rows.items():
        if m.startswith('ratequant') and 'curves-' not in m and 'ratequant' in r.get('diagnostics', {}):
            bits = r['diagnostics']['ratequant']['bits']
            kb = [[bits[(l * H + h) * 2] for h in range(H)] for l in range(L)]
            vb = [[bits[(l * H + h) * 2 + 1] for h in range(H)] for l in range(L)]
            lm = [(sum(kb[l]) + sum(vb[l])) / (2 * H) for l in range(L)]
            avg = sum(lm) / L
            alloc[f'b{b}/{q}/{m}'] = {'k_bits': kb, 'v_bits': vb, 'layer_mean': lm,
                                     'first_layer': lm[0], 'last_layer': lm[-1], 'mean': avg,
                                     'am_gm': r['diagnostics']['ratequant']['am_gm']}

    rep = {'format': 'ratekv-ratequant-smollm2', 'version': 1,
           'model': 'SmolLM2-135M-Instruct.Q4_1.gguf', 'eval_text': 'eval.txt', 'ctx': 512,
           'windows': fp.get('n_chunks', a.windows), 'scored_tokens': fp.get('n_scored'),
           'calibration': '16 x 512 tokens of calib.txt', 'sensitivity': S,
           'budget_unit': 'code bits per element (average over K and V components); effective = codes + all metadata',
           'fp32_ppl': fp['ppl'], 'rows': sorted(rows.values(), key=lambda r: (r['budget'], r['quantizer'], r['method'])),
           'claims': claims, 'boundary': boundary, 'allocations': alloc, 'curves': curves}
    for r in rep['rows']:
        r.pop('diagnostics', None)
    with open(a.out + '.json', 'w') as f:
        json.dump(rep, f, indent=1)

    md = [f'# RateQuant on SmolLM2-135M-Instruct (Q4_1 weights)\n',
          f'Perplexity with K and V quantized (fake-quant cache, every cached K/V incl. the current token; no fp16 window, no sink), '
          f'{rep["windows"]} windows of 512 tokens of eval.txt ({rep["scored_tokens"]} scored tokens, llama.cpp convention). '
          f'fp32 cache: **{fp["ppl"]:.3f}**. Calibration: 16 × 512 tokens of calib.txt. Main sensitivity: `{S}`. '
          f'Budgets are average **code** bits per element over the 2N = {2 * L * H} K/V components (the paper\'s convention); '
          f'the effective bits (codes + every stored norm/scale/zero) are given in every row. '
          f'Seeds = plan rotation seeds (kivi has no randomness: 1 run). Produced by `bash tools/ratequant_smollm2.sh`.\n']
    if curves:
        md.append('## Fitted distortion curves D(b) = α·β^(−b)\n')
        md.append('MSE per element of post-RoPE K and V through each plan codec at the listed code widths, on the 8192 '
                  'calibration tokens; one β per quantizer and side, one α per (layer, KV head); least squares in ln D.\n')
        md.append('| quantizer | side | widths | β | α min | α median | α max | R² (ln D) | R² within | max \\|Δ ln D\\| |')
        md.append('|---|---|---|---|---|---|---|---|---|---|')
        for q, c in curves.items():
            for side in ['k', 'v']:
                e = c[side]
                md.append(f'| {q} | {side.upper()} | {c["bits"][0]:g}..{c["bits"][-1]:g} | {e["beta"]:.3f} | {e["alpha_min"]:.3g} | '
                          f'{e["alpha_median"]:.3g} | {e["alpha_max"]:.3g} | {e["r2_log"]:.4f} | {e["r2_within"]:.4f} | {e["max_abs_log_err"]:.3f} |')
        md.append('')
    md.append('## Perplexity\n')
    md.append('| budget | quantizer | method | K code | V code | K eff | V eff | avg eff | PPL mean | sd | seeds | per seed |')
    md.append('|---|---|---|---|---|---|---|---|---|---|---|---|')
    for r in rep['rows']:
        ac = r['achieved']
        md.append(f'| {r["budget"]:g} | {r["quantizer"]} | {r["method"]} | {ac["k_code"]:.3f} | {ac["v_code"]:.3f} | '
                  f'{ac["k"]:.3f} | {ac["v"]:.3f} | {ac["total"]:.3f} | {r["ppl_mean"]:.3f} | {r["ppl_sd"]:.3f} | '
                  f'{len(r["ppl"])} | {", ".join(f"{x:.3f}" for x in r["ppl"])} |')
    md.append('\n## Claims\n')
    md.append('A claim "A better than B" holds only when PPL B − PPL A exceeds the seed spread: the sd of the '
              'paired per-seed differences when both rows ran the same seeds, else sqrt(sd_A² + sd_B²).\n')
    md.append('| claim | A | PPL A | B | PPL B | B − A | spread | verdict |')
    md.append('|---|---|---|---|---|---|---|---|')
    for c in claims:
        md.append(f'| {c["claim"]} | {c["a"]} | {c["a_ppl"]:.3f} | {c["b"]} | {c["b_ppl"]:.3f} | '
                  f'{c["difference"]:+.3f} | {c["spread"]:.3f} | {c["verdict"]} |')
    md.append('\n## Boundary layers\n')
    for name, bd in boundary.items():
        md.append(f'- `{name}` sensitivity (K+V summed over heads): top-5 layers {bd["top5_layers"]}; rank of layer 0: '
                  f'{bd["rank_of_layer"]["0"]}, layer {L - 1}: {bd["rank_of_layer"][str(L - 1)]} (of {L}).')
    for k, v in sorted(alloc.items()):
        md.append(f'- {k}: mean bits of layer 0 {v["first_layer"]:.2f}, layer {L - 1} {v["last_layer"]:.2f}, '
                  f'all layers {v["mean"]:.2f}; AM/GM of w·α {v["am_gm"]:.3f}')
    with open(a.out + '.md', 'w') as f:
        f.write('\n'.join(md) + '\n')

    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        print('matplotlib missing: no plots', file=sys.stderr)
        return
    base = os.path.basename(a.out)
    for b in budgets:
        keys = [k for k in sorted(alloc) if k.startswith(f'b{b}/') and k.endswith('-' + S)]
        if not keys:
            continue
        fig, axes = plt.subplots(1, len(keys), figsize=(3.6 * len(keys) + 1.5, 7.5), squeeze=False)
        for i, (ax, k) in enumerate(zip(axes[0], keys)):
            v = alloc[k]
            grid = [v['k_bits'][l] + v['v_bits'][l] for l in range(L)]
            im = ax.imshow(grid, aspect='auto', cmap='viridis', vmin=1, vmax=6)
            ax.set_title(k.split('/')[1] + '\n' + k.split('/')[2], fontsize=8)
            ax.set_xticks(range(2 * H))
            ax.set_xticklabels([f'K{h}' for h in range(H)] + [f'V{h}' for h in range(H)], fontsize=7)
            if i == 0:
                ax.set_ylabel('layer')
            for l in range(L):
                for j in range(2 * H):
                    ax.text(j, l, str(grid[l][j]), ha='center', va='center', fontsize=5, color='w')
        fig.colorbar(im, ax=axes[0].tolist(), label='code bits per element')
        fig.suptitle(f'RateQuant per-head allocation, average {b} code bits ({S} sensitivity)')
        fig.savefig(f'{a.out}_alloc_b{b}.png', dpi=110)
        plt.close(fig)
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    for name, s in sens.items():
        for i, side in enumerate(['k', 'v']):
            per_layer = [sum(s[side][l * H:(l + 1) * H]) for l in range(L)]
            tot = sum(per_layer)
            ax[i].plot(range(L), [x / tot for x in per_layer], marker='o', ms=3, label=name)
    for i, side in enumerate(['K', 'V']):
        ax[i].set_yscale('log')
        ax[i].set_xlabel('layer')
        ax[i].set_title(f'{side} sensitivity per layer (normalized)')
        ax[i].legend()
    fig.tight_layout()
    fig.savefig(f'{a.out}_sensitivity.png', dpi=110)
    plt.close(fig)
    fig, axes = plt.subplots(1, len(budgets), figsize=(7 * len(budgets), 5), squeeze=False)
    for ax, b in zip(axes[0], budgets):
        rs = [r for r in rep['rows'] if f'{r["budget"]:g}' == f'{float(b):g}']
        labels = [f'{r["quantizer"]}\n{r["method"]}' for r in rs]
        ax.barh(range(len(rs)), [r['ppl_mean'] for r in rs], xerr=[r['ppl_sd'] for r in rs], color='tab:blue')
        ax.axvline(fp['ppl'], color='k', ls='--', lw=1, label='fp32 cache')
        ax.set_yticks(range(len(rs)))
        ax.set_yticklabels(labels, fontsize=6)
        ax.set_xscale('log')
        ax.set_xlabel('perplexity (K+V quantized)')
        ax.set_title(f'average {b} code bits')
        ax.legend()
    fig.tight_layout()
    fig.savefig(f'{a.out}_ppl.png', dpi=110)
    plt.close(fig)


if __name__ == '__main__':
    main()
