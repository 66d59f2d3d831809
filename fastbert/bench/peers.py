"""The engines a user would deploy instead of fastbert on a CPU, as encoder-benchmark providers.

    onnxruntime   torch.onnx export of transformers' BertModel (eager attention), then
                  onnxruntime.transformers' BERT optimizer (its EmbedLayerNorm / Attention /
                  SkipLayerNorm / BiasGelu fusions); fp32, and int8: that graph through
                  onnxruntime.quantization.quantize_dynamic (int8 weights, activations quantized
                  dynamically per tensor)
    openvino      openvino.convert_model of transformers' BertModel, compiled for the CPU with the
                  dtype as its inference precision hint; int8: that model through NNCF's
                  post-training quantization (nncf.quantize, model type TRANSFORMER: int8 weights
                  and activations, the activations' scales calibrated on the run's own inputs, the
                  best case for its accuracy), compiled the same way
    ctranslate2   CTranslate2's transformers converter and its Encoder (float32, and compute type
                  int8; no bf16 on CPUs)
    torch.compile torch.compile of transformers' BertModel (sdpa), in the dtype

Each is converted from the same random-weight transformers model inside the run (`pip install
-e .[peers]` installs them); a missing package or a failed conversion skips that peer with a
printed reason. Every provider returns the last hidden state [batch, seq, hidden] as a tensor, so
its error against the fp32 reference can be measured on the real tokens.

The ONNX export is one function, export_onnx: torch.onnx.export of the model's last hidden state
with its eager attention, the TorchScript exporter at opset 17, the batch and sequence axes of
input_ids and attention_mask dynamic. The encoder benchmark's ONNX Runtime peer optimizes that
file for BERT; onnx_peers runs it as exported on ONNX Runtime and on OpenVINO (the same file read
by both), as an engine of any (ids, mask), for models the BERT optimizer does not know (ModernBERT).
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import os
import shutil
import sys
import tempfile
from typing import Callable, Dict, Optional, Tuple

import torch

from fastbert.dtypes import dtype_name

PEERS = ("onnxruntime", "openvino", "ctranslate2", "torch.compile")
ONNX_PEERS = ("onnxruntime", "openvino")  # the peers that run an exported ONNX file as it is (onnx_peers)
Providers = Dict[str, Callable[[], torch.Tensor]]
Engine = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (input_ids, attention_mask) -> last hidden state


def _onnxruntime(hf, ids, mask, dtype, workdir):
    if dtype not in (torch.float32, torch.int8):
        raise _Skip("ONNX Runtime has no bf16 CPU kernels for BERT")
    path = _onnx_fused(hf, ids, mask, workdir)
    if dtype == torch.int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        fused, path = path, os.path.join(workdir, "bert-fused-int8.onnx")
        if not os.path.exists(path):
            import onnx

            # the optimized graph holds ONNX Runtime's own fused ops, whose outputs its shape inference
            # cannot type: DefaultTensorType tells the quantizer they are float (ONNX Runtime's advice)
            quantize_dynamic(fused, path, weight_type=QuantType.QInt8,
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    engine = _onnxruntime_engine(path)
    return lambda: engine(ids, mask)


def _onnxruntime_engine(path: str) -> Engine:
    """An ONNX Runtime CPU session of the ONNX file (every graph optimization, torch's thread count)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = torch.get_num_threads()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]  # an optimized graph may have dropped an unused input

    def run(ids, mask):
        feed = {k: v.numpy() for k, v in (("input_ids", ids), ("attention_mask", mask)) if k in names}
        return torch.from_numpy(sess.run(["last_hidden_state"], feed)[0])

    return run


def _onnxruntime_int8_engine(path: str) -> Engine:
    """An ONNX Runtime CPU session of the ONNX file after its dynamic quantization (int8 weights, the
    activations quantized on each call), written beside it."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantized = path[:-len(".onnx")] + "-int8.onnx"
    quantize_dynamic(path, quantized, weight_type=QuantType.QInt8)
    return _onnxruntime_engine(quantized)


def _onnx_fused(hf, ids, mask, workdir) -> str:
    """The ONNX file of `hf` after ONNX Runtime's BERT optimizer (made once per workdir)."""
    from onnxruntime.transformers import optimizer

    raw, fused = os.path.join(workdir, "bert.onnx"), os.path.join(workdir, "bert-fused.onnx")
    if not os.path.exists(fused):
        export_onnx(hf, ids, mask, raw)
        cfg = hf.config
        opt = optimizer.optimize_model(raw, model_type="bert", num_heads=cfg.num_attention_heads,
                                       hidden_size=cfg.hidden_size, opt_level=1)
        if not opt.get_fused_operator_statistics().get("Attention"):
            print("onnxruntime: the BERT optimizer fused no attention in this export", file=sys.stderr)
        opt.save_model_to_file(fused)
    return fused


def export_onnx(hf, ids, mask, path: str) -> str:
    """`hf`'s last hidden state exported to the ONNX file `path` (returned): torch.onnx.export's
    TorchScript exporter (dynamo=False; the dynamo exporter needs onnxscript, which the peers extra
    does not install), opset 17, inputs input_ids and attention_mask with dynamic batch and sequence
    axes, output last_hidden_state. Traced on (ids, mask), which should hold padding, so that the
    mask's path is the one recorded. The attention is the eager one, on a copy: the graph whose
    attention ONNX Runtime's BERT optimizer fuses (in the sdpa one it fuses no attention:
    benchmarks/LOG.md, "Against the engines people deploy"); for ModernBERT the eager and the sdpa exports compute the same."""
    import copy
    import warnings

    eager = copy.deepcopy(hf)
    eager.set_attn_implementation("eager")
    with torch.no_grad(), warnings.catch_warnings():
        # the exporter warns of every shape it reads while tracing; the graph is checked where it is run
        warnings.simplefilter("ignore")
        torch.onnx.export(_LastHidden(eager), (ids, mask), path, input_names=["input_ids", "attention_mask"],
                          output_names=["last_hidden_state"], dynamo=False, opset_version=17,
                          dynamic_axes={n: {0: "batch", 1: "seq"} for n in ("input_ids", "attention_mask")})
    return path


class _LastHidden(torch.nn.Module):
    """hf(input_ids, attention_mask).last_hidden_state, with the two inputs positional (exporters)."""

    def __init__(self, hf):
        super().__init__()
        self.hf = hf

    def forward(self, input_ids, attention_mask):
        return self.hf(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def _openvino(hf, ids, mask, dtype, workdir):
    import openvino as ov

    engine = _openvino_peer(ov.convert_model(hf, example_input={"input_ids": ids, "attention_mask": mask}), dtype,
                            ids, mask)
    return lambda: engine(ids, mask)


def _openvino_peer(model, dtype: torch.dtype, ids, mask) -> Engine:
    """OpenVINO's engine of `model` (an openvino.Model, or the path of an ONNX file) in `dtype`: fp32
    or bf16 as the inference precision; int8 through NNCF (_nncf_int8, calibrated on ids and mask),
    the rest of the graph in fp32."""
    if dtype == torch.int8:
        model = _nncf_int8(model, ids, mask)
    return _openvino_engine(model, {torch.float32: "f32", torch.bfloat16: "bf16", torch.int8: "f32"}[dtype])


def _nncf_int8(model, ids, mask):
    """`model` (an openvino.Model, or the path of an ONNX file) quantized to int8 by NNCF's
    post-training quantization for transformers: int8 weights and activations in the products, each
    activation's scale set from the calibration inputs, here (ids, mask) themselves, one sequence a
    sample (the run's own tokens: the best case for OpenVINO's accuracy)."""
    if importlib.util.find_spec("nncf") is None:
        raise _Skip('its int8 needs NNCF (pip install nncf, in the peers extra: pip install -e ".[peers]")')
    import nncf
    import openvino as ov

    if isinstance(model, str):
        model = ov.Core().read_model(model)
    samples = [{"input_ids": ids[i:i + 1].numpy(), "attention_mask": mask[i:i + 1].numpy()}
               for i in range(ids.shape[0])]
    logger = logging.getLogger("nncf")
    level = logger.level
    logger.setLevel(logging.WARNING)  # its statistics lines, and its progress bars below: not the run's output
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return nncf.quantize(model, nncf.Dataset(samples), model_type=nncf.ModelType.TRANSFORMER,
                                 subset_size=len(samples))
    finally:
        logger.setLevel(level)


def _openvino_engine(model, precision: str = "f32") -> Engine:
    """`model` (an openvino.Model, or the path of an ONNX file) compiled for the CPU: `precision` as
    the inference precision hint, torch's thread count, the latency hint."""
    import openvino as ov

    core = ov.Core()
    if isinstance(model, str):
        model = core.read_model(model)
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": precision,
                                                 "INFERENCE_NUM_THREADS": torch.get_num_threads(),
                                                 "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()

    def run(ids, mask):
        out = request.infer({"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
        return torch.from_numpy(next(iter(out.values())).copy())

    return run


def _ctranslate2(hf, ids, mask, dtype, workdir):
    import ctranslate2
    import numpy as np

    if dtype not in (torch.float32, torch.int8):
        raise _Skip("CTranslate2 has no bf16 compute type on CPUs")
    model_dir, out_dir = os.path.join(workdir, "hf"), os.path.join(workdir, "ct2")
    if not os.path.exists(out_dir):
        _save_with_vocab(hf, model_dir)
        ctranslate2.converters.TransformersConverter(model_dir).convert(out_dir, force=True)
    compute_type = "int8" if dtype == torch.int8 else "float32"
    enc = ctranslate2.Encoder(out_dir, device="cpu", compute_type=compute_type, intra_threads=torch.get_num_threads())
    lengths = mask.sum(1).tolist()
    rows = [r[:n] for r, n in zip(ids.tolist(), lengths)]
    seq = ids.shape[1]

    def run():
        hidden = np.asarray(enc.forward_batch(rows).last_hidden_state)
        out = torch.from_numpy(hidden)
        return torch.nn.functional.pad(out, (0, 0, 0, seq - out.shape[1]))

    return run


def _save_with_vocab(hf, model_dir: str) -> None:
    """hf saved with a WordPiece vocabulary of its size (the converter reads one; the ids are random)."""
    import copy

    import transformers

    hf = copy.copy(hf)
    hf.config = copy.deepcopy(hf.config)
    hf.config.position_embedding_type = "absolute"  # read by the converter; transformers 5 dropped it
    hf.save_pretrained(model_dir)
    vocab = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += [f"w{i}" for i in range(hf.config.vocab_size - len(vocab))]
    with open(os.path.join(model_dir, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(vocab) + "\n")
    transformers.BertTokenizer(os.path.join(model_dir, "vocab.txt")).save_pretrained(model_dir)


def _torch_compile(hf, ids, mask, dtype, workdir):
    import copy

    if dtype == torch.int8:
        raise _Skip("torch.compile has no int8 quantization of its own (torchao's is a separate package)")
    model = hf if dtype == torch.float32 else copy.deepcopy(hf).to(dtype)
    compiled = torch.compile(model)
    return lambda: compiled(input_ids=ids, attention_mask=mask).last_hidden_state


class _Skip(Exception):
    """A peer that does not run this dtype (printed as the reason)."""


BUILD = {"onnxruntime": _onnxruntime, "openvino": _openvino, "ctranslate2": _ctranslate2,
          "torch.compile": _torch_compile}
_PACKAGE = {"onnxruntime": "onnxruntime", "openvino": "openvino", "ctranslate2": "ctranslate2", "torch.compile": None}


def _missing(peer: str) -> str:
    """Why `peer` cannot run here ("" when its package is installed)."""
    import importlib.util

    package = _PACKAGE[peer]
    if package is not None and importlib.util.find_spec(package) is None:
        return f"{package} is not installed (pip install -e .[peers])"
    return ""


def _first_line(e: Exception) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first[:200]}"


def _build_one(peer, dtype, hf, ids, mask, workdir, provs, skipped) -> None:
    """provs[name] = the peer's run in `dtype`, or skipped[name] = why not."""
    name = f"{peer} {dtype_name(dtype)}"
    if _missing(peer):
        skipped[name] = _missing(peer)
        return
    try:
        with torch.no_grad():
            provs[name] = BUILD[peer](hf, ids, mask, dtype, workdir)
    except _Skip as e:
        skipped[name] = str(e)
    except Exception as e:  # a converter that fails on this machine: say so, time the rest
        skipped[name] = f"conversion failed: {_first_line(e)}"
    finally:
        if hf is not None:
            hf.eval()  # an exporter may leave it in training mode


def peer_providers(hf, ids, mask, dtypes, peers=PEERS) -> Tuple[Providers, Dict[str, str]]:
    """({"<peer> <dtype>": run}, {"<peer> <dtype>": why skipped}); `hf` is transformers' BertModel
    (fp32, eval) with the weights fastbert runs."""

    provs: Providers = {}
    skipped: Dict[str, str] = {}
    # the exported models (ONNX, OpenVINO, CTranslate2: 0.4-1.8 GB each for BERT-base) are read
    # into the engines when they are built, so the directory goes when the last one is
    workdir = tempfile.mkdtemp(prefix="fastbert-peers-")
    try:
        for peer in peers:
            for dtype in dtypes:
                _build_one(peer, dtype, hf, ids, mask, workdir, provs, skipped)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print_skipped(skipped)
    return provs, skipped


def print_skipped(skipped: Dict[str, str]) -> None:
    """Each peer not run, and why, on stderr."""
    for name, why in skipped.items():
        print(f"peer skipped: {name}: {why}", file=sys.stderr)


def onnx_skips(peers, dtype: torch.dtype) -> Dict[str, str]:
    """{peer: why it cannot run here in `dtype`} for those of the ONNX_PEERS asked for that cannot."""
    skipped = {p: _missing(p) for p in peers if _missing(p)}
    if dtype == torch.bfloat16 and "onnxruntime" in peers and "onnxruntime" not in skipped:
        skipped["onnxruntime"] = "its CPU provider runs this graph in fp32: not a bf16 peer"
    return skipped


def export_for(hf, ids, mask, peers, path: str) -> Tuple[Optional[str], Dict[str, str]]:
    """(`path`, {}) once export_onnx has written `hf` there for `peers`, or (None, {peer: why}) for
    each of them when the export failed."""
    try:
        return export_onnx(hf, ids, mask, path), {}
    except Exception as e:
        return None, {p: f"ONNX export failed: {_first_line(e)}" for p in peers}


def onnx_engine(peer: str, path: str, dtype: torch.dtype, ids, mask) -> Tuple[Optional[Engine], str]:
    """(`peer`'s engine of the ONNX file `path` in `dtype`, "") or (None, why it could not be built):
    onnx_peers' engines, one at a time (a benchmark that builds each engine in a process of its own)."""
    try:
        if peer == "onnxruntime":
            return (_onnxruntime_int8_engine if dtype == torch.int8 else _onnxruntime_engine)(path), ""
        return _openvino_peer(path, dtype, ids, mask), ""
    except _Skip as e:
        return None, str(e)
    except Exception as e:  # an engine that cannot load this graph: say so, run the rest
        return None, f"loading the ONNX file failed: {_first_line(e)}"


def onnx_peers(hf, ids, mask, peers=ONNX_PEERS, dtype: torch.dtype = torch.float32
               ) -> Tuple[Dict[str, Engine], Dict[str, str]]:
    """({peer: engine}, {peer: why skipped}) for the ONNX_PEERS asked for: `hf` (transformers' model,
    fp32, eval) exported once (export_onnx, traced on ids and mask), and each peer's engine built from
    that same file, as it is (no model-specific optimizer); an engine takes any (input_ids,
    attention_mask), padded batches with their mask, and returns the last hidden state. dtype: the
    precision the engines compute in: fp32, bf16 (OpenVINO's bf16 inference precision; ONNX
    Runtime, whose CPU provider runs the exported graph in fp32, is skipped) or int8 (ONNX Runtime
    on the file through its dynamic quantization: int8 weights, activations quantized per call;
    OpenVINO on the file through NNCF, _nncf_int8, calibrated on ids and mask). The file's temporary directory is
    removed before this returns (each engine has read the model by then)."""
    engines: Dict[str, Engine] = {}
    skipped = onnx_skips(peers, dtype)
    wanted = [p for p in peers if p not in skipped]
    if wanted:
        workdir = tempfile.mkdtemp(prefix="fastbert-peers-")
        try:
            path, failed = export_for(hf, ids, mask, wanted, os.path.join(workdir, "model.onnx"))
            skipped.update(failed)
            for peer in wanted if path else ():
                engine, why = onnx_engine(peer, path, dtype, ids, mask)
                if engine is None:
                    skipped[peer] = why
                else:
                    engines[peer] = engine
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            hf.eval()
    print_skipped(skipped)
    return engines, skipped
