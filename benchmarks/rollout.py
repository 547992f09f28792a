"""Time the constrained rollout: eager against static decoding, and the old against the new grammar
mask fill, side by side in one run.

Usage (from the repository root):

    python benchmarks/rollout.py [--model tiny] [--task expr24] [--rows 32,128] [--repeats 20] \
        [--threads 1] [--json FILE]
    python benchmarks/rollout.py --model-config llama-1b --tokenizer DIR --task fixed \
        --lengths 10,64 --rows 32,128,256 --repeats 5 --json FILE
    python benchmarks/rollout.py --baseline FILE   # another version of raptb.adapters.lm.rollout
    python benchmarks/rollout.py --split 4 --rows 128 [--repeats 20]   # one rollout vs four
    python benchmarks/rollout.py --model smollm2-135m --rows 32 --flip-search 20000

The policy is the one ``raptb train`` builds (``build_task``, ``build_policy``: the task's
alphabet, grammar and stop token; LoRA for a pretrained model; bf16 on CUDA).
``--model-config`` writes a random-weight model of that shape over the tokenizer in
``--tokenizer DIR`` (``train_step.write_random_model``). ``--task fixed`` is ``train_step``'s task
with no grammar, every non-special token legal and min_length = max_length = T for each T of
``--lengths``, so every row has exactly T tokens; other tasks use their own lengths.

For each number of rows, the two decoding paths (``sampling.decode`` "eager" and "static") alternate
on the same policy, one rollout each per repeat with the same generator seed, so both see the same
machine load; the first ``WARMUP`` repeats are not timed (on CUDA the static path captures its
graphs at a decoder's second rollout).
Each rollout is closed by a device synchronisation. The static rollout is compared with the eager
one by ``adapters.lm.gpu.decode_agreement.compare_rollouts``: ``identical`` (the same rows,
log-probs within 1e-5), ``rounding`` (log-probs farther apart, or a draw flipped, with the static
path no farther from a float64 copy of the model than rounding puts the eager one; the line printed
gives the logits' difference at the flip and the draw's margin) or ``genuine``, which stops the
script on the CPU; on a GPU every verdict is counted and reported. Per
path: median ms per rollout (``step_s``), ms per token step (the rollout over its longest row's
length: one forward and one draw per step), generated tokens per second, the rollout's own grammar
time, and peak ``torch.cuda.max_memory_allocated``.

Grammar fill (tasks with a grammar): the masks of the last static rollout's rows are rebuilt step
by step along its tokens, timing only the mask: "old" is ``GrammarBatch.next_mask().to(device)``
(every row filled, unpacked on the host, a bool copy), "new" is the static path's
``fill_bitmask(active rows)``, one non-blocking copy of the packed int32 mask and
``unpack_bitmask`` on the device; ms per step, each step closed by a synchronisation.

``--json FILE`` appends one record per (rows, T, path) to the list in FILE: ``device``, ``date``,
``model``, ``task``, ``rows``, ``max_length``, ``decode``, ``decode_ms_per_token_step``,
``tokens_per_s``, ``step_s`` (seconds per rollout), ``peak_mib`` (null on the CPU),
``graphs_captured`` (the static path ran as CUDA graphs: every decoder captured, none failed;
false on the CPU and for eager) with ``graph_capture_error``, the static record's
``agreement_with_eager`` (timed repeats by verdict), ``max_abs_log_prob_difference`` (before any
flip) and ``first_parting`` (the first flipped draw's description, or null), and the
measurement's details.

``--baseline FILE`` instead alternates the ``sample_rollout`` of another version of
``raptb.adapters.lm.rollout`` (e.g. ``git show main:adapters/lm/rollout.py > FILE``) with the
current one on the eager path, requires bit-identical rollouts, and prints both medians.

``--split N`` instead alternates one ``sample_rollout`` of ``--rows`` rows and N rollouts of
rows / N each (the trainer's layout after and before one rollout per optimizer step), on the
configured decoding path, and prints the median milliseconds per step's rows of each, with
generated tokens per second.

``--flip-search N`` instead searches seeds 0..N-1 for one where rounding flips the first draw of
``--rows`` rows (both paths' logits after the prompt, the grammar's first mask, each seed's first
noise q, the paths' own ``argmax(softmax / q)``), rolls both paths out at that seed and prints
``compare_rollouts``' verdict with the flip's logits difference and margins (CPU generators).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from train_step import FIXED_PROMPT, MODEL_CONFIGS, write_random_model

from raptb.adapters.lm.gpu.decode_agreement import Agreement, compare_rollouts, float64_copy
from raptb.adapters.lm.gpu.static_decode import static_logits
from raptb.adapters.lm.grammar import GrammarBatch, packed_width, unpack_bitmask
from raptb.adapters.lm.policy import HFPolicy
from raptb.adapters.lm.rollout import Rollout, eager_logits, sample_rollout
from raptb.app.configuration.config import build_config
from raptb.app.task_and_policy import build_policy, build_task
from raptb.core.ports import Task

DECODES = ("eager", "static")
WARMUP = 2


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def build(args: argparse.Namespace, model: str, length: int | None) -> tuple[HFPolicy, Task]:
    """The task and its policy as ``raptb train`` builds them (``length``: the fixed task's T)."""
    overrides: dict[str, Any] = {"model": model, "task": args.task}
    if args.task == "fixed":
        overrides |= {
            "task": "custom",
            "custom.reward": "train_step:digit_reward",
            "custom.prompts": [FIXED_PROMPT],
            "custom.min_length": length,
            "custom.max_length": length,
        }
    config = build_config(overrides=overrides)
    task = build_task(config)
    return build_policy(config.model, task, config.seed, lora=config.lora), task


def agreement(
    policy: HFPolicy,
    references: dict[str, torch.nn.Module],
    prompt: str,
    rows: int,
    repeat: int,
    eager: Rollout,
    static: Rollout,
) -> Agreement:
    """``compare_rollouts`` of a repeat's two rollouts (seed ``repeat``, temperature 1); the
    float64 reference model is made once, on first need, and kept in ``references``."""
    if "model" not in references:
        references["model"] = float64_copy(policy.model)
    return compare_rollouts(
        policy,
        references["model"],
        [policy.prompt_ids(prompt)] * rows,
        eager,
        static,
        generator=torch.Generator(device=policy.device).manual_seed(repeat),
        temperature=torch.ones(rows),
    )


def grammar_fill_ms(policy: HFPolicy, rollout: Rollout, device: torch.device) -> dict[str, float]:
    """Median ms per step of the old and the new mask fill along ``rollout``'s rows (docstring)."""
    assert policy.grammar is not None
    rows = rollout.rows
    n, width = len(rows), len(policy.legal_ids) + 1
    cuda = device.type == "cuda"
    grammar = GrammarBatch(
        policy.grammar,
        policy.legal_ids,
        policy.texts,
        n,
        max_threads=policy.grammar_threads,
        pin_memory=cuda,
    )
    on_device = torch.empty(n, packed_width(width), dtype=torch.int32, device=device)
    times: dict[str, list[float]] = {"old": [], "new": []}
    for variant in times:
        grammar.reset()
        for k in range(max(len(row) for row in rows) + 1):
            active = [r for r in range(n) if k <= len(rows[r])]
            sync()
            start = time.perf_counter()
            if variant == "old":
                grammar.next_mask().to(device)
            else:
                on_device.copy_(grammar.fill_bitmask(active), non_blocking=True)
                unpack_bitmask(on_device, width)
            sync()
            times[variant].append(time.perf_counter() - start)
            movers = [r for r in active if k < len(rows[r])]
            grammar.accept_many(movers, [rows[r][k] for r in movers])
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def measure(
    args: argparse.Namespace, policy: HFPolicy, task: Task, model_name: str, rows: int
) -> list[dict[str, Any]]:
    """The records of eager and static decoding of ``rows`` rows (module docstring)."""
    device = policy.device
    prompt = task.prompts()[0]
    seconds: dict[str, list[float]] = {name: [] for name in DECODES}
    grammar_s: dict[str, list[float]] = {name: [] for name in DECODES}
    peak = dict.fromkeys(DECODES, 0.0)
    tokens = steps = 0
    verdicts: dict[str, int] = dict.fromkeys(("identical", "rounding", "genuine"), 0)
    worst = 0.0
    flip: str | None = None
    references: dict[str, torch.nn.Module] = {}
    last: dict[str, Rollout] = {}
    for repeat in range(args.repeats + WARMUP):
        timed = repeat >= WARMUP
        for name in DECODES:
            policy.decode = name
            generator = torch.Generator(device=device).manual_seed(repeat)
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            sync()
            start = time.perf_counter()
            last[name] = policy.sample(
                prompt,
                rows,
                min_length=task.min_length,
                max_length=task.max_length,
                generator=generator,
            )
            sync()
            if timed:
                seconds[name].append(time.perf_counter() - start)
                grammar_s[name].append(last[name].timings.grammar_s)
                if torch.cuda.is_available():
                    peak[name] = max(peak[name], torch.cuda.max_memory_allocated() / 2**20)
        found = agreement(policy, references, prompt, rows, repeat, last["eager"], last["static"])
        if found.verdict != "identical":
            print(f"rows {rows}, repeat {repeat}: static against eager {found.describe()}")
        if device.type == "cpu" and found.verdict == "genuine":
            raise SystemExit(f"rows {rows}, repeat {repeat}: static and eager rollouts differ")
        worst = max(worst, found.log_prob_difference)
        if found.parting is not None and flip is None:
            flip = found.describe()
        if timed:
            verdicts[found.verdict] += 1
            tokens += int(last["eager"].length.sum())
            steps += max(1, int(last["eager"].length.max()))
    fill = grammar_fill_ms(policy, last["static"], device) if policy.grammar else {}
    records = []
    for name in DECODES:
        rollout_s = statistics.median(seconds[name])
        record = {
            "device": device_name(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "model": model_name,
            "task": args.task,
            "rows": rows,
            "max_length": task.max_length,
            "decode": name,
            "decode_ms_per_token_step": sum(seconds[name]) / steps * 1e3,
            "tokens_per_s": tokens / sum(seconds[name]),
            "step_s": rollout_s,
            "peak_mib": peak[name] if torch.cuda.is_available() else None,
            "grammar_ms_per_rollout": statistics.median(grammar_s[name]) * 1e3,
            "generated_tokens_per_rollout": tokens / args.repeats,
            "repeats": args.repeats,
            "torch": str(torch.__version__),
            "threads": torch.get_num_threads(),
        }
        if name == "static":
            record["identical_to_eager"] = f"{verdicts['identical']}/{args.repeats}"
            record["agreement_with_eager"] = verdicts
            record["max_abs_log_prob_difference"] = worst
            record["first_parting"] = flip
            graphs = policy.decoders.graph_summary()
            record["graphs_captured"] = graphs["captured"] > 0 and not graphs["failed"]
            record["graph_capture_error"] = graphs["error"]
        else:
            record["graphs_captured"] = False
        if fill:
            record["grammar_fill_old_ms_per_step"] = fill["old"]
            record["grammar_fill_new_ms_per_step"] = fill["new"]
        records.append(record)
    return records


def agreement_cell(record: dict[str, Any]) -> str:
    """``identical/repeats``, with ``+ k rounding`` and ``+ k genuine`` where there are any."""
    if "agreement_with_eager" not in record:
        return ""
    counts = record["agreement_with_eager"]
    cell = f"{counts['identical']}/{record['repeats']}"
    for verdict in ("rounding", "genuine"):
        if counts[verdict]:
            cell += f" + {counts[verdict]} {verdict}"
    return cell


def print_tables(records: list[dict[str, Any]]) -> None:
    print(
        "| rows | T | decode | ms per rollout | ms per token step | tokens/s | grammar ms per "
        "rollout | peak MiB | static = eager (+ rounding) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in records:
        peak = "-" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"
        print(
            f"| {r['rows']} | {r['max_length']} | {r['decode']} | {r['step_s'] * 1e3:.1f} | "
            f"{r['decode_ms_per_token_step']:.2f} | {r['tokens_per_s']:.0f} | "
            f"{r['grammar_ms_per_rollout']:.2f} | {peak} | {agreement_cell(r)} |"
        )
    fills = [r for r in records if r["decode"] == "static" and "grammar_fill_old_ms_per_step" in r]
    if fills:
        print("\n| rows | T | old fill ms per step | new fill ms per step | new / old |")
        print("|---|---|---|---|---|")
        for r in fills:
            old, new = r["grammar_fill_old_ms_per_step"], r["grammar_fill_new_ms_per_step"]
            print(f"| {r['rows']} | {r['max_length']} | {old:.3f} | {new:.3f} | {new / old:.2f} |")


def load_baseline(path: Path) -> Callable[..., Rollout]:
    """``sample_rollout`` of the rollout module stored at ``path``."""
    spec = importlib.util.spec_from_file_location("rollout_baseline", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--baseline: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module.sample_rollout


def baseline_main(args: argparse.Namespace, policy: HFPolicy, task: Task, rows: int) -> None:
    policy.decode = "eager"
    versions = {"baseline": load_baseline(args.baseline), "current": sample_rollout}
    times: dict[str, list[float]] = {name: [] for name in versions}
    for repeat in range(args.repeats + 1):
        results = {}
        for name, sample in versions.items():
            start = time.perf_counter()
            results[name] = sample(
                policy,
                task.prompts()[0],
                rows,
                min_length=task.min_length,
                max_length=task.max_length,
                generator=torch.Generator().manual_seed(repeat),
            )
            if repeat:
                times[name].append(time.perf_counter() - start)
        a, b = results["baseline"], results["current"]
        if not (
            torch.equal(a.tokens, b.tokens)
            and torch.equal(a.log_pf.view(torch.int32), b.log_pf.view(torch.int32))
            and torch.equal(a.log_pterm.view(torch.int32), b.log_pterm.view(torch.int32))
        ):
            raise SystemExit(f"repeat {repeat}: the two versions' rollouts differ")
    base, cur = (statistics.median(times[name]) * 1e3 for name in versions)
    print(f"{rows} rows, {args.repeats} repeats; all rollouts identical")
    print("| baseline ms | current ms | current / baseline |")
    print(f"| {base:.1f} | {cur:.1f} | {cur / base:.3f} |")


def split_main(args: argparse.Namespace, policy: HFPolicy, task: Task, rows: int) -> None:
    """One rollout of ``rows`` rows against ``args.split`` rollouts of rows / split."""
    if rows % args.split:
        raise SystemExit("--rows must be a multiple of --split")
    layouts = {f"1 x {rows}": 1, f"{args.split} x {rows // args.split}": args.split}
    times: dict[str, list[float]] = {name: [] for name in layouts}
    tokens: dict[str, int] = dict.fromkeys(layouts, 0)
    for repeat in range(args.repeats + 1):  # repeat 0 warms up and is not timed
        for name, calls in layouts.items():
            generator = torch.Generator().manual_seed(repeat)
            start = time.perf_counter()
            done = [
                sample_rollout(
                    policy,
                    task.prompts()[0],
                    rows // calls,
                    min_length=task.min_length,
                    max_length=task.max_length,
                    generator=generator,
                )
                for _ in range(calls)
            ]
            sync()
            if repeat:
                times[name].append(time.perf_counter() - start)
                tokens[name] += sum(int(r.length.sum()) for r in done)
    print(f"{rows} rows per step, {args.repeats} repeats, {torch.get_num_threads()} thread(s)")
    print("| rollouts x rows | median ms per step | generated tokens/s |")
    print("|---|---|---|")
    for name in layouts:
        median = statistics.median(times[name])
        rate = tokens[name] / sum(times[name])
        print(f"| {name} | {median * 1e3:.1f} | {rate:.0f} |")


def flip_main(args: argparse.Namespace, policy: HFPolicy, task: Task, rows: int) -> None:
    """Seeds 0..N-1 searched for one where the two paths' first draw differs (both paths' logits
    after the prompt, the grammar's first mask, each seed's first noise, the paths' own float32
    formula); at the first found, both rollouts and ``compare_rollouts``' verdict."""
    prompt = task.prompts()[0]
    prompt_rows = [policy.prompt_ids(prompt)] * rows
    none = torch.zeros(rows, 0, dtype=torch.long)
    sub_ids = torch.tensor([*policy.legal_ids, policy.stop_id])
    mask = torch.ones(rows, len(sub_ids), dtype=torch.bool)
    grammar = policy.grammar_batch(rows)
    if grammar is not None:
        grammar.reset()
        mask = unpack_bitmask(grammar.next_bitmask(), len(sub_ids))
    if task.min_length > 0:
        mask[:, -1] = False
    behaviour = {
        name: torch.softmax(logits.cpu()[:, sub_ids].masked_fill(~mask, float("-inf")), dim=1)
        for name, logits in (
            ("eager", eager_logits(policy, prompt_rows, none)),
            ("static", static_logits(policy, prompt_rows, none, task.max_length)),
        )
    }
    for seed in range(args.flip_search):
        noise = torch.empty(rows, len(sub_ids)).exponential_(1, generator=manual_seed(seed))
        eager, static = (torch.argmax(p / noise, dim=1) for p in behaviour.values())
        if not torch.equal(eager, static):
            break
    else:
        print(f"no first draw differs in seeds 0..{args.flip_search - 1} ({rows} rows)")
        return
    print(f"seed {seed}: the first draw differs in rows {(eager != static).nonzero().flatten()}")
    rollouts = {}
    for name in DECODES:
        policy.decode = name
        rollouts[name] = policy.sample(
            prompt,
            rows,
            min_length=task.min_length,
            max_length=task.max_length,
            generator=manual_seed(seed),
        )
    found = compare_rollouts(
        policy,
        float64_copy(policy.model),
        prompt_rows,
        rollouts["eager"],
        rollouts["static"],
        generator=manual_seed(seed),
        temperature=torch.ones(rows),
    )
    print(f"static against eager: {found.describe()}")


def manual_seed(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--model-config", choices=sorted(MODEL_CONFIGS), default=None)
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder for --model-config")
    parser.add_argument("--task", default="expr24", help="a registered task, or fixed")
    parser.add_argument("--lengths", default="10", help="T values of --task fixed, e.g. 10,64")
    parser.add_argument("--rows", default="32,128")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="append the records to FILE")
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--split", type=int, default=None, help="one rollout against N")
    parser.add_argument(
        "--flip-search", type=int, default=None, help="seeds to search for a flipped first draw"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, model_name = args.model, args.model
    if args.model_config is not None:
        if args.tokenizer is None:
            raise SystemExit("--model-config needs --tokenizer DIR")
        folder = Path(tempfile.mkdtemp()) / "model"
        model = str(write_random_model(args.model_config, args.tokenizer, folder))
        model_name = args.model_config
    lengths = [int(t) for t in args.lengths.split(",")] if args.task == "fixed" else [None]
    all_rows = [int(r) for r in args.rows.split(",")]
    records: list[dict[str, Any]] = []
    for length in lengths:
        policy, task = build(args, model, length)
        for rows in all_rows:
            if args.baseline is not None:
                baseline_main(args, policy, task, rows)
            elif args.split is not None:
                split_main(args, policy, task, rows)
            elif args.flip_search is not None:
                flip_main(args, policy, task, rows)
            else:
                records += measure(args, policy, task, model_name, rows)
        del policy
    if not records:
        return
    print(
        f"{model_name}, {args.task}, {device_name()}, {args.repeats} repeats, "
        f"{torch.get_num_threads()} torch threads"
    )
    print_tables(records)
    if args.json is not None:
        previous = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(previous + records, indent=2) + "\n")


if __name__ == "__main__":
    main()
