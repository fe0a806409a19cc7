#!/usr/bin/env python3
"""Zoo: a convolutional network, torchvision's ResNet-50 (random weights, weights=None), whose
Bottleneck blocks add the shortcut in place (`out += identity`) and use in-place ReLU, trained on
random images and labels with cross-entropy, channels_last and bf16 autocast on CUDA, fp32 weights,
AdamW (common.train's loop).

Stands for: image-classification training as torchvision's reference scripts do it (synthetic data).
Defaults: ResNet-50 (Bottleneck blocks 3,4,6,3, width 64), 1000 classes, 224x224 images, batch 256
(an estimated 50-60 MB of saved activations an image in bf16: over 10 GB), 12 steps (3 warm-up). Images and
labels are drawn on the device from a generator seeded per step (no host-side data pipeline).
--dtype bf16 means fp32 weights under bf16 autocast (default); fp32 means no autocast.
Methods: none, checkpointing (torch.utils.checkpoint per Bottleneck block, non-reentrant: 16 regions;
the stem, pooling and head are not checkpointed), save_on_cpu, stream_offload (default
--offload-modules Bottleneck). In train mode, batch norm normalises with the batch's statistics, so
recomputation gives the same activations (it updates the running statistics a second time, which
only evaluation would read).

Deterministic mode (--deterministic): cuDNN deterministic algorithms, no cudnn.benchmark, and the
final AdaptiveAvgPool2d(1) is replaced by a mean over height and width (the same function): torch has
no deterministic CUDA backward for adaptive_avg_pool2d and raises in that mode. The result's config
says which pooling ran. Without --deterministic, cudnn.benchmark is on, as the reference scripts do.

    python3 examples/zoo/resnet.py --deterministic
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import zoo_common  # noqa: E402  (puts examples/ on the path)
import common  # noqa: E402

NAME = "resnet"
METHODS = ("none", "checkpointing", "save_on_cpu", "stream_offload")
RESNET50_BLOCKS = "3,4,6,3"
TINY = dict(blocks="1,1,1,1", width_per_group=16, classes=10, image=32, batch=2)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_argument_group("model (torchvision ResNet with Bottleneck blocks)")
    group.add_argument("--blocks", default=RESNET50_BLOCKS,
                       help="Bottleneck blocks per stage (default %(default)s: ResNet-50)")
    group.add_argument("--width-per-group", type=int, default=64, help="Bottleneck base width (default 64)")
    group.add_argument("--classes", type=int, default=1000, help="classes (default 1000)")
    group.add_argument("--image", type=int, default=224, help="image height and width (default 224)")
    zoo_common.add_zoo_arguments(parser, METHODS, default_offload_modules="Bottleneck", default_seq=0,
                                 default_batch=256)
    args = zoo_common.parse_zoo_args(parser, argv, TINY, dtypes=("bf16", "fp32"))
    try:
        args.blocks = [int(n) for n in args.blocks.split(",")]
    except ValueError:
        parser.error("--blocks: four comma-separated counts, got %r" % args.blocks)
    if len(args.blocks) != 4 or min(args.blocks) < 1:
        parser.error("--blocks: four counts of at least 1, got %r" % args.blocks)
    return args


def build_resnet(args, device):
    """(model, config): ResNet with Bottleneck blocks, random weights (seeded), fp32, on device;
    channels_last on CUDA; with --deterministic the global pooling as a mean (see the docstring)."""
    import torch
    from torch import nn
    from torchvision.models.resnet import Bottleneck, ResNet

    class GlobalMeanPool(nn.Module):
        """AdaptiveAvgPool2d(1) as a mean over height and width, which has a deterministic backward."""

        def forward(self, x):
            return x.mean(dim=(2, 3), keepdim=True)

    class CheckpointableResNet(nn.Module):
        """torchvision's ResNet as it is, plus gradient_checkpointing_enable(): then its forward is
        torchvision's _forward_impl with each Bottleneck block a checkpointed region."""

        def __init__(self, net):
            super().__init__()
            self.net = net
            self.checkpoint_blocks = False

        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            self.checkpoint_blocks = True

        def forward(self, images):
            net = self.net
            if not (self.checkpoint_blocks and self.training):
                return net(images)
            x = net.maxpool(net.relu(net.bn1(net.conv1(images))))
            for stage in (net.layer1, net.layer2, net.layer3, net.layer4):
                for block in stage:
                    x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            return net.fc(torch.flatten(net.avgpool(x), 1))

    torch.manual_seed(args.seed)
    net = ResNet(Bottleneck, args.blocks, num_classes=args.classes, width_per_group=args.width_per_group)
    pooling = "AdaptiveAvgPool2d(1)"
    if args.deterministic:
        net.avgpool = GlobalMeanPool()
        pooling = "mean over H, W (deterministic backward)"
    model = CheckpointableResNet(net).to(device)
    channels_last = device.type == "cuda"
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    arch = "resnet50" if args.blocks == [3, 4, 6, 3] and args.width_per_group == 64 else "resnet-bottleneck"
    return model, {"model": "torchvision ResNet (%s)" % arch, "blocks": args.blocks,
                   "width_per_group": args.width_per_group, "classes": args.classes, "image": args.image,
                   "batch": args.batch, "channels_last": channels_last, "weights": "fp32",
                   "autocast": None if args.dtype == "fp32" else args.dtype, "global_pool": pooling,
                   "parameters": sum(p.numel() for p in model.parameters())}


def random_images(args, device, channels_last):
    """make_batch: images N(0, 1) and labels drawn on the device, from a generator seeded per step."""
    import torch

    def make_batch(step):
        generator = torch.Generator(device=device).manual_seed(int(args.seed) * 1000003 + int(step))
        images = torch.randn(args.batch, 3, args.image, args.image, generator=generator, device=device)
        labels = torch.randint(0, args.classes, (args.batch,), generator=generator, device=device)
        if channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return {"images": images, "labels": labels}

    return make_batch


def main(argv=None, out=None):
    args = parse_args(argv)
    torch = common.prepare_process(args)
    if args.deterministic:
        torch.backends.cudnn.deterministic = True
    else:
        torch.backends.cudnn.benchmark = True  # as torchvision's reference training script
    device = common.pick_device(args)
    model, config = build_resnet(args, device)
    if args.method == "checkpointing":
        config["checkpointing"] = "per Bottleneck block: torch.utils.checkpoint, non-reentrant"

    def compute_loss(model, batch):
        with zoo_common.autocast_context(device, args.dtype):
            logits = model(batch["images"])
        return torch.nn.functional.cross_entropy(logits.float(), batch["labels"])

    job = common.Job(NAME, model, random_images(args, device, config["channels_last"]), compute_loss, config,
                     result_fields=zoo_common.determinism_fields(args))
    return common.train(job, args, out=out)


if __name__ == "__main__":
    main()
    sys.exit(0)
