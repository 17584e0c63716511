"""The Benchmarks page's figures, from the saved runs ``docs/data/bench_NAME.json``.

docs/benchmarks.md states no measured number by hand: where a figure goes, it holds a
placeholder that this module fills at build time (``site.py``'s ``on_page_markdown``) from the
saved run of ``benchmarks/NAME.py`` (written by ``python -m docs_hooks.save_bench NAME ARGS``):

- ``{{ run NAME }}``: where, when and how the run was made: command, date, machine, load
  average, versions (and, for figures copied from an earlier page, where they were copied from);
- ``{{ table NAME }}``: the run's table, the rows its script prints;
- ``{{ plot NAME }}``: its plot, an SVG drawn by ``docs_hooks.bench_plots`` at build time;
- ``{{ figure NAME KEY }}``: one figure of it, named in ``FIGURES``.

tests/test_bench_page.py checks that every saved run has the fields these need, that the
page's hand-written text holds no measured number, and that each table's cells are the run's.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

__all__ = ["BENCHES", "FIGURES", "PLACEHOLDER", "load", "provenance", "render", "table"]

DATA = Path(__file__).resolve().parents[1] / "docs" / "data"
BENCHES = ("throughput", "models", "start_up", "main_command", "precision", "stream_train", "data_loading",
           "run_epoch", "data_parallel", "loaded_runs", "conv_sweep", "conv_models", "conv_models_grid",
           "parallel_step", "gpt_small", "convert_zoo_libraries")
PLACEHOLDER = re.compile(r"\{\{ *(run|table|plot|figure) +([a-z_]+)(?: +([a-z_0-9]+))? *\}\}")
RUN_FIELDS = ("command", "date", "machine", "load", "versions")

THROUGHPUT_COLUMNS = {"torch eager": "torch eager", "torch.compile": "torch.compile", "flax nnx": "flax nnx",
                      "raw JAX": "raw JAX", "funcnet make_step": "`make_step` loop", "funcnet run_epoch": "`run_epoch`",
                      "matmul floor": "the model's matmuls alone"}
PEERS = ("raw JAX", "flax nnx", "equinox")
# runs saved under another name than their script's (save_bench --name): the arguments that save them
SAVED_AS = {"conv_sweep": "conv --name conv_sweep --part sweep ...",
            "conv_models": "conv --name conv_models --part models ...",
            "conv_models_grid": "conv --name conv_models_grid --part models ..."}


def load(name: str, data: Path = DATA) -> dict:
    """The saved run ``{"run": {...}, "result": {...}}`` of ``benchmarks/NAME.py``.

    Raises ValueError naming the file, what is missing and the command that saves it again."""
    path = data / f"bench_{name}.json"
    again = f"python -m docs_hooks.save_bench {SAVED_AS.get(name, name)}"
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: no saved run ({type(e).__name__}: {e}); save one with {again}") from None
    missing = [f for f in RUN_FIELDS if f not in saved.get("run", {})]
    if missing or "result" not in saved:
        raise ValueError(f"{path}: the run record lacks {missing or ['result']}; save it again with {again}")
    return saved


def _f(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}"


def provenance(saved: dict) -> str:
    """The admonition above a table: command, date, machine, load, versions."""
    run = saved["run"]
    load = run["load"]
    loads = (f"{load[0]:g}-{load[1]:g} over the run" if run.get("transcribed_from")
             else f"{load[0]:g} before the run and {load[1]:g} after it")
    versions = ", ".join(f"{k} {v}" for k, v in run["versions"].items())
    took = f", {run['seconds']} s" if "seconds" in run else ""
    took += f" at niceness {run['niceness']}" if run.get("niceness") else ""
    text = f"`{run['command']}` on {run['date']}{took}; {run['machine']}; load average {loads}; {versions}."
    if run.get("transcribed_from"):
        text += f" Copied from {run['transcribed_from']}."
    return f'!!! info "Saved run"\n    {text}\n'


def _throughput(result: dict) -> str:
    rows = [r for r in result["rows"] if r.get("seconds_per_epoch")]
    impls = [i for i in THROUGHPUT_COLUMNS if any(r["impl"] == i for r in rows)]
    out = ["| batch | " + " | ".join(THROUGHPUT_COLUMNS[i] for i in impls) + " |", "|---" * (len(impls) + 1) + "|"]
    for batch in sorted({r["batch"] for r in rows}):
        cells = []
        for impl in impls:
            r = next((r for r in rows if r["impl"] == impl and r["batch"] == batch), None)
            cell = "-" if r is None else _f(r["seconds_per_epoch"] * 1e3, 1)
            if r is not None and impl == "funcnet run_epoch" and "vs_torch_eager" in r:
                cell += f" ({_f(r['vs_torch_eager'])}x torch)"
            cells.append(cell)
        out.append(f"| {batch} | " + " | ".join(cells) + " |")
    goals = [f"- {'met' if g['met'] else '**missed**'}: {g['goal']}: {g['figure']}" for g in result.get("goals", [])]
    return "\n".join(out) + ("\n\nThe script's goals, checked on this run:\n\n" + "\n".join(goals) if goals else "")


def _models(result: dict) -> str:
    out = ["| model | row | ms/step | CPU ms/step | x torch eager | x torch.compile | start-up s | "
           "trace / lower / compile s | peak MB | max diff vs torch |", "|---" * 10 + "|"]
    for r in result["rows"]:
        st = r.get("stages_s")
        stages = "-" if not st else " / ".join(_f(st[k]) for k in ("trace", "lower", "compile")) + \
            (" (epoch)" if r.get("stages_whole_epoch") else "")
        vs = r["vs"]
        mb = r["peak_mb"] if "peak_mb" in r else r["memory"]["peak"] / 2**20
        diff = f"{r['max_diff_vs_torch_eager']:.1e}" + (" (= make_step, bitwise)" if r.get("bitwise_equal_make_step")
                                                        else "")
        out.append(f"| {r['model']} | {r['impl']} | {_f(r['ms_per_step'])} | {_f(r['cpu_ms_per_step'])} | "
                   + " | ".join(_f(vs[k]) if k in vs else "-" for k in ("torch eager", "torch.compile"))
                   + f" | {_f(r['startup_s'])} | {stages} | {_f(mb, 1)} | {diff} |")
    peers = [r for r in result["rows"] if r["impl"].startswith("funcnet") and any(p in r["vs"] for p in PEERS)]
    if peers:
        out += ["", "funcnet against the JAX peers: the peer's time over funcnet's, medians of per-round ratios, "
                "wall / CPU (> 1: funcnet faster):", "",
                "| model | funcnet row | " + " | ".join(PEERS) + " |", "|---" * (2 + len(PEERS)) + "|"]
        for r in peers:
            out.append(f"| {r['model']} | {r['impl']} | " + " | ".join(
                f"{_f(r['vs'][p])} / {_f(r['vs_cpu'][p])}x" if p in r["vs"] else "-" for p in PEERS) + " |")
    return "\n".join(out)


def _start_up(result: dict) -> str:
    out = ["| command | rounds | cache entries | CPU s: off / empty / filled | off / filled CPU | off / filled wall |",
           "|---" * 6 + "|"]
    for name, r in result.items():
        c = r["median_cpu"]
        out.append(f"| `python {' '.join(r['argv'])}` | {len(r['cpu']['off'])} | {r['entries']} ({r['bytes'] / 2**20:.1f} MB) | "
                   f"{_f(c['off'], 1)} / {_f(c['cold'], 1)} / {_f(c['warm'], 1)} | {_f(r['cpu_ratios']['off'])}x | "
                   f"{_f(r['wall_ratios']['off'])}x |")
    return "\n".join(out)


def _run_epoch(result: dict) -> str:
    out = [f"| batch | steps/epoch | make_step loop, s per {result['epochs']} epochs | run_epoch scan | speed-up | "
           "max param diff |", "|---" * 6 + "|"]
    for r in result["rows"]:
        out.append(f"| {r['batch']} | {r['steps']} | {r['loop_seconds']:.3f} | {r['scan_seconds']:.3f} | "
                   f"{_f(r['speedup'], 1)}x | {r['max_param_diff']:g} |")
    return "\n".join(out)


def _stream_train(result: dict) -> str:
    out = ["| data | training s | x in memory | end to end s | x in memory | test accuracy |", "|---" * 6 + "|"]
    for r in result["rows"]:
        out.append(f"| {r['source']} | {_f(r['train_s'], 1)} | {_f(r['train_vs_memory'])}x | {_f(r['wall_s'], 1)} | "
                   f"{_f(r['wall_vs_memory'])}x | {_f(r['test_accuracy'], 4)} |")
    same = "bitwise equal" if result["same_bits_across_workers"] else "**not** equal"
    return "\n".join(out) + f"\n\nThe streamed runs' parameters are {same} whatever the number of workers."


def _data_loading(result: dict) -> str:
    out = ["| framework | data | ms/step | x on-device step | torch / funcnet |", "|---" * 5 + "|"]
    for r in result["rows"]:
        tf = _f(r["torch_over_funcnet"]) if "torch_over_funcnet" in r else ""
        out.append(f"| {r['framework']} | {r['source']} | {_f(r['ms_per_step'])} | {_f(r['vs_on_device'])} | {tf} |")
    return "\n".join(out)


def _data_parallel(result: dict) -> str:
    kinds = list(result["rows"][0]["steps_per_s"])
    out = ["| devices | per-device batch | " + " | ".join(f"{k} steps/s" for k in kinds) + " | best over 1 device's |",
           "|---" * (3 + len(kinds)) + "|"]
    for r in result["rows"]:
        out.append(f"| {r['devices']} | {r['per_device_batch']} | "
                   + " | ".join(_f(r["steps_per_s"][k], 0) for k in kinds) + f" | {_f(r['best_vs_one_device'])}x |")
    return "\n".join(out)


def _loaded_summary(result: dict) -> dict:
    if "summary" in result:
        return result["summary"]
    runs = result["runs"]
    secs, loads = [r["seconds"] for r in runs], [r["load"][0] for r in runs]
    return {"runs": len(runs), "passed": sum(r["status"] == 0 for r in runs), "seconds": [min(secs), max(secs)],
            "load_at_ends": [min(loads), max(loads)]}


def _loaded_runs(result: dict) -> str:
    s = _loaded_summary(result)
    return (f"{s['passed']} of {s['runs']} runs of `{' '.join(result['command'])}` passed, in "
            f"{s['seconds'][0]:g}-{s['seconds'][1]:g} s each, {result['busy']} spinning processes beside them, "
            f"load average {s['load_at_ends'][0]:g}-{s['load_at_ends'][1]:g} at the runs' ends.")


def _precision(result: dict) -> str:
    out = ["| policy | ms/step | time over fp32's | compiled total MB | temps MB | temps over fp32's | matmuls |",
           "|---" * 7 + "|"]
    for r in result["rows"]:
        out.append(f"| {r['mode']} | {_f(r['ms_per_step'])} | {_f(r['time_vs_fp32'])}x | {_f(r['total_bytes'] / 1e6)} | "
                   f"{_f(r['temps_bytes'] / 1e6)} | {_f(r['temps_vs_fp32'])}x | {r['matmul_dtypes']} |")
    return "\n".join(out)


def _main_command(result: dict) -> str:
    out = ["| step | wall s | CPU s |", "|---|---|---|"]
    for r in result["steps"]:
        out.append(f"| {r['step']} | {r['wall_s']:g} | {'-' if r.get('cpu_s') is None else format(r['cpu_s'], 'g')} |")
    cold, warm = (next(r for r in result["steps"] if r["step"].startswith(k)) for k in ("first", "second"))
    return "\n".join(out) + (f"\n\nThe warm run is {cold['wall_s'] / warm['wall_s']:.1f}x faster than the cold one "
                             f"(wall), {cold['cpu_s'] / warm['cpu_s']:.1f}x (CPU).")


def _shape(s: dict) -> str:
    """A sweep row's convolution: batch, in->out channels, spatial size, kernel, stride, depthwise."""
    return (f"N{s['batch']} {s['cin']}->{s['cout']} {s['spatial']}x{s['spatial']} k{s['kernel']} s{s['stride']}"
            + (" dw" if s["groups"] > 1 else ""))


