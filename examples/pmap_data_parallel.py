"""The articles' five-line training loop, data parallel over N devices with ``pmap``.

torch (one process per GPU, launched by torchrun)::

    model = DistributedDataParallel(model)
    for data, target in dataloader:          # a DistributedSampler gives each GPU its share
        optimizer.zero_grad()
        output = model(data)
        loss = loss_fn(output, target)
        loss.backward()                      # DDP all-reduces the gradients here
        optimizer.step()

JAX (one process drives every device): the step is one pure function; ``pmap`` runs a
copy on each device over its block of the batch and ``lax.pmean`` averages the gradients.

    python examples/pmap_data_parallel.py --devices 4

On a CPU-only machine the devices are simulated (they share the CPU cores, so the
throughput shows the mechanics, not a speed-up); on GPUs/TPUs the real ones are used.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import optax

import funcnet
from funcnet import data, nn, parallel


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=128, help="global batch, split over the devices")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="2 devices, 2 epochs: the CI setting")
    args = p.parse_args(argv)
    if args.quick:
        args.devices, args.epochs = 2, 2
    bar = 0.5  # test accuracy, five times chance: 2 epochs of SGD at lr 0.1 reach 0.64

    parallel.simulate_cpu_devices(args.devices)  # before the first array; no effect on GPUs/TPUs
    n = args.devices
    devices = parallel.data_mesh(n).devices.tolist()
    (x_tr, y_tr), (x_te, y_te) = data.load("digits", seed=args.seed)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    tx = optax.sgd(args.lr)

    step = funcnet.make_step(model, tx, axis_name="data")  # pmap-ed; gradients pmean-ed over "data"
    key, data_key = jax.random.split(jax.random.key(args.seed))
    state = parallel.replicate(funcnet.create_train_state(model, tx, key), devices)
    print(f"{n} {devices[0].platform} devices; global batch {args.batch_size} = {n} devices x "
          f"{args.batch_size // n} per device")

    for epoch in range(1, args.epochs + 1):
        data_key, perm_key = jax.random.split(data_key)
        start, steps, pending = time.perf_counter(), 0, None
        for x, y in data.batches(perm_key, x_tr, y_tr, args.batch_size):
            state, metrics = step(state, parallel.shard((x, y), n))  # zero_grad..step in one call
            # Wait for the previous step only: the host stays one step ahead of the devices,
            # and the queue stays short (XLA:CPU can deadlock with dozens of all-reduce steps
            # queued on simulated devices).
            jax.block_until_ready(pending)
            pending, steps = metrics, steps + 1
        jax.block_until_ready(state)
        seconds = time.perf_counter() - start
        scores = funcnet.evaluate(model, parallel.unreplicate(state).params, x_te, y_te)
        loss = float(parallel.unreplicate(metrics)["loss"])
        note = " (includes compiling)" if epoch == 1 else ""
        print(f"epoch {epoch}: loss {loss:.4f}  test accuracy {scores['accuracy']:.4f}  "
              f"{steps / seconds:.0f} steps/s, {steps * args.batch_size / seconds:.0f} examples/s{note}")
    if scores["accuracy"] <= bar:
        print(f"FAILED: test accuracy {scores['accuracy']:.4f} is not above the bar {bar}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    __import__("funcnet.compile_cache").compile_cache.enable()  # a second run reads its compiled programs from disk
    sys.exit(main())
