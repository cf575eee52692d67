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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """`--dist loadgroup` (make test): an item marked `xdist_group(NAME)` gets "@NAME" after its node id, which is how
    xdist's scheduler keeps a group on one worker. xdist 3.8 sets it on `item._nodeid`, which pytest 9 no longer
    reads (it derives the id from `item._id`): without this the groups are split across the workers (and a family
    of tests/test_published.py is built on each)."""
    if not getattr(config.option, "loadgroup", False):  # (set on xdist's workers under --dist loadgroup)
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        suffix = "@" + "_".join(names)
        if names and not item.nodeid.endswith(suffix):  # (an older pytest shows xdist's own suffix)
            from _pytest.nodeid import coerce_node_id

            item._id = coerce_node_id(item.nodeid + suffix)
