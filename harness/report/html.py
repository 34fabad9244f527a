"""report.html: one self-contained page per run (PNGs and sample images embedded as base64 data URIs,
inline CSS, no script, no network), so it opens from disk or from a CI artefact store as is."""

from __future__ import annotations

import base64
from collections import defaultdict
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from urllib.parse import quote

from harness import __version__
from harness.report.gates import NOT_MEASURED, NOT_MET, GateResult, gate_table
from harness.report.plots import PLOT_NAMES, Plot
from harness.report.sections import (
    REPEATS_NOTE,
    REPORT_PAGE,
    Table,
    accuracy_table,
    accuracy_unavailable,
    artefacts,
    human_size,
    notes,
    operating_point_table,
    per_class_table,
    performance_table,
    repeats_table,
    repro_commands,
    run_date,
    server_table,
    setup_table,
)
from harness.results.reader import RunFolder

# shown under Accuracy, not with the timing plots
ACCURACY_PLOTS = ("precision_recall.png", "confidence.png", "confusion.png")
MAX_SAMPLE_IMAGES = 4
MAX_IMAGE_BYTES = 2 * 1024 * 1024
IMAGE_TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png"}

# the page may load nothing from anywhere: embedded images and its own inline style only (a browser blocks
# and reports anything else, which the headless-Chromium test would see)
CSP = ("<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; img-src data:; "
       "style-src 'unsafe-inline'\">")
CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1f2328; margin: 0;
       background: #f6f8fa; }
