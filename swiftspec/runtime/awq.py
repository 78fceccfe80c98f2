"""Write an AWQ-format int4 copy of a Hugging Face checkpoint (round-to-nearest, `kernels.int4`).

The copy is what AutoAWQ's GEMM layout holds (qweight / qzeros / scales per projection, config.json
`quantization_config` {"quant_method": "awq", "bits": 4, "group_size": g, "zero_point": true,
"version": "gemm"}), with round-to-nearest quantization instead of AWQ's activation-aware search:
the same loader reads both, and a model quantized while loading (`--weight-format int4`) at the
same group size holds the same numbers. Embedding, norms, biases and LM head are copied as they are.
The copy is built in memory and written as one file: meant for the small models of tests and
quality checks (SmolLM2-135M: ≈ 1 s), not for 70B checkpoints.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from swiftspec.kernels.int4 import quantize_rtn
from swiftspec.runtime.weights import PROJECTIONS, check_checkpoint
from swiftspec.spec import ModelSpec, UserError, resolve_model_path

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                    "generation_config.json", "vocab.json", "merges.txt")


def write_awq_checkpoint(src: str | Path, dst: str | Path, group_size: int = 128) -> Path:
    """Quantize checkpoint `src` (a folder of native safetensors weights) into a new folder `dst`
    (must not exist) in the AWQ GEMM format with groups of `group_size` inputs; returns dst."""
    folder, out = resolve_model_path(src), Path(dst)
    if out.exists():
        raise UserError(f"{out} exists: give a new folder for the int4 copy")
    spec = ModelSpec.from_config(folder)
    if spec.weight_format != "native":
        raise UserError(f"{folder} is already quantized ({spec.weight_format})")
    weight_map, handles = check_checkpoint(folder, spec)
    tensors: dict[str, torch.Tensor] = {}
    quantized = {f"model.layers.{i}.{p}.weight" for i in range(spec.num_layers) for p in PROJECTIONS}
    for name, fname in weight_map.items():
        t = handles[fname].get_tensor(name)
        if name in quantized:
            awq = quantize_rtn(t, group_size)
            base = name.removesuffix(".weight")
            tensors.update({base + ".qweight": awq.qweight, base + ".qzeros": awq.qzeros, base + ".scales": awq.scales})
        else:
            tensors[name] = t.contiguous()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
                                     "version": "gemm", "modules_to_not_convert": None}
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    for f in _TOKENIZER_FILES:
        if (folder / f).exists():
            shutil.copy2(folder / f, tmp / f)
    tmp.rename(out)  # the folder appears whole or not at all
    return out
