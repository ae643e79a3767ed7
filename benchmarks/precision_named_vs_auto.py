"""What ``dtype="float32"`` named and ``dtype="auto"`` compute, against ``transformers`` float32:
the accuracy behind the precision the engine announces (docs/precision.md).

    .venv/bin/python benchmarks/precision_named_vs_auto.py --models 4 --prompts 10

For each of ``--models`` unseen random Llamas (the ``cadenza bench engine`` shape, 31 M
parameters, a new seed each) the engine is built twice, as a user would: named float32 and
``auto`` (bf16 products, KV cache and codec where the CPU multiplies bf16 natively; float32
logits either way). Each greedily continues ``--prompts`` random 24-token prompts by 32 tokens.
Reported per setting: sequences identical to ``transformers``, the share of tokens equal before
the first divergence, and the logits' error while the tokens agree (the largest absolute
difference over the largest reference logit, worst over steps, and the mean cosine).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from typing import Any

import torch

from cadenza.bench.engine_throughput import reference_llama
from cadenza.engine import model_runner, sampler
from cadenza.engine.engine import Engine
from cadenza.engine.offline import generate_ids

NEW_TOKENS = 32
PROMPT_TOKENS = 24


def _engine_logits(engine: Engine, prompts: list[list[int]]) -> tuple[list[list[int]], list[Any]]:
    """Greedy tokens of every prompt, one at a time, and the logits each step sampled from."""
    captured: list[torch.Tensor] = []
    original = sampler.sample_rows

    def recording(logits: torch.Tensor, *args: Any, **kwargs: Any) -> list[list[int]]:
        captured.append(logits[:, 0].float().clone())
        return original(logits, *args, **kwargs)

    model_runner.sample_rows = recording  # type: ignore[attr-defined]
    tokens, logits = [], []
    try:
        for prompt in prompts:
            captured.clear()
            tokens.append(generate_ids(engine, [prompt], NEW_TOKENS)[0])
            logits.append(torch.cat(captured))
    finally:
        model_runner.sample_rows = original  # type: ignore[attr-defined]
    return tokens, logits


def _reference(model: Any, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return out.sequences[0, len(prompt) :].tolist(), torch.cat(out.logits).float()


def _score(
    got: list[list[int]],
    logits: list[torch.Tensor],
    reference: list[tuple[list[int], torch.Tensor]],
) -> dict[str, float]:
    identical, agreed, worst_error, cosines = 0, 0, 0.0, []
    for tokens, step_logits, (ref_tokens, ref_logits) in zip(got, logits, reference, strict=True):
        identical += tokens == ref_tokens
        same = next(
            (i for i, (a, b) in enumerate(zip(tokens, ref_tokens, strict=True)) if a != b),
            NEW_TOKENS,
        )
        agreed += same
        steps = min(same + 1, len(step_logits))  # the logits up to the first divergence
        ours, theirs = step_logits[:steps], ref_logits[:steps]
        error = ((ours - theirs).abs().amax(dim=1) / theirs.abs().amax(dim=1)).max().item()
        worst_error = max(worst_error, error)
        cosines += torch.nn.functional.cosine_similarity(ours, theirs, dim=1).tolist()
    return {
        "identical": identical,
        "sequences": len(got),
        "tokens_agreeing": agreed / (len(got) * NEW_TOKENS),
        "worst_logit_error": worst_error,
        "mean_cosine": sum(cosines) / len(cosines),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    totals: dict[str, list[dict[str, float]]] = {"float32 (named)": [], "auto": []}
    described: dict[str, str] = {}
    for seed in range(args.models):
        torch.manual_seed(seed)
        reference = reference_llama()
        rng = torch.Generator().manual_seed(1000 + seed)
        vocab = reference.config.vocab_size
        prompts = torch.randint(3, vocab, (args.prompts, PROMPT_TOKENS), generator=rng).tolist()
        expected = [_reference(reference, prompt) for prompt in prompts]
        with tempfile.TemporaryDirectory() as directory:
            reference.save_pretrained(directory)
            for name, dtype in (("float32 (named)", "float32"), ("auto", "auto")):
                engine = Engine.from_pretrained(directory, dtype=dtype)
                assert engine.precision is not None
                described[name] = engine.precision.describe()
                tokens, logits = _engine_logits(engine, prompts)
                totals[name].append(_score(tokens, logits, expected))
    summary = {}
    for name, runs in totals.items():
        summary[name] = {
            "precision": described[name],
            "identical_sequences": f"{sum(r['identical'] for r in runs)}/"
            f"{sum(r['sequences'] for r in runs)}",
            "tokens_agreeing": round(sum(r["tokens_agreeing"] for r in runs) / len(runs), 3),
            "worst_logit_error": f"{max(r['worst_logit_error'] for r in runs):.1e}",
            "mean_cosine": round(sum(r["mean_cosine"] for r in runs) / len(runs), 6),
        }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(
        "| setting | precision | identical sequences | tokens before divergence | "
        "worst logit error | mean cosine |"
    )
    print("|---|---|---|---|---|---|")
    for name, row in summary.items():
        print(
            f"| {name} | {row['precision']} | {row['identical_sequences']} | "
            f"{row['tokens_agreeing']:.1%} | {row['worst_logit_error']} | {row['mean_cosine']} |"
        )


if __name__ == "__main__":
    main()
