import os

# pytest-xdist runs a worker per core, each with torch's OpenMP threads on every core: threads that spin at a
# barrier (libgomp's default) then wait on ones the other workers took, and small operators take many times their
# time. Waiting threads sleep instead (read when torch loads OpenMP: before it is imported; subprocesses inherit it).
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers import WORDS, random_translator, save_copier, save_counter, save_model, save_word_tokenizer

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("TFCLI_SHARED_DATA", ROOT.parent / "shared" / "data"))


@pytest.fixture(autouse=True)
def _seed_and_threads():
    torch.manual_seed(0)
    yield


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} not present")
    return SHARED_DATA


@pytest.fixture(scope="module")
def copier(tmp_path_factory) -> Path:
    """A hand-built model that copies its input word for word (helpers.copy_model over WORDS), as a checkpoint: what
    it outputs is known by construction, on every CPU."""
    return save_copier(tmp_path_factory.mktemp("copier"), WORDS)


@pytest.fixture(scope="module")
def counter(tmp_path_factory) -> Path:
    """A hand-built LM (helpers.successor_lm) that counts up WORDS ("cat" -> "dog" -> ...) and ends after "tree"
    with "." and </s>, as a checkpoint."""
    return save_counter(tmp_path_factory.mktemp("counter"), WORDS)


@pytest.fixture(scope="module")
def random_checkpoint(tmp_path_factory) -> Path:
    """helpers.random_translator(3) over WORDS, as a checkpoint: outputs arbitrary but fixed, for checks that a
    sentence's output does not depend on its batch or neighbours."""
    d = tmp_path_factory.mktemp("random")
    return save_model(d / "ckpt", random_translator(3), save_word_tokenizer(d / "tok", WORDS))
