"""The comparisons as one static HTML page: ``python -m comparisons --html DIR``.

``write_page(results, DIR, opts)`` writes ``DIR/index.html``: a summary (each verdict,
the checks passed, both frameworks' first-call, compile and steady-state times), the
concept map with a link from each row to its comparison, then one section per
comparison with the PyTorch and JAX sources side by side in two aligned columns
(highlighted by pygments), their outputs and timings under them, the checks with their
tolerances and why, and the plots. The page needs no server and no network: the
styles are inline, the plots are PNG data URIs, and there is no script. Under 900 px
(or printed in portrait on narrow paper) the two columns stack, PyTorch above JAX.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from comparisons._core import Options, Result, fmt_seconds
from comparisons._terminal import timing_line

__all__ = ["CONCEPTS", "write_page", "render", "plot_png"]

# The README's concept map (tests/test_comparisons_html.py keeps the two equal):
# (concept in the articles, funcnet's form, comparisons that show it).
CONCEPTS: list[tuple[str, str, tuple[str, ...]]] = [
    ("tensor creation, attributes, ops (.T, index, slice, matmul, @, mean, cat)", "jnp + explicit PRNG keys",
     ("tensors",)),
    ("storage + view + stride, transpose aliasing, view/reshape/contiguous", "immutable arrays, `.at[]`", ("tensors",)),
    ("in-place ops (`add_`, `+=`)", "functional update, buffer donation", ("tensors",)),
    ("NumPy bridge shares memory", "copies in, read-only views out", ("tensors",)),
    ("autograd x**2+3x -> 7, grad_fn graph, chain rule", "`jax.grad`, jaxpr, `funcnet.autodiff`",
     ("autograd", "autograd_from_scratch")),
    ("graph freed after backward, `retain_graph=True`", "`jax.vjp` pullback is reusable", ("autograd",)),
    ("gradients accumulate, `zero_grad()`", "gradients are return values", ("autograd", "training_loop")),
    ("dynamic graph: Python if/for, `use_dropout`, model_a/model_b", "tracing, static args, `lax.cond`, retrace counts",
     ("dynamic_graph",)),
    ("nn.Module: registration, forward, train/eval, `.to(device)`, `state_dict`",
     "`Module(init, apply)`, params pytree, `train=`, `device_put`, `state_dict`", ("modules",)),
    ("nn.Module manages state: buffers (BatchNorm's running stats) in `state_dict`, `.train()`/`.eval()`",
     "state in, state out: running stats returned, never mutated", ("buffers",)),
    ("hand-written TwoLayerNet (Xavier, clamp ReLU, manual SGD)", "pure functions + `tree_map` update",
     ("two_layer_net",)),
    ("five-line training loop", "`make_step` + `run_epoch`", ("training_loop",)),
    ("mixed precision: autocast + GradScaler", "`Policy` + `DynamicLossScale`", ("mixed_precision",)),
    ("DDP all-reduce of gradients", "pmap + `lax.pmean`; shard_map; sharding; `jax.distributed`", ("data_parallel",)),
    ("memory: params + grads + optimizer + activations, 7B -> ~160 GB", "`memory.estimate`, `memory.measure`",
     ("memory",)),
    ("timing with CUDA events + synchronize; per-step copies, `.item()`",
     "`block_until_ready`, `profile`, on-device accumulation", ("performance",)),
    ("PyTorch vs JAX table; the layered stacks", "every row backed by a measurement; `funcnet info`", ("paradigms",)),
    ("real models: a conv net, a residual block, a GPT, built from torch.nn layers",
     "funcnet.nn layers with torch's signatures, names and layouts; `nn.Composite`", ("gpt",)),
    ("7B memory: activations depend on batch size and sequence length",
     "transformer activation model (Korthikanti et al.); `funcnet memory --transformer`", ("memory", "gpt")),
    ("remedies for memory: shard params/grads/optimizer state, recompute activations",
     "ZeRO-3 sharding with `NamedSharding` (vs torch FSDP2); `jax.checkpoint` (vs torch.utils.checkpoint)",
     ("fsdp", "activation_checkpointing")),
    ("your own model: an nn.Module with its own forward, its optimizer and LR scheduler",
     "`interop.convert` (traced), `interop.to_source`, `interop.convert_optimizer`", ("convert",)),
]

_CSS = """
:root { --pass: #17803d; --fail: #c62828; --rule: #d0d7de; --muted: #57606a; --code-bg: #f6f8fa; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1f2328;
       margin: 0 auto; padding: 1rem 1.5rem 3rem; max-width: 1600px; }