def _over_torch(row: dict) -> float:
    """A sweep row's larger funcnet / torch time ratio, forward or train step."""
    return max(row[k]["funcnet"] / row[k]["torch"] for k in ("forward_ms", "train_ms"))


def _conv_sweep(result: dict) -> str:
    out = ["| convolution | forward ms: funcnet / XLA / torch | funcnet / torch | "
           "train step ms: funcnet / XLA / torch | funcnet / torch |", "|---" * 5 + "|"]
    for r in result["sweep"]:
        cells = []
        for d in (r["forward_ms"], r["train_ms"]):
            ratio = d["funcnet"] / d["torch"]
            cells += [" / ".join(_f(d[k]) for k in ("funcnet", "lax.conv", "torch")),
                      f"**{_f(ratio)}**" if ratio > 2 else _f(ratio)]
        out.append(f"| {_shape(r['shape'])}{'' if r['ok'] else ' (WRONG)'} | " + " | ".join(cells) + " |")
    worst = max(result["sweep"], key=_over_torch)
    return "\n".join(out) + (f"\n\nThe largest funcnet / torch ratio, forward or train step, is "
                             f"{_f(result['worst_sweep_ratio'])} ({_shape(worst['shape'])}); "
                             + ("ratios above twice torch's time are in bold." if _over_torch(worst) > 2
                                else "none is above twice torch's time."))


