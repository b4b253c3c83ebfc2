"""transformers loading through real mounts, from threads, as a serving process does.

transformers v5 opens every safetensors shard with ``safe_open(..., backend="mmap")`` and materializes the
tensors in a pool of worker threads (core_model_loading's ThreadPoolExecutor); ``disable_mmap=True`` reads
each file whole instead (what it does by itself on hf-mount, whose mmap deadlocks under parallel faults).
Here a sharded safetensors folder (written by ``save_pretrained``, three shards and an index) is mounted and
loaded both ways, and by four threads calling ``from_pretrained`` at once; a GGUF's ``hf/`` folder (--hf) is
loaded by four threads at once. The oracle is the same call on the original files: the state dicts must be
equal and the logits bit-identical.
"""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers needs it for gguf_file=
pytest.importorskip("sentencepiece")

from hf_models import sentencepiece_vocab, write_model  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

THREADS = 4
JOIN_TIMEOUT = 300.0
IDS = torch.tensor([[1, 17, 300, 4095, 2, 99, 1024, 7]])


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A random llama (float32, ~20 MB) saved as transformers saves a model: 3 shards and an index."""
    folder = tmp_path_factory.mktemp("hf-model")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(str(folder), max_shard_size="8MB")
    assert len(list(folder.glob("model-*-of-*.safetensors"))) == 3
    return folder


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(IDS).logits


def load_from_threads(load, n: int = THREADS) -> list:
    """Call ``load()`` in ``n`` threads released at once; their results, or the test fails (error, hang)."""
    barrier = threading.Barrier(n)
    results: list = [None] * n
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            barrier.wait(timeout=60)
            results[i] = load()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=JOIN_TIMEOUT)
    assert not any(t.is_alive() for t in threads), f"from_pretrained hung for {JOIN_TIMEOUT:.0f} s"
    assert not errors, errors
    return results


def assert_same_model(model, reference) -> None:
    got, want = model.state_dict(), reference.state_dict()
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    assert torch.equal(logits(model), logits(reference))


@pytest.fixture(scope="module")
def reference(hf_folder):
    return AutoModelForCausalLM.from_pretrained(str(hf_folder)).eval()


@pytest.fixture(scope="module")
def folder_mount(module_mounted, hf_folder):
    mnt = module_mounted(str(hf_folder))
    for path in hf_folder.iterdir():  # the folder's own files, passed through byte for byte
        assert (mnt / path.name).read_bytes() == path.read_bytes(), path.name
    return mnt


@pytest.mark.parametrize("disable_mmap", [False, True], ids=["mmap-threads", "read-whole"])
def test_mounted_safetensors_folder_loads(folder_mount, reference, disable_mmap):
    model = AutoModelForCausalLM.from_pretrained(str(folder_mount), disable_mmap=disable_mmap).eval()
    assert_same_model(model, reference)


def test_four_threads_load_the_mounted_folder_at_once(folder_mount, reference):
    models = load_from_threads(lambda: AutoModelForCausalLM.from_pretrained(str(folder_mount)).eval())
    for model in models:
        assert_same_model(model, reference)


def test_four_threads_load_hf_of_a_gguf_at_once(mounted, tmp_path):
    single = write_model(tmp_path / "llama.gguf", "llama", sentencepiece_vocab(tmp_path / "spm", gemma=False)).path
    ids = torch.tensor([[1, 5, 40, 300, 2, 77]])
    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="llama.gguf",
                                                     dtype=torch.float32).eval()
    mnt = mounted(str(single), "--hf", "--hf-dtype", "float32")
    models = load_from_threads(lambda: AutoModelForCausalLM.from_pretrained(str(mnt / "hf")).eval())
    with torch.no_grad():
        expected = reference(ids).logits
        for model in models:
            assert torch.equal(model(ids).logits, expected)
