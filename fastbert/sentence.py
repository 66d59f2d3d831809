"""Sentence embeddings from a sentence-transformers directory, on fastbert's encoders.

    enc = fastbert.SentenceEncoder("path/to/multilingual-e5-base")
    emb = enc.encode(["a sentence", "another one"], batch_size=64, prompt_name="query")   # numpy [n, dim]

Reads what sentence-transformers 2.x to 6.x write: modules.json (a Transformer module of any
family fastbert runs, Pooling, then any Dense and Normalize modules), sentence_bert_config.json
(max_seq_length, do_lower_case; else the tokenizer's model_max_length, as sentence-transformers
takes it), the pooling config (the pooling_mode_* flags of older versions or pooling_mode: cls,
mean, max, mean_sqrt_len_tokens, weightedmean, lasttoken; include_prompt),
config_sentence_transformers.json (prompts, default_prompt_name), each Dense module's config and
weights, and the fast tokenizer (tokenizer.json); and gives the embeddings sentence-transformers
gives. quantize="int8" runs the encoder's linear layers in int8 (fastbert.model.quantize; its accuracy
against fp32 on MiniLM: benchmarks/RESULTS.md). Sentences are batched longest first, so each batch
pads little, and returned in the order given.

A model with task adapters (jina-embeddings-v3; fastbert.model.lora) runs a task per call: encode's
task=, or its prompt_name where that names a task (the original model's rule: its prompts are named
after its tasks); the task instructions of its config are its prompts where the directory has none.
SentenceEncoder(..., task=) folds one task into the weights at load instead (the fast inference
routes; int8).

    fastbert encode MODEL_DIR --input sentences.txt --output embeddings.npy [--quantize int8] [--prompt-name query]
"""
from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from fastbert import token_outputs

