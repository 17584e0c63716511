"""Step time when the data streams from disk, against data already on the device, funcnet vs torch.

The same files (``funcnet.loader.write_records``: ArrayRecord shards of uint8 1x16x16 images)
and the same per-example host transform (``CropFlip(2)``: a random crop with padding and a
horizontal flip, in NumPy) feed the same model in both frameworks (the ConvNet with
BatchNorm, SGD with momentum):

- funcnet: ``funcnet.loader.Loader(workers=k)`` (grain: worker processes, batches prefetched
  to the device) into ``make_step``; baseline: the arrays on the device, a batch gathered by
  index per step (``data.batches``), no augmentation.
- torch: ``DataLoader(Records, batch_size, shuffle=True, drop_last=True, num_workers=k,
  pin_memory=True, persistent_workers=True)`` with the transform in ``__getitem__`` (the
  torchvision way: per example, then ``ToTensor``-style scaling) into the eager step; baseline:
  the tensors in memory, ``randperm`` and indexing.

Workers start by spawning (grain always does; torch is told to, since forking a process that
runs JAX's threads can deadlock), once per configuration, before timing. Every configuration
keeps its pipeline alive and the rounds interleave them, one epoch each; within an epoch the
first ``--skip`` steps are not timed, since the batches the workers prepared while the other
configurations ran would flatter it. Ratios are medians over rounds.

    python benchmarks/data_loading.py [--workers 0 1 2] [--examples 4096] [--batch 128] [--repeat 3]
    [--json PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

ROOT = Path(__file__).resolve().parent.parent
IMAGE, PAD = 16, 2


class TorchRecords:
    """torch map-style Dataset over the records: the transform per example, in the worker."""

    def __init__(self, directory, seed):
        from funcnet import loader

        self.records, self.augment, self.seed, self.rng = loader.Records(directory), loader.CropFlip(PAD), seed, None

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        import torch

        if self.rng is None:  # one generator per worker process, seeded from torch's worker seed
            info = torch.utils.data.get_worker_info()
            self.rng = np.random.default_rng(self.seed if info is None else info.seed % 2**32)
        image, label = self.augment(self.records[i], self.rng)
        return torch.from_numpy(image.astype(np.float32) / np.float32(255)).view(-1), int(label)


def _models():
    import torch

    sys.path.insert(0, str(ROOT / "examples"))
    from port_cnn import TorchConvNet

    import funcnet
    from funcnet import models

    torch.manual_seed(0)
    theirs, ours = TorchConvNet(image=IMAGE), models.ConvNet(image=IMAGE)
    params, state = funcnet.load_state_dict(ours.init(jax.random.key(0)), theirs.state_dict(), state=ours.init_state())
    return theirs, ours, params, state


def funcnet_config(directory, x, y, batch, workers, steps, rounds, *, on_device):
    from funcnet import data, loader, train

    _, ours, params, model_state = _models()
    tx = optax.sgd(0.05, momentum=0.9)
    step = train.make_step(ours, tx)
    holder = [train.create_train_state(ours, tx, jax.random.key(0), params=params, model_state=model_state)]
    if on_device:
        xs, ys = jnp.asarray(x.reshape(len(x), -1).astype(np.float32) / np.float32(255)), jnp.asarray(y)
        keys = iter(jax.random.split(jax.random.key(1), rounds + 1))
        batches = lambda: data.batches(next(keys), xs, ys, batch)  # noqa: E731
    else:
        lo = loader.Loader(directory, batch, seed=1, workers=workers, augment=loader.CropFlip(PAD))
        stream = lo.batches(0, (rounds + 1) * steps)  # one pipeline for the whole run: workers start once
        batches = lambda: (next(stream) for _ in range(steps))  # noqa: E731

    def epoch(skip):
        state, t0 = holder[0], None
        for i, b in enumerate(batches()):
            if i == skip:
                jax.block_until_ready(state)
                t0 = time.perf_counter()
            state, _ = step(state, b)
        holder[0] = jax.block_until_ready(state)
        return (time.perf_counter() - t0) / (steps - skip)

    return epoch, (None if on_device else stream)


def torch_config(directory, x, y, batch, workers, steps, rounds, *, on_device):
    import torch

    theirs, _, _, _ = _models()
    model = type(theirs)(image=IMAGE)
    model.load_state_dict(theirs.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if on_device:
        xs, ys = torch.from_numpy(x.reshape(len(x), -1).astype(np.float32) / np.float32(255)), torch.from_numpy(y)
        gen = torch.Generator().manual_seed(1)
        batches = lambda: ((xs[i], ys[i]) for i in torch.randperm(len(xs), generator=gen)[: steps * batch].view(steps, batch))  # noqa: E731
        dl = None
    else:
        dl = torch.utils.data.DataLoader(
            TorchRecords(directory, seed=1), batch_size=batch, shuffle=True, drop_last=True, num_workers=workers,
            pin_memory=True, persistent_workers=workers > 0,
            multiprocessing_context="spawn" if workers else None, generator=torch.Generator().manual_seed(1))
        batches = lambda: iter(dl)  # noqa: E731

    def epoch(skip):
        t0 = None
        for i, (xb, yb) in enumerate(batches()):
            if i == steps:
                break
            if i == skip:
                t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(xb), yb.long()).backward()
            opt.step()
        return (time.perf_counter() - t0) / (steps - skip)

    return epoch, None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--examples", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--skip", type=int, default=8, help="untimed steps at the start of each epoch")
    parser.add_argument("--json", default=None, help="write the figures to this JSON file")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 256 examples, batch 32, 0 workers, 1 round")
    parser.add_argument("--single-thread", action="store_true",
                        help="one core for each framework's compute (torch.set_num_threads(1), XLA without its thread "
                             "pool): fair on a busy machine; the loader's workers are processes of their own")
    args = parser.parse_args(argv)
    if args.quick:
        args.workers, args.examples, args.batch, args.repeat, args.skip = [0], 256, 32, 1, 4
    import torch

    if args.single_thread:
        from funcnet import profile

        profile.one_core()  # before JAX's first computation, below
        profile.reuse_host_memory()  # each call's scratch memory kept for the next (glibc)
        torch.set_num_threads(1)
    from rich.console import Console
    from rich.table import Table

    from funcnet import loader

    # pin_memory=True is what the articles advise for GPUs; on a CPU-only machine torch ignores it, with a warning
    warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator.*")
    console = Console(width=max(Console().width, 120))
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(args.examples, 1, IMAGE, IMAGE), dtype=np.uint8)
    y = rng.integers(0, 10, size=args.examples).astype(np.int32)
    steps = args.examples // args.batch
    if steps <= args.skip:
        parser.error(f"--examples / --batch gives {steps} steps an epoch; more than --skip {args.skip} are needed")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        directory = loader.write_records(tmp, x, y, shards=8)
        configs = {}
        for fw, build in (("funcnet", funcnet_config), ("torch", torch_config)):
            configs[(fw, "on device")] = build(directory, x, y, args.batch, 0, steps, args.repeat, on_device=True)
            for k in args.workers:
                configs[(fw, k)] = build(directory, x, y, args.batch, k, steps, args.repeat, on_device=False)
        for name, (epoch, _) in configs.items():  # warm-up: compiles, starts the workers
            t0 = time.perf_counter()
            epoch(args.skip)
            console.log(f"{name}: first epoch (compile, worker start) {time.perf_counter() - t0:.1f}s")
        times = {name: [] for name in configs}
        for r in range(args.repeat):
            for name, (epoch, _) in configs.items():
                times[name].append(epoch(args.skip))
            console.log(f"round {r + 1}/{args.repeat}")
        for _, stream in configs.values():
            if stream is not None:
                stream.close()
    load_after = os.getloadavg()

    rows = []
    for (fw, k), t in times.items():
        base = times[(fw, "on device")]
        row = {"framework": fw, "source": "on device" if k == "on device" else f"loader, {k} workers",
               "workers": None if k == "on device" else k, "ms_per_step": statistics.median(t) * 1e3,
               "ms_per_step_all": [v * 1e3 for v in t],
               "vs_on_device": statistics.median(a / b for a, b in zip(t, base))}
        other = times.get(("torch" if fw == "funcnet" else "funcnet", k))
        if fw == "funcnet" and other:
            row["torch_over_funcnet"] = statistics.median(b / a for a, b in zip(t, other))
        rows.append(row)
    table = Table(title=f"ConvNet on {args.examples} uint8 1x{IMAGE}x{IMAGE} images from ArrayRecord files, CropFlip({PAD}) "
                        f"per example, batch {args.batch}, {steps} steps an epoch (first {args.skip} untimed), median "
                        f"of {args.repeat} interleaved rounds; torch {torch.__version__} ({torch.get_num_threads()} "
                        f"threads), load average {load_before[0]:.1f} -> {load_after[0]:.1f}")
    for col in ("framework", "data", "ms/step", "x on-device step time", "torch / funcnet"):
        table.add_column(col, justify="left" if col in ("framework", "data") else "right")
    for r in rows:
        table.add_row(r["framework"], r["source"], f"{r['ms_per_step']:.2f}", f"{r['vs_on_device']:.2f}",
                      f"{r['torch_over_funcnet']:.2f}" if "torch_over_funcnet" in r else "")
    console.print(table)
    console.print("x on-device step time: the step time with this data source over the same framework's step on "
                  "data already on the device (1.00 = the loader hides completely); torch / funcnet: > 1 when "
                  "funcnet's step is faster with the same data source")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": platform.platform(), "cpus": os.cpu_count(),
                       "load_average": [load_before, load_after], "torch": torch.__version__, "jax": jax.__version__,
                       "single_thread": args.single_thread, "examples": args.examples, "batch": args.batch, "steps_per_epoch": steps, "skip": args.skip,
                       "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
