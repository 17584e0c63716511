"""Data-parallel training across several processes with ``jax.distributed``.

On one machine (launches N processes on 127.0.0.1, a free port, CPU devices simulated):

    python examples/multi_process.py --num-processes 2 --devices-per-process 2

Across hosts, start one process per host with the address of process 0 (the same
command everywhere except --process-id; GPUs/TPUs are used as found):

    host0$ python examples/multi_process.py --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 0
    host1$ python examples/multi_process.py --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 1

(or set FUNCNET_COORDINATOR, FUNCNET_NUM_PROCESSES, FUNCNET_PROCESS_ID instead of the flags).
Every process runs the same program: the same seed gives every process the same initial
weights and the same global batches; each feeds only its own slice of each global batch,
and the gradients are averaged over every device of every process (gloo on CPU, NCCL on
GPU). torch counterpart: ``torchrun --nproc-per-node N train.py`` with
``init_process_group`` + ``DistributedDataParallel`` + ``DistributedSampler``.

If a process dies, the others stop within about --heartbeat-timeout seconds with an error
naming the lost process (or a failed collective), never a hang; the launcher then reports
which process failed first and stops the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-processes", type=int, default=None, help="processes in the run (default 2 when launching)")
    p.add_argument("--devices-per-process", type=int, default=2, help="CPU devices to simulate per process")
    p.add_argument("--process-id", type=int, default=None, help="run one process of the run (no launcher)")
    p.add_argument("--coordinator", default=None, help="host:port of process 0 (default: 127.0.0.1:<free port>)")
    p.add_argument("--parallel", choices=["shard_map", "sharding", "pmap"], default="shard_map")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="global batch, split over every device")
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="process 0 writes OUT/params.npz and OUT/metrics.json")
    p.add_argument("--init-timeout", type=int, default=60, help="seconds for every process to join")
    p.add_argument("--heartbeat-timeout", type=int, default=10, help="seconds before a silent peer counts as dead")
    p.add_argument("--timeout", type=float, default=600, help="launcher: seconds before the whole run is stopped")
    p.add_argument("--quick", action="store_true", help="1 epoch: the CI setting")
    args = p.parse_args(argv)
    if args.quick:
        args.epochs = 1
    return args


def worker(args) -> int:
    import jax
    import numpy as np
    import optax

    import funcnet
    from funcnet import data, nn, parallel, state_dict
    from funcnet.callbacks import Callback

    parallel.simulate_cpu_devices(args.devices_per_process)  # must precede the first JAX array
    cluster = parallel.initialize(args.coordinator, args.num_processes, args.process_id,
                                  initialization_timeout=args.init_timeout,
                                  heartbeat_timeout=args.heartbeat_timeout)
    me = f"[process {cluster.process_id}/{cluster.num_processes}]"
    print(f"{me} {cluster.local_devices} local of {cluster.devices} devices; global batch "
          f"{args.batch_size} = {args.batch_size // cluster.num_processes} from this process "
          f"({args.batch_size // cluster.devices} per device)", flush=True)
    (x_tr, y_tr), test = data.load("digits", seed=args.seed)
    model = nn.MLP([x_tr.shape[1], args.hidden, 10])
    tx = optax.sgd(args.lr) if args.optimizer == "sgd" else optax.adam(args.lr)

    def report(state, record):
        print(f"{me} epoch {record['epoch']} loss {record['train_loss']:.5f} "
              f"test accuracy {record['test_accuracy']:.4f}", flush=True)

    start = time.perf_counter()
    try:
        state, history = funcnet.fit(model, tx, (x_tr, y_tr), test, epochs=args.epochs,
                                     batch_size=args.batch_size, key=jax.random.key(args.seed), progress=False,
                                     strategy=args.parallel,
                                     callbacks=[Callback(on_epoch=report)])
    except jax.errors.JaxRuntimeError as e:  # a collective whose peer is gone
        print(f"{me} training stopped: a peer process failed: {e}", file=sys.stderr, flush=True)
        return 1
    seconds = time.perf_counter() - start
    print(f"{me} {args.epochs} epochs in {seconds:.1f} s", flush=True)
    if args.out and cluster.process_id == 0:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        np.savez(out / "params.npz", **{k: np.asarray(v) for k, v in state_dict(state.params).items()})
        (out / "metrics.json").write_text(json.dumps({"cluster": cluster._asdict(), "history": history},
                                                     indent=2) + "\n")
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _relay(proc, tag: str, stream, sink) -> None:
    for line in stream:
        sink.write(f"{tag} {line}")
        sink.flush()


def launch(args, argv: list[str]) -> int:
    """Start the processes, relay their output, report the first failure and stop the rest."""
    n = args.num_processes or 2
    coordinator = args.coordinator or f"127.0.0.1:{free_port()}"
    script = [sys.executable, "-u", os.path.abspath(__file__)]
    procs = []
    for rank in range(n):
        env = dict(os.environ, FUNCNET_COORDINATOR=coordinator, FUNCNET_NUM_PROCESSES=str(n),
                   FUNCNET_PROCESS_ID=str(rank))
        proc = subprocess.Popen(script + argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        for stream, sink in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
            threading.Thread(target=_relay, args=(proc, f"[{rank}]", stream, sink), daemon=True).start()
        procs.append(proc)
        print(f"started process {rank} of {n} (pid {proc.pid}), coordinator {coordinator}", flush=True)
    deadline, first_failure, grace_end = time.monotonic() + args.timeout, None, None
    while any(p.poll() is None for p in procs):
        now = time.monotonic()
        for rank, p in enumerate(procs):
            if first_failure is None and p.poll() not in (None, 0):
                first_failure = (rank, p.returncode, now)
                grace_end = now + args.heartbeat_timeout + 20
        if now > deadline or (grace_end is not None and now > grace_end):
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
            break
        time.sleep(0.1)
    codes = [p.wait() for p in procs]
    time.sleep(0.2)  # let the relays flush
    if first_failure is None and all(c == 0 for c in codes):
        print(f"all {n} processes finished", flush=True)
        return 0
    if first_failure is None:
        print(f"error: the run took longer than --timeout {args.timeout:g} s; stopped every process",
              file=sys.stderr)
        return 1
    rank, code, _ = first_failure
    others = ", ".join(f"process {r}: {_status(c)}" for r, c in enumerate(codes) if r != rank)
    print(f"error: process {rank} failed first ({_status(code)}); the others then stopped ({others})",
          file=sys.stderr)
    return 1


def _status(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.process_id is not None or "FUNCNET_PROCESS_ID" in os.environ:
        return worker(args)
    return launch(args, argv)


if __name__ == "__main__":
    __import__("funcnet.compile_cache").compile_cache.enable()  # a second run reads its compiled programs from disk
    sys.exit(main())
