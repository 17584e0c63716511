"""The Benchmarks page's plots: one SVG per saved run, drawn at build time with matplotlib.

``svg(name, saved)`` returns the SVG of ``docs/data/bench_NAME.json``'s plot (``None`` for a run
with nothing to plot, such as a summary without its runs); ``docs_hooks.site`` adds it to the
site as ``img/bench-NAME.svg``. The plots draw the same numbers as the tables above them.
"""

from __future__ import annotations

import io

__all__ = ["svg"]


def _throughput(ax, result):
    rows = [r for r in result["rows"] if r.get("seconds_per_epoch")]
    for impl in dict.fromkeys(r["impl"] for r in rows):
        pts = sorted((r["batch"], r["seconds_per_epoch"] * 1e3) for r in rows if r["impl"] == impl)
        ax.plot(*zip(*pts), "o-" if impl.startswith("funcnet") else "o--", label=impl, linewidth=1.5)
    ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="ms per epoch",
           title="MLP: ms per epoch by batch size (lower is faster)")
    ax.set_xticks(sorted({r["batch"] for r in rows}), [str(b) for b in sorted({r["batch"] for r in rows})])
    ax.minorticks_off()
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))


def _models(fig, result):
    models = list(dict.fromkeys(r["model"] for r in result["rows"]))
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    for ax, model in zip(axes, models):
        rows = [r for r in result["rows"] if r["model"] == model]
        ratios = [r["vs"].get("torch eager", 1.0) for r in rows]
        colors = ["tab:orange" if r["impl"].startswith(("funcnet", "interop")) else
                  "tab:blue" if r["impl"].startswith("torch") else "tab:gray" for r in rows]
        ax.barh(range(len(rows)), ratios, color=colors)
        ax.set_yticks(range(len(rows)), [r["impl"] for r in rows], fontsize=8)
        ax.invert_yaxis()
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set(title=model, xlabel="x torch eager (> 1: faster)")


def _start_up(ax, result):
    kinds = ("off", "cold", "warm")
    labels = {"off": "cache off", "cold": "on, empty", "warm": "on, filled"}
    names = list(result)
    for i, kind in enumerate(kinds):
        ax.bar([n + (i - 1) * 0.27 for n in range(len(names))], [result[n]["median_cpu"][kind] for n in names],
               width=0.27, label=labels[kind])
    ax.set_xticks(range(len(names)), names)
    ax.set(ylabel="CPU seconds (median)", title="Start-up: CPU seconds per command by compile cache")
    ax.legend(fontsize=8)


def _pairs(ax, rows, left: tuple, right: tuple, ticks: list) -> None:
    """Two bars per row, ``left`` and ``right`` each ``(key, label)``, with a legend."""
    xs = range(len(rows))
    for shift, (key, label) in ((-0.2, left), (0.2, right)):
        ax.bar([x + shift for x in xs], [r[key] for r in rows], width=0.4, label=label)
    ax.set_xticks(list(xs), ticks)
    ax.legend(fontsize=8)


def _run_epoch(ax, result):
    rows = result["rows"]
    _pairs(ax, rows, ("loop_seconds", "make_step loop"), ("scan_seconds", "run_epoch scan"),
           [f"batch {r['batch']}" for r in rows])
    ax.set(ylabel=f"seconds per {result['epochs']} epochs", title="run_epoch against a Python loop of steps")


