"""Task LoRA adapters (jina-embeddings-v3's): one low-rank update of a weight per task, chosen per
call, or per row of a batch.

A layer's weight W (a linear layer's [out, in], an embedding table's [rows, dim]) has one update per
task t, scaling * B[t] @ A[t] (an embedding's: scaling * A[t] @ B[t]), with the tensors laid out as
the original model's files hold them (lora_A [tasks, rank, in] and lora_B [tasks, out, rank]; an
embedding's lora_A [tasks, rows, rank] and lora_B [tasks, rank, dim]).

Applied as a low-rank side product, never as a changed copy of W: x @ W^T + scaling * (x @ A[t]^T) @
B[t]^T costs 2 * rank * (in + out) multiply-adds a row (under 1% of the product itself at rank 4),
needs nothing kept that could fall behind W, A or B, and trains (the gradients reach A and B). Rows of
different tasks in one batch take one pair of products over every task's rank at once, the rows'
task masking the middle. Folding one task into W for good (fold_) is the model's choice, made once
(JinaEmbeddingsV3Model.fold_task).

Which tasks a forward runs with is a per-thread selection (selecting(...)), set by the model a call
enters and read by its embeddings, layers and pooler: per-row tasks as a tensor [batch] of task
indices (the number of tasks: no adapter for that row), or one int for every row.
"""
from __future__ import annotations

import contextlib
import math
import threading
from typing import Iterator, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

Rows = Union[int, torch.Tensor]  # one task index for every row, or one per row (tasks: none)

_SELECTION = threading.local()


def selection() -> Optional[Rows]:
    """The tasks the current forward on this thread runs with, or None: no adapter."""
    return getattr(_SELECTION, "rows", None)


@contextlib.contextmanager
def selecting(rows: Optional[Rows]) -> Iterator[None]:
    """Run the block with `rows` as selection() (None: leave the current selection as it is)."""
    if rows is None:
        yield
        return
    before = selection()
    _SELECTION.rows = rows
    try:
        yield
    finally:
        _SELECTION.rows = before


def task_rows(tasks: Sequence[str], batch: int, device, task=None, adapter_mask=None, where: str = "fastbert"
              ) -> Optional[Rows]:
    """The selection for a batch of `batch` rows from `task` (a task name for every row, or one name
    or None per row) or `adapter_mask` (transformers' and the original model's argument: task
    indices [batch]); None where neither chooses an adapter."""
    if task is not None and adapter_mask is not None:
        raise ValueError(f"{where}: pass task= or adapter_mask=, not both")
    if adapter_mask is not None:
        index = torch.as_tensor(adapter_mask).long().reshape(-1).tolist()
        if len(index) != batch:
            raise ValueError(f"{where}: adapter_mask has {len(index)} entries for a batch of {batch}")
        if any(i < 0 or i >= len(tasks) for i in index):
            raise ValueError(f"{where}: adapter_mask holds indices outside 0..{len(tasks) - 1} (tasks: {list(tasks)})")
    elif task is None:
        return None
    else:
        if not tasks:
            raise ValueError(f"{where}: task={task!r}, but this model has no task adapters")
        names = [task] * batch if isinstance(task, str) else list(task)
        if len(names) != batch:
            raise ValueError(f"{where}: task has {len(names)} entries for a batch of {batch}")
        unknown = sorted({n for n in names if n is not None and n not in tasks})
        if unknown:
            raise ValueError(f"{where}: unknown task {unknown[0]!r}; this model's tasks: {', '.join(tasks)}")
        index = [len(tasks) if n is None else list(tasks).index(n) for n in names]
    if len(set(index)) == 1:  # one task for every row (or none): the single-task products
        return None if index[0] == len(tasks) else index[0]
    return torch.tensor(index, dtype=torch.long, device=device)


class TaskLoRA(nn.Module):
    """One layer's adapters for `tasks` tasks: lora_A, lora_B (see the module's docstring), scaling
    alpha / rank. kind "linear" (a [fan_out, fan_in] weight) or "embedding" (a [fan_in rows, fan_out]
    table); initialised as the original model initialises new adapters (no change until trained)."""

    def __init__(self, tasks: int, rank: int, alpha: float, fan_in: int, fan_out: int, kind: str = "linear"):
        super().__init__()
        self.kind, self.tasks, self.rank = kind, tasks, rank
        self.scaling = alpha / rank
        if kind == "linear":
            self.lora_A = nn.Parameter(torch.empty(tasks, rank, fan_in))
            self.lora_B = nn.Parameter(torch.zeros(tasks, fan_out, rank))
            for a in self.lora_A.data:
                nn.init.kaiming_uniform_(a, a=math.sqrt(5))
        elif kind == "embedding":
            self.lora_A = nn.Parameter(torch.zeros(tasks, fan_in, rank))
            self.lora_B = nn.Parameter(torch.randn(tasks, rank, fan_out))
        else:
            raise ValueError(f"fastbert.TaskLoRA: kind must be 'linear' or 'embedding', got {kind!r}")

    def extra_repr(self) -> str:
        return f"{self.kind}, tasks={self.tasks}, rank={self.rank}, scaling={self.scaling:g}"

    def add(self, y: torch.Tensor, x: torch.Tensor, rows: Rows) -> torch.Tensor:
        """A linear layer's output y [..., out] for input x [..., in] plus the adapters' update: rows one
        task (int) or a task index per row, broadcast against x.shape[:-1] (the number of tasks:
        none). The scaling and the rows' tasks apply to the narrow middle [..., rank]; the
        up-projection accumulates into y itself where nothing needs y's old value (no autograd)."""
        a, b = self.lora_A.to(x.dtype), self.lora_B.to(x.dtype)
        if isinstance(rows, int):
            z = F.linear(x, a[rows]) * self.scaling  # [..., rank]
            up = b[rows]  # [out, rank]
        else:
            t, r = self.tasks, self.rank
            z = F.linear(x, a.reshape(t * r, -1))  # [..., tasks * rank]: every task's down-projection
            keep = F.one_hot(rows, t + 1)[..., :t].to(z.dtype).repeat_interleave(r, dim=-1) * self.scaling
            z = z * keep
            up = b.permute(1, 0, 2).reshape(b.shape[1], t * r)
        z = z.reshape(-1, z.shape[-1])
        if y.is_contiguous() and not (torch.is_grad_enabled() and (y.requires_grad or z.requires_grad)):
            y.view(-1, y.shape[-1]).addmm_(z, up.t())
            return y
        return torch.addmm(y.reshape(-1, y.shape[-1]), z, up.t()).view(y.shape)

    def embedding_delta(self, ids: torch.Tensor, rows: Rows, dtype: torch.dtype) -> torch.Tensor:
        """An embedding's update of the vectors it gives token ids [batch, seq]: rows one task (int)
        or a task index per row [batch] (the number of tasks: none)."""
        a, b = self.lora_A, self.lora_B
        if isinstance(rows, int):
            return (F.embedding(ids, a[rows]) @ b[rows]).to(dtype) * self.scaling
        task = rows.clamp(max=self.tasks - 1)
        d = torch.bmm(a[task[:, None], ids], b[task]) * (rows < self.tasks).to(a.dtype)[:, None, None]
        return d.to(dtype) * self.scaling

    def weight_delta(self, task: int) -> torch.Tensor:
        """The update of the weight itself for one task: [out, in] (an embedding's [rows, dim])."""
        a, b = self.lora_A[task], self.lora_B[task]
        return (b @ a if self.kind == "linear" else a @ b) * self.scaling
