"""The fingerprint (miles/guard/fingerprint.py): an exact hash that changes under every realistic corruption, checked
against the xxhash library on the tensors' bytes (numpy's, not torch's view) and on the embedded model's real weights."""

import math

import numpy as np
import pytest
import torch
import xxhash

from miles.guard.fingerprint import (
    combine_digests,
    differing_tensors,
    digest_table,
    tensor_digest,
    weights_are_finite,
    weights_fingerprint,
)
from miles.models.hf import load_causal_lm
from tests.fixtures.weight_corruptions import CORRUPTIONS, VALUE_CORRUPTIONS, one_ulp


@pytest.fixture(scope="module")
def hf_state(embedded) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in load_causal_lm(embedded.checkpoint_dir).state_dict().items()}


def _copy(state):
    return {name: tensor.clone() for name, tensor in state.items()}


def _reference_fingerprint(state) -> str:
    """Written out independently: per tensor the XXH3-128 of numpy's row-major bytes; the sorted lines hashed."""
    lines = []
    for name in sorted(state):
        array = np.ascontiguousarray(state[name].numpy())
        lines.append(f"{name}\t{state[name].dtype}\t{list(array.shape)}\t{xxhash.xxh3_128(array.tobytes()).hexdigest()}\n")
    return xxhash.xxh3_128("".join(lines).encode()).hexdigest()


def test_the_fingerprint_is_xxh3_128_of_the_sorted_per_tensor_hashes(hf_state):
    assert weights_fingerprint(hf_state) == _reference_fingerprint(hf_state)
    name = "model.layers.0.self_attn.q_proj.weight"
    assert tensor_digest(hf_state[name]).digest == xxhash.xxh3_128(hf_state[name].numpy().tobytes()).hexdigest()


def test_equal_weights_give_equal_fingerprints_whatever_the_order_copy_or_container(embedded, hf_state):
    reversed_copy = {name: hf_state[name].clone() for name in reversed(list(hf_state))}
    assert weights_fingerprint(reversed_copy) == weights_fingerprint(hf_state)
    assert weights_fingerprint(load_causal_lm(embedded.checkpoint_dir)) == weights_fingerprint(hf_state)


@pytest.mark.parametrize("corruption", list(CORRUPTIONS), ids=list(CORRUPTIONS))
def test_every_corruption_class_changes_the_fingerprint_and_is_named(hf_state, corruption):
    corrupted = _copy(hf_state)
    CORRUPTIONS[corruption](corrupted)
    assert weights_fingerprint(corrupted) != weights_fingerprint(hf_state)
    changed = [name for name in sorted(set(hf_state) | set(corrupted))
               if name not in hf_state or name not in corrupted or not torch.equal(hf_state[name], corrupted[name])]
    assert changed  # the corruption did something
    assert [entry.split(" ")[0] for entry in differing_tensors(digest_table(hf_state), digest_table(corrupted))] == changed


@pytest.mark.parametrize("corruption", [name for name, f in VALUE_CORRUPTIONS.items() if f is not one_ulp])
def test_the_value_corruptions_are_invisible_to_an_exact_sum(hf_state, corruption):
    """Why a sum (the old fingerprint) was not enough: each of these leaves Σ of every weight exactly as it was."""
    corrupted = _copy(hf_state)
    CORRUPTIONS[corruption](corrupted)

    def exact_sum(state):
        return math.fsum(value for tensor in state.values() for value in tensor.double().flatten().tolist())

    assert exact_sum(corrupted) == exact_sum(hf_state)


def test_differing_tensors_marks_changed_missing_and_extra():
    a = {"x": torch.zeros(2), "y": torch.ones(2), "z": torch.ones(1)}
    b = {"x": torch.zeros(2), "y": torch.tensor([1.0, 2.0]), "w": torch.ones(1)}
    assert differing_tensors(digest_table(a), digest_table(b)) == ["w (extra)", "y (changed)", "z (missing)"]


def test_dtype_shape_and_name_are_part_of_the_fingerprint():
    base = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    assert weights_fingerprint({"w": base["w"].reshape(3, 2)}) != weights_fingerprint(base)  # same bytes
    assert weights_fingerprint({"w": base["w"].double()}) != weights_fingerprint(base)
    assert weights_fingerprint({"v": base["w"]}) != weights_fingerprint(base)
    # A transposed view hashes as the matrix it shows, not as its storage.
    square = torch.arange(4, dtype=torch.float32).reshape(2, 2)
    assert tensor_digest(square.t()) == tensor_digest(square.t().contiguous()) != tensor_digest(square)