def _conv_models(result: dict) -> str:
    out = ["| model | variant | px, batch | funcnet ms: forward / train | x torch eager | x torch.compile |",
           "|---" * 6 + "|"]
    for r in result["models"]:
        f, t = r["forward_ms"], r["train_ms"]
        vs = [" / ".join(_f(d[k] / d["funcnet"]) for d in (f, t)) if k in f else "-"
              for k in ("torch", "torch.compile")]
        out.append(f"| {r['model']} | {r['variant']}{'' if r['ok'] else ' (WRONG)'} | {r['size']}, {r['batch']} | "
                   f"{_f(f['funcnet'], 1)} / {_f(t['funcnet'], 1)} | " + " | ".join(vs) + " |")
    return "\n".join(out)


def _parallel_step(result: dict) -> str:
    out = ["| step | compiled MB per device | planned MB (`memory.layout.plan`) | planned / compiled "
           "| the ZeRO paper's formula MB | ms/step |", "|---" * 6 + "|"]
    rows = [(f"pipeline P={r['stages']} M={r['microbatches']} {r['schedule']}", r, "-") for r in result["pipeline"]]
    rows += [(f"ZeRO-{r['zero']} on {r['devices']} devices", r, _f(r["paper_formula_bytes"] / 1e6))
             for r in result["zero"]]
    for name, r, paper in rows:
        out.append(f"| {name} | {_f(r['bytes_per_device'] / 1e6)} | {_f(r['planned_bytes'] / 1e6)} | "
                   f"{r['planned_bytes'] / r['bytes_per_device']:.3f} | {paper} | {_f(r['seconds'] * 1e3, 1)} |")
    verdict = ("every row's plan is within a tenth of the compiled bytes" if result["planner_within_10_percent"]
               else "a row's plan is more than a tenth off the compiled bytes")
    return "\n".join(out) + f"\n\nIn this run {verdict}."


