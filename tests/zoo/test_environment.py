"""The model zoo's environment is what the set-up installs
(requirements-zoo.txt, requirements-zoo-nodeps.txt, scripts/common.sh):
the pinned versions, and ExecuTorch's LFM2 example and llama infrastructure
importable (the LFM2 example needs safetensors, which transformers brings)."""

import importlib.metadata
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def pins(name: str) -> dict[str, str]:
    text = (ROOT / name).read_text()
    return dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)$", text, flags=re.MULTILINE))


@pytest.mark.parametrize("requirements", ["requirements-zoo.txt", "requirements-zoo-nodeps.txt"])
def test_installed_versions_are_the_pinned_ones(requirements):
    wanted = pins(requirements)
    assert wanted, f"no pins in {requirements}"
    for dist, version in wanted.items():
        assert importlib.metadata.version(dist) == version, (
            f"{dist} {importlib.metadata.version(dist)} installed, {requirements} pins {version}: "
            "run scripts/setup.sh"
        )


def test_zoo_requirements_leave_the_environment_pins_alone():
    """Installed with requirements.txt as constraints: no zoo file pins what
    requirements.txt pins, and torchaudio (built against another torch) is
    not in the file installed with dependencies."""
    base = pins("requirements.txt")
    for name in ("requirements-zoo.txt", "requirements-zoo-nodeps.txt"):
        assert not set(pins(name)) & set(base), name
    assert "torchaudio" not in pins("requirements-zoo.txt")
    common = (ROOT / "scripts" / "common.sh").read_text()
    assert '-c "$ROOT/requirements.txt" -r "$ROOT/requirements-zoo.txt"' in common
    assert '--no-deps -r "$ROOT/requirements-zoo-nodeps.txt"' in common


def test_executorch_lfm2_example_and_llama_infrastructure_import():
    import safetensors  # noqa: F401  (the LFM2 example's convert_weights needs it)
    from executorch.examples.models.lfm2 import ShortConvBlock, convert_weights  # noqa: F401
    from executorch.examples.models.llama import export_llama_lib
    from executorch.extension.llm.export.builder import LLMEdgeManager  # noqa: F401

    configs = Path(export_llama_lib.__file__).parents[1] / "lfm2" / "config"
    for recipe in ("lfm2_xnnpack_fp32", "lfm2_xnnpack_q8da4w"):
        assert (configs / f"{recipe}.yaml").is_file(), recipe


def test_torchaudio_models_run_on_the_pinned_torch():
    import torch
    from torchaudio.models import Wav2Letter

    model = Wav2Letter(num_classes=4, input_type="mfcc", num_features=13).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 13, 20)).shape == (1, 4, 11)
