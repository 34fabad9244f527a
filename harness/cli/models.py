"""`va-bench models list` and `va-bench models fetch`: the registry and its weights."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.cli.app import models_app, terminal
from harness.errors import UsageError
from harness.views.output import print_json


@models_app.command("list")
def models_list(
    family: str | None = typer.Option(None, "--family", help="only this family (e.g. rtmdet)"),
    task: str | None = typer.Option(None, "--task", help="only this task: detect or segment"),
    as_json: bool = typer.Option(False, "--json", help="print the registry as JSON"),
) -> None:
    """Registered models, their task and whether their weights are present locally; the families the
    leaderboard names that cannot be built here are listed as not available, with why."""
    from harness.catalogue import native_input_sizes, size_ranks, unavailable_families
    from harness.models.registry import REGISTRY
    from harness.views.commands import models_table

    if task is not None and task not in ("detect", "segment"):
        raise UsageError(f"--task {task!r}: use detect or segment")
    families = {e.family for e in REGISTRY.values()} | {u.family for u in unavailable_families()}
    if family is not None and family not in families:
        raise UsageError(f"--family {family!r} is not a family here; families: {', '.join(sorted(families))}")
    rows = []
    libreyolo_ids = _libreyolo_ids()  # fetched through libreyolo's own download
    sizes, ranks = native_input_sizes(), size_ranks()
    for entry in REGISTRY.values():
        if family in (None, entry.family) and task in (None, entry.task):
            found = entry.local_weights()
            rank = ranks.get(entry.model_id)
            rows.append({"id": entry.model_id, "family": entry.family, "task": entry.task, "available": True,
                         "weights": str(found) if found else None, "url": entry.weights_url, "note": entry.note,
                         "fetch": bool(entry.weights_url) or entry.model_id in libreyolo_ids,
                         # what aggregate reads: the size it is published at, its place in its family's size order
                         "input_size": sizes.get(entry.model_id),
                         "size_order": {"family": rank[0], "rank": rank[1]} if rank else None})
    for missing in unavailable_families():
        if family in (None, missing.family) and task in (None, "detect"):
            rows += [{"id": model_id, "family": missing.family, "task": "detect", "available": False, "weights": None,
                      "url": None, "note": f"not available: {missing.why}", "fetch": False, "input_size": None,
                      "size_order": None} for model_id in missing.ids]
    if not rows and not as_json:  # a family and a task that do not meet: say so, not an empty table
        terminal.out.print(f"no {task} model in the {family} family; `va-bench models list --task {task}` lists them",
                           highlight=False)
        return
    print_json(terminal.out, rows) if as_json else terminal.out.print(models_table(rows, terminal.out.width))


def _libreyolo_ids() -> set[str]:
    from harness.models.libreyolo import catalogue

    return set(catalogue())


@models_app.command("fetch")
def models_fetch(
    model_id: str = typer.Argument(..., help="registry id, e.g. yolox-s"),
    force: bool = typer.Option(False, "--force", help="download again even when the weights are found locally"),
    base_url: str | None = typer.Option(None, "--base-url", help="a mirror holding the release's files under their "
                                                                  "own names (http(s):// or file://)"),
) -> None:
    """Download a model's official weights into the weights cache (nothing to do when they are found locally); a
    release file whose SHA-256 is pinned is checked against it."""
    from harness.catalogue import check_model_id
    from harness.detector.graph import onnx_problem
    from harness.detector.weights import ENV_WEIGHTS_DIR, weights_dir
    from harness.files import check_base_url, download, file_sha256, output_file_problem
    from harness.models.registry import REGISTRY

    entry = REGISTRY.get(model_id)
    if entry is None:
        check_model_id(model_id)  # why, for an id the leaderboard names that cannot be built here; else the closest
        raise UsageError(f"{model_id}: not in the model registry; see `va-bench models list`")
    found = None if force else entry.local_weights()
    if found is not None:
        try:
            entry.check_weights(found)
        except UsageError as exc:
            # a file in the cache is replaced by --force; one found elsewhere (an environment variable, an offline
            # folder) is looked up before the cache, so only its owner can change it
            cached = found.resolve().parent == weights_dir().resolve()
            fix = ("--force downloads them again" if cached else
                   "it is looked up before the weights cache: replace or remove that file (or its environment "
                   "variable)")
            raise UsageError(f"{model_id}: {found} is there but is not its weights ({exc}); {fix}") from exc
        terminal.out.print(f"{model_id}: already present, {found} (sha256 {file_sha256(found)}); "
                           "--force downloads it again")
        return
    if base_url is not None and not entry.weights_url:
        raise UsageError(f"--base-url applies to a model whose release file va-bench downloads itself; {model_id}'s "
                         "weights come through its library: drop it")
    if base_url is not None:
        check_base_url(base_url, "the release's own")
    if not entry.weights_url and model_id in _libreyolo_ids():
        from harness.models.libreyolo import fetch_weights

        path, sha256 = fetch_weights(model_id, force=force)  # libreyolo's own resolution and download (its pins)
        terminal.out.print(f"{model_id}: {path} (sha256 {sha256})")
        return
    if not entry.weights_url:
        raise UsageError(f"{model_id} has no download of its own here ({entry.note}): {entry.weights_hint}")
    target = weights_dir() / entry.weights_file
    problem = output_file_problem(target)
    if problem:  # before the download: a cache that cannot be written is not the network's fault
        raise UsageError(f"the weights cache {target} {problem}; set ${ENV_WEIGHTS_DIR} to a writable folder")

    def weights_problem(path: Path) -> str | None:
        if entry.weights_sha256 is not None and (digest := file_sha256(path)) != entry.weights_sha256:
            return (f"is not {model_id}'s release file (SHA-256 {digest[:16]}..., the release's "
                    f"{entry.weights_sha256[:16]}...)")
        problem = onnx_problem(path) if entry.weights_file.endswith(".onnx") else None
        if problem is None:
            try:
                entry.check_weights(path)
            except UsageError as exc:  # a run's refusal of the file: its facts, not the temp file's name or advice
                return f"is not {model_id}'s weights ({str(exc).replace(str(path), 'the file').split('; ')[0]})"
        return problem

    url = entry.weights_url if base_url is None else f"{base_url.rstrip('/')}/{entry.weights_url.rsplit('/', 1)[1]}"
    for stale in target.parent.glob(f".{target.name}.*.part"):  # a download killed before it could tidy up
        stale.unlink(missing_ok=True)
    dest = download(url, target, check=weights_problem)
    pinned = "checked against the release's" if entry.weights_sha256 else "not pinned here: checked for its shape only"
    terminal.out.print(f"{model_id}: {dest} (sha256 {file_sha256(dest)}; {pinned})")
