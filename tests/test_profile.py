"""funcnet.profile: timers wait for results, benchmark statistics, traces, flop counts."""

import ast
import os
import platform
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import pytest

from funcnet import profile


@jax.jit
def _matmul_chain(a):
    for _ in range(40):
        a = jnp.tanh(a @ a)
    return a


@pytest.fixture(scope="module")
def square():
    a = jax.random.normal(jax.random.key(0), (512, 512)) / 512**0.5
    _matmul_chain(a).block_until_ready()  # compile outside the timings
    return a


def test_benchmark_of_a_known_sleep():
    result = profile.benchmark(time.sleep, 0.01, warmup=1, repeat=5)
    assert len(result.samples) == 5 and result.number == 1
    # sleep guarantees at least its duration; the upper bound only rules out nonsense units
    assert 0.01 <= result.min <= result.median < 0.5
    assert result.min == min(result.samples)
    assert result.median == statistics.median(result.samples)
    assert result.mean == pytest.approx(sum(result.samples) / 5)
    assert result.first is not None and result.first >= 0.01


def test_benchmark_calls_warmup_plus_repeat_times_number():
    calls = []
    result = profile.benchmark(lambda v: calls.append(v) or jnp.asarray(v), 3, warmup=2, repeat=3, number=4)
    assert len(calls) == 2 + 3 * 4
    assert len(result.samples) == 3 and result.number == 4
    assert profile.benchmark(lambda: None, warmup=0, repeat=1).first is None


def test_benchmark_excludes_compilation_from_the_samples():
    @jax.jit
    def fresh(a):  # a new function: the first call compiles
        return jnp.tanh(a @ a.T).sum()

    result = profile.benchmark(fresh, jnp.ones((64, 64)), warmup=1, repeat=5)
    assert result.first > result.median  # compile + run vs run


def test_blocking_timer_waits_for_the_work(square):
    # without blocking the clock stops at dispatch: the result is not even computed yet
    out, dispatch = profile.timed(_matmul_chain, square, block=False)
    ready_at_return = out.is_ready()
    out.block_until_ready()
    out, blocked = profile.timed(_matmul_chain, square)
    assert out.is_ready()
    assert not ready_at_return
    assert blocked >= dispatch


def test_timer_context_manager_blocks_on_what_it_is_handed(square):
    with profile.Timer() as lazy:
        out = _matmul_chain(square)
    ready_at_exit = out.is_ready()
    out.block_until_ready()
    with profile.Timer() as waited:
        out = waited.block(_matmul_chain(square))
    assert not lazy.blocked and waited.blocked
    assert not ready_at_exit and out.is_ready()
    assert waited.seconds >= lazy.seconds


def test_trace_writes_profile_files(tmp_path):
    with profile.trace(tmp_path / "run") as logdir:
        jnp.tanh(jnp.ones((128, 128)) @ jnp.ones((128, 128))).block_until_ready()
    files = list(logdir.glob("plugins/profile/*/*.xplane.pb"))
    assert files and all(f.stat().st_size > 0 for f in files)
    assert list(logdir.glob("plugins/profile/*/*.trace.json.gz"))


def test_trace_rejects_a_file_as_logdir(tmp_path):
    target = tmp_path / "not_a_dir"
    target.write_text("x")
    with pytest.raises(ValueError, match=r"not_a_dir.*not a directory"):
        with profile.trace(target):
            pass


@pytest.mark.parametrize("m, k, n", [(3, 5, 7), (64, 128, 32)])
def test_flops_of_a_matmul_is_2mkn(m, k, n):
    a, b = jax.ShapeDtypeStruct((m, k), jnp.float32), jax.ShapeDtypeStruct((k, n), jnp.float32)
    assert profile.flops(jnp.matmul, a, b) == 2 * m * k * n
    assert profile.flops(jnp.matmul, a, b, optimized=False) == 2 * m * k * n


def test_matmul_peak_is_a_positive_rate():
    peak = profile.matmul_peak(128, repeat=2, number=2)
    assert peak > 0 and peak != float("inf")