POOLING_MODES = ("cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# the pooling_mode_* flags sentence-transformers wrote before version 5
_LEGACY_POOLING = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                   "pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
WHERE = "fastbert.SentenceEncoder"


def read_json(path: str, what: str, where: str = WHERE):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{where}: {what} not found at {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: {path} is not valid JSON ({e})") from None


def pooling_modes(config: dict, where: str = WHERE) -> Tuple[str, ...]:
    """The pooling modes of a Pooling module's config, old format or new."""
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    else:
        modes = tuple(m for k, m in _LEGACY_POOLING.items() if config.get(k)) or ("mean",)
    bad = [m for m in modes if m not in POOLING_MODES]
    if bad or not modes:
        raise ValueError(f"{where}: pooling mode {bad or modes} is not supported; supported: {POOLING_MODES}")
    return modes


def pool(hidden: torch.Tensor, mask: torch.Tensor, modes: Sequence[str]) -> torch.Tensor:
    """Sentence vectors [batch, len(modes) * hidden] of token vectors hidden [batch, seq, hidden]
    (right-padded) at the tokens that mask [batch, seq] keeps, as sentence-transformers' Pooling."""
    m = mask[..., None].to(hidden.dtype)
    parts = []
    for mode in modes:
        if mode == "cls":  # the first token the mask keeps
            first = mask.to(torch.int).argmax(dim=1)
            parts.append(hidden[torch.arange(hidden.shape[0]), first])
        elif mode == "max":
            parts.append(hidden.masked_fill(m == 0, float("-inf")).max(dim=1).values)
        elif mode in ("mean", "mean_sqrt_len_tokens"):
            count = m.sum(dim=1).clamp(min=1e-9)
            parts.append((hidden * m).sum(dim=1) / (count if mode == "mean" else count.sqrt()))
        elif mode == "weightedmean":  # token i weighs i + 1
            w = m * torch.arange(1, hidden.shape[1] + 1, dtype=hidden.dtype, device=hidden.device).view(1, -1, 1)
            parts.append((hidden * w).sum(dim=1) / w.sum(dim=1).clamp(min=1e-9))
        else:  # lasttoken: the last token the mask keeps
            seq = mask.shape[1]
            kept, back = mask.flip(1).max(1)
            last = seq - 1 - torch.where(kept == 0, seq - 1, back)  # none kept: the first
            parts.append((hidden * m)[torch.arange(hidden.shape[0]), last])
    return torch.cat(parts, dim=-1)


def activation(name: Optional[str], where: str) -> nn.Module:
    """The torch.nn module a Dense config names (sentence-transformers writes its class path)."""
    if name is None:
        return nn.Identity()
    module, _, cls = name.rpartition(".")
    if not module.startswith("torch."):
        raise ValueError(f"{where}: the Dense activation {name!r} is not a torch.nn module")
    act = getattr(importlib.import_module(module), cls, None)
    if not (isinstance(act, type) and issubclass(act, nn.Module)):
        raise ValueError(f"{where}: the Dense activation {name!r} is not a torch.nn module")
    return act()


class Dense(nn.Module):
    """sentence-transformers' Dense module: activation(linear(x)) (+ x, or its projection, with use_residual)."""

    def __init__(self, directory: str, where: str = WHERE):
        super().__init__()
        from fastbert.model.checkpoint import load_state_dict

        cfg = read_json(os.path.join(directory, "config.json"), "the Dense config", where)
        n_in, n_out, bias = int(cfg["in_features"]), int(cfg["out_features"]), bool(cfg.get("bias", True))
        self.linear = nn.Linear(n_in, n_out, bias=bias)
        self.activation = activation(cfg.get("activation_function"), where)
        self.use_residual = bool(cfg.get("use_residual", False))
        if self.use_residual and n_in != n_out:
            self.residual = nn.Linear(n_in, n_out, bias=False)
        state = load_state_dict(directory)
        missing, unexpected = self.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"{where}: {directory}: Dense weights missing {missing}, unexpected {unexpected}")
        self.out_features = n_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.activation(self.linear(x))
        if self.use_residual:
            out = out + (self.residual(x) if hasattr(self, "residual") else x)
        return out


def load_tokenizer(root: str, max_length: int, where: str):
    """The fast tokenizer of tokenizer.json in root, truncating to max_length tokens, unpadded."""
    from tokenizers import Tokenizer

    file = os.path.join(root, "tokenizer.json")
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{where}: {root} has no tokenizer.json (a fast tokenizer is needed)")
    tok = Tokenizer.from_file(file)
    tok.no_padding()
    tok.enable_truncation(max_length=max_length)
    return tok


def max_length(root: str, model, given: Optional[int], st_config: dict) -> int:
    """sentence-transformers' max_seq_length: given, else sentence_bert_config.json's, else the
    tokenizer's model_max_length capped at max_position_embeddings; never more than the model's
    position table holds."""
    limit = model.base_model.embeddings.max_tokens
    n = given or st_config.get("max_seq_length")
    if not n:
        tok_cfg = os.path.join(root, "tokenizer_config.json")
        n = read_json(tok_cfg, "tokenizer_config.json").get("model_max_length") if os.path.isfile(tok_cfg) else None
        n = min(int(n), model.config.max_position_embeddings) if n and n < 1e12 else model.config.max_position_embeddings
    return min(int(n), limit)


def pad_batch(ids: List[List[int]], pad_id: int, device) -> Tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) [batch, longest], right-padded with pad_id."""
    n = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), n), pad_id, dtype=torch.long)
    mask = torch.zeros(len(ids), n, dtype=torch.long)
    for i, x in enumerate(ids):
        input_ids[i, : len(x)] = torch.tensor(x, dtype=torch.long)
        mask[i, : len(x)] = 1
    return input_ids.to(device), mask.to(device)


def longest_first(model, lengths: Sequence[int], batch_size: int, out, run, desc: str, progress: bool,
                  store=None):
    """out[chunk] = run(chunk) (or store(chunk, run(chunk))) for chunks of batch_size indices taken
    longest first (each batch then pads little), with `model` in eval mode meanwhile (its mode
    restored after); returns out."""
    from tqdm import tqdm

    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    # the modules in training mode, put back after; a model already in eval mode (as loaded) is
    # only read: model.eval() and model.train() set every module, a cost a short call would feel
    # (benchmarks/LOG.md, "fastbert serve: the model in the thread that loaded it")
    training = [m for m in model.modules() if m.training]
    if training:
        model.eval()
    try:
        for s in tqdm(range(0, len(order), batch_size), desc=desc, unit="batch", disable=not progress,
                      file=sys.stderr):
            chunk = order[s : s + batch_size]
            if store is None:
                out[chunk] = run(chunk).cpu()
            else:
                store(chunk, run(chunk))
    finally:
        for m in training:
            m.training = True
    return out


def _modules(path: str) -> List[Tuple[str, str]]:
    """(kind, directory) of each module in modules.json, checked: Transformer, Pooling, then any
    Dense and Normalize modules; or a SPLADE model's MLMTransformer then SpladePooling."""
    modules = read_json(os.path.join(path, "modules.json"), "modules.json")
    found = [(m.get("type", "").rsplit(".", 1)[-1], os.path.join(path, m.get("path", ""))) for m in modules]
    kinds = [k for k, _ in found]
    if kinds[:1] == ["MLMTransformer"]:
        if kinds != ["MLMTransformer", "SpladePooling"]:
            raise ValueError(f"{WHERE}: {path}: a sparse encoder's modules must be MLMTransformer then SpladePooling "
                             f"(SPLADE), got {kinds}")
        return found
    if not kinds or kinds[0] != "Transformer" or "Pooling" not in kinds:
        raise ValueError(f"{WHERE}: {path}: expected a Transformer module then Pooling, got {kinds}")
    unsupported = [k for k in kinds if k not in ("Transformer", "Pooling", "Dense", "Normalize")]
    if unsupported:
        raise ValueError(f"{WHERE}: {path}: modules {unsupported} are not supported; supported: Transformer, "
                         "Pooling, Dense, Normalize")
    return found


