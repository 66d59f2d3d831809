"""jina-embeddings-v3's original files at a small size (its remote code's layout: model_type
"xlm-roberta" with rotary positions, the weights under "roberta.", each adapted weight a
parametrization with its task adapters), built from a transformers JinaEmbeddingsV3Model with random
weights and random adapters; and the reference for a task: transformers' model with that task's
update folded into its weights."""
import json
import os

import pytest
import torch

from tests.helpers.families import CONFIGS

transformers = pytest.importorskip("transformers")

TASKS = ["retrieval.query", "retrieval.passage", "separation", "classification", "text-matching"]
INSTRUCTIONS = {"retrieval.query": "Represent the query for retrieving evidence documents: ",
                "retrieval.passage": "Represent the document for retrieval: ", "separation": "", "classification": "",
                "text-matching": ""}
ADAPTED = ("word_embeddings", "token_type_embeddings", "mixer.Wqkv", "mixer.out_proj", "mlp.fc1", "mlp.fc2",
           "pooler.dense")
RANK, ALPHA = 4, 1


class OriginalJina:
    """The files in `path`; transformers' model without adapters (.base); folded(t): transformers'
    model with task t's update in its weights; updates: {file key of a weight: (lora_A, lora_B, is an
    embedding)}; state: the plain weights under transformers' file names."""

    def __init__(self, path, seed=0, **config):
        from safetensors.torch import load_file, save_file

        self.path = str(path)
        torch.manual_seed(seed)
        hc = transformers.AutoConfig.for_model("jina_embeddings_v3", **dict(CONFIGS["jina_embeddings_v3"], **config))
        self.base = transformers.JinaEmbeddingsV3Model(hc).eval()
        plain = os.path.join(self.path, "plain")
        self.base.save_pretrained(plain)
        self.state = load_file(os.path.join(plain, "model.safetensors"))
        self.config = json.load(open(os.path.join(plain, "config.json")))
        g = torch.Generator().manual_seed(seed + 1)
        files, self.updates = {}, {}
        for key, value in self.state.items():
            module = key[:-len(".weight")]
            if not (key.endswith(".weight") and module.endswith(ADAPTED)):
                files["roberta." + key] = value
                continue
            emb = module.endswith("embeddings")
            n = len(TASKS)
            if emb:  # [tasks, rows, rank], [tasks, rank, dim]
                a, b = torch.randn(n, value.shape[0], RANK, generator=g), torch.randn(n, RANK, value.shape[1], generator=g)
            else:  # [tasks, rank, in], [tasks, out, rank]
                a, b = torch.randn(n, RANK, value.shape[1], generator=g), torch.randn(n, value.shape[0], RANK, generator=g)
            a, b = a * 0.3, b * 0.3
            files[f"roberta.{module}.parametrizations.weight.original"] = value
            files[f"roberta.{module}.parametrizations.weight.0.lora_A"] = a
            files[f"roberta.{module}.parametrizations.weight.0.lora_B"] = b
            self.updates[key] = (a, b, emb)
        save_file(files, os.path.join(self.path, "model.safetensors"))
        cfg = dict(self.config, model_type="xlm-roberta", position_embedding_type="rotary",
                   rotary_emb_base=self.config["rope_parameters"]["rope_theta"], architectures=["XLMRobertaLoRA"],
                   lora_adaptations=TASKS, lora_rank=RANK, lora_alpha=ALPHA, lora_dropout_p=0.0,
                   load_trained_adapters=True, task_instructions=INSTRUCTIONS, use_flash_attn=False,
                   auto_map={"AutoModel": "jinaai/xlm-roberta-flash-implementation--modeling_lora.XLMRobertaLoRA"})
        cfg.pop("rope_parameters")
        with open(os.path.join(self.path, "config.json"), "w") as f:
            json.dump(cfg, f)
        self._folded = {}

    def update(self, key, t):
        """Task t's update of the weight `key` (its file name), as the original model makes it."""
        a, b, emb = self.updates[key]
        return (a[t] @ b[t] if emb else b[t] @ a[t]) * (ALPHA / RANK)

    def folded(self, t):
        from safetensors.torch import save_file

        if t is None:
            return self.base
        if t not in self._folded:
            d = os.path.join(self.path, f"folded{t}")
            os.makedirs(d, exist_ok=True)
            save_file({k: v + self.update(k, t) if k in self.updates else v for k, v in self.state.items()},
                      os.path.join(d, "model.safetensors"))
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(self.config, f)
            self._folded[t] = transformers.JinaEmbeddingsV3Model.from_pretrained(d).eval()
        return self._folded[t]


def jina_st_directory(directory, seed=0):
    """jina-embeddings-v3's repository at a small size: the original files (OriginalJina) with the
    Unigram tokenizer, modules.json naming its own Transformer module (custom_st.Transformer), mean
    pooling, Normalize, and its prompts named after its tasks; returns the OriginalJina."""
    from tests.helpers.st_dirs import unigram_tokenizer

    tok = unigram_tokenizer()
    jina = OriginalJina(directory, seed, vocab_size=len(tok), initializer_range=0.2)
    tok.save_pretrained(jina.path)
    modules = [{"idx": 0, "name": "transformer", "path": "", "type": "custom_st.Transformer"},
               {"idx": 1, "name": "pooler", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "normalizer", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    files = {"modules.json": modules,
             "config_sentence_transformers.json": {"prompts": INSTRUCTIONS, "default_prompt_name": None},
             "sentence_bert_config.json": {"max_seq_length": 256},
             "1_Pooling/config.json": {"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True}}
    for name, content in files.items():
        os.makedirs(os.path.dirname(os.path.join(jina.path, name)), exist_ok=True)
        with open(os.path.join(jina.path, name), "w") as f:
            json.dump(content, f)
    os.makedirs(os.path.join(jina.path, "2_Normalize"), exist_ok=True)
    jina.tokenizer = tok
    return jina


def reference_embeddings(jina, sentences, task):
    """What the original model's encode(sentences, task=task) gives: the task's instruction before
    each sentence, its adapters (transformers' model with them folded in), mean pooling, normalised."""
    t = None if task is None else TASKS.index(task)
    prompt = "" if task is None else INSTRUCTIONS[task]
    enc = jina.tokenizer([prompt + s for s in sentences], padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = jina.folded(t)(enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
    mask = enc["attention_mask"][..., None].float()
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1).numpy()
