"""What a trainer rank gives and takes besides its step: its weights (whole, by name, or streamed in
buckets to the rollout engines), its gradients, and the optimizer, schedule and version a checkpoint keeps.

`Trainer` (`trainer.py`) is made of this part and its step; under FSDP2 each of these gathers from the
ranks' shards, a collective every rank joins."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from distillery_runtime.checkpoints.streamed_export import WeightStream
    from distillery_runtime.training.lora_export import AdapterExport


class TrainerWeightsAndState:
    """The weights and state half of `Trainer` (which sets these attributes in its `__init__`)."""

    model: Any
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    device: torch.device
    fsdp: bool
    rank: int
    world_size: int
    version: int
    lora: Any

    def synced_items(self) -> list[tuple[str, torch.Tensor]]:
        """What a weight sync sends, in order: every weight by its Hugging Face name, or a LoRA student's
        adapter alone, by the names peft saves it under (`training.lora`): megabytes, not the model."""
        state = self.model.state_dict()
        if self.lora is None:
            return list(state.items())
        from distillery_runtime.training.lora import adapter_items

        return adapter_items(state)

    def _collective_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

    def weights(self, dtype: torch.dtype | None = None) -> list[tuple[str, torch.Tensor]]:
        """The student's weights by Hugging Face name, on CPU (what the rollout engine loads).

        On a GPU the cast runs there, before the copy (half the bytes for bf16, no cast on the CPU),
        and the copies go asynchronously into pinned memory with one synchronisation at the end. The
        per-tensor blocking copy of float32 followed by a CPU cast took 1.95 s for a 0.68B student
        on an H100 (bench/gpu_breakdown.py), as long as the whole training step and teacher scoring.
        """
        on_gpu = self.device.type == "cuda"
        out = []
        for name, tensor in self.synced_items():
            t = self._full(tensor.detach())
            if self.fsdp and self.rank != 0:
                continue
            cast = dtype is not None and t.is_floating_point() and t.dtype != dtype
            if cast:
                t = t.to(dtype)
            if on_gpu:
                host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                host.copy_(t, non_blocking=True)
            else:
                host = t if cast else t.clone()  # a copy: the caller must not hold live parameters
            out.append((name, host))
        if on_gpu:
            torch.cuda.synchronize(self.device)
        return out

    def weight_metas(self, dtype: torch.dtype | None = None) -> list[Any]:
        """Names, whole shapes and travelling dtypes of the weights a streamed sync sends (`sync/weight_sync.py`)."""
        from distillery_runtime.sync.weight_sync import tensor_metas

        return tensor_metas(self.synced_items(), dtype)

    def stream_weights(self, group: Any, dtype: torch.dtype | None, bucket_bytes: int) -> int:
        """A streamed sync: every rank gathers each bucket's tensors from the shards (a collective), rank 0
        broadcasts them to the engines over `group` (a weight_sync.SyncGroup; None on other ranks). No
        rank holds more than a bucket of whole tensors. Returns the bytes rank 0 sent."""
        from distillery_runtime.sync.weight_sync import WeightSyncError, sender_buckets, tensor_metas

        failure: WeightSyncError | None = None
        if self.rank == 0:
            try:
                group.wait_ready()
            except WeightSyncError as error:
                failure = error
        if self.fsdp and self.world_size > 1:
            # All ranks stop together, before the first gather, or the others would wait in it.
            failed = torch.tensor([int(failure is not None)], device=self._collective_device())
            dist.all_reduce(failed, op=dist.ReduceOp.MAX)
            if int(failed) and failure is None:
                raise WeightSyncError("weight sync failed on trainer rank 0 (its error names the peer)")
        if failure is not None:
            raise failure
        items = self.synced_items()
        tensors = [tensor for _, tensor in items]
        metas = tensor_metas(items, dtype)

        def gather(i: int) -> torch.Tensor | None:
            whole = self._full(tensors[i].detach())
            if self.rank != 0:
                return None
            return whole.to(dtype) if dtype is not None and whole.is_floating_point() else whole

        buckets = sender_buckets(metas, bucket_bytes, gather)
        if self.rank == 0:
            return int(group.send(metas, bucket_bytes, buckets))
        for _ in buckets:  # take part in the gathers
            pass
        return 0

    def _full(self, tensor: torch.Tensor) -> torch.Tensor:
        """A whole tensor from a sharded one (FSDP: a collective, every rank calls it)."""
        if not self.fsdp:
            return tensor
        from distillery_runtime.training.sharding import full_tensor

        return full_tensor(tensor, self._collective_device())

    def gradients(self) -> dict[str, torch.Tensor]:
        """The last step's gradients after all-reduce and clipping (what the optimizer applied)."""
        return {
            n: self._full(p.grad.detach()).cpu().clone()
            for n, p in self.model.named_parameters()
            if p.grad is not None
        }

    def weight_stream(self) -> WeightStream | None:
        """The weights as a checkpoint streams them (a `streamed_export.WeightStream`: gathered a tensor at
        a time, every rank walking it), or None where the model's names need save_pretrained's conversion.
        A LoRA student's: the merged model under the base's names (`lora_export.merged_sources`), each
        adapted weight merged with its A and B as it is gathered."""
        from distillery_runtime.checkpoints.streamed_export import WeightStream, streamable
        from distillery_runtime.training.sharded_load import tied_keys

        if not streamable(self.transformers_model()):
            return None
        if self.lora is None:
            return WeightStream(self.model.state_dict(), self._full, tied=tied_keys(self.model))
        from distillery_runtime.training import lora_export

        sources = lora_export.merged_sources(self.model.state_dict(), lora_export.lora_layers(self.model))
        tied = lora_export.tied_base_names(self.model)
        return WeightStream(sources, lora_export.gather_merged(self._full), tied=tied)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The student's float32 weights, whole, on CPU (FSDP: a collective; every rank gets them); a LoRA
        student's under peft's names, the adapter beside the frozen base."""
        return {n: self._full(t.detach()).cpu() for n, t in self.model.state_dict().items()}

    def transformers_model(self) -> Any:
        """The transformers causal LM: the student, or the base under a LoRA student's peft wrapper (its
        config, generation config and save_pretrained are the kept model's)."""
        return self.model if self.lora is None else self.model.get_base_model()

    def merged_state_dict(self) -> dict[str, torch.Tensor]:
        """A LoRA student's merged model, whole, on CPU, by the base's names (FSDP: a collective; every rank
        gets it): what a checkpoint's model/ holds where its weights are not streamed."""
        from distillery_runtime.training import lora_export

        sources = lora_export.merged_sources(self.model.state_dict(), lora_export.lora_layers(self.model))
        whole = lora_export.gather_merged(self._full)
        return {name: whole(source).cpu() for name, source in sources.items()}

    def kept_weights(self, streamed: bool) -> tuple[WeightStream | None, dict[str, torch.Tensor] | None]:
        """The kept model's weights as a checkpoint writes them: a stream (`streamed`, where the names
        allow), else the whole state dict where the model's own is not it (sharded, or a LoRA student's
        merge), else neither (save_pretrained of the model's own). Every rank calls it."""
        stream = self.weight_stream() if streamed else None
        if stream is not None:
            return stream, None
        if self.lora is not None:
            return None, self.merged_state_dict()
        return None, self.full_state_dict() if self.fsdp else None

    def adapter_export(self, base_model: str) -> AdapterExport | None:
        """A LoRA student's adapter as its checkpoint's adapter/ keeps it: whole, float32, by peft's saved
        names, on rank 0 (FSDP: a collective; other ranks get an empty one); None for full fine-tuning.
        `base_model`: the student as the job names it ('' : the folder the trainer loaded)."""
        if self.lora is None:
            return None
        from distillery_runtime.training.lora_export import AdapterExport

        base = base_model or str(self.transformers_model().name_or_path)
        return AdapterExport(tensors=self.weights(), lora=self.lora, base_model=base)

    @torch.no_grad()
    def load_adapter(self, tensors: dict[str, torch.Tensor], source: str = "adapter") -> None:
        """A LoRA student's adapter, by peft's saved names (a checkpoint's adapter/, named `source` in a
        refusal), into the live adapter exactly (FSDP: every rank keeps its shards of each). Refuses
        (CheckpointReadError, one line) an adapter whose tensors are not this student's (other names or
        shapes: another rank or target modules), or any adapter where the student trains every weight."""
        from distillery_runtime.checkpoints.checkpoint import CheckpointReadError
        from distillery_runtime.training.lora import live_keys

        state = self.model.state_dict()
        keys = live_keys(state)
        missing, unexpected = sorted(set(keys) - set(tensors)), sorted(set(tensors) - set(keys))
        wrong = [
            n for n in set(keys) & set(tensors) if tuple(tensors[n].shape) != tuple(state[keys[n]].shape)
        ]
        if self.lora is None:
            raise CheckpointReadError(
                f"{source}: refused: a LoRA student's adapter, and this student trains every weight "
                "(no spec.student.lora); resume from a checkpoint of full fine-tuning or start afresh"
            )
        if missing or unexpected or wrong:
            raise CheckpointReadError(
                f"{source}: refused: not this student's adapter (other rank or target modules): missing "
                f"{missing[:3]}, unexpected {unexpected[:3]}, other shapes {sorted(wrong)[:3]}"
            )
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            options = StateDictOptions(full_state_dict=True, strict=False)
            set_model_state_dict(self.model, {keys[n]: t for n, t in tensors.items()}, options=options)
            return
        parameters = dict(self.model.named_parameters())
        for name, tensor in tensors.items():
            parameters[keys[name]].copy_(tensor)

    def trainer_state(self, *, with_optimizer: bool = True) -> dict[str, Any]:
        """Optimizer, schedule and version (FSDP: the optimizer state gathered whole, a collective);
        without the optimizer where it is saved in shards (`save_optimizer_shards`)."""
        if not with_optimizer:
            return {"scheduler": self.scheduler.state_dict(), "version": self.version}
        if self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            optimizer = get_optimizer_state_dict(self.model, self.optimizer, options=options)
        else:
            optimizer = self.optimizer.state_dict()
        return {
            "optimizer": optimizer,
            "scheduler": self.scheduler.state_dict(),
            "version": self.version,
        }

    def save_optimizer_shards(self, path: str | Path) -> None:
        """Every rank writes its own shards of the AdamW state with torch.distributed.checkpoint (a
        collective): nothing is gathered, and a resume onto another number of ranks reshards them."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        dcp.save({"optimizer": get_optimizer_state_dict(self.model, self.optimizer)}, checkpoint_id=str(path))

    def load_optimizer_shards(self, path: str | Path) -> None:
        """The AdamW state `save_optimizer_shards` wrote, at any number of ranks: DCP reads each rank's
        part of every tensor into the state this rank's shards hold (a collective)."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

        from distillery_runtime.checkpoints.optimizer_shards import load_shards

        # The state's layout (initialised by a zero-lr step of zero gradients), then the saved values, read
        # as data only: the claim may be written by other jobs (optimizer_shards.py).
        state = {"optimizer": get_optimizer_state_dict(self.model, self.optimizer)}
        load_shards(state, path)
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])

    def load_trainer_state(self, state: dict[str, Any]) -> None:
        """Optimizer (unless it was saved in shards: `load_optimizer_shards`), schedule and version."""
        if "optimizer" in state and self.fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(
                self.model,
                self.optimizer,
                state["optimizer"],
                options=StateDictOptions(full_state_dict=True),
            )
        elif "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.version = int(state["version"])