def _adapter_tasks(root: str) -> List[str]:
    """The task adapters of the model in `root` (its config.json's lora_adaptations), before loading it."""
    from fastbert.model.config import read_config

    return list(read_config(root, WHERE)[1].get("lora_adaptations") or [])


def run_task(path: str, prompt_name: Optional[str]) -> Optional[str]:
    """The task a run with one prompt folds in at load (SentenceEncoder(..., task=)): prompt_name
    where it names one of the model's task adapters (config.json's lora_adaptations), else None."""
    if prompt_name is None:
        return None
    return prompt_name if prompt_name in _adapter_tasks(_modules(path)[0][1]) else None


class SentenceEncoder:
    def __init__(self, path: str, *, backend: Optional[str] = None, dtype: Optional[torch.dtype] = None,
                 device=None, max_seq_length: Optional[int] = None, quantize: Optional[str] = None,
                 cuda_graphs: bool = True, task: Optional[str] = None):
        from fastbert.model.auto import AutoModel

        if not os.path.isdir(path):
            raise FileNotFoundError(f"{WHERE}: {path} is not a directory")
        modules = _modules(path)
        root = modules[0][1]
        st_file = os.path.join(root, "sentence_bert_config.json")
        st_config = read_json(st_file, "sentence_bert_config.json") if os.path.isfile(st_file) else {}
        # SPLADE (an MLM head pooled over the vocabulary: fastbert.token_outputs.splade) or a dense encoder
        self.splade: Optional[str] = None
        if modules[0][0] == "MLMTransformer":
            pooling = read_json(os.path.join(dict(modules)["SpladePooling"], "config.json"), "the SPLADE pooling config")
            self.splade = pooling.get("pooling_strategy", "max")
            if self.splade not in token_outputs.SPLADE_POOLING or pooling.get("activation_function", "relu") != "relu":
                raise ValueError(f"{WHERE}: {path}: SPLADE pooling {self.splade!r} with activation "
                                 f"{pooling.get('activation_function')!r} is not supported; supported: max or sum "
                                 "of log(1 + relu)")
            self.pooling_modes, self.include_prompt = (), True
        else:
            pooling = read_json(os.path.join(dict(modules)["Pooling"], "config.json"), "the pooling config")
            self.pooling_modes = pooling_modes(pooling)
            self.include_prompt = bool(pooling.get("include_prompt", True))
        self.dense = nn.Sequential(*[Dense(d) for k, d in modules if k == "Dense"])
        self.normalize = modules[-1][0] == "Normalize"
        prompts_file = os.path.join(path, "config_sentence_transformers.json")
        st_model = read_json(prompts_file, "config_sentence_transformers.json") if os.path.isfile(prompts_file) else {}
        self.prompts: Dict[str, str] = dict(st_model.get("prompts") or {})
        self.default_prompt_name: Optional[str] = st_model.get("default_prompt_name")
        self.do_lower_case = bool(st_config.get("do_lower_case", False))
        if self.splade is not None:
            from fastbert.model.auto import AutoModelForMaskedLM

            self.model = AutoModelForMaskedLM.from_pretrained(root, backend=backend, dtype=dtype, quantize=quantize)
        else:  # no pooler: sentence-transformers pools the token vectors itself
            folding = {}
            if task is not None:  # (from_pretrained folds the task in before any quantizing)
                if not _adapter_tasks(root):
                    raise ValueError(f"{WHERE}: task={task!r}, but the model in {root} has no task adapters")
                folding["task"] = task
            self.model = AutoModel.from_pretrained(root, backend=backend, dtype=dtype, quantize=quantize,
                                                   add_pooling_layer=False, **folding)
        # the task adapters a call chooses among (none once one is folded in), and the folded task
        self.tasks: List[str] = list(getattr(self.model.config, "tasks", []))
        self.folded_task: Optional[str] = getattr(self.model.config, "folded_task", None)
        if not self.prompts and getattr(self.model.config, "task_instructions", None):
            self.prompts = dict(self.model.config.task_instructions)
        if device is not None:
            self.model.to(device)
        # on CUDA the encoder replays CUDA graphs (fastbert.ops.encoder.EncoderGraphs); elsewhere a no-op
        self.model.cuda_graphs(cuda_graphs)
        self.dense.to(self.model.device)
        self.max_seq_length = max_length(root, self.model, max_seq_length, st_config)
        self.tokenizer = load_tokenizer(root, self.max_seq_length, WHERE)
        # what the model gives ("dense", "tokens", "sparse", "colbert"), and BGE-M3's sparse and ColBERT
        # heads where the directory ships them (fastbert.token_outputs)
        self.outputs = token_outputs.outputs_in(path)
        self.token_heads = None if self.splade is not None else token_outputs.TokenHeads.load(
            path, self.model.config.hidden_size, token_outputs.special_ids(root, self.model.config), WHERE)
        if self.token_heads is not None:
            self.token_heads.to(self.model.device)

    @property
    def dim(self) -> int:
        """The embedding's width (a SPLADE model's: its vocabulary's size)."""
        if self.splade is not None:
            return self.model.config.vocab_size
        if len(self.dense):
            return self.dense[-1].out_features
        return self.model.config.hidden_size * len(self.pooling_modes)

    def tokenize(self, sentences: Sequence[str]) -> List[List[int]]:
        texts = [s.lower() if self.do_lower_case else s for s in sentences]
        return [e.ids for e in self.tokenizer.encode_batch(texts)]

    def _prompt(self, prompt_name: Optional[str], prompt: Optional[str]) -> str:
        if prompt is not None:
            return prompt
        name = prompt_name if prompt_name is not None else self.default_prompt_name
        if name is None:
            return ""
        if name not in self.prompts:
            raise ValueError(f"{WHERE}.encode: prompt_name {name!r} is not one of this model's prompts "
                             f"{sorted(self.prompts)}")
        return self.prompts[name]

    def task_for(self, prompt_name: Optional[str] = None, task: Optional[str] = None) -> Optional[str]:
        """The task adapters a call runs: `task`, else prompt_name where it names one of the model's
        tasks, else none (None: also where the task is the one folded in at load). A ValueError
        names a task the model lacks, or a quantized model asked for one per call."""
        named = self.tasks or list(getattr(self.model.config, "task_instructions", None) or [])
        if task is None and prompt_name in named:  # (a folded model's config still names every task)
            task = prompt_name
        if task is None or (task == self.folded_task and not self.tasks):
            return None
        if task not in self.tasks:
            have = (f"it runs the task {self.folded_task!r} folded in at load" if self.folded_task
                    else f"its tasks: {', '.join(self.tasks)}" if self.tasks else "it has no task adapters")
            raise ValueError(f"{WHERE}: unknown task {task!r}; {have}")
        if self.model.quantized:
            raise ValueError(f"{WHERE}: task {task!r}: a quantized model runs no task adapters per call; load it "
                             "with the task folded in: SentenceEncoder(..., task=..., quantize='int8')")
        return task

    def prompt(self, prompt_name: Optional[str] = None, prompt: Optional[str] = None) -> Tuple[str, int]:
        """(the text put before every sentence, how many of its tokens the pooling leaves out: all
        but the closing special token when the Pooling module excludes the prompt, else 0)."""
        text = self._prompt(prompt_name, prompt)
        if text and not self.include_prompt:
            return text, len(self.tokenize([text])[0]) - 1
        return text, 0

    def embed_ids(self, ids: List[List[int]], prompt_lengths, normalize: bool = True, task=None) -> torch.Tensor:
        """Embeddings [len(ids), dim] of token id lists, one batch; prompt_lengths: the leading
        tokens of each row (or of all rows, an int) the pooling leaves out; normalize=False skips
        the model's Normalize module; task: the task adapters (task_for's), one for every row or one
        (or None) per row."""
        return self.outputs_of_ids(ids, prompt_lengths, ("dense",), normalize, task)["dense"]

    def outputs_of_ids(self, ids: List[List[int]], prompt_lengths, outputs: Sequence[str],
                       normalize: bool = True, task=None) -> dict:
        """{output: value} for the outputs asked ("dense", "sparse", "colbert", "tokens") of token id
        lists, one batch, from one forward: dense as embed_ids gives it; sparse, per row (token ids,
        weights); colbert, per row its vectors [tokens - 1, dim] (fastbert.token_outputs); tokens,
        per row its tokens' last hidden states [tokens, width] (float32). task: as embed_ids'."""
        input_ids, mask = pad_batch(ids, self.model.config.pad_token_id or 0, self.model.device)
        if self.splade is not None:  # SPLADE: the MLM logits pooled over the vocabulary
            return {"sparse": token_outputs.splade(self.model(input_ids, mask).logits, mask, self.splade)}
        if task is not None and not isinstance(task, str) and all(t is None for t in task):
            task = None
        adapters = {} if task is None else {"task": task}  # (the families without adapters take no task=)
        hidden = self.model(input_ids, mask, **adapters).last_hidden_state
        out = {}
        if "tokens" in outputs:
            out["tokens"] = [h[:len(x)].float() for h, x in zip(hidden, ids)]
        if "sparse" in outputs:
            out["sparse"] = self.token_heads.sparse(hidden, input_ids, mask)
        if "colbert" in outputs:
            out["colbert"] = self.token_heads.colbert(hidden, mask)
        if "dense" in outputs:
            hidden = hidden.float()
            lengths = [prompt_lengths] * len(ids) if isinstance(prompt_lengths, int) else list(prompt_lengths)
            if any(lengths):  # include_prompt False: the prompt's tokens take no part in the pooling
                mask = mask.clone()
                for row, n in enumerate(lengths):
                    mask[row, :n] = 0
            emb = self.dense(pool(hidden, mask, self.pooling_modes))
            if self.normalize and normalize:
                emb = torch.nn.functional.normalize(emb, p=2, dim=1)
            out["dense"] = emb
        return out

    def _check_output(self, output: Optional[str]) -> Tuple[str, ...]:
        if output is None:
            output = "sparse" if self.splade is not None else "dense"
        if output not in token_outputs.OUTPUTS:
            raise ValueError(f"{WHERE}.encode: output must be one of {token_outputs.OUTPUTS}, got {output!r}")
        wanted = ("dense", "sparse", "colbert") if output == "all" else (output,)
        missing = [name for name in wanted if name not in self.outputs]
        if missing:
            raise ValueError(f"{WHERE}.encode: output={output!r}: {token_outputs.lacking(missing, self.outputs)}")
        return wanted

    @torch.no_grad()
    def encode(self, sentences, batch_size: int = 32, *, prompt_name: Optional[str] = None,
               prompt: Optional[str] = None, normalize_embeddings: bool = False, convert_to_numpy: bool = True,
               convert_to_tensor: bool = False, show_progress_bar: bool = False, output: Optional[str] = None,
               task: Optional[str] = None):
        """Embeddings [n, dim] (numpy float32, or a torch tensor), in the order of `sentences`.
        prompt_name picks one of the model's prompts (e5's "query" / "passage"; the default prompt
        when the model names one), prompt gives the text itself; it is put before every sentence.
        task (a model with task adapters, jina-embeddings-v3: "retrieval.query", ...) runs that
        task's adapters; a prompt_name that names a task runs it too (task_for).

        output (a model with BGE-M3's heads, fastbert.token_outputs): "sparse", per sentence its
        lexical weights as (token ids int64 ascending, weights float32); "colbert", per sentence its
        multi-vector [tokens - 1, dim] float32 (normalised); "all", {"dense", "sparse", "colbert"}
        from one forward each batch; "dense" (the default), the embeddings alone. A SPLADE model
        (MLMTransformer, SpladePooling) gives "sparse" (its default): per sentence (vocabulary ids,
        weights). Lists of numpy arrays, or of tensors with convert_to_tensor / convert_to_numpy=False."""
        single = isinstance(sentences, str)
        if single:
            sentences = [sentences]
        if not all(isinstance(s, str) for s in sentences):
            raise TypeError(f"{WHERE}.encode: sentences must be strings")
        if batch_size < 1:
            raise ValueError(f"{WHERE}.encode: batch_size must be >= 1, got {batch_size}")
        wanted = self._check_output(output)
        task = self.task_for(prompt_name, task)
        text, prompt_length = self.prompt(prompt_name, prompt)
        ids = self.tokenize([text + s for s in sentences])
        lengths = [len(x) for x in ids]
        dense = torch.empty(len(ids), self.dim)
        per_text = {name: [None] * len(ids) for name in wanted if name != "dense"}

        numpy = convert_to_numpy and not convert_to_tensor

        def store(chunk, got):
            if "dense" in got:
                dense[chunk] = got["dense"].cpu()
            for name, items in per_text.items():
                for i, item in zip(chunk, got[name]):
                    items[i] = token_outputs.on_cpu(item, numpy)

        longest_first(self.model, lengths, batch_size, None,
                      lambda chunk: self.outputs_of_ids([ids[i] for i in chunk], prompt_length, wanted, task=task),
                      "encode",
                      show_progress_bar, store=store)
        if normalize_embeddings:
            dense = torch.nn.functional.normalize(dense, p=2, dim=1)
        result = {"dense": dense.numpy() if numpy else dense} if "dense" in wanted else {}
        result.update(per_text)
        if single:
            result = {name: value[0] for name, value in result.items()}
        return result if output == "all" else result[wanted[0]]

