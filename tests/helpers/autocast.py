"""A model run under torch.autocast("cpu", bfloat16), the standard mixed-precision recipe, or in its
own dtype: the outputs at real tokens and the loss, and the backward of loss + weighted outputs."""
import torch

BF16 = torch.bfloat16


def run(model, is_fastbert, ids, mask, tt, extra, weights, autocast):
    """The outputs at real tokens and the loss (fp32), and the backward of loss + weighted outputs."""
    ctx = torch.autocast("cpu", dtype=BF16) if autocast else torch.autocast("cpu", enabled=False)
    with ctx:
        out = model(ids, mask, tt, **extra) if is_fastbert else model(
            input_ids=ids, attention_mask=mask, token_type_ids=tt, **extra)
    got, total = {}, 0.0
    for key in out.keys():
        a = out[key]
        if not isinstance(a, torch.Tensor) or key in ("hidden_states", "attentions"):
            continue
        if a.dim() >= 2 and tuple(a.shape[:2]) == tuple(ids.shape):
            a = a[mask.bool()]
        got[key] = a.float()
        w = weights.setdefault(key, torch.randn(a.shape, generator=torch.Generator().manual_seed(len(weights))))
        total = total + (a.double() * w.double()).sum()
    total.backward()
    return got, dict(model.named_parameters())