def _gpt_small(result: dict) -> str:
    out = ["| dtype | step | implementation | ms | tokens/s | model GFLOP/s | fraction of peak | torch eager's time "
           "over this |", "|---" * 8 + "|"]
    for r in result["rows"]:
        out.append(f"| {r['dtype']} | {r['mode']} | {r['impl']} | {_f(r['ms'], 1)} | {_f(r['tokens_per_s'], 1)} | "
                   f"{_f(r['model_gflops_per_s'], 1)} | {_f(r['mfu'], 3)} | {_f(r['vs_torch_eager'])} |")
    peak = result["matmul_peak"]
    rates = ", ".join(f"{k} {_f(v, 1)}" for k, v in peak["gflops_per_s"].items())
    return "\n".join(out) + (
        f"\n\n{result['n_params'] / 1e6:.1f}M parameters (N, without the position embedding), batch "
        f"{result['batch']} x {result['seq']} tokens. Model FLOPs: {result['flops_formula']}. The fraction of peak "
        f"divides them by the best matmul rate measured in the same run in the row's dtype, a "
        f"{peak['n']}x{peak['n']} matmul (GFLOP/s: {rates}).")


ZOO_STATUSES = ("match", "match (f32 rounding)", "refused", "vacuous", "WRONG", "CRASH")


def _convert_zoo_libraries(result: dict) -> str:
    """The converter zoo: counts per input checked, then each model's status at each input."""
    every = result["counts"]["every model"]
    out = ["| input | models | " + " | ".join(ZOO_STATUSES) + " |", "|---" * (2 + len(ZOO_STATUSES)) + "|"]
    for check, c in every.items():
        out.append(f"| {check} | {c['models']} | " + " | ".join(
            f"**{c[s]}**" if s in ("WRONG", "CRASH") and c[s] else str(c[s]) for s in ZOO_STATUSES) + " |")
    out += ["", "| model | set | fresh batch | input 1 | input 2 | input 3 | first line of the worst input's reason |",
            "|---" * 7 + "|"]
    for r in result["rows"]:
        inputs = [r] + r.get("sizes", [])
        cells = [r["status"]] + [f"{x['status']} ({x['size']})" for x in r.get("sizes", [])]
        cells += ["-"] * (4 - len(cells))
        worst = max(inputs, key=lambda x: ZOO_STATUSES.index(x["status"]))
        why = (worst.get("why") or "").replace("|", "\\|").replace("<", "&lt;")  # <root>: no HTML tag
        out.append(f"| {r['model']} | {r['set']} | " + " | ".join(cells) + f" | {why} |")
    notes = []
    if result.get("resumed"):
        notes.append("Rows kept from the interrupted first part of the run (`--resume`): "
                     + ", ".join(result["resumed"]) + ".")
    if result.get("not_run"):
        notes.append("Not run (the run was stopped before it reached them; their fresh-batch figures are in "
                     "docs/design.md's earlier run): " + ", ".join(result["not_run"]) + ".")
    return "\n".join(out) + "".join("\n\n" + n for n in notes)