main { max-width: 1240px; margin: 0 auto; padding: 24px 32px 48px; background: #fff; }
h1 { font-size: 24px; margin: 0 0 4px; } h2 { font-size: 19px; margin: 32px 0 8px; border-bottom: 1px solid #d0d7de;
     padding-bottom: 4px; } h3 { font-size: 15px; margin: 20px 0 6px; }
.sub { color: #57606a; margin: 0 0 12px; } nav a { margin-right: 14px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 12.5px; } .scroll { overflow-x: auto; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; vertical-align: top; } th { background: #f6f8fa; }
td { white-space: nowrap; } table.wrap td { white-space: normal; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 8px 0 20px; } figure img { max-width: 100%; border: 1px solid #d0d7de; }
figcaption, .note { color: #57606a; font-size: 12.5px; }
.unavailable { color: #9a6700; background: #fff8c5; padding: 6px 10px; border-radius: 4px; }
.met { color: #1a7f37; } .notmet { color: #cf222e; font-weight: 700; } .notmeasured { color: #9a6700; }
pre { background: #f6f8fa; padding: 8px 12px; overflow-x: auto; white-space: pre-wrap; word-break: break-all; }
.images { display: flex; flex-wrap: wrap; gap: 12px; } .images figure { width: 290px; margin: 0; }
.images img { width: 100%; }
"""


def _table(table: Table, status_col: int | None = None, wrap: bool = False) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in table.header)
    body = []
    for row in table.rows:
        cells = []
        for i, value in enumerate(row):
            cls = ' class="num"' if table.numeric[i] else ""
            if i == status_col:
                cls = {NOT_MET: ' class="notmet"', NOT_MEASURED: ' class="notmeasured"'}.get(value, ' class="met"')
            cells.append(f"<td{cls}>{escape(value)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    cls = ' class="wrap"' if wrap else ""
    return (f'<div class="scroll"><table{cls}><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
            "</table></div>")


def _noted(heading: str, table: Table, note: str) -> str:
    """A section's heading, its table and the note that says how to read it."""
    return f"{heading}{_table(table)}<p class='note'>{escape(note)}</p>"


def _data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _plot(plot: Plot) -> str:
    if plot.png is None:
        return f'<h3>{escape(plot.title)}</h3><p class="unavailable">{escape(plot.unavailable or "unavailable")}</p>'
    notes_html = "".join(f"<li>{escape(n)}</li>" for n in plot.notes)
    return (f'<h3>{escape(plot.title)}</h3><figure><img alt="{escape(plot.title)}" '
            f'src="{_data_uri(plot.png, "image/png")}"><figcaption>{escape(plot.name)}'
            f'{f"<ul>{notes_html}</ul>" if notes_html else ""}</figcaption></figure>')


def _sample_images(run: RunFolder) -> list[Path]:
    """Up to MAX_SAMPLE_IMAGES drawn images, alternating between the models/backends that drew them."""
    folder = run.path / "images"
    if not folder.is_dir() or folder.is_symlink():
        return []
    groups: dict[str, list[Path]] = defaultdict(list)
    for p in sorted(folder.iterdir()):
        if _drawn_image(p):
            groups[p.name.rsplit("__", 1)[0]].append(p)
    picked: list[Path] = []
    while len(picked) < MAX_SAMPLE_IMAGES and any(groups.values()):
        for files in groups.values():
            if files and len(picked) < MAX_SAMPLE_IMAGES:
                picked.append(files.pop(0))
    return picked


IMAGE_SIGNATURES = {"image/jpeg": b"\xff\xd8\xff", "image/png": b"\x89PNG\r\n\x1a\n"}


def _drawn_image(path: Path) -> bool:
    """A file the run drew: a regular file in the folder (a link could point anywhere: the report would embed
    whatever it names), not too large, whose bytes are of the type its name says."""
    if path.suffix.lower() not in IMAGE_TYPES or path.is_symlink() or not path.is_file():
        return False
    if path.stat().st_size > MAX_IMAGE_BYTES:
        return False
    signature = IMAGE_SIGNATURES[IMAGE_TYPES[path.suffix.lower()]]
    with path.open("rb") as f:
        return f.read(len(signature)) == signature


def _images_section(run: RunFolder) -> str:
    figs = []
    for p in _sample_images(run):
        uri = _data_uri(p.read_bytes(), IMAGE_TYPES[p.suffix.lower()])
        name = escape(p.name)
        figs.append(f"<figure><img alt='{name}' src='{uri}'><figcaption>{name}</figcaption></figure>")
    if not figs:
        return ""
    return f"<h2 id='images'>Detections drawn by the run (images/)</h2><div class='images'>{''.join(figs)}</div>"


def _artefacts_section(run: RunFolder, plots: list[Plot]) -> str:
    """The run folder's files, then the report's own as this report writes them (an earlier report's are not
    listed: they are replaced)."""
    written = [(p.name, human_size(len(p.png))) for p in plots if p.png is not None] + [(REPORT_PAGE, "this page")]
    listed = [(name, human_size(size)) for name, size in artefacts(run, [REPORT_PAGE, *PLOT_NAMES])] + written
    rows = "".join(f"<li><a href='{escape(quote(name))}'>{escape(name)}</a> <span class='note'>{size}"
                   "</span></li>" for name, size in listed)
    return (f"<h2 id='artefacts'>Artefacts</h2><p class='note'>{escape(str(run.path.resolve()))}</p>"
            f"<ul>{rows}</ul>")


def render_html(run: RunFolder, plots: list[Plot], gates: list[GateResult] | None, gate_source: str,
                gate_notes: list[str]) -> str:
    """The whole page as a string."""
    title = f"va-bench report: {run.run_id}"
    first = run.cells[0]
    dataset = first.get("dataset.id") or "coco2017"  # the site's rows without one are COCO's
    named = "" if dataset == "coco2017" else f"{dataset} {first.get('dataset.split') or ''} ".replace("  ", " ")
    subtitle = (f"{run_date(run)} · {first.get('hardware.id') or '?'} · {named}{first.dataset_variant or '?'} "
                f"({first.get('dataset.num_images') or '?'} images) · {len(run.cells)} cells")
    parts = [f"<h1>{escape(title)}</h1><p class='sub'>{escape(subtitle)}</p>",
             "<nav><a href='#performance'>Performance</a><a href='#plots'>Plots</a><a href='#accuracy'>Accuracy</a>"
             "<a href='#gates'>Gates</a><a href='#notes'>Notes</a><a href='#environment'>Environment</a>"
             "<a href='#artefacts'>Artefacts</a></nav>"]
    parts.append("<h2 id='performance'>Performance</h2>" + _table(performance_table(run)))
    parts.append("<p class='note'>img/s: images over the summed batch times (latency mode) or over the stream's "
                 "wall time (overlapped); ms/batch percentiles over the timed batches; J/img over the timing "
                 "window.</p>")
    accuracy_plots = [p for p in plots if p.name in ACCURACY_PLOTS]
    repeated = repeats_table(run)
    if repeated is not None:
        parts.append(_noted("<h3>Repeated in fresh processes (--repeats)</h3>", repeated, REPEATS_NOTE))
    served = server_table(run)
    if served is not None:
        parts.append(_noted("<h2 id='server'>Server scenario</h2>", served,
                            "Poisson arrivals, one image a query, served first come first served by the batch-1 "
                            "pipeline; latency from a query's arrival to its result, queueing included; every "
                            "query's latency is in the cell's server/ file."))
    parts.append("<h2 id='plots'>Plots</h2>" + "".join(_plot(p) for p in plots if p.name not in ACCURACY_PLOTS))
    acc = accuracy_table(run)
    parts.append("<h2 id='accuracy'>Accuracy (COCO statistics: bbox; segm for a segmentation cell)</h2>"
                 + (_table(acc) if acc else f"<p class='unavailable'>{escape(accuracy_unavailable(run))}</p>"))
    point = operating_point_table(run)
    if point is not None:
        parts.append(_noted("<h3>Operating point</h3>", point,
                            "the detection score with the highest mean F1 over the classes (IoU 0.50, COCO's "
                            "matching, the lowest such score at a tie), and the classes' mean precision, recall and "
                            "F1 there: what running the detector at that confidence gives on these images."))
    parts.append("".join(_plot(p) for p in accuracy_plots if acc))
    per_class = per_class_table(run)
    if per_class is not None:
        label, table = per_class
        parts.append(f"<details><summary>per-category AP, and P/R/F1 at the operating point, of {escape(label)}"
                     f"</summary>{_table(table)}</details>")
    parts.append(f"<h2 id='gates'>Gates</h2><p class='note'>targets from {escape(gate_source)}</p>")
    if gates is not None:
        parts.append(_table(gate_table(gates), status_col=4, wrap=True) if gates else "<p>no gates in the file</p>")
        parts.append("".join(f"<p class='note'>{escape(n)}</p>" for n in gate_notes))
    found = notes(run)
    parts.append("<h2 id='notes'>Notes and warnings</h2>"
                 + ("<ul>" + "".join(f"<li>{escape(n)}</li>" for n in found) + "</ul>" if found else "<p>none</p>"))
    parts.append("<h2 id='environment'>Setup and environment</h2>" + _table(setup_table(run), wrap=True))
    parts.append("<h3>Reproduce</h3>" + "".join(f"<pre>{escape(c)}</pre>" for c in repro_commands(run)))
    parts.append(_images_section(run))
    parts.append(_artefacts_section(run, plots))
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts.append(f"<p class='note'>generated by va-bench {escape(__version__)} at {stamp} from the run's records; "
                 "nothing was re-run.</p>")
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>{CSP}<style>{CSS}</style></head>"
            f"<body><main>{''.join(parts)}</main></body></html>\n")
