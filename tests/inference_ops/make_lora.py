"""Write a small LoRA adapter for a converted model, in peft's format, without peft.

Run by the vLLM venv's python (torch and safetensors are there): `python make_lora.py MODEL OUT`.
Its weights are random but large enough to change greedy answers, which is what the contract
suite needs to see: the engine answered through the adapter, not the base model.
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

RANK = 8


def main(model: Path, out: Path, seed: int = 0) -> None:
    config = json.loads((model / "config.json").read_text())
    hidden, heads, kv_heads = (
        config["hidden_size"],
        config["num_attention_heads"],
        config["num_key_value_heads"],
    )
    head_dim = config.get("head_dim") or hidden // heads
    shapes = {"q_proj": heads * head_dim, "v_proj": kv_heads * head_dim}
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module, out_features in shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (
                torch.randn(RANK, hidden, generator=generator) * 0.05
            )
            tensors[f"{prefix}.lora_B.weight"] = (
                torch.randn(out_features, RANK, generator=generator) * 0.05
            )
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {name: t.contiguous() for name, t in tensors.items()},
        str(out / "adapter_model.safetensors"),
    )
    (out / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "task_type": "CAUSAL_LM",
                "r": RANK,
                "lora_alpha": 2 * RANK,
                "lora_dropout": 0.0,
                "bias": "none",
                "target_modules": list(shapes),
                "base_model_name_or_path": str(model),
                "fan_in_fan_out": False,
                "modules_to_save": None,
                "use_rslora": False,
                "use_dora": False,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 0)
