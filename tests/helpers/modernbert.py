"""ModernBERT beside transformers' ModernBERT classes: a small config whose global and sliding layers
alternate, seeded random weights in every tensor, batches with [CLS] / [SEP] and padding, labels for
each head, and the checks the ModernBERT-shaped families share (errors against transformers,
packed against padded, checkpoints both ways)."""
import contextlib
import copy
import json

import pytest
import torch

import fastbert

transformers = pytest.importorskip("transformers")

SMALL = dict(vocab_size=100, hidden_size=64, num_attention_heads=4, intermediate_size=96, num_hidden_layers=4,
             local_attention=8, pad_token_id=0, cls_token_id=1, sep_token_id=2, bos_token_id=1, eos_token_id=2)
# every bias and the other options on: biased LayerNorms, attention and MLP, the tanh GELU, an untied
# decoder without a bias, a SiLU prediction head, a global layer every 2
BIASED = dict(SMALL, norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True, decoder_bias=False,
              tie_word_embeddings=False, hidden_activation="gelu_pytorch_tanh", classifier_activation="silu",
              global_attn_every_n_layers=2, local_rope_theta=500.0, global_rope_theta=20000.0)
REL = 1e-4  # max abs error allowed, relative to the largest value compared (fp32)
FLOOR = 1e-2  # the smallest magnitude an error is measured against
LENGTHS = (30, 17, 26, 5)  # right padding, mixed lengths (the first row full)