h1 { font-size: 1.6rem; margin: .3rem 0; } h2 { font-size: 1.3rem; margin: 0 0 .4rem; }
h3 { font-size: 1rem; margin: 0; }
a { color: #0969da; text-decoration: none; } a:hover { text-decoration: underline; }
code, pre { font: 12.5px/1.4 ui-monospace, SFMono-Regular, Menlo, Consolas, "DejaVu Sans Mono", monospace; }
table { border-collapse: collapse; width: 100%; margin: .4rem 0 1rem; }
th, td { border-bottom: 1px solid var(--rule); padding: .25rem .5rem; text-align: left; vertical-align: top; }
th { background: #f0f3f6; font-weight: 600; }
td.num, th.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
.verdict { font-weight: 700; } .pass { color: var(--pass); } .fail { color: var(--fail); }
.badge { display: inline-block; padding: 0 .5rem; border-radius: 1rem; color: #fff; font-size: .85rem; }
.badge.pass { background: var(--pass); } .badge.fail { background: var(--fail); }
.muted, caption { color: var(--muted); font-size: .85rem; } caption { caption-side: bottom; text-align: left; }
section.comparison { border-top: 2px solid var(--rule); padding-top: 1rem; margin-top: 2rem; }
.pair { display: grid; grid-template-columns: minmax(0, 1fr) minmax(0, 1fr); column-gap: 1rem; row-gap: .35rem; }
.pair > * { min-width: 0; }
.pair pre { margin: 0; padding: .5rem .7rem; background: var(--code-bg); border: 1px solid var(--rule);
            border-radius: 6px; white-space: pre-wrap; overflow-wrap: break-word; }
.pair pre.out { background: #fff; }
.timing { font-size: .85rem; color: var(--muted); }
.checks td:first-child { width: 1.5rem; text-align: center; }
.checks td.tol { white-space: nowrap; }
figure { display: inline-block; margin: .5rem 1rem .5rem 0; } figure img { max-width: 100%; height: auto; }
figcaption { color: var(--muted); font-size: .85rem; }
pre.notes { white-space: pre-wrap; color: var(--muted); }
@media (max-width: 900px) {
  .pair { grid-template-columns: minmax(0, 1fr); }
  .pair > .torch { order: 1; } .pair > .jax { order: 2; }
}
@media print {
  body { font-size: 9pt; max-width: none; padding: 0; }
  code, pre { font-size: 7pt; }
  a { color: inherit; }
  .pair pre { white-space: pre-wrap; overflow: visible; border-color: #bbb; }
  section.comparison { break-before: page; }
  tr, figure, h2, h3 { break-inside: avoid; } h2, h3 { break-after: avoid; }
}
"""


def _e(text: str) -> str:
    return html.escape(text or "", quote=True)


def _anchor(name: str) -> str:
    return f"cmp-{name}"


def _md_code(text: str) -> str:
    """The concept map's `code` spans as <code>, the rest escaped."""
    parts = (text or "").split("`")
    return "".join(f"<code>{_e(p)}</code>" if i % 2 else _e(p) for i, p in enumerate(parts))


def plot_png(title: str, curves: dict[str, list[float]]) -> bytes:
    """One plot: each curve a line over its index (the report and the page draw the same)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for (label, values), style in zip(curves.items(), ("-", "--", ":", "-.") * 4):
        ax.plot(range(len(values)), values, style, label=label, linewidth=1.5)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def _highlight(code: str) -> str:
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer

    if not code:
        return ""
    return highlight(code, PythonLexer(), HtmlFormatter(nowrap=True))




def _check_parts(detail: str, tolerance: str, why: str) -> str:
    """The measured part of a check's detail: without the '; why' and '(tolerance)' it repeats."""
    if why and detail.endswith(f"; {why}"):
        detail = detail[: -len(why) - 2]
    if tolerance and detail.endswith(f" ({tolerance})"):
        detail = detail[: -len(tolerance) - 3]
    return detail


def _summary(results: list[Result]) -> str:
    rows = []
    for r in results:
        passed = sum(c.ok for c in r.checks)
        cells = [f'<td><a href="#{_anchor(r.name)}">{_e(r.name)}</a></td>',
                 f'<td class="verdict {"pass" if r.ok else "fail"}">{"PASS" if r.ok else "FAIL"}</td>',
                 f'<td class="num">{passed}/{len(r.checks)}</td>']
        for side in (r.torch, r.jax):
            compiled = "n/a" if not side.compile_seconds else fmt_seconds(side.compile_seconds)  # eager: nothing
            cells += [f'<td class="num">{v}</td>'
                      for v in (fmt_seconds(side.seconds), compiled, fmt_seconds(side.steady_seconds))]
        rows.append(f"<tr>{''.join(cells)}</tr>")
    head = ('<tr><th rowspan="2">comparison</th><th rowspan="2">verdict</th><th rowspan="2" class="num">checks</th>'
            '<th colspan="3">PyTorch</th><th colspan="3">JAX</th></tr><tr>'
            + '<th class="num">first call</th><th class="num">compile</th><th class="num">steady</th>' * 2 + "</tr>")
    caption = ("first call: the timed work run once, tracing and compilation included (what you wait for the first "
               "time); compile: the part of it spent tracing and compiling (JAX's compile events, torch.compile's; "
               "torch eager compiles nothing); steady: the same work called again, once compiled. "
               "n/a: nothing compiled (torch eager). \"-\": not measured (the comparison compiled outside its timing, or a second call would change "
               "what it checks).")
    return (f'<table class="summary" id="summary"><caption>{_e(caption)}</caption><thead>{head}</thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


def _concept_map(results: list[Result]) -> str:
    present = {r.name for r in results}
    rows = []
    for concept, ours, names in CONCEPTS:
        links = ", ".join(f'<a href="#{_anchor(n)}">{_e(n)}</a>' if n in present else f'<span class="muted">{_e(n)}</span>'
                          for n in names)
        rows.append(f"<tr><td>{_md_code(concept)}</td><td>{_md_code(ours)}</td><td>{links}</td></tr>")
    return ('<table class="concepts" id="concepts"><thead><tr><th>concept in the articles</th><th>funcnet</th>'
            f"<th>comparison</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")


def _section(r: Result) -> str:
    verdict = f'<span class="badge {"pass" if r.ok else "fail"}">{"PASS" if r.ok else "FAIL"}</span>'
    pair = []
    for cls, label, side in (("torch", "PyTorch", r.torch), ("jax", "JAX", r.jax)):
        pair.append(f'<h3 class="{cls}">{label}</h3>')
    for cls, side in (("torch", r.torch), ("jax", r.jax)):
        pair.append(f'<pre class="src highlight {cls}"><code>{_highlight(side.source)}</code></pre>')
    for cls, side in (("torch", r.torch), ("jax", r.jax)):
        pair.append(f'<pre class="out {cls}">{_e(side.output)}</pre>')
    for cls, side in (("torch", r.torch), ("jax", r.jax)):
        pair.append(f'<div class="timing {cls}">{_e(timing_line(side))}</div>')
    checks = "".join(
        f'<tr class="check {"pass" if c.ok else "fail"}"><td>{"✓" if c.ok else "✗"}</td><td>{_e(c.name)}</td>'
        f"<td>{_e(_check_parts(c.detail, c.tolerance, c.why))}</td><td class=\"tol\">{_e(c.tolerance)}</td>"
        f"<td>{_e(c.why)}</td></tr>" for c in r.checks)
    figures = "".join(
        f'<figure><img alt="{_e(title)}" src="data:image/png;base64,'
        f'{base64.b64encode(plot_png(title, curves)).decode()}"><figcaption>{_e(title)}</figcaption></figure>'
        for title, curves in r.series.items())
    notes = f'<pre class="notes">{_e(r.notes)}</pre>' if r.notes else ""
    return (f'<section class="comparison" id="{_anchor(r.name)}"><h2>{_e(r.name)}: {_e(r.title)} {verdict}</h2>'
            f'<div class="pair">{"".join(pair)}</div>'
            f'<table class="checks"><thead><tr><th></th><th>check</th><th>measured</th><th>tolerance</th>'
            f"<th>why</th></tr></thead><tbody>{checks}</tbody></table>{figures}{notes}"
            f'<p class="muted"><a href="#summary">back to the summary</a></p></section>')


def render(results: list[Result], opts: Options = Options()) -> str:
    """The whole page as one string (inline CSS, PNG data URIs, no script)."""
    from pygments.formatters import HtmlFormatter

    n_checks, n_passed = sum(len(r.checks) for r in results), sum(c.ok for r in results for c in r.checks)
    failed = [r.name for r in results if not r.ok]
    headline = (f'<p class="verdict pass">all {len(results)} comparisons agree: {n_passed}/{n_checks} checks pass</p>'
                if not failed else
                f'<p class="verdict fail">{len(failed)} of {len(results)} comparisons fail ({", ".join(failed)}): '
                f"{n_passed}/{n_checks} checks pass</p>")
    css = _CSS + HtmlFormatter(style="default").get_style_defs(".highlight")
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,"><title>funcnet comparisons: PyTorch and JAX side by side</title>'
        f"<style>{css}</style></head><body>"
        "<header><h1>funcnet comparisons: PyTorch and JAX on the same numbers</h1>"
        f'{headline}<p class="muted">dtype {_e(opts.dtype)}; written by <code>python -m comparisons --html</code>. '
        "Each comparison runs the PyTorch form and the JAX form of one idea on the same numbers and checks "
        "that they agree.</p></header>"
        f"<h2>Summary</h2>{_summary(results)}<h2>Concept map</h2>{_concept_map(results)}"
        + "".join(_section(r) for r in results)
        + "</body></html>\n"
    )


def write_page(results: list[Result], directory: Path, opts: Options = Options()) -> Path:
    """Write ``directory/index.html`` and return its path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "index.html"
    path.write_text(render(results, opts), encoding="utf-8")
    return path
