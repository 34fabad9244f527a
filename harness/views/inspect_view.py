"""Rich rendering of a `va-bench inspect` report (its JSON dict, so report/ stays torch-free); fits 80 columns."""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from harness.views.text import escape, printable


def _si(value: float | None, unit: str = "") -> str:
    if value is None:
        return "unavailable"
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3f} {prefix}{unit}".rstrip()
    return f"{value:g} {unit}".rstrip()


def _share(part: int, whole: int | None) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _summary(r: dict) -> list[RenderableType]:
    h, w = r["input_size"]
    via = " (layers and FLOPs from its onnx2torch conversion)" if r["source"] == "onnx" else ""
    lines = [Text.assemble((printable(r["model"]), "bold"), f": {r['source']} model{via}")]
    if r["params_total"] is not None:
        sparsity = f"{r['sparsity']:.2%}" if r["sparsity"] is not None else "-"
        trainable = f", trainable {r['params_trainable']:,}" if r["params_trainable"] is not None else ""
        lines.append(Text(f"parameters {r['params_total']:,} ({r['params_total'] / 1e6:.3f} M){trainable}"))
        if r.get("params_used") is not None and r["params_used"] != r["params_total"]:
            lines.append(Text(f"used by the forward {r['params_used']:,} ({r['params_used'] / 1e6:.3f} M)"))
        lines.append(Text(f"weight sparsity {sparsity} ({r['zeros_total']:,} exact zeros)"))
    lines.append(Text(f"FLOPs {_si(r['flops_total'])} per image at {h}x{w}, batch 1"))
    lines.append(Text(f"convention: {r['flops_convention']}", style="dim"))
    return lines


def _by_type(r: dict) -> Table:
    table = Table(title="by layer type", box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("type", "layers", "params", "FLOPs", "FLOPs %"):
        table.add_column(col, justify="left" if col == "type" else "right")
    counts: dict[str, int] = {}
    for layer in r["layers"]:
        counts[layer["type"]] = counts.get(layer["type"], 0) + 1
    for kind, flops in r["flops_by_type"].items():  # 0: none of its ops is of a kind the convention counts
        table.add_row(escape(kind), str(counts.get(kind, 0)), f"{r['params_by_type'].get(kind, 0):,}",
                      _si(flops) if flops else "-", _share(flops, r["flops_total"]) if flops else "-")
    if any(not flops for flops in r["flops_by_type"].values()):
        table.caption, table.caption_justify = "-: not counted (see the convention above)", "left"
    return table


def _layers(r: dict, top: int) -> Table:
    rows = sorted(r["layers"], key=lambda x: (-x["flops"], -x["params"]))
    shown = rows if top <= 0 else rows[:top]
    title = "layers" if len(shown) == len(rows) else f"top {len(shown)} of {len(rows)} layers by FLOPs (--top N)"
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("name", overflow="fold", max_width=24)
    table.add_column("type", overflow="ellipsis", max_width=12, no_wrap=True)
    table.add_column("output", overflow="fold", max_width=14)
    for col in ("params", "FLOPs", "zeros"):
        table.add_column(col, justify="right")
    for x in shown:
        zeros = f"{x['sparsity']:.1%}" if x["sparsity"] is not None else "-"
        table.add_row(escape(x["name"]), escape(x["type"]), escape(x["output_shape"]), f"{x['params']:,}",
                      _si(x["flops"]) if x["flops"] else "-", zeros)
    return table


def _onnx(g: dict) -> list[RenderableType]:
    opset = ", ".join(f"{d} {v}" for d, v in g["opset"].items())
    size = f", file {_si(g['file_bytes'], 'B')}" if g["file_bytes"] else ""
    ops = ", ".join(f"{op} {n}" for op, n in g["nodes_by_op"].items())
    inputs = "; ".join(f"{k} {v}" for k, v in g["inputs"].items())
    outputs = "; ".join(f"{k} {v}" for k, v in g["outputs"].items())
    # names from the file: Text shows them as they are, control characters escaped
    return [Text(printable(f"ONNX graph: opset {opset}, IR {g['ir_version']}, producer {g['producer'] or '-'}{size}")),
            Text(printable(f"  {g['nodes']} nodes: {ops}")),
            Text(f"  {g['initializers']} initialisers; weights {g['weights']:,} elements, "
                 f"{g['weight_zeros']:,} exact zeros"),
            Text(printable(f"  inputs {inputs}; outputs {outputs}"))]


def render_inspect(r: dict, top: int = 15) -> Group:
    """Summary, by-type table, top layers by FLOPs, ONNX graph metrics, notes."""
    parts: list[RenderableType] = _summary(r)
    if r["layers"]:
        parts += [_by_type(r), _layers(r, top)]
    if r["onnx"]:
        parts += _onnx(r["onnx"])
    parts += [Text(printable(f"note: {n}"), style="yellow") for n in r["notes"]]
    return Group(*parts)