@pytest.mark.parametrize(
    "kwargs, match",
    [({"repeat": 0}, r"repeat.*>= 1.*0"), ({"number": 0}, r"number.*>= 1.*0"),
     ({"warmup": -1}, r"warmup.*>= 0.*-1"), ({"repeat": 2.5}, r"repeat.*int.*2\.5")],
)
def test_benchmark_rejects_bad_counts(kwargs, match):
    with pytest.raises(ValueError, match=match):
        profile.benchmark(lambda: None, **kwargs)


def test_matmul_peak_rejects_bad_size():
    with pytest.raises(ValueError, match=r"n.*>= 1.*0"):
        profile.matmul_peak(0)


_ONE_CORE = """
import os, sys, time
from funcnet import profile
core = profile.one_core()
import jax, jax.numpy as jnp
x = jnp.ones((384, 384))
f = jax.jit(lambda x: [jnp.tanh(x @ x + i) for i in range(16)])  # independent ops XLA may run side by side
jax.block_until_ready(f(x))
cpu, wall = time.process_time(), time.perf_counter()
for _ in range(5):
    jax.block_until_ready(f(x))
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
masks = set()
for tid in os.listdir("/proc/self/task"):
    status = open(f"/proc/self/task/{tid}/status").read()
    masks.add(status.split("Cpus_allowed_list:")[1].split()[0])
try:
    profile.one_core()
    late = "no error"
except RuntimeError as e:
    late = str(e)
print(repr((core, sorted(masks), cpu, wall, late)))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="threads' CPU masks are read from Linux's /proc")
def test_one_core_confines_every_thread_jax_starts_and_refuses_once_jax_has_started():
    # in a child: the pin would confine this test worker for the rest of its tests
    out = subprocess.run([sys.executable, "-c", _ONE_CORE], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "XLA_FLAGS": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    core, masks, cpu, wall, late = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert masks == [str(core)]  # JAX's pool threads included (they start after the call)
    assert cpu <= 1.05 * wall + 0.02  # one core can spend no more CPU time than wall time
    assert "call profile.one_core() before the first JAX computation" in late


_REUSE = """
import resource, sys, time
from funcnet import profile
if sys.argv[1] == "reuse":
    profile.reuse_host_memory()
import jax, jax.numpy as jnp
ws = [jnp.full((512, 512), 0.01) for _ in range(12)]
x = jnp.ones((4096, 512))
def loss(ws, x):
    for w in ws:
        x = jnp.tanh(x @ w)
    return x.sum()
step = jax.jit(jax.grad(loss))  # keeps 12 activations of 8 MiB for the backward: scratch memory
temp = step.lower(ws, x).compile().memory_analysis().temp_size_in_bytes
faults = []
for _ in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    jax.block_until_ready(step(ws, x))
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    time.sleep(0.02)  # XLA frees the call's scratch memory on its own thread after the result
try:
    profile.reuse_host_memory()
    late = "no error"
except RuntimeError as e:
    late = str(e)
print(repr((temp, faults, late)))
"""


@pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_reuse_host_memory_stops_each_call_faulting_its_scratch_memory_in_again():
    # page faults a call, from the operating system's count; in children, as the setting is the process's
    pages = {}
    for mode in ("default", "reuse"):
        out = subprocess.run([sys.executable, "-c", _REUSE, mode], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "XLA_FLAGS": ""})
        assert out.returncode == 0, out.stderr[-2000:]
        temp, faults, late = ast.literal_eval(out.stdout.strip().splitlines()[-1])
        assert temp >= 64 * 2**20  # larger than glibc's largest heap allocation (32 MiB): served by mmap
        pages[mode] = (sorted(faults[-4:])[1], temp // 4096)
    faulted, temp_pages = pages["default"]
    assert faulted > temp_pages / 2  # the control: each call takes its scratch memory from the OS again
    faulted, temp_pages = pages["reuse"]
    assert faulted < temp_pages / 20  # the call reuses the memory the last one freed
    assert "call profile.reuse_host_memory() before the first JAX computation" in late
