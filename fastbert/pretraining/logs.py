"""What a run writes for people: log.jsonl (one JSON object per log window and per evaluation),
the held-out table printed at the end, and curves.png."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

import torch

from fastbert.backend import resolve
from fastbert.plotting import pyplot


class JsonlLog:
    """log.jsonl, appended to by the main process; a resumed run keeps the records up to its step."""

    def __init__(self, path: str, enabled: bool, keep_until: Optional[int]):
        self.path = path
        self.enabled = enabled
        if not enabled:
            return
        kept: List[str] = []
        if keep_until is not None and os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue  # a line cut by a kill
                    if rec.get("step", 0) <= keep_until:
                        kept.append(json.dumps(rec))
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in kept)

    def write(self, record: Dict[str, Any]) -> None:
        if self.enabled:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")

    def records(self) -> List[Dict[str, Any]]:
        if not os.path.isfile(self.path):
            return []
        out = []
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out

def eval_line(m: Dict[str, float]) -> str:
    nsp = f", NSP loss {m['nsp_loss']:.3f}, NSP accuracy {m['nsp_acc']:.3f}" if "nsp_acc" in m else ""
    what = "pairs" if "nsp_acc" in m else "sequences"
    return (f"MLM loss {m['mlm_loss']:.3f}, MLM accuracy {m['mlm_acc']:.3f}{nsp} ({m['pairs']} {what}, "
            f"{m['masked_tokens']} masked tokens)")


def format_eval_table(first: Optional[Dict[str, float]], last: Optional[Dict[str, float]], step: int) -> str:
    if first is None or last is None:
        return "no held-out evaluation (the data has no held-out split)"
    rows = [("MLM loss", "mlm_loss", "{:.3f}"), ("MLM perplexity", "mlm_perplexity", "{:.1f}"),
            ("MLM accuracy", "mlm_acc", "{:.1%}"), ("NSP loss", "nsp_loss", "{:.3f}"),
            ("NSP accuracy", "nsp_acc", "{:.1%}")]
    rows = [r for r in rows if r[1] in last]
    what = "pairs" if "nsp_acc" in last else "sequences"
    head = f"held-out ({last['pairs']} {what}, {last['masked_tokens']} masked tokens, fixed masks)"
    lines = [head, f"  {'':<16}{'start (step 0)':>16}{f'end (step {step})':>18}"]
    for label, key, fmt in rows:
        lines.append(f"  {label:<16}{fmt.format(first[key]):>16}{fmt.format(last[key]):>18}")
    return "\n".join(lines)


def plot_curves(log_path: str, png_path: str, quiet: bool = False) -> bool:
    """Loss, accuracy and learning-rate curves from log.jsonl; False when matplotlib is not installed
    (with the one line that says how to get it, unless quiet: the run goes on without its curves)."""
    plt = pyplot(quiet, what=os.path.basename(png_path))
    if plt is None:
        return False
    recs = JsonlLog(log_path, False, None).records()
    train = [r for r in recs if r.get("type") == "train"]
    ev = [r for r in recs if r.get("type") == "eval"]
    if not train and not ev:
        return False
    nsp = "nsp_loss" in (train or ev)[0]
    fig, axes = plt.subplots(1, 4 if nsp else 3, figsize=(18 if nsp else 14, 4))
    ax = axes[0]
    for name in ("MLM", "NSP") if nsp else ("MLM",):
        key = name.lower() + "_loss"
        if train:
            ax.plot([r["step"] for r in train], [r[key] for r in train], label=f"{name} (train)")
        if ev:
            ax.plot([r["step"] for r in ev], [r[key] for r in ev], "o--", label=f"{name} (held-out)")
    ax.set_title("loss")
    ax.set_xlabel("step")
    ax.legend()
    panels = ((axes[1], "mlm_acc", "MLM accuracy"), (axes[2], "nsp_acc", "NSP accuracy"))
    for ax, key, title in panels[:2 if nsp else 1]:
        if train:
            ax.plot([r["step"] for r in train], [r[key] for r in train], label="train")
        if ev:
            ax.plot([r["step"] for r in ev], [r[key] for r in ev], "o--", label="held-out")
        if key == "nsp_acc":
            ax.axhline(0.5, color="grey", lw=0.8, ls=":")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend()
    if train:
        axes[-1].plot([r["step"] for r in train], [r["lr"] for r in train])
    axes[-1].set_title("learning rate")
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    tmp = png_path + ".tmp.png"
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, png_path)
    return True


def describe_run(trainer) -> List[str]:
    """The lines a run starts with: the model, the backend, the data and the schedule."""
    lines: List[str] = []
    cfg, info = trainer.cfg, trainer.info
    n_params = sum(p.numel() for p in trainer.model.parameters())
    mc = trainer.model_config
    backend = resolve(cfg.backend, next(trainer.model.parameters()))
    lines.append(
        f"model: {type(trainer.model).__name__}, {mc.num_hidden_layers} layers, hidden {mc.hidden_size}, "
        f"{mc.num_attention_heads} heads, intermediate {mc.intermediate_size}, vocab {mc.vocab_size}: "
        f"{n_params / 1e6:.2f} M parameters; "
        f"fastbert backend {backend!r} on {trainer.device}, {cfg.precision}"
    )
    what = "pairs" if trainer.index.get("next_sentence", True) else "sequences"
    ev = f", held-out {len(trainer.eval_data)} {what}" if trainer.eval_data is not None else ", no held-out split"
    lines.append(f"data: {cfg.data_dir}: {len(trainer.train_data)} training {what} "
                 f"(max_seq_length {trainer.index['max_seq_length']}){ev}")
    lines.append(
        f"training: {trainer.total_steps} steps of {cfg.batch_size * cfg.grad_accum * info.world_size} {what} "
        f"({info.world_size} process(es) x batch {cfg.batch_size} x accumulation {cfg.grad_accum}), "
        f"{trainer.plan.per_epoch // cfg.grad_accum if cfg.grad_accum <= trainer.plan.per_epoch else 0} steps per epoch, "
        f"lr {cfg.lr:g}, warm-up {trainer.warmup_steps} steps, {torch.get_num_threads()} thread(s) per process"
    )
    return lines