TABLES = {"throughput": _throughput, "models": _models, "start_up": _start_up, "main_command": _main_command,
          "precision": _precision, "stream_train": _stream_train, "data_parallel": _data_parallel,
          "run_epoch": _run_epoch, "data_loading": _data_loading, "loaded_runs": _loaded_runs,
          "conv_sweep": _conv_sweep, "conv_models": _conv_models, "conv_models_grid": _conv_models,
          "parallel_step": _parallel_step, "gpt_small": _gpt_small, "convert_zoo_libraries": _convert_zoo_libraries}


def _row(result, **match):
    return next(r for r in result["rows"] if all(r.get(k) == v for k, v in match.items()))


def _mb_range(result, impls):
    mbs = [r["peak_mb"] for r in result["rows"] if r["model"] == "convnet" and r["impl"] in impls]
    return f"{min(mbs):.1f}-{max(mbs):.1f}"


# one figure of a run that the prose quotes: {{ figure NAME KEY }}
FIGURES = {
    "models": {
        "convnet_ours_mb": lambda res: f"{_row(res, model='convnet', impl='funcnet make_step')['peak_mb']:.1f}",
        "convnet_peers_mb": lambda res: _mb_range(res, PEERS),
        "lstm_vs_cell_loop": lambda res: "{:.1f}".format(
            _row(res, model="lstm", impl="torch LSTMCell loop")["ms_per_step"]
            / _row(res, model="lstm", impl="funcnet run_epoch")["ms_per_step"]),
    },
    "conv_sweep": {
        "xla_worst": lambda res: "{:.0f}".format(max(r[k]["lax.conv"] / r[k]["torch"] for r in res["sweep"]
                                                     for k in ("forward_ms", "train_ms"))),
    },
    "start_up": {
        "cpu_off_over_warm": lambda res: "-".join(
            f"{x:.2f}x" for x in sorted((min(r["cpu_ratios"]["off"] for r in res.values()),
                                         max(r["cpu_ratios"]["off"] for r in res.values())))),
        "cold_over_off": lambda res: "-".join(f"{x:.2f}" for x in sorted((
            min(statistics.median(a / b for a, b in zip(r["cpu"]["cold"], r["cpu"]["off"])) for r in res.values()),
            max(statistics.median(a / b for a, b in zip(r["cpu"]["cold"], r["cpu"]["off"])) for r in res.values())))),
    },
}


def table(name: str, saved: dict) -> str:
    """The Markdown of ``NAME``'s table (or sentence, for a summary) from its saved run."""
    return TABLES[name](saved["result"])


def render(markdown: str, plot_path=lambda name: f"img/bench-{name}.svg", data: Path = DATA) -> str:
    """``markdown`` with every placeholder filled from the saved runs; ``plot_path(name)`` is where
    the page links each plot. Raises ValueError on a placeholder it cannot fill."""
    runs: dict[str, dict] = {}

    def fill(m: re.Match) -> str:
        kind, name, key = m.groups()
        if name not in TABLES:
            raise ValueError(f"{m.group(0)}: no benchmark {name!r}; the page knows {sorted(TABLES)}")
        saved = runs.setdefault(name, load(name, data))
        if kind == "run":
            return provenance(saved)
        if kind == "table":
            return table(name, saved)
        if kind == "plot":
            return f"![{name}: the saved run's figures]({plot_path(name)})"
        if key not in FIGURES.get(name, {}):
            raise ValueError(f"{m.group(0)}: no figure {key!r} of {name}; known: {sorted(FIGURES.get(name, {}))}")
        return FIGURES[name][key](saved["result"])

    return PLACEHOLDER.sub(fill, markdown)