def test_bfloat16_is_hashed_by_its_own_bytes():
    tensor = torch.tensor([1.0, -2.5, 3.0], dtype=torch.bfloat16)
    expected = xxhash.xxh3_128(tensor.view(torch.int16).numpy().tobytes()).hexdigest()
    assert tensor_digest(tensor).digest == expected


def test_combination_is_separate_so_a_layout_adapter_can_re_key_the_table(hf_state):
    """An engine in a fused layout (SGLang's qkv_proj) reports its own table; an adapter maps the HF tensors into
    it. The combination of a re-keyed table is a plain function of the table."""
    layer = "model.layers.0.self_attn"
    fused = torch.cat([hf_state[f"{layer}.{p}_proj.weight"] for p in "qkv"])  # what SGLang holds
    engine_table = {f"{layer}.qkv_proj.weight": tensor_digest(fused)}
    adapted = {f"{layer}.qkv_proj.weight": tensor_digest(torch.cat([hf_state[f"{layer}.{p}_proj.weight"].clone()
                                                                     for p in "qkv"]))}
    assert combine_digests(adapted) == combine_digests(engine_table)
    swapped = _copy(hf_state)
    CORRUPTIONS["swapped k/v"](swapped)
    wrong = {f"{layer}.qkv_proj.weight": tensor_digest(torch.cat([swapped[f"{layer}.{p}_proj.weight"] for p in "qkv"]))}
    assert combine_digests(wrong) != combine_digests(engine_table)


def test_non_finite_weights_are_found_though_they_hash_like_any_others():
    state = {"w": torch.ones(3), "steps": torch.tensor([3])}  # integer tensors are not checked
    assert weights_are_finite(state)
    for bad in (float("nan"), float("inf"), -float("inf")):
        broken = {"w": torch.tensor([1.0, bad, 3.0]), "steps": torch.tensor([3])}
        assert not weights_are_finite(broken)
        assert weights_fingerprint(broken) == weights_fingerprint(_copy(broken))  # NaN bytes hash equal
    # Finite weights whose float32 sum overflows are finite all the same.
    assert weights_are_finite({"w": torch.full((4,), 3e38)})
    assert not weights_are_finite({"w": torch.tensor([3e38, 3e38, float("nan")])})


def test_finiteness_is_not_fooled_by_tensor_sums_that_cancel():
    """The check adds the tensors' sums: an inf in one tensor and a -inf in another give a NaN total, which is then
    confirmed element by element; finite tensors whose float32 sums overflow to +inf and -inf are finite."""
    assert not weights_are_finite({"a": torch.tensor([1.0, float("inf")]), "b": torch.tensor([-float("inf")])})
    assert weights_are_finite({"a": torch.full((4,), 3e38), "b": torch.full((4,), -3e38)})
    assert not weights_are_finite({"a": torch.ones(2), "b": torch.tensor([2.0, float("nan")])})


@pytest.mark.parametrize("tensor", [torch.arange(5, dtype=torch.int64), torch.tensor([True, False, True]),
                                    torch.tensor(2.5), torch.zeros(0, 3)], ids=["int64", "bool", "0-d", "empty"])
def test_every_tensor_kind_is_hashed_by_numpy_s_bytes_of_it(tensor):
    assert tensor_digest(tensor).digest == xxhash.xxh3_128(np.ascontiguousarray(tensor.numpy()).tobytes()).hexdigest()


def test_dtypes_numpy_lacks_are_hashed_by_their_raw_bytes():
    tensor = torch.tensor([0.5, -1.0, 448.0]).to(torch.float8_e4m3fn)
    assert tensor_digest(tensor).digest == xxhash.xxh3_128(tensor.view(torch.uint8).numpy().tobytes()).hexdigest()


def test_entries_that_are_not_tensors_are_left_out_of_the_table():
    """megatron's state dicts carry ``_extra_state`` entries (None, or bytes of metadata): no weights to hash."""
    table = digest_table({"w": torch.ones(2), "layer._extra_state": None, "other._extra_state": b"meta"})
    assert list(table) == ["w"]