def randomize(model, seed, scale=0.1):
    """Every parameter drawn afresh: LayerNorm weights 1 + N(0, scale), the rest N(0, scale)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = scale * torch.randn(p.shape, generator=g)
            p.copy_(1 + noise if "norm" in name and name.endswith("weight") else noise)


def hf_config(base=None, **kw):
    return transformers.ModernBertConfig(**dict(SMALL if base is None else base, **kw), attn_implementation="eager")


def pair(name, base=None, seed=0, backend=None, **kw):
    """(transformers' model, fastbert's on `backend`) with the same random weights, loaded strictly (every key)."""
    torch.manual_seed(seed)
    hc = hf_config(base, num_labels=2 if name.endswith("QuestionAnswering") else 3, **kw)
    hm = getattr(transformers, name)(hc).eval()
    randomize(hm, seed)
    cls = getattr(fastbert, name)
    fm = cls(cls.config_class(**hc.to_dict())).eval()
    fm.load_state_dict(hm.state_dict(), strict=True)
    return hm, fm.set_backend(backend)


def batch(bsz, seq, g, lengths=None, left=False, config=SMALL):
    """(input_ids starting with [CLS] and ending each sequence with [SEP], attention_mask): the ids of
    `config` (vocab_size, cls_token_id, sep_token_id, pad_token_id; ModernBERT's small one by default)."""
    lengths = lengths or (seq,) * bsz
    ids = torch.randint(3, config["vocab_size"], (bsz, seq), generator=g)
    mask = torch.zeros(bsz, seq, dtype=torch.long)
    for b, n in enumerate(lengths):
        span = slice(seq - n, seq) if left else slice(0, n)
        mask[b, span] = 1
        ids[b, span.start] = config["cls_token_id"]
        ids[b, span.stop - 1] = config["sep_token_id"]
    return ids.masked_fill(mask == 0, config["pad_token_id"]), mask


def inputs(name, seed, lengths=LENGTHS, left=False):
    """(input_ids, attention_mask, the labels of name's head) of a batch of 4 x 30 (lengths None: no padding)."""
    g = torch.Generator().manual_seed(seed)
    ids, mask = batch(4, 30, g, lengths, left)
    return ids, mask, labels_for(name, ids, mask, g)


def labels_for(name, ids, mask, g):
    """The labels of name's head (by its suffix: ModernBERT's and MPNet's heads alike), for 3 classes."""
    bsz, seq = ids.shape
    if name.endswith("ForMaskedLM"):
        return dict(labels=torch.where((torch.rand(bsz, seq, generator=g) < 0.3) & (mask == 1), ids, -100))
    if name.endswith("ForSequenceClassification"):
        return dict(labels=torch.randint(0, 3, (bsz,), generator=g))
    if name.endswith("ForTokenClassification"):
        return dict(labels=torch.randint(0, 3, (bsz, seq), generator=g).masked_fill(mask == 0, -100))
    if name.endswith("ForQuestionAnswering"):
        return dict(start_positions=torch.randint(0, seq + 3, (bsz,), generator=g),
                    end_positions=torch.randint(0, seq + 3, (bsz,), generator=g))
    return {}


def check_close(errors, tag, got, want):
    """Records and checks the max abs error of got against want (relative to want's magnitude)."""
    assert got.shape == want.shape, f"{tag}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{tag}: non-finite values"
    err = (got.double() - want.double()).abs().max().item() if got.numel() else 0.0
    scale = max(want.abs().max().item() if want.numel() else 0.0, FLOOR)
    errors[tag] = err
    assert err <= REL * scale, f"{tag}: max abs error {err:.3e} > {REL:g} x {scale:.3e}"


def parity(hm, fm, ids, mask, extra=None, grads=True, grad_check=None, **kwargs):
    """Every output of fastbert's model against transformers' (per-token ones at the real tokens),
    then every parameter's gradient of (loss + random-weighted outputs). -> {what: max abs error}.
    grad_check(errors, name, ours, theirs): a family's own check of a parameter's gradient, True
    where it made one (MPNet's key bias, which has none in exact arithmetic)."""
    real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    hout, fout = (m(input_ids=ids, attention_mask=mask, **(extra or {}), **kwargs) for m in (hm, fm))
    assert list(fout.keys()) == list(hout.keys())
    errors, totals = {}, [0.0, 0.0]
    g = torch.Generator().manual_seed(5)
    for key in fout.keys():
        many = key in ("hidden_states", "attentions")  # one per layer; attentions: every row, padded ones too
        assert not many or len(fout[key]) == len(hout[key]), key
        pairs = zip(fout[key], hout[key]) if many else [(fout[key], hout[key])]
        for i, (a, b) in enumerate(pairs):
            if a.dim() >= 2 and tuple(a.shape[:2]) == tuple(ids.shape):
                a, b = a[real], b[real]
            check_close(errors, f"{key}[{i}]" if many else key, a, b)
            w = torch.randn(a.shape, generator=g)
            totals = [totals[0] + (a * w).sum(), totals[1] + (b * w).sum()]
    if not grads:
        return errors
    for total in totals:
        total.backward()
    theirs = dict(hm.named_parameters(remove_duplicate=False))  # a tied weight under either name
    ours = dict(fm.named_parameters())
    assert set(ours) <= set(theirs) and len(ours) == len(dict(hm.named_parameters()))
    for pname, p in ours.items():
        assert p.grad is not None and theirs[pname].grad is not None, f"no gradient for {pname}"
        if grad_check is None or not grad_check(errors, pname, p, theirs):
            check_close(errors, f"grad {pname}", p.grad, theirs[pname].grad)
    return errors


def assert_full_size_matches(hm, parity, seq, short, pad=None, **kw):
    """fastbert's twin of hm (a full-size transformers model, its weights drawn), built on the meta
    device and given hm's own tensors (no second copy of the weights), on cpp: parity without
    gradients on 2 rows of `seq` tokens, the second padded after `short` (its padded ids set to pad
    when given), compares last_hidden_state alone. kw: the fastbert class's own arguments."""
    cls = getattr(fastbert, type(hm).__name__)
    with torch.device("meta"):
        fm = cls(cls.config_class(**hm.config.to_dict()), **kw)
    fm.load_state_dict(hm.state_dict(), strict=True, assign=True)
    fm.eval().set_backend("cpp")
    g = torch.Generator().manual_seed(12)
    ids = torch.randint(3, hm.config.vocab_size, (2, seq), generator=g)
    mask = torch.ones_like(ids)
    mask[1, short:] = 0
    if pad is not None:
        ids = ids.masked_fill(mask == 0, pad)
    with torch.no_grad():
        errors = parity(hm, fm, ids, mask, grads=False)
    assert set(errors) == {"last_hidden_state"}


def assert_paths_agree(hm, fm, base, ids, mask, extra, parity_check):
    """The packed and the padded path (base.unpad_inputs) each pass parity_check against transformers,
    and agree with each other: token logits at real tokens and every parameter's gradient."""
    results = []
    for unpad in (True, False):
        base.unpad_inputs = unpad
        hm.zero_grad()
        fm.zero_grad()
        parity_check(hm, fm, ids, mask, extra)
        out = fm(input_ids=ids, attention_mask=mask, **extra)
        results.append((out.logits[mask.bool()], {n: p.grad.clone() for n, p in fm.named_parameters()}))
    (a, ga), (b, gb) = results
    errors = {}
    check_close(errors, "logits", a, b)
    for n in ga:
        check_close(errors, n, ga[n], gb[n])


def assert_checkpoints_both_ways(tmp_path, hm, name, inputs, output_name):
    """transformers' save -> fastbert's from_pretrained and the Auto class -> save_pretrained ->
    transformers' from_pretrained: the same weights (nothing missing or left over), the same outputs
    (output_name, at real tokens) on inputs (ids, mask). Returns the config.json fastbert saved."""
    hm.save_pretrained(tmp_path / "hf")
    fm = getattr(fastbert, name).from_pretrained(str(tmp_path / "hf"))
    task = {"Model": fastbert.AutoModel, "ForMaskedLM": fastbert.AutoModelForMaskedLM,
            "ForSequenceClassification": fastbert.AutoModelForSequenceClassification,
            "ForTokenClassification": fastbert.AutoModelForTokenClassification,
            "ForQuestionAnswering": fastbert.AutoModelForQuestionAnswering}
    auto = next(cls for suffix, cls in task.items() if name.endswith(suffix))
    assert type(auto.from_pretrained(str(tmp_path / "hf"))) is type(fm)
    fm.save_pretrained(str(tmp_path / "fb"))
    saved = json.loads((tmp_path / "fb" / "config.json").read_text())
    assert saved["architectures"] == [name]
    back, info = getattr(transformers, name).from_pretrained(str(tmp_path / "fb"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    theirs = hm.state_dict()
    assert list(back.state_dict()) == list(theirs) == list(fm.state_dict())
    for k, v in back.state_dict().items():
        assert torch.equal(v, theirs[k]), k
        assert torch.equal(fm.state_dict()[k], theirs[k]), k
    ids, mask = inputs
    with torch.no_grad():
        for m in (fm, back.eval()):
            got, want = (getattr(x(input_ids=ids, attention_mask=mask), output_name) for x in (m, hm))
            if got.shape[:2] == ids.shape:
                got, want = got[mask.bool()], want[mask.bool()]
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    return saved


def outputs_and_grads(model, ids, mask, labels, mode=None, fn=None):
    """{logits and the last hidden state at real tokens, loss, "grad <name>" of every parameter} in fp32,
    of fn (model by default) in `mode`: "bf16 model" (a bf16 copy), "autocast" (bf16), None: as it is."""
    model = copy.deepcopy(model).to(torch.bfloat16) if mode == "bf16 model" else model
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16) if mode == "autocast" else contextlib.nullcontext():
        out = (model if fn is None else fn)(input_ids=ids, attention_mask=mask, output_hidden_states=True, **labels)
    out.loss.backward()
    got = dict(logits=out.logits[mask.bool()], last_hidden_state=out.hidden_states[-1][mask.bool()], loss=out.loss,
               **{f"grad {n}": p.grad for n, p in model.named_parameters()})
    return {k: v.float() for k, v in got.items()}
