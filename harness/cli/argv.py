"""The command line as typed, made ready for Click: several values after one flag become repeated flags, an old
file option gets its new name, and an option of one value given twice is named (Click keeps the last silently)."""

from __future__ import annotations

import typing

from harness.cli.app import terminal

# Commands whose list options take several values after one flag, like `run --batch-sizes 1 2 4`; commands with
# positional arguments (compare, aggregate) repeat the flag instead, so a value is never taken for a path.
EXTRA_MULTI_VALUE_FLAGS = {("fleet", "run"): {"--hardware"}, ("parity", "preprocess"): {"--impls"}}


def multi_value_flags() -> set[str]:
    """Flags of list-typed run options: they take several values after one flag (`--batch-sizes 1 2 4`)."""
    from harness.config import run_option_fields

    return {flag for f in run_option_fields().values() if typing.get_origin(f.annotation) is list
            for flag in f.json_schema_extra["flags"]}


def renamed_file_options(argv: list[str]) -> list[str]:
    """`parity preprocess --json PATH` (its old file output) is `--json-out PATH` now; `--json` alone prints JSON."""
    if argv[:2] != ["parity", "preprocess"]:
        return list(argv)
    out = []
    for i, token in enumerate(argv):
        if token.startswith("--json="):
            token = "--json-out=" + token.split("=", 1)[1]
        elif token == "--json" and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            token = "--json-out"
        else:
            out.append(token)
            continue
        terminal.err.print("[yellow]deprecated[/]: parity preprocess --json PATH is now --json-out PATH (--json "
                           "prints the report as JSON)", highlight=False)
        out.append(token)
    return out


def expand_multi_value_options(argv: list[str]) -> list[str]:
    """['--batch-sizes', '1', '2'] -> ['--batch-sizes', '1', '--batch-sizes', '2'] (Click has no nargs=-1
    for options, so main() rewrites them into repeated flags before Typer parses argv)."""
    command = tuple(argv[:1]) if argv[:1] == ["run"] else tuple(argv[:2])
    if command not in (("run",), ("fleet", "run"), ("parity", "preprocess")):  # options of one value each
        return list(argv)
    multi = EXTRA_MULTI_VALUE_FLAGS.get(command, set()) | (multi_value_flags() if command != ("parity", "preprocess")
                                                           else set())
    out: list[str] = []
    current = None
    for token in argv:
        if token.startswith("-"):
            current = token if token in multi else None
            out.append(token)
        elif current is not None and out[-1] != current:
            out += [current, token]
        else:
            out.append(token)
    return out


def repeated_options(command, argv: list[str]) -> list[str]:
    """A warning for each option of one value given more than once (`--dataset A --dataset B`): Click keeps the last
    one without a word, and a user who gave two datasets (as `--model` takes two models) would see one scored, not
    knowing which; a script's later flag overriding an earlier one (`$COMMON --limit 4`) still works."""
    leaf, tokens = command, list(argv)
    while tokens and tokens[0] in getattr(leaf, "commands", {}):
        leaf, tokens = leaf.commands[tokens[0]], tokens[1:]
    params = getattr(leaf, "params", ())
    single = {opt: param for param in params if getattr(param, "is_flag", True) is False
              and not param.multiple for opt in param.opts}
    switches = {opt: param for param in params if getattr(param, "is_flag", False) and param.secondary_opts
                for opt in (*param.opts, *param.secondary_opts)}  # --x/--no-x
    given: dict[str, list[str]] = {}
    flags: dict[str, str] = {}
    turned: dict[str, list[str]] = {}
    tokens = iter(tokens)
    for token in tokens:
        flag, equals, value = token.partition("=")
        param = single.get(flag)
        if param is not None:
            given.setdefault(param.name, []).append(value if equals else next(tokens, ""))
            flags[param.name] = flag
        elif token in switches:
            turned.setdefault(switches[token].name, []).append(token)
    warnings = [f"{flags[name]} is given {len(values)} times ({', '.join(values)}): it takes one value, and the "
                f"last, {values[-1]}, is the one used" for name, values in given.items() if len(set(values)) > 1]
    return warnings + [f"{' and '.join(dict.fromkeys(used))} are both given: the last, {used[-1]}, is the one used"
                       for used in turned.values() if len(set(used)) > 1]
