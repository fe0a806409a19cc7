#!/usr/bin/env python3
"""Zoo: a Hugging Face Trainer run. Their loop (Trainer, accelerate), their mixed precision
(TrainingArguments(bf16=True): fp32 master weights, bf16 autocast), dataloader worker processes, a
Llama causal LM with random weights from a config, on a random-token torch Dataset.

Stands for: the usual fine-tuning script built on transformers.Trainer.
Defaults: LlamaForCausalLM hidden 2048, ffn 5632, 12 layers, 16 heads, vocab 32000; seq 2048,
per_device_train_batch_size 4, dataloader_num_workers 2, max_steps 12, logging_steps 1, lr 1e-4
(linear decay, Trainer's default schedule), max_grad_norm 1.0, report_to none, save_strategy no.
What the zoo measures, without touching their loop: a TrainerCallback brackets each optimizer step
between torch.cuda.synchronize() calls (on_step_begin to on_step_end: forward, backward, clipping,
optimizer and scheduler step; the batch is fetched before on_step_begin); forward pre/post hooks on
the model record CUDA events around each forward pass (fwd_ms, the GPU's time) and keep the loss the
model returned; bwd_ms runs from the forward's end to on_pre_optimizer_step (backward and gradient
clipping); device memory in use comes from common.MemorySampler, started at on_train_begin.
Methods: none, checkpointing (TrainingArguments(gradient_checkpointing=True), non-reentrant),
save_on_cpu and stream_offload (default --offload-modules MLP), entered around every forward pass by
forward hooks on the model (zoo_common.ForwardContextHooks).
Deterministic with --deterministic: common.prepare_process sets torch's deterministic mode and
CUBLAS_WORKSPACE_CONFIG before CUDA starts; TrainingArguments(full_determinism=True) is left off
because it also sets CUDA_LAUNCH_BLOCKING=1, which would serialise every kernel launch wherever it
takes effect. The dataset draws each sample from a generator seeded by its index, so worker
processes change nothing.
Under autocast the bf16 copies of the fp32 weights are saved tensors too: stream_offload (which skips
only parameters) and save_on_cpu copy them with the activations.

--loop plain drives the same callback, hooks and dataset with a minimal loop of ours in the
Trainer's order of events instead of the Trainer (the CPU tests: no transformers there); the result
says which loop ran. --tiny: a pure-torch Llama stand-in.

    python3 examples/zoo/hf_trainer.py --deterministic
"""

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zoo_common  # noqa: E402  (puts examples/ on the path)
import common  # noqa: E402

NAME = "hf_trainer"
METHODS = ("none", "checkpointing", "save_on_cpu", "stream_offload")
TINY = dict(zoo_common.LLAMA_TINY, workers=0)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    zoo_common.add_llama_arguments(parser, layers=12, hidden=2048, ffn=5632, heads=16)
    group = parser.add_argument_group("Trainer")
    group.add_argument("--workers", type=int, default=2, help="dataloader_num_workers (default 2)")
    group.add_argument("--output-dir", default=None, help="TrainingArguments.output_dir (default: a temporary one)")
    group.add_argument("--loop", choices=("trainer", "plain"), default="trainer",
                       help="trainer: transformers.Trainer (default); plain: our minimal loop in the Trainer's order "
                            "of events, for tests without transformers")
    zoo_common.add_zoo_arguments(parser, METHODS, default_offload_modules="MLP", default_seq=2048, default_batch=4)
    return zoo_common.parse_zoo_args(parser, argv, TINY, own_loop=True, dtypes=("bf16", "fp16", "fp32"))


def random_token_dataset(vocab, seq, length, seed):
    """A map-style Dataset of `length` samples {input_ids, labels} of random tokens, sample i drawn from
    a generator seeded by (seed, i): the same data in any worker process and any order."""
    import torch

    class RandomTokenDataset(torch.utils.data.Dataset):
        def __len__(self):
            return length

        def __getitem__(self, index):
            if not 0 <= index < length:
                raise IndexError(index)
            generator = torch.Generator().manual_seed(int(seed) * 1000003 + int(index))
            ids = torch.randint(0, vocab, (seq,), generator=generator)
            return {"input_ids": ids, "labels": ids.clone()}

    return RandomTokenDataset()


