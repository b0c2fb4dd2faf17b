"""Weight-only probe: Qwen's bf16 weights replaced by their int4 round trip with groups of G
inputs (scale and zero per group, as weights.quantize_levels), run through --quant none."""
import os, sys, torch
import dyncomplete.models.fast as fast
G = int(os.environ.get("GROUP", "0"))
orig = fast.Linear

def roundtrip(w, g):
    n, k = w.shape
    x = w.detach().float().reshape(n, k // g, g)
    lo, hi = x.amin(-1), x.amax(-1)
    s = ((hi - lo) / 15).clamp_min(1e-8).to(torch.bfloat16).float()
    z = (lo + 8 * s).to(torch.bfloat16).float()
    q = torch.round((x - z[..., None]) / s[..., None] + 8).clamp_(0, 15)
    return ((q - 8) * s[..., None] + z[..., None]).reshape(n, k).to(w.dtype)

def patched(weight, bias, quant, invariant, packed=None):
    if G and quant == "none":
        with torch.no_grad():
            weight.copy_(roundtrip(weight, G))
    return orig(weight, bias, quant, invariant, packed=packed)

fast.Linear = patched
from dyncomplete.cli import main
sys.exit(main(sys.argv[1:]))
