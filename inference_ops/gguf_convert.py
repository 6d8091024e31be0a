"""Convert a GGUF model into the Hugging Face folder vLLM serves, and check the result.

Runs in the vLLM venv (`<venv>/bin/python -m inference_ops.gguf_convert GGUF OUT`), never in the
app's: it needs that venv's transformers with `gguf` and `accelerate`, and imports nothing of
Django. `inference_ops.vllm_engine.ensure_model()` runs it once per machine.

What the conversion must mend, found by trying:
- transformers loads a GGUF dequantized (in float32 here, see below) but keeps a
  `quantization_config` marker saying "gguf"; vLLM would then look for a GGUF file. The weights
  saved are plain bf16, so the marker goes.
- The tokenizer converted from the GGUF has no post-processor that puts `<bos>` first, and Gemma
  without `<bos>` answers garbage ("France of France of ..."). The saved tokenizer gets one, so
  `/v1/completions` prompts start with `<bos>` as llama.cpp's do.
- A base model has no chat template. The question/answer template of the CPU engine
  (chat_templates/qa.jinja) is saved as the model's, preceded by `{{ bos_token }}` because vLLM
  renders chat prompts without adding special tokens (the template carries them).
- The question/answer form ends an answer at a blank line (the CPU engine's QA_STOP). vLLM takes
  no default stop strings from a model, but it does stop at every `eos_token_id` of the model's
  generation config: the newline-run tokens ("\\n\\n" and longer) are added there.

The check: for a few prompts, the converted model (through transformers: the same weights and
tokenizer vLLM loads) reads llama.cpp's greedy continuation (`data/gemma3_270m_greedy.json`) one
step at a time, and the report keeps, for each step, the token it would pick and how far
llama.cpp's token is below it in logits; the caller judges them. A model whose prompts do not
start with `<bos>` fails here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

# llama.cpp's greedy continuations of a few prompts, recorded from llama-server.
REFERENCE = Path(__file__).resolve().parent / "data" / "gemma3_270m_greedy.json"
NEWLINE_RUNS = ("\n\n", "\n\n\n", "\n\n\n\n")


def _bos_post_processor(bos: str, bos_id: int) -> dict:
    single = [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]
    return {
        "type": "TemplateProcessing",
        "single": single,
        "pair": [
            *single,
            {"SpecialToken": {"id": bos, "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }


def convert(gguf: Path, out: Path, template: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # Dequantized in float32, then rounded to bf16 once: dequantizing straight into bf16 changed
    # greedy answers within a dozen tokens ("Earth" for "Jupiter"); rounded from float32 they
    # match llama.cpp's on the check prompts, at half the size and twice the speed of float32.
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    model = model.to(dtype=torch.bfloat16)  # type: ignore[call-arg]  # transformers types `to` as unbound
    loaded = time.monotonic() - started
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = (
        None  # the same marker on the model: save_pretrained refuses a "gguf" model
    )
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)

    bos, bos_id = tokenizer.bos_token, tokenizer.bos_token_id
    tokenizer_json = partial / "tokenizer.json"
    data = json.loads(tokenizer_json.read_text())
    data["post_processor"] = _bos_post_processor(bos, bos_id)
    tokenizer_json.write_text(json.dumps(data, ensure_ascii=False))
    config_path = partial / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["add_bos_token"] = True
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config, ensure_ascii=False, indent=2))
    (partial / "chat_template.jinja").write_text("{{- bos_token -}}\n" + template.read_text())

    encoded = [tokenizer.encode(run, add_special_tokens=False) for run in NEWLINE_RUNS]
    newline_ids = sorted({ids[0] for ids in encoded if len(ids) == 1})
    generation = GenerationConfig.from_model_config(model.config)
    eos = generation.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    for name in ("<end_of_turn>", "<eos>"):
        token_id = tokenizer.convert_tokens_to_ids(name)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id and token_id not in eos:
            eos.append(token_id)
    generation.eos_token_id = eos + [i for i in newline_ids if i not in eos]
    generation.bos_token_id = bos_id
    generation.save_pretrained(partial)

    report = {
        "loaded_seconds": round(loaded, 1),
        "bos_token_id": bos_id,
        "eos_token_ids": generation.eos_token_id,
        "agreement": _agreement(partial),
    }
    (partial / "conversion.json").write_text(json.dumps(report, ensure_ascii=False, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return report


def _agreement(folder: Path) -> dict[str, dict[str, list]]:
    """For each prompt of the reference: the saved model (loaded back as vLLM will load it) fed
    the prompt and llama.cpp's greedy tokens in one pass; at each step the token the model would
    pick (`greedy`) and the logit gap from its pick down to llama.cpp's token (`gaps`, 0 where
    they agree). Teacher-forced, so one near tie does not change every later step."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reference = json.loads(REFERENCE.read_text())["tokens"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    found = {}
    for prompt, expected in reference.items():
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        if ids[0, 0].item() != tokenizer.bos_token_id:
            raise SystemExit(
                f"the converted tokenizer does not start {prompt!r} with {tokenizer.bos_token}"
            )
        fed = torch.cat([ids, torch.tensor([expected[:-1]])], dim=1)
        with torch.no_grad():
            logits = model(fed, attention_mask=torch.ones_like(fed)).logits[0].float()
        steps = logits[ids.shape[1] - 1 :]
        picks = steps.argmax(dim=-1)
        chosen = steps[torch.arange(len(expected)), torch.tensor(expected)]
        found[prompt] = {
            "greedy": picks.tolist(),
            "gaps": [round(g, 4) for g in (steps.max(dim=-1).values - chosen).tolist()],
        }
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--chat-template",
        type=Path,
        default=Path(__file__).resolve().parent / "chat_templates" / "qa.jinja",
    )
    args = parser.parse_args(argv)
    report = convert(args.gguf, args.out, args.chat_template)
    print(json.dumps(report, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
