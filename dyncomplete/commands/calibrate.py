"""`dyncomplete calibrate`: pick exit-policy thresholds that keep a target agreement with the
full model on the calib split."""

from __future__ import annotations

import argparse
import json

from ..exits.policies import POLICIES, ExitPolicy, make_policy, policy_class
from ..exits.shortlist import DEFAULT_SIZE
from ._common import add_model_options, load_from_args, out_file


def run(args) -> int:
    from ..exits.heads import lens_heads, load_heads
    from ..exits.shortlist import Shortlist
    from ..energy.work import layer_macs
    from ..training.calibrate import calibrate, calibrate_checks, layer_signals
    from ..training.collect import cached_collect

    out = out_file(args.out)
    model = load_from_args(args)
    heads = load_heads(model, args.heads)
    if args.lens:
        heads = lens_heads(model, heads.layers)
    data = cached_collect(model, heads.layers, "calib", args.tokens)
    names = list(POLICIES) if args.policy == "all" else args.policy.split(",")
    signals = layer_signals(heads, data, names, shortlist=Shortlist(model, args.short) if args.short else None)
    suffix = "" if args.short == DEFAULT_SIZE else f"/short={args.short}"
    results = {}
    for name in names:
        shortlisted = policy_class(name).needs_logits
        results[name] = {t: calibrate(heads, signals, name, t, suffix=suffix if shortlisted else "")
                         for t in args.target}
        if args.checks and policy_class(name).reset is ExitPolicy.reset:  # no state along a token's checks
            policy = make_policy(name, 0.5, model, heads)
            work = policy.decision_macs() + (heads.map_macs() + args.short * model.hidden_size if shortlisted else 0)
            results[name + " checks"] = {t: calibrate_checks(heads, signals, name, t, args.checks, work / layer_macs(model))
                                         for t in args.target}
    for name, by_target in results.items():
        for t, r in by_target.items():
            print(f"{r['method']:<48} target {t:.3f}: agreement {r['agreement']:.3f}, "
                  f"{r['layers_per_token']:.2f} layers/token, {r['checks_per_token']:.2f} checks, "
                  f"{100 * r['exit_share']:.0f}% exit")
    agreement = {e: round(float(a), 4) for e, a in zip(heads.layers, signals.agree.float().mean(1))}
    record = {"model": model.name, "heads": heads.kind, "tokens": len(data), "per_layer_agreement": agreement,
              "policies": results}
    if out:
        out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({"per_layer_agreement": agreement}))
    return 0


def check_counts(text: str) -> range:
    """`--checks N-M` (or `N`): the sizes of check-layer sets to try."""
    low, _, high = text.partition("-")
    try:
        sizes = range(int(low), int(high or low) + 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N-M, for example 2-4, got {text!r}") from None
    if not sizes or sizes.start < 1:
        raise argparse.ArgumentTypeError(f"expected 1 <= N <= M, got {text!r}")
    return sizes


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="choose exit thresholds for a target agreement (calib split)")
    add_model_options(p)
    p.add_argument("--policy", default="all", help=f"comma list of {', '.join(POLICIES)}, or all")
    p.add_argument("--target", type=float, nargs="+", default=[0.95, 0.99], help="agreement(s) to keep")
    p.add_argument("--heads", default=None, help="exit heads file (default: the shipped heads)")
    p.add_argument("--lens", action="store_true", help="calibrate plain logit-lens heads on the same layers")
    p.add_argument("--short", type=int, default=DEFAULT_SIZE,
                   help="shortlist rows the logit policies decide on, as `early-exit:.../short=N` (0: full head)")
    p.add_argument("--checks", type=check_counts, default=None, metavar="N-M",
                   help="also pick, per policy and target, the best set of N to M check layers (`/at=`), each check "
                        "counted as its multiply-accumulates in layers (for example 2-4)")
    p.add_argument("--tokens", type=int, default=2000, help="calib-split tokens")
    p.add_argument("--out", default=None, help="write thresholds and curves as JSON")
    p.set_defaults(run=run)