def _data_loading(ax, result):
    rows = result["rows"]
    ax.barh(range(len(rows)), [r["vs_on_device"] for r in rows],
            color=["tab:orange" if r["framework"] == "funcnet" else "tab:blue" for r in rows])
    ax.set_yticks(range(len(rows)), [f"{r['framework']}: {r['source']}" for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set(xlabel="step time over the same framework's on-device step (1 = hidden)",
           title="Data loading: what the loader adds to a step")


def _precision(ax, result):
    rows = result["rows"]
    _pairs(ax, rows, ("time_vs_fp32", "step time"), ("temps_vs_fp32", "compiled temps"), [r["mode"] for r in rows])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set(ylabel="over fp32's (> 1: more)", title="Mixed precision on this CPU: step time and scratch memory")


def _stream_train(ax, result):
    rows = result["rows"]
    _pairs(ax, rows, ("train_s", "training"), ("wall_s", "end to end"), [r["source"] for r in rows])
    ax.set(ylabel="seconds (median)", title="funcnet train: in memory against --stream")


def _data_parallel(ax, result):
    rows = result["rows"]
    for kind in rows[0]["steps_per_s"]:
        ax.plot([r["devices"] for r in rows], [r["steps_per_s"][kind] for r in rows], "o-", label=kind)
    ax.set_xscale("log", base=2)
    ax.set_xticks([r["devices"] for r in rows], [str(r["devices"]) for r in rows])
    ax.minorticks_off()
    ax.set(xlabel="simulated devices", ylabel="steps per second",
           title=f"Data parallel on simulated devices sharing {result['cores']} cores")
    ax.legend(fontsize=8)


def _loaded_runs(ax, result):
    runs = result["runs"]
    ax.bar([r["run"] for r in runs], [r["seconds"] for r in runs],
           color=["tab:green" if r["status"] == 0 else "tab:red" for r in runs])
    ax.set(xlabel="run", ylabel="seconds", title="Runs under load (green: passed)")


def _conv_sweep(ax, result):
    from docs_hooks.benchmarks import _shape

    rows = result["sweep"]
    ys = range(len(rows))
    for i, (key, label) in enumerate((("forward_ms", "forward"), ("train_ms", "train step"))):
        ax.barh([y + (i - 0.5) * 0.4 for y in ys], [r[key]["funcnet"] / r[key]["torch"] for r in rows], height=0.4,
                label=f"funcnet, {label}")
    ax.scatter([r["forward_ms"]["lax.conv"] / r["forward_ms"]["torch"] for r in rows], list(ys), marker="|",
               color="tab:gray", label="XLA's convolution, forward")
    ax.set_yticks(list(ys), [_shape(r["shape"]) for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.axvline(2.0, color="tab:red", linewidth=0.8, linestyle="--", label="2x torch's time")
    ax.set(xlabel="time over torch eager's (< 1: faster than torch)", title="Convolutions by shape, one core each")
    ax.legend(fontsize=8, loc="lower right")


def _conv_models(ax, result):
    rows = result["models"]
    xs = range(len(rows))
    bars = [("torch", "forward_ms", "eager, forward"), ("torch", "train_ms", "eager, train step"),
            ("torch.compile", "forward_ms", "compile, forward"), ("torch.compile", "train_ms", "compile, train step")]
    bars = [b for b in bars if any(b[0] in r[b[1]] for r in rows)]  # torch.compile only where it was timed
    width = 0.8 / len(bars)
    for i, (torch_kind, key, label) in enumerate(bars):
        ax.bar([x + (i - (len(bars) - 1) / 2) * width for x in xs],
               [r[key][torch_kind] / r[key]["funcnet"] if torch_kind in r[key] else 0.0 for r in rows],
               width=width, label=f"torch {label}")
    ax.axhline(1.0, color="black", linewidth=0.8)
    many = len(rows) > 8
    ax.set_xticks(list(xs), [f"{r['model']} {r['variant']}\n{r['size']} px, batch {r['batch']}" for r in rows],
                  fontsize=7 if many else 8, rotation=90 if many else 0)
    ax.set(ylabel="torch's time over funcnet's (> 1: funcnet faster)",
           title="Whole convolutional models, one core each")
    ax.legend(fontsize=8)


FIGSIZE = {"conv_sweep": (8, 7.5), "conv_models_grid": (14, 6.5)}
AXES = {"data_parallel": _data_parallel, "throughput": _throughput, "precision": _precision, "stream_train": _stream_train, "start_up": _start_up, "run_epoch": _run_epoch, "data_loading": _data_loading,
        "loaded_runs": _loaded_runs, "conv_sweep": _conv_sweep, "conv_models": _conv_models,
        "conv_models_grid": _conv_models}


def svg(name: str, saved: dict) -> bytes | None:
    """The SVG of the plot of ``NAME``'s saved run, or None when the run holds nothing to plot."""
    result = saved["result"]
    if (name == "loaded_runs" and "runs" not in result) or (name not in AXES and name != "models"):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with plt.rc_context({"svg.hashsalt": name, "svg.fonttype": "none"}):
        if name == "models":
            fig = plt.figure(figsize=(12, 4.5))
            _models(fig, result)
        else:
            fig, ax = plt.subplots(figsize=FIGSIZE.get(name, (8, 4.5)))
            AXES[name](ax, result)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
        plt.close(fig)
    return buf.getvalue()
