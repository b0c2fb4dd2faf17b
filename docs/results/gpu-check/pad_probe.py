import torch
torch.manual_seed(0)
for dtype in (torch.bfloat16, torch.float32):
    for (n, k) in ((1152, 896), (9728, 896), (896, 4864), (151936, 896)):
        w = torch.randn(n, k, device="cuda", dtype=dtype) * 0.02
        x = torch.randn(16, k, device="cuda", dtype=dtype)
        one = x[:1] @ w.t()
        eight = (x[:8] @ w.t())[:1]
        pad1 = (torch.cat([x[:1], torch.zeros(15, k, device="cuda", dtype=dtype)]) @ w.t())[:1]
        pad8 = (torch.cat([x[:8], torch.zeros(8, k, device="cuda", dtype=dtype)]) @ w.t())[:1]
        lin1 = torch.nn.functional.linear(torch.cat([x[:1], x[8:]]), w)[:1]  # 16 rows, other content
        print(dtype, n, k, "M=1 vs M=8:", torch.equal(one, eight), "| padded to 16 (1 vs 8 real rows):",
              torch.equal(pad1, pad8), "| 16 rows, other rows' content:", torch.equal(pad1, lin1), flush=True)