def training_arguments(args, output_dir, device):
    """The TrainingArguments of this run, as keyword arguments."""
    checkpointing = args.method == "checkpointing"
    kwargs = dict(output_dir=output_dir, max_steps=args.steps, per_device_train_batch_size=args.batch,
                  gradient_accumulation_steps=1, learning_rate=args.lr, max_grad_norm=1.0,
                  bf16=args.dtype == "bf16", fp16=args.dtype == "fp16", dataloader_num_workers=args.workers,
                  logging_steps=1, report_to="none", save_strategy="no", seed=args.seed, data_seed=args.seed,
                  gradient_checkpointing=checkpointing, use_cpu=device.type == "cpu", disable_tqdm=True,
                  optim="adamw_torch")
    if checkpointing:
        kwargs["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    return kwargs


class StepRecorder:
    """Measures steps of a loop it does not own. Call on_train_begin, then per optimizer step
    on_step_begin, (forward passes: seen by the hooks), on_pre_optimizer_step, on_step_end, and
    on_train_end; then result(). The forward hooks count only inside a step."""

    def __init__(self, model, device, args):
        self.device = device
        self.args = args
        self.cuda = device.type == "cuda"
        self.sampler = None
        self.timer = None
        self.in_step = False
        self.pending = []
        self.start = None
        self.losses, self.step_ms, self.fwd_ms, self.bwd_ms, self.forwards = [], [], [], [], []
        self._handles = [model.register_forward_pre_hook(self._forward_begins),
                         model.register_forward_hook(self._forward_ends)]

    def _forward_begins(self, module, inputs):
        if self.in_step:
            if self.timer.running("backward"):  # the previous micro-batch's backward ended before this forward
                self.timer.stop("backward")
            self.timer.start("forward")

    def _forward_ends(self, module, inputs, output):
        if not self.in_step:
            return
        self.timer.stop("forward")
        loss = output["loss"] if isinstance(output, dict) else getattr(output, "loss", None)
        if loss is None and isinstance(output, (tuple, list)):
            loss = output[0]
        self.pending.append(loss.detach())
        self.timer.start("backward")

    def on_train_begin(self):
        self.sampler = zoo_common.start_memory_sampler(self.device, self.args)

    def on_step_begin(self):
        zoo_common.synchronize(self.device)
        self.timer = zoo_common.PhaseTimer(self.cuda)
        self.pending = []
        self.in_step = True
        self.start = time.perf_counter()

    def on_pre_optimizer_step(self):
        if self.in_step and self.timer.running("backward"):
            self.timer.stop("backward")

    def on_step_end(self):
        self.on_pre_optimizer_step()  # a Trainer without that event: the backward ends here
        zoo_common.synchronize(self.device)
        self.step_ms.append((time.perf_counter() - self.start) * 1000.0)
        if self.sampler is not None:
            self.sampler.step_ended()
        self.in_step = False
        self.fwd_ms.append(self.timer.total_ms("forward"))
        self.bwd_ms.append(self.timer.total_ms("backward"))
        values = [float(v.float().item()) for v in self.pending]
        self.losses.append(sum(values) / len(values) if values else float("nan"))
        self.forwards.append(len(values))
        self.pending = []

    def on_train_end(self):
        if self.sampler is not None:
            self.sampler.stop()

    def remove(self):
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def result(self, config, extra=None):
        fields = {"microbatches": max(self.forwards) if self.forwards else 0, "forwards_per_step": self.forwards}
        fields.update(extra or {})
        sampler = self.sampler or common.MemorySampler(enabled=False)
        return zoo_common.loop_result(NAME, self.args, self.device, config, self.losses, self.step_ms, self.fwd_ms,
                                      self.bwd_ms, sampler, fields)


def trainer_callback(recorder):
    """A transformers.TrainerCallback forwarding the Trainer's events to the recorder."""
    from transformers import TrainerCallback

    class ZooStepCallback(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            recorder.on_train_begin()

        def on_step_begin(self, args, state, control, **kwargs):
            recorder.on_step_begin()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            recorder.on_pre_optimizer_step()

        def on_step_end(self, args, state, control, **kwargs):
            recorder.on_step_end()

        def on_train_end(self, args, state, control, **kwargs):
            recorder.on_train_end()

    return ZooStepCallback()


def run_trainer(args, model, dataset, recorder, output_dir, device):
    """transformers.Trainer(...).train() with the recorder's callback; returns what the result says
    about the Trainer. TrainingArguments this transformers lacks are left out and named (stderr and
    result), never silently."""
    transformers = zoo_common.import_transformers(
        "--loop trainer (transformers.Trainer)", "--loop plain drives the same callback and hooks without it")
    Trainer, TrainingArguments = transformers.Trainer, transformers.TrainingArguments

    wanted = training_arguments(args, output_dir, device)
    known = {field.name for field in dataclasses.fields(TrainingArguments)}
    dropped = sorted(set(wanted) - known)
    if dropped:
        sys.stderr.write("hf_trainer: this transformers has no TrainingArguments %s; left out\n" % ", ".join(dropped))
    training_args = TrainingArguments(**{k: v for k, v in wanted.items() if k in known})
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset, callbacks=[trainer_callback(recorder)])
    trainer.train()
    return {"loop": "transformers.Trainer", "transformers": transformers.__version__,
            "training_arguments": {k: v for k, v in wanted.items() if k in known and k != "output_dir"},
            "training_arguments_left_out": dropped}


def run_plain_loop(args, model, dataset, recorder, device):
    """The Trainer's order of events driven by a minimal loop (no transformers): a shuffling
    DataLoader with the same workers, AdamW, autocast as bf16=True sets it, clip 1.0."""
    import torch

    if args.method == "checkpointing":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, shuffle=True, num_workers=args.workers,
                                         generator=torch.Generator().manual_seed(args.seed), drop_last=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    recorder.on_train_begin()
    try:
        for _, batch in zip(range(args.steps), loader):
            batch = {key: value.to(device) for key, value in batch.items()}
            recorder.on_step_begin()
            with zoo_common.autocast_context(device, args.dtype):
                loss = model(**batch)["loss"]
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            recorder.on_pre_optimizer_step()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            recorder.on_step_end()
    finally:
        recorder.on_train_end()
    return {"loop": "plain (not the Trainer: the Trainer's events driven by hf_trainer.run_plain_loop)"}


def main(argv=None, out=None):
    args = parse_args(argv)
    if "WORLD_SIZE" not in os.environ and args.device in (None, "cuda"):
        # One process on a machine with several GPUs: the Trainer would wrap the model in
        # nn.DataParallel over all of them. This job stands for a single-GPU run: one GPU it sees.
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")
    common.prepare_process(args)
    device = common.pick_device(args)
    # Trainer's mixed precision keeps fp32 master weights: the model is built in fp32.
    model, config = zoo_common.build_llama(args, device, common.torch_dtype("fp32"))
    config.update(seq=args.seq, batch=args.batch, workers=args.workers, weights="fp32",
                  autocast=None if args.dtype == "fp32" else args.dtype)
    dataset = random_token_dataset(args.vocab, args.seq, args.steps * args.batch, args.seed)
    factory, offload = zoo_common.method_forward_context(args.method, model, args, device)
    context_hooks = None
    if args.method in ("save_on_cpu", "stream_offload"):
        # Registered before the recorder's hooks: entered first, left first, so the forward's timing
        # includes what leaving costs (StreamOffload makes the compute stream wait for its copies).
        context_hooks = zoo_common.ForwardContextHooks(model, factory)
    recorder = StepRecorder(model, device, args)
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="zoo-hf-trainer-")
    try:
        if args.loop == "trainer":
            loop_fields = run_trainer(args, model, dataset, recorder, output_dir, device)
        else:
            loop_fields = run_plain_loop(args, model, dataset, recorder, device)
    finally:
        if args.output_dir is None:
            shutil.rmtree(output_dir, ignore_errors=True)
    if context_hooks is not None:
        context_hooks.remove()
    extra = dict(loop_fields, **zoo_common.determinism_fields(args))
    if offload is not None:
        extra["stream_offload"] = offload.stats()
    result = recorder.result(config, extra)
    common.emit_result(result, out, args.result_json)
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
