"""The attack-drill tables of benchmarks/dropin/README.md, from the stored drill cells (issue 42).

Usage: ``python benchmarks/dropin/drills_table.py sgdm-0.05 bn-sgdm-0.05`` (settings to tabulate).
The cells are written by ``run.py --attack <kind> --attackers 1 --out benchmarks/dropin/drill-<kind>``
(and ``--out benchmarks/dropin/drill-clean`` without an attack).
"""
import json, statistics, pathlib, sys
root = pathlib.Path(__file__).resolve().parent
def cells(folder):
    p = root / folder / 'cells.jsonl'
    return [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []
def row(cs, strategy, setting):
    rs = [c for c in cs if c['strategy'] == strategy and c['setting'] == setting]
    if not rs: return None
    f = [c['final'] for c in rs]; div = sum(1 for c in rs if c.get('diverged'))
    return rs, f, div
def fmt(cs, strategy, setting):
    r = row(cs, strategy, setting)
    if r is None: return "–"
    rs, f, div = r
    sd = statistics.stdev(f) if len(f) > 1 else 0.0
    extra = f", {div} diverged" if div else ""
    return f"{statistics.mean(f):.3f} ± {sd:.3f} ({len(f)}{extra})"
ATT = [("drill-clean", "none (honest)"), ("drill-noise", "noise, sd 10"), ("drill-sign-flip", "sign-flip"), ("drill-scale", "scale × 10")]
STR = [("flower-fedavg", "Flower FedAvg"), ("flower-fedmedian", "Flower FedMedian"), ("flower-fedtrimmedavg", "Flower FedTrimmedAvg (β 0.2)"),
       ("fedbuff", "**FedBuff, default (bound on)**"), ("fedbuff-nobound", "FedBuff, `update_norm_bound=0`"), ("fedbuff-reject", "FedBuff, `update_norm_action=\"reject\"`"),
       ("fedbuff:aggregation=median", "FedBuff, `aggregation=\"median\"` (default buffer: 2 at 8 nodes, 10 at 50)"),
       ("fedbuff:buffer_size=5", "FedBuff, `buffer_size=5`"),
       ("fedbuff:aggregation=median,buffer_size=5", "FedBuff, `buffer_size=5, aggregation=\"median\"`"),
       ("fedasync", "**FedAsync, default (bound on)**"), ("fedasync-nobound", "FedAsync, `update_norm_bound=0`"), ("fedasync-reject", "FedAsync, `update_norm_action=\"reject\"`")]
for setting in sys.argv[1:]:
    data = {f: cells(f) for f, _ in ATT}
    if not any(c['setting'] == setting for cs in data.values() for c in cs):
        continue
    print(f"| {setting}: strategy | " + " | ".join(a for _, a in ATT) + " |")
    print("|---|" + "---|" * len(ATT))
    for s, label in STR:
        vals = [fmt(data[f], s, setting) for f, _ in ATT]
        if all(v == "–" for v in vals): continue
        print(f"| {label} | " + " | ".join(vals) + " |")
    print()
    # honest clipping
    cl = data["drill-clean"]
    for s in ("fedbuff", "fedasync", "fedbuff-reject", "fedasync-reject"):
        rs = [c for c in cl if c['strategy'] == s and c['setting'] == setting]
        kind = "rejected" if s.endswith("reject") else "clipped"
        if rs:
            counts = " / ".join(str(c.get(f"update-norm-{kind}")) for c in rs)
            ratios = " / ".join(f"{c.get('update-norm-largest-ratio'):.1f}" for c in rs)
            print(f"- honest `{s}`: {kind} {counts} of {rs[0]['updates']} updates per seed; largest norm / reference "
                  f"{ratios}")
    print()
    dp = [("fedbuff-b4", None), ("fedbuff-b4-dp0.05", 0.05), ("fedbuff-b4-dp0.2", 0.2), ("fedbuff-b4-dp1", 1.0)]
    if any(c['strategy'] == 'fedbuff-b4' and c['setting'] == setting for c in cl):
        print(f"| {setting}: DP-FedBuff (B 4, server_lr 1, C 0.3) | noise multiplier σ | final accuracy | ε at δ = 1e-5 (the most any client spent) | releases |")
        print("|---|---|---|---|---|")
        for s, sigma in dp:
            rs = [c for c in cl if c['strategy'] == s and c['setting'] == setting]
            if not rs: continue
            eps = [c.get('dp-epsilon') for c in rs if c.get('dp-epsilon') is not None]
            e = f"{statistics.mean(eps):,.0f} ({min(eps):,.0f}–{max(eps):,.0f})" if eps else "– (not private)"
            rel = rs[0].get('dp-releases', rs[0]['versions'])
            print(f"| `{s}` | {sigma if sigma is not None else '–'} | {fmt(cl, s, setting)} | {e} | {rel} |")
        print()
